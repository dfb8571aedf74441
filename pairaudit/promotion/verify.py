"""A decision re-derived from what it consumed: every gate, the decision word, the reasons (docs/interop.md).

``pairaudit verdict`` reads ``promotion/decision.json`` and then, before it
believes a word of it, re-derives it (:func:`verify`):

1. **The chain.** Every artifact the decision lists under
   ``provenance.consumed`` must be the file it consumed: present, and of the
   sha256 recorded there (the shared control archive, an append-only log
   that later audits keep appending to, is named and not hash-checked; no
   gate is computed from it).
2. **The stage gates.** Each consumed stage artifact's own gate is
   recomputed from the evidence the artifact records, with the registered
   rule (``gates.rule``) it names: the speed gate from the bracket's
   recorded starts (``speed.decision.decide`` over ``pooled``, the clock
   check, the host evidence), boundary-v1 from the cases side by side, the
   grid-tie and determinism rules from each divergence record. The quality
   gates are recomputed from their paired tables while deciding (3).
3. **The decision.** The decision is made again from those artifacts,
   exactly as the promotion stage makes it (``promotion.stage`` reading,
   ``promotion.decision.decide``), and every gate (its rule, verdict,
   outcome, reasons, numbers), the decision, its gate verdict, deciding
   gates, reasons, deviations and per-dataset lines must be what the file
   states.

``deep`` goes on to the primary records: every consumed artifact's own
``provenance.consumed`` hashes, recursively; the sampled answers assembled
again from their journals, the scores scored again from the answers, the
paired tables paired again from the scores (each stage's own function, into
a temporary directory); the client-side speed metrics pooled again from the
streams; determinism from the greedy runs' repeat hashes; the boundary gate
from each arm's boundary cases.

Anything that does not follow is refused (:class:`VerificationError`, an
``ArtifactError``), naming the gate or the field and the artifact it was
re-derived from. A decision made by other code (its recorded
``code_version``) is held to its words (every rule, verdict, outcome, the
decision, the per-dataset counts); differences of wording are listed as
notes, since a later version may word a reason differently.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pairaudit import gates
from pairaudit.answers.stage import assemble
from pairaudit.boundary.stage import rule_cases, side_by_side
from pairaudit.core import artifacts
from pairaudit.core.contracts import (
    ARMS,
    BOUNDARY_GATE_SCHEMA,
    BOUNDARY_SCHEMA,
    DATASET_SCHEMA,
    DIVERGENCE_SCHEMA,
    GREEDY_SCHEMA,
    LAUNCH_SCHEMA,
    PAIRED_SCHEMA,
    PHASE_SCHEMA,
    PREFLIGHT_SCHEMA,
    REQUESTS_SCHEMA,
    SAMPLED_SCHEMA,
    SCORES_SCHEMA,
    SPEED_DECISION_SCHEMA,
    SPEED_STREAMS_SCHEMA,
    arm_role,
)
from pairaudit.core.readers import AnswersPhase, LaunchReceipt, Paired, Preflight
from pairaudit.core.settings import QualitySettings
from pairaudit.promotion.decision import boundary_evidence, decide, speed_evidence
from pairaudit.promotion.stage import _load_keyed, _load_later
from pairaudit.quality.stage import paired_stage, score_stage
from pairaudit.speed import decision as speed_decision
from pairaudit.speed.metrics import finite_json, pool_repeat
from pairaudit.speed.starts import start_cost_s

LEVELS = ("chain", "deep")

# What a decision states that must follow from its evidence whatever code made it (a word, an outcome, a count);
# everything else it states must follow too, but only code of the same version words it the same.
_GATE_WORDS = ("rule", "verdict", "outcome")
_TOP_WORDS = ("rule", "decision", "gate_verdict", "deciding_gates", "not_evaluated", "identical_arms", "calibration")
_TOP_TEXT = ("reasons", "deviations", "multiplicity", "datasets", "arms", "switch_diff", "preflight", "evidence")
_DATASET_WORDS = ("n", "control_correct", "candidate_correct", "control_only", "candidate_only", "verdict", "rule")
_APPEND_ONLY = "control-archive.jsonl"   # results/control-archive.jsonl: every audit of the host appends to it


class VerificationError(artifacts.ArtifactError):
    """A decision that does not follow from what it consumed; ``gate`` and ``artifact`` name where."""

    def __init__(self, message: str, *, gate: str | None = None, artifact: str | None = None):
        super().__init__(message)
        self.gate, self.artifact = gate, artifact


@dataclass(frozen=True)
class Verification:
    """What was checked: the level, the artifacts whose hash held, the gates re-derived, and notes."""
    level: str
    consumed: tuple[str, ...]
    append_only: tuple[str, ...]
    stage_gates: tuple[str, ...]
    gates: tuple[str, ...]
    recomputed: tuple[str, ...] = ()
    chain: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        out = (f"verified ({self.level}): {len(self.consumed)} consumed artifact(s) hold their recorded sha256, "
               f"{len(self.stage_gates)} stage gate(s) recomputed from their recorded evidence, "
               f"{len(self.gates)} gate(s) and the decision re-derived from them")
        if self.append_only:
            out += f"; not hash-checked (append-only logs): {', '.join(self.append_only)}"
        if self.level == "deep":
            out += (f"; deep: {len(self.chain)} earlier input(s) hold their hashes, {len(self.recomputed)} "
                    f"artifact(s) recomputed from the primary records")
        return out + "".join(f"\nnote: {n}" for n in self.notes)


# ------------------------------------------------------------------ reading

def _bases(decision_path: Path) -> list[Path]:
    """Where a consumed path (as the workflow recorded it, relative to its working directory) may be: the
    decision's own directories, nearest first, then the current directory."""
    return [*Path(decision_path).resolve().parents, Path.cwd()]


def _resolve(key: str, bases: Iterable[Path]) -> Path | None:
    p = Path(key)
    if p.is_absolute():
        return p if p.exists() else None
    return next((b / p for b in bases if (b / p).exists()), None)


def _schema_of(path: Path) -> str | None:
    if path.suffix == ".jsonl":
        return artifacts.read_jsonl(path)[0].get("schema")
    if path.suffix == ".json":
        return artifacts.read_json(path).get("schema")
    return None


def _canon(obj: Any) -> Any:
    """What a writer would store of ``obj``: no NaN, JSON types only."""
    return json.loads(json.dumps(finite_json(obj)))


def _diff(stated: Any, derived: Any, path: str = "") -> list[str]:
    """The key paths at which two JSON values differ (a list compares whole)."""
    if isinstance(stated, Mapping) and isinstance(derived, Mapping):
        out = []
        for k in sorted(set(stated) | set(derived), key=str):
            if k == artifacts.CONTENT_KEY:
                continue
            out += _diff(stated.get(k), derived.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if _canon(stated) == _canon(derived) else [path or "(value)"]


def _short(v: Any, limit: int = 140) -> str:
    text = json.dumps(_canon(v), ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ------------------------------------------------------------------ stage gates

def speed_gate_again(doc: Mapping[str, Any], where: str) -> dict | None:
    """The speed gate from the bracket's recorded starts, under the rule the bracket records (None: not
    measured, whose gate can only be INCONCLUSIVE)."""
    gate = doc.get("gate") or {}
    if doc.get("not_run") is not None:
        if gate.get("verdict") != "INCONCLUSIVE":
            raise VerificationError(f"{where}: a bracket not measured ({doc['not_run']}) states the speed verdict "
                                    f"{gate.get('verdict')}; only INCONCLUSIVE follows from no measurement",
                                    gate="speed", artifact=where)
        return None
    missing = [k for k in ("pooled", "params", "clock_check", "starts", "spread") if not doc.get(k)]
    if missing:
        raise VerificationError(f"{where}: states the speed verdict {gate.get('verdict')} but records no "
                                f"{', '.join(missing)} to re-derive it from", gate="speed", artifact=where)
    cfg = doc["params"]
    pooled = doc["pooled"]
    # every start measured to its end (a sweep's failed start is recorded beside them, not pooled)
    names = [s["start"] for s in doc["starts"] if all(s["start"] in pooled[c] for c in pooled)]
    results = {st: {cell: {"pooled": pooled[cell][st]} for cell in pooled} for st in names}
    archive_pct = {n: (s or {}).get("archive_with_window_pct") for n, s in doc["spread"].items()}
    sweep = doc.get("sweep") or None
    kw = {} if not sweep else {"arms": sweep["arms"], "candidate": sweep["candidate"]}
    try:
        # the rule the bracket ran under, through the registry (speed.decision.decide selects it by name)
        _, _, again = speed_decision.decide(results, cfg, json.loads(json.dumps(doc["clock_check"])), archive_pct,
                                            starts=names, evidence=doc.get("evidence"),
                                            start_cost_s=start_cost_s(doc["starts"]), **kw)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise VerificationError(f"{where}: its gate cannot be re-derived from its recorded starts under rule "
                                f"{cfg.get('rule')!r}: {type(exc).__name__}: {exc}", gate="speed",
                                artifact=where) from None
    return _canon(again)


def boundary_gate_again(doc: Mapping[str, Any], where: str) -> dict | None:
    gate = doc.get("gate")
    if gate is None:
        return None
    cases = [{"arm": arm, "case": c["case"], "correct": side.get("correct"), "finish_reason": side.get("finish_reason"),
              "expected": c.get("expected"), "text": side.get("text"), "config_error": side.get("config_error")}
             for arm in ARMS for c in doc.get("cases") or [] if (side := c.get(arm)) is not None]
    return _canon(_apply(gate, "boundary", where, "boundary", lambda spec: spec.apply(cases)))


def _apply(stated: Mapping[str, Any], decides: str, where: str, name: str, call: Callable[[gates.Rule], dict]) -> dict:
    try:
        spec = gates.rule(stated.get("rule"), decides)
    except ValueError as exc:
        raise VerificationError(f"{where}: gate {name}: {exc}", gate=name, artifact=where) from None
    return call(spec)


def divergence_gates_again(doc: Mapping[str, Any], where: str) -> dict[str, dict | None]:
    """grid-tie and determinism of one dataset's divergence record, from the inputs it keeps."""
    ds = doc.get("dataset")
    out: dict[str, dict | None] = {}
    grid, det = doc.get("grid_tie"), doc.get("determinism")
    if doc.get("not_run") is not None:
        for n, g in (("grid_tie", grid), ("determinism", det)):
            if g is not None and g.get("verdict") != "INCONCLUSIVE":
                raise VerificationError(f"{where}: not run ({doc['not_run']}) but its {n} states "
                                        f"{g.get('verdict')}", gate=f"{n}:{ds}", artifact=where)
        return {f"grid_tie:{ds}": None, f"determinism:{ds}": None}
    if grid is not None:
        if "grid_tie_inputs" not in doc or "counts" not in doc:
            raise VerificationError(f"{where}: states grid-tie {grid.get('verdict')} but keeps no grid_tie_inputs "
                                    "and counts to re-derive it from", gate="grid_tie", artifact=where)
        counts = doc["counts"]
        out[f"grid_tie:{ds}"] = _canon(_apply(grid, "grid_tie", where, "grid_tie", lambda spec: spec.apply(
            doc["grid_tie_inputs"], grid.get("params") or {}, selected=counts.get("selected"),
            compared=counts.get("compared"))))
    if det is not None:
        hashes = {arm: _hashes_of(v) for arm, v in (det.get("arms") or {}).items()}
        out[f"determinism:{ds}"] = _canon(_apply(det, "determinism", where, f"determinism:{ds}",
                                                 lambda spec: spec.apply(hashes)))
    return out


def _hashes_of(arm: Mapping[str, Any]) -> list[str]:
    """A repeat list with the recorded repeats and distinct hashes: all determinism-v1 reads of the hashes."""
    distinct = list(arm.get("distinct_hashes") or [])
    n = int(arm.get("repeats") or 0)
    return distinct + distinct[:1] * max(0, n - len(distinct))


def _check_stage_gate(stated: Mapping[str, Any] | None, again: Mapping[str, Any] | None, *, name: str,
                      where: str, same_code: bool, notes: list[str]) -> None:
    if stated is None or again is None:
        return
    for k in ("rule", "verdict"):
        if _canon(stated.get(k)) != _canon(again.get(k)):
            raise VerificationError(
                f"{where}: gate {name} states {k} {stated.get(k)!r}, but its recorded evidence under "
                f"{stated.get('rule')} gives {again.get(k)!r} (reasons re-derived: {_short(again.get('reasons'))})",
                gate=name, artifact=where)
    diff = _diff(stated, again)
    if diff:
        msg = (f"{where}: gate {name} does not follow from its recorded evidence at {', '.join(diff[:6])} "
               f"(stated {_short(_pick(stated, diff[0]))}, re-derived {_short(_pick(again, diff[0]))})")
        if same_code:
            raise VerificationError(msg, gate=name, artifact=where)
        notes.append(msg + " (made by other code: wording not held)")


def _pick(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        doc = doc.get(part) if isinstance(doc, Mapping) else None
    return doc


# ------------------------------------------------------------------ the decision

@dataclass
class _Consumed:
    """The decision's consumed artifacts by kind (their paths as found), and which were hash-checked."""
    by_kind: dict[str, list[Path]] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)
    append_only: list[str] = field(default_factory=list)


def _consumed(doc: Mapping[str, Any], path: Path) -> _Consumed:
    prov = doc.get("provenance") or {}
    consumed = prov.get("consumed")
    if not isinstance(consumed, Mapping) or not consumed:
        raise VerificationError(f"{path}: records no consumed artifacts (provenance.consumed), so none of its gates "
                                "can be re-derived; refusing it. A decision written by the promotion stage always "
                                "records them", artifact=str(path))
    bases = _bases(path)
    out = _Consumed()
    for key, recorded in consumed.items():
        found = _resolve(key, bases)
        if Path(key).name == _APPEND_ONLY:
            # appended to by every later audit of the host: hashed as read at decision time, never re-read here
            out.append_only.append(key)
            continue
        if found is None:
            raise VerificationError(f"{path}: consumed {key}, which is not there (looked beside the decision and in "
                                    f"{Path.cwd()}): nothing to re-derive its gates from", artifact=key)
        actual = artifacts.sha256_file(found)
        if actual != recorded:
            raise VerificationError(f"{path}: consumed {key} of sha256 {str(recorded)[:12]}..., but {found} is now "
                                    f"{actual[:12]}...: the evidence changed after the decision (or the decision was "
                                    "rewritten); rerun the workflow so the chain is rebuilt", artifact=key)
        out.checked.append(key)
        out.by_kind.setdefault(str(_schema_of(found)), []).append(found)
    return out


def _one(c: _Consumed, schema: str, path: Path) -> Path | None:
    got = c.by_kind.get(schema) or []
    if len(got) > 1:
        raise VerificationError(f"{path}: consumed {len(got)} {schema} artifacts ({', '.join(map(str, got))}); "
                                "a decision reads one", artifact=str(path))
    return got[0] if got else None


def verify(path: str | os.PathLike, doc: Mapping[str, Any], *, deep: bool = False) -> Verification:
    """Re-derive ``doc`` (the decision at ``path``, its self-hash already checked) from what it consumed.

    Returns what was checked; :class:`VerificationError` naming the gate, the field or the artifact otherwise.
    """
    path = Path(path)
    prov = doc.get("provenance") or {}
    same_code = prov.get("code_version") == artifacts.code_version()
    notes: list[str] = []
    if not same_code:
        notes.append(f"made by code {str(prov.get('code_version'))[:12]}..., checked by {artifacts.code_version()[:12]}"
                     "...: every rule, verdict, outcome, decision and count is held to; wording is not")
    c = _consumed(doc, path)
    stage_gates: list[str] = []
    # 2. each stage artifact's own gate, from the evidence it records
    speed_path = _one(c, SPEED_DECISION_SCHEMA, path)
    if speed_path is not None:
        sdoc = artifacts.read_json(speed_path)
        again = speed_gate_again(sdoc, str(speed_path))
        _check_stage_gate(sdoc.get("gate"), again, name="speed", where=str(speed_path), same_code=same_code,
                          notes=notes)
        stage_gates.append(f"speed ({speed_path})")
    boundary_path = _one(c, BOUNDARY_GATE_SCHEMA, path)
    if boundary_path is not None:
        bdoc = artifacts.read_json(boundary_path)
        _check_stage_gate(bdoc.get("gate"), boundary_gate_again(bdoc, str(boundary_path)), name="boundary",
                          where=str(boundary_path), same_code=same_code, notes=notes)
        stage_gates.append(f"boundary ({boundary_path})")
    for p in c.by_kind.get(DIVERGENCE_SCHEMA, []):
        ddoc = artifacts.read_json(p)
        for name, again in divergence_gates_again(ddoc, str(p)).items():
            kind = name.split(":", 1)[0]
            _check_stage_gate(ddoc.get(kind), again, name=name, where=str(p), same_code=same_code, notes=notes)
            stage_gates.append(f"{name} ({p})")
    # 3. the decision made again from them, as the promotion stage makes it
    params = prov.get("params") or {}
    derived = _decide_again(c, path, calibration=bool(params.get("calibration")))
    if params.get("datasets") is not None and sorted(params["datasets"]) != sorted(derived["datasets"]):
        raise VerificationError(f"{path}: records the datasets {params['datasets']} but consumed the paired tables "
                                f"of {sorted(derived['datasets'])}", artifact=str(path))
    _compare(doc, derived, c, path, same_code=same_code, notes=notes)
    stage_gates += [f"quality:{ds} ({p})" for p in c.by_kind.get(PAIRED_SCHEMA, [])
                    for ds in [artifacts.read_json(p).get("dataset")]]
    result = Verification(level="chain", consumed=tuple(c.checked), append_only=tuple(c.append_only),
                          stage_gates=tuple(stage_gates), gates=tuple(derived["gates"]), notes=tuple(notes))
    if not deep:
        return result
    try:
        chain, recomputed = _deep(c, path, same_code=same_code, notes=notes)
    except (ValueError, TypeError, KeyError) as exc:
        raise VerificationError(f"{path}: its artifacts cannot be recomputed from the primary records they name: "
                                f"{type(exc).__name__}: {exc}", artifact=str(path)) from None
    return Verification(level="deep", consumed=result.consumed, append_only=result.append_only,
                        stage_gates=result.stage_gates, gates=result.gates, recomputed=tuple(recomputed),
                        chain=tuple(chain), notes=tuple(notes))


def _decide_again(c: _Consumed, path: Path, *, calibration: bool) -> dict:
    paired = _load_keyed(c.by_kind.get(PAIRED_SCHEMA, []), Paired, "dataset")
    launch = _load_keyed(c.by_kind.get(LAUNCH_SCHEMA, []), LaunchReceipt, "arm")
    preflight = _load_keyed(c.by_kind.get(PREFLIGHT_SCHEMA, []), Preflight, "arm")
    later: dict[str, Any] = {}
    if c.by_kind.get(DIVERGENCE_SCHEMA):
        later["divergence"] = c.by_kind[DIVERGENCE_SCHEMA]
    if c.by_kind.get(PHASE_SCHEMA):
        later["answers"] = c.by_kind[PHASE_SCHEMA]
    for kind, schema in (("boundary", BOUNDARY_GATE_SCHEMA), ("speed", SPEED_DECISION_SCHEMA)):
        p = _one(c, schema, path)
        if p is not None:
            later[kind] = p
    try:
        kw, _, docs = _load_later(later)
        derived = dict(decide(paired, launch, preflight, calibration=calibration, **kw))
    except (ValueError, KeyError, TypeError) as exc:
        raise VerificationError(f"{path}: the decision cannot be made again from what it consumed: "
                                f"{type(exc).__name__}: {exc}", artifact=str(path)) from None
    derived["evidence"] = {"boundary_cases": boundary_evidence(docs.boundary), "speed": speed_evidence(docs.speed)}
    return _canon(derived)


def _gate_source(name: str, c: _Consumed) -> str:
    """The artifact(s) a gate of the decision is re-derived from, for the refusal's message."""
    kind, _, rest = name.partition(":")
    paths: list[Path] = {
        "quality": [p for p in c.by_kind.get(PAIRED_SCHEMA, []) if p.stem == rest] or c.by_kind.get(PAIRED_SCHEMA, []),
        "speed": c.by_kind.get(SPEED_DECISION_SCHEMA, []),
        "boundary": c.by_kind.get(BOUNDARY_GATE_SCHEMA, []),
        "grid_tie": c.by_kind.get(DIVERGENCE_SCHEMA, []),
        "determinism": c.by_kind.get(DIVERGENCE_SCHEMA, []),
        "servers": c.by_kind.get(PHASE_SCHEMA, []),
        "preflight": c.by_kind.get(PREFLIGHT_SCHEMA, []),
    }.get(kind, [])
    return ", ".join(map(str, paths)) or "nothing it consumed"


def _compare(doc: Mapping[str, Any], derived: Mapping[str, Any], c: _Consumed, path: Path, *, same_code: bool,
             notes: list[str]) -> None:
    stated_gates, again = doc.get("gates") or {}, derived["gates"]
    for name in list(stated_gates) + [n for n in again if n not in stated_gates]:
        if name not in again:
            raise VerificationError(f"{path}: gate {name} is stated, but nothing the decision consumed gives it",
                                    gate=name, artifact=str(path))
        if name not in stated_gates:
            raise VerificationError(f"{path}: gate {name} follows from {_gate_source(name, c)} "
                                    f"({(again[name] or {}).get('verdict', 'not evaluated')}) but the decision leaves "
                                    "it out", gate=name, artifact=str(path))
        s, d = stated_gates[name], again[name]
        if (s is None) != (d is None):
            raise VerificationError(
                f"{path}: gate {name} is stated {'not evaluated' if s is None else s.get('verdict')}, but "
                f"{_gate_source(name, c)} gives {'not evaluated' if d is None else d.get('verdict')}",
                gate=name, artifact=str(path))
        if s is None or d is None:
            continue
        words = [k for k in _GATE_WORDS if _canon(s.get(k)) != _canon(d.get(k))]
        if words:
            raise VerificationError(
                f"{path}: gate {name} does not follow from {_gate_source(name, c)}: it states "
                + ", ".join(f"{k} {s.get(k)}" for k in words) + "; re-derived under " + str(d.get("rule")) + ": "
                + ", ".join(f"{k} {d.get(k)}" for k in words) + f" (its reasons: {_short(d.get('reasons'))})",
                gate=name, artifact=str(path))
        diff = _diff(s, d)
        if diff:
            msg = (f"{path}: gate {name} does not follow from {_gate_source(name, c)} at {', '.join(diff[:6])} "
                   f"(stated {_short(_pick(s, diff[0]))}, re-derived {_short(_pick(d, diff[0]))})")
            if same_code:
                raise VerificationError(msg, gate=name, artifact=str(path))
            notes.append(msg)
    for k in _TOP_WORDS:
        if k in doc and _canon(doc.get(k)) != _canon(derived.get(k)):
            raise VerificationError(f"{path}: its {k} is {_short(doc.get(k))}, but the decision made again from what "
                                    f"it consumed gives {_short(derived.get(k))}", artifact=str(path))
    for ds, line in (doc.get("datasets") or {}).items():
        again_line = (derived.get("datasets") or {}).get(ds) or {}
        bad = [k for k in _DATASET_WORDS if _canon(line.get(k)) != _canon(again_line.get(k))]
        if bad:
            raise VerificationError(f"{path}: dataset {ds}'s {', '.join(bad)} do not follow from its paired table "
                                    f"(stated {_short({k: line.get(k) for k in bad})}, re-derived "
                                    f"{_short({k: again_line.get(k) for k in bad})})", gate=f"quality:{ds}",
                                    artifact=str(path))
    for k in _TOP_TEXT:
        if k not in doc and k == "evidence":
            continue
        diff = _diff(doc.get(k), derived.get(k), k)
        if diff:
            msg = (f"{path}: its {', '.join(diff[:6])} do not follow from what it consumed (stated "
                   f"{_short(_pick(doc, diff[0]))}, re-derived {_short(_pick(derived, diff[0]))})")
            if same_code:
                raise VerificationError(msg, artifact=str(path))
            notes.append(msg)


# ------------------------------------------------------------------ deep

def _walk(c: _Consumed, path: Path) -> list[str]:
    """Every earlier input of every consumed artifact, recursively, holds the hash its consumer recorded."""
    bases = _bases(path)
    seen: set[Path] = set()
    todo = [p for ps in c.by_kind.values() for p in ps]
    checked: list[str] = []
    while todo:
        p = todo.pop()
        if p in seen or p.suffix not in (".json", ".jsonl"):
            continue
        seen.add(p)
        doc = artifacts.read_jsonl(p)[0] if p.suffix == ".jsonl" else artifacts.read_json(p)
        for key, recorded in ((doc.get("provenance") or {}).get("consumed") or {}).items():
            if Path(key).name == _APPEND_ONLY:
                continue
            found = _resolve(key, bases)
            if found is None:
                raise VerificationError(f"{p}: consumed {key}, which is not there", artifact=str(p))
            actual = artifacts.sha256_file(found)
            if actual != recorded:
                raise VerificationError(f"{p}: consumed {key} of sha256 {str(recorded)[:12]}..., but it is now "
                                        f"{actual[:12]}...: the chain below the decision changed", artifact=key)
            checked.append(key)
            todo.append(found)
    return sorted(set(checked))


def _inputs(p: Path, bases: list[Path]) -> dict[str, list[Path]]:
    """An artifact's consumed inputs by schema."""
    doc = artifacts.read_jsonl(p)[0] if p.suffix == ".jsonl" else artifacts.read_json(p)
    out: dict[str, list[Path]] = {}
    for key in (doc.get("provenance") or {}).get("consumed") or {}:
        found = _resolve(key, bases)
        if found is not None and found.suffix in (".json", ".jsonl"):
            out.setdefault(str(_schema_of(found)), []).append(found)
    return out


def _first(ins: Mapping[str, list[Path]], schema: str) -> Path | None:
    got = ins.get(schema) or []
    return got[0] if got else None


def _same_table(stated: Path, again: Path, what: str) -> None:
    h1, r1 = artifacts.read_jsonl(stated)
    h2, r2 = artifacts.read_jsonl(again)
    h1.pop("provenance", None)
    h2.pop("provenance", None)
    where = [f"header {k}" for k in _diff(h1, h2)[:4]]
    bad = [i for i, (a, b) in enumerate(zip(r1, r2)) if _canon(a) != _canon(b)]
    if bad:
        where.append(f"record {bad[0]} (index {r1[bad[0]].get('index')}: {', '.join(_diff(r1[bad[0]], r2[bad[0]])[:4])})")
    if len(r1) != len(r2):
        where.append(f"{len(r1)} records against {len(r2)}")
    if where:
        raise VerificationError(f"{stated}: does not follow from {what}: {'; '.join(where)} differ",
                                artifact=str(stated))


def _deep(c: _Consumed, path: Path, *, same_code: bool, notes: list[str]) -> tuple[list[str], list[str]]:
    bases = _bases(path)
    chain = _walk(c, path)
    recomputed: list[str] = []
    phases = {arm_role(AnswersPhase.read(p).arm or ""): p for p in c.by_kind.get(PHASE_SCHEMA, [])}
    with tempfile.TemporaryDirectory(prefix="pairaudit-verify-") as tmp:
        t = Path(tmp)
        for pp in c.by_kind.get(PAIRED_SCHEMA, []):
            ins = _inputs(pp, bases)
            pdoc = artifacts.read_json(pp)
            ds = pdoc["dataset"]
            sampled = {arm_role(artifacts.read_jsonl(s)[0]["arm"]): s for s in ins.get(SAMPLED_SCHEMA, [])}
            scores = {arm_role(artifacts.read_jsonl(s)[0]["arm"]): s for s in ins.get(SCORES_SCHEMA, [])}
            dataset = _first(ins, DATASET_SCHEMA)
            if dataset is None or set(sampled) != set(ARMS) or set(scores) != set(ARMS):
                raise VerificationError(f"{pp}: does not record the dataset, both arms' answers and scores it was "
                                        "paired from", gate=f"quality:{ds}", artifact=str(pp))
            for arm in ARMS:
                # the answers, from the journal of every answer as it arrived
                sh = artifacts.read_jsonl(sampled[arm])[0]
                s_in = _inputs(sampled[arm], bases)
                journal = _resolve(str((sh.get("provenance") or {}).get("params", {}).get("journal")), bases)
                req, rec, pre = (_first(s_in, k) for k in (REQUESTS_SCHEMA, LAUNCH_SCHEMA, PREFLIGHT_SCHEMA))
                if None in (journal, req, rec, pre) or arm not in phases:
                    raise VerificationError(f"{sampled[arm]}: its journal, requests, receipt, preflight or answers "
                                            "phase is not there to assemble it again", artifact=str(sampled[arm]))
                out = t / f"sampled-{ds}-{arm}.jsonl"
                assemble(dataset_path=str(dataset), requests_path=str(req), journal_path=str(journal), out_path=str(out),
                         receipt_path=str(rec), preflight_path=str(pre), phase_path=str(phases[arm]))
                _same_table(sampled[arm], out, f"the journal {journal}")
                recomputed.append(str(sampled[arm]))
                # the scores, scored again from those answers
                ch = artifacts.read_jsonl(scores[arm])[0]
                out = t / f"scores-{ds}-{arm}.jsonl"
                score_stage(dataset_path=str(dataset), sampled_path=str(sampled[arm]), out_path=str(out),
                            sandbox_limits=((ch.get("provenance") or {}).get("params") or {}).get("sandbox") or {},
                            workers=1)
                _same_table(scores[arm], out, f"the answers {sampled[arm]}")
                recomputed.append(str(scores[arm]))
            # the paired table and its quality gate, paired again from the scores
            params = (pdoc.get("provenance") or {}).get("params") or {}
            out = t / f"paired-{ds}.json"
            paired_stage(dataset_path=str(dataset), sampled_paths={a: str(sampled[a]) for a in ARMS},
                         score_paths={a: str(scores[a]) for a in ARMS}, out_path=str(out),
                         quality=QualitySettings.from_json(params.get("quality") or {}),
                         datasets=int(params.get("datasets") or 1))
            again = artifacts.read_json(out)
            diff = _diff({k: v for k, v in pdoc.items() if k != "provenance"},
                         {k: v for k, v in again.items() if k != "provenance"})
            if diff:
                raise VerificationError(f"{pp}: does not follow from its scores and answers at {', '.join(diff[:6])}",
                                        gate=f"quality:{ds}", artifact=str(pp))
            recomputed.append(str(pp))
        for bp in c.by_kind.get(BOUNDARY_GATE_SCHEMA, []):
            bdoc = artifacts.read_json(bp)
            arms = {arm_role(d["arm"]): d for d in (artifacts.read_json(p) for p in _inputs(bp, bases).get(BOUNDARY_SCHEMA, []))}
            if set(arms) != set(ARMS):
                raise VerificationError(f"{bp}: does not record both arms' boundary cases", gate="boundary",
                                        artifact=str(bp))
            gate = _apply(bdoc["gate"], "boundary", str(bp), "boundary", lambda spec: spec.apply(rule_cases(arms)))
            _check_stage_gate(bdoc["gate"], _canon(gate), name="boundary", where=str(bp), same_code=same_code,
                              notes=notes)
            if _canon(side_by_side(arms)) != _canon(bdoc.get("cases")):
                raise VerificationError(f"{bp}: its cases are not both arms' boundary cases side by side",
                                        gate="boundary", artifact=str(bp))
            recomputed.append(str(bp))
        for dp in c.by_kind.get(DIVERGENCE_SCHEMA, []):
            ddoc = artifacts.read_json(dp)
            det = ddoc.get("determinism")
            if ddoc.get("not_run") is not None or det is None:
                continue
            greedy = {arm_role(h["arm"]): h for h in (artifacts.read_jsonl(p)[0]
                                                      for p in _inputs(dp, bases).get(GREEDY_SCHEMA, []))}
            if set(greedy) != set(ARMS):
                raise VerificationError(f"{dp}: does not record both arms' greedy runs", gate=f"determinism:"
                                        f"{ddoc.get('dataset')}", artifact=str(dp))
            hashes = {arm: (greedy[arm].get("determinism") or {}).get("hashes") or [] for arm in ARMS}
            again = _apply(det, "determinism", str(dp), "determinism", lambda spec: spec.apply(hashes))
            _check_stage_gate(det, _canon(again), name=f"determinism:{ddoc.get('dataset')}", where=str(dp),
                              same_code=same_code, notes=notes)
            recomputed.append(f"{dp} (determinism)")
        sp = _one(c, SPEED_DECISION_SCHEMA, path)
        if sp is not None:
            recomputed += _speed_streams(artifacts.read_json(sp), sp, bases)
    return chain, recomputed


def _speed_streams(doc: Mapping[str, Any], sp: Path, bases: list[Path]) -> list[str]:
    """The client-side metrics of every measured repeat, pooled again from the streams (the server's counters
    are primary records of their own: ``pooled`` keeps each repeat's deltas)."""
    if doc.get("not_run") is not None or not doc.get("pooled"):
        return []
    streams = _resolve(str(doc.get("streams")), bases)
    if streams is None or _schema_of(streams) != SPEED_STREAMS_SCHEMA:
        raise VerificationError(f"{sp}: its streams ({doc.get('streams')}) are not there", gate="speed",
                                artifact=str(sp))
    _, records = artifacts.read_jsonl(streams)
    for cell, per_start in doc["pooled"].items():
        for st, repeats in per_start.items():
            for r, stated in enumerate(repeats):
                mine = [s for s in records if s.get("start") == st and s.get("cell") == cell and s.get("repeat") == r]
                again = pool_repeat([{"delta": {}, "streams": mine}])
                for k in ("streams", "decode_tps", "ttft_s"):
                    a, b = stated.get(k), again.get(k)
                    close = (a == b) or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                         and abs(a - b) <= 1e-9 * max(1.0, abs(a)))
                    if not close:
                        raise VerificationError(f"{sp}: {cell} {st} repeat {r}: {k} {a!r} does not follow from its "
                                                f"streams in {streams} ({b!r})", gate="speed", artifact=str(sp))
    return [f"{sp} (client metrics from {streams})"]
