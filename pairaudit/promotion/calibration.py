"""A/A calibration: the control against itself through every gate, and the citation of it.

``snakemake --cores 4 calibrate`` runs the audit of the configured control
against a copy of itself.  The Snakefile loads itself a second time as a
Snakemake ``module`` whose config is :func:`calibration_config` of the
audit's: audit name ``<audit>-calibration`` (so everything lands in
``results/<audit>-calibration/`` and the audit's own results are never
touched), the candidate arm a copy of the control arm, ``calibration.of``
naming the calibrated audit.  A module rather than a config rewritten by
target: Snakemake parses the Snakefile before it knows the targets, and a
cluster job parses it again with only its own config, so the calibration's
rules must follow from the config alone.

With ``calibration.of`` set the promotion decides in calibration mode
(``decision.decide(..., calibration=True)``: identical arms are decided by
their gates) and writes the summary below beside the decision; every gate
that flags something on A vs A is a false alarm of this host and this
control, which is exactly what the calibration is there to show.

``results/<audit>-calibration/promotion/calibration.json`` (``summarize``)::

    {"schema": "pairaudit.calibration/v1", "audit", "of_audit",
     "control_spec_sha256",             # the control's launch spec_sha256 (= the candidate's)
     "host": {"hostname", "cpu_count", "accelerators"}, "host_sha256",   # host_facts / host_sha256
     "decision",                        # what the gates give on A vs A (calibration mode)
     "headline": str,                   # one line: what was flagged, or "nothing flagged"
     "flagged": [gate, ...],            # gates whose verdict is not what identical arms should give
     "not_evaluated": [gate, ...],
     "findings": [str, ...],            # one line per flagged gate, saying what it means here
     "notes": [str, ...],               # facts that flag nothing (e.g. spread above the bar, yet NO_WIN)
     "gates": {gate: {"rule", "verdict", "expected": [verdict, ...], "flagged": bool, "reason"}},
     "speed": None | {"rule", "verdict", "win_pct", "pooled_gain_pct",
                      "max_window_pct", "max_archive_pct",
                      "cells": {cell: {"window_pct": [per repeat], "window_max_pct", "archive_pct",
                                       "archive_n", "archive_with_window_pct", "archive_with_window_n"}}},
     "quality": {dataset: {"n", "control_only": [index], "candidate_only": [index], "discordant",
                           "mcnemar_p", "exact_text_matches", "verdict"}},
     "greedy": {dataset: {"selected", "compared", "diverged": [index], "determinism",
                          "nondeterministic_arms": [arm]}},
     "grid_tie": verdict | None, "boundary": None | {"verdict", "cases", "candidate_failures",
                                                      "control_failures", "identical_text_cases"},
     "preflight": {arm: verdict | None}, "servers": verdict | None}

``results/calibrations.jsonl`` (``calibration.log``; append-only, one line
per finished calibration, :class:`CalibrationEntry`)::

    {"schema": "pairaudit.calibration_log/v1", "time", "audit", "of_audit", "control_spec_sha256",
     "host", "host_sha256", "decision", "headline", "flagged", "summary_path", "summary_sha256",
     "decision_path", "decision_sha256"}

Every promotion decision looks the log up (:func:`cite`) and states in
``decision.json`` ``calibration_ref`` (:class:`CalibrationRef` or None): the
latest calibration of the same control spec on the same host.  It never
changes the verdict.

The host is what the control's launch receipt records of the machine the
control server ran on (hostname, CPU count, accelerators; not the kernel
version, which an update changes without changing the hardware): the
promotion job itself may run on another node.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from pairaudit.core.artifacts import sha256_json
from pairaudit.core.contracts import CALIBRATION_LOG_SCHEMA, CALIBRATION_SCHEMA, PATHS, Decision, audit_dir
from pairaudit.core.jsonlog import append_record, read_log
from pairaudit.core.readers import (
    CalibrationCitation,
    DecisionDoc,
    DivergenceDoc,
    GateEntry,
    LaunchReceipt,
    Record,
    SpeedDecisionDoc,
    as_record,
)
from pairaudit.gates import REGISTERED

SUFFIX = "-calibration"
LOG = PATHS[CALIBRATION_LOG_SCHEMA]

# The preflight gate is the decision's own (the API rehearsal), not a registered rule: identical arms pass it.
PREFLIGHT_EXPECTED = ("PASS",)


def expected(rule: str | None) -> tuple[str, ...]:
    """What rule ``rule`` should say when control and candidate are the same server: its registered
    ``on_identical_arms`` (``pairaudit.gates.REGISTERED``). An unknown rule, or one that registers no
    expectation, is an error: a calibration that cannot say what it expected cannot flag anything."""
    if rule == "preflight":
        return PREFLIGHT_EXPECTED
    spec = None if rule is None else REGISTERED.get(rule)
    if spec is None:
        raise ValueError(f"calibration: gate rule {rule!r} is not registered (registered: "
                         f"{', '.join(REGISTERED)}, and preflight)")
    return tuple(spec.need("on_identical_arms"))


# ------------------------------------------------------------------ config

def is_calibration(config: Mapping[str, Any]) -> bool:
    """This config is the A/A calibration of an audit (``calibration.of`` set)."""
    return bool((config.get("calibration") or {}).get("of"))


def log_path(config: Mapping[str, Any]) -> str:
    return (config.get("calibration") or {}).get("log", LOG)


def calibration_config(config: Mapping[str, Any]) -> dict:
    """The calibration module's config: ``<audit>-calibration``, candidate := a copy of the control."""
    if is_calibration(config):
        raise ValueError(f"audit {config.get('audit')!r} is already a calibration (calibration.of is set)")
    out = copy.deepcopy(dict(config))
    out["audit"] = f"{config['audit']}{SUFFIX}"
    # A sweep's calibration is the same one: its shared control against itself, once for every candidate.
    out["arms"] = {"control": copy.deepcopy(config["arms"]["control"]),
                   "candidate": copy.deepcopy(config["arms"]["control"])}
    # A/A has no change under audit: the change form's server + change (or a
    # sweep's candidates), from which the arms were derived at load, would
    # state one, so the calibration keeps only its two (identical) arms.
    out.pop("server", None)
    out.pop("change", None)
    out.pop("candidates", None)
    out["calibration"] = {**(config.get("calibration") or {}), "of": config["audit"]}
    return out


def check(config: Mapping[str, Any]) -> list[str]:
    """Load-time problems of the calibration keys (one message each, naming the key)."""
    audit, of = config.get("audit"), (config.get("calibration") or {}).get("of")
    if not of:
        if isinstance(audit, str) and audit.endswith(SUFFIX):
            return [f"audit: {audit!r} ends in {SUFFIX!r}, which names the calibration of audit "
                    f"{audit[:-len(SUFFIX)]!r} ({audit_dir(audit)}/); choose another name"]
        return []
    problems = []
    if audit != f"{of}{SUFFIX}":
        problems.append(f"calibration.of: {of!r} calibrates audit {of!r}, whose results go to "
                        f"{audit_dir(of + SUFFIX)}/, but audit is {audit!r}")
    arms = config.get("arms") or {}
    if arms.get("candidate") != arms.get("control"):
        problems.append("calibration.of is set: arms.candidate must equal arms.control (an A/A calibration "
                        "runs the control against itself)")
    return problems


# -------------------------------------------------------------------- host

def host_facts(control_receipt: LaunchReceipt | Mapping[str, Any]) -> dict:
    """The host a calibration is of: the control's launch receipt's machine facts (see module docstring).

    ``control_receipt``: the launch receipt, or decision.json's arm summary (which keeps its machine facts).
    """
    m = (control_receipt.machine if isinstance(control_receipt, LaunchReceipt) else control_receipt["machine"]) or {}
    return {"hostname": m.get("hostname"), "cpu_count": m.get("cpu_count"),
            "accelerators": list(m.get("accelerators") or [])}


def host_sha256(host: Mapping[str, Any]) -> str:
    return sha256_json(dict(host))


# ----------------------------------------------------------------- summary

def _pct(v: Any) -> str:
    return f"{v:.1f} %" if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def _max(values: Sequence[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(nums) if nums else None


def speed_summary(gate_entry: GateEntry | Mapping[str, Any] | None,
                  speed_doc: SpeedDecisionDoc | Mapping[str, Any] | None) -> dict | None:
    """The speed gate on A vs A with the host's noise: in-window control spread and archive spread per cell.

    ``gate_entry``: decision.json's speed gate; ``speed_doc``: speed/decision.json (its bar and spread).
    """
    gate = as_record(GateEntry, gate_entry, where="gate speed")
    if gate is None:
        return None
    speed = as_record(SpeedDecisionDoc, speed_doc, where="speed decision")
    cells = {}
    for cell, sp in ((speed.spread if speed is not None else None) or {}).items():
        cells[cell] = {"window_pct": sp.window_pct, "window_max_pct": sp.window_max_pct,
                       "archive_pct": sp.archive_pct, "archive_n": sp.archive_n,
                       "archive_with_window_pct": sp.archive_with_window_pct,
                       "archive_with_window_n": sp.archive_with_window_n}
    win_pct = speed.win_pct if speed is not None and speed.bar is not None else gate.win_pct
    return {"rule": gate.rule, "verdict": gate.verdict, "win_pct": win_pct, "pooled_gain_pct": gate.point_gain_pct,
            "max_window_pct": _max([c["window_max_pct"] for c in cells.values()]),
            "max_archive_pct": _max([c["archive_with_window_pct"] for c in cells.values()]),
            "cells": cells}


def _speed_finding(speed: Mapping[str, Any], reason: str) -> str:
    noise = (f"in-window control spread up to {_pct(speed['max_window_pct'])}, archive spread "
             f"{_pct(speed['max_archive_pct'])}, against the {speed['win_pct']} % bar")
    v = speed["verdict"]
    if v == "LOSS":
        return f"speed LOSS on identical arms: this host's noise is too large for the bar ({noise})"
    if v == "WIN":
        return f"speed WIN on identical arms: a false WIN, this host's noise is too large for the bar ({noise})"
    return f"speed {v} on identical arms ({noise}): {reason}"


def _finding(name: str, g: GateEntry, expected: Sequence[str], summary: Mapping[str, Any]) -> str:
    kind, _, ds = name.partition(":")
    v, reason = g.verdict, (g.reasons or ["(no reason recorded)"])[0]
    if kind == "speed" and summary["speed"]:
        return _speed_finding(summary["speed"], reason)
    if kind == "quality" and ds in summary["quality"] and v in ("HOLD", "FAIL"):
        q = summary["quality"][ds]
        return (f"{name} {v} on identical arms: control-only {q['control_only']}, candidate-only "
                f"{q['candidate_only']}, McNemar p {q['mcnemar_p']}: two starts of one server disagree")
    if kind == "grid_tie":
        div = {d: x["diverged"] for d, x in summary["greedy"].items() if x["diverged"]}
        return f"grid_tie {v} on identical arms: greedy divergences of the server against itself {div}: {reason}"
    if kind == "boundary":
        return f"boundary {v} on identical arms: the control itself: {reason}"
    return f"{name} {v} on identical arms (expected {'/'.join(expected)}): {reason}"


def summarize(decision: Decision, *, audit: str | None, of_audit: str | None,
              speed_doc: SpeedDecisionDoc | Mapping[str, Any] | None = None,
              divergence_docs: Mapping[str, DivergenceDoc | Mapping[str, Any]] | None = None) -> dict:
    """calibration.json (module docstring) from a calibration-mode decision and the stage artifacts it read.

    decision: ``decision.decide(..., calibration=True)`` with the gates' key
    numbers; speed_doc: ``speed/decision.json`` (its ``spread``);
    divergence_docs: dataset -> ``divergence/<dataset>.json`` (its
    ``divergences`` and ``items``).
    """
    doc = as_record(DecisionDoc, decision, where="decision")
    assert doc is not None
    if doc.calibration is not True or doc.identical_arms is not True:
        raise ValueError("a calibration summary needs a decision made in calibration mode on identical arms")
    ctrl = doc.arms["control"]
    host = host_facts(ctrl.raw)  # the decision's arm summary keeps the receipt's machine facts
    gates: dict[str, dict[str, Any]] = {}
    flagged: list[str] = []
    findings: list[str] = []
    for name, g in doc.gates.items():
        if g is None:
            gates[name] = {"rule": None, "verdict": None, "expected": None, "flagged": False,
                           "reason": "not evaluated: its stage produced no result"}
            continue
        want = expected(g.rule)
        gates[name] = {"rule": g.rule, "verdict": g.verdict, "expected": list(want),
                       "flagged": g.verdict not in want,
                       "reason": (g.reasons or ["(no reason recorded)"])[0]}
        if gates[name]["flagged"]:
            flagged.append(name)
    quality = {ds: {"n": t.n, "control_only": list(t.control_only), "candidate_only": list(t.candidate_only),
                    "discordant": len(t.control_only) + len(t.candidate_only),
                    "mcnemar_p": t.mcnemar_p, "exact_text_matches": t.exact_text_matches, "verdict": t.verdict}
               for ds, t in doc.datasets.items()}

    def gate(name: str) -> GateEntry | None:
        return doc.gates[name] if name in doc.gates else None

    greedy = {}
    for ds, given in (divergence_docs or {}).items():
        div = as_record(DivergenceDoc, given, where=f"divergence {ds}")
        assert div is not None
        det = gate(f"determinism:{ds}")
        greedy[ds] = {"selected": len(div.items or []),
                      "compared": sum(1 for d in div.divergences if d.diverged is not None),
                      "diverged": [d.index for d in div.divergences if d.diverged],
                      "determinism": None if det is None else det.verdict,
                      "nondeterministic_arms": None if det is None else det.nondeterministic_arms}
    b, grid_tie, servers = gate("boundary"), gate("grid_tie"), gate("servers")
    out: dict[str, Any] = {"schema": CALIBRATION_SCHEMA, "audit": audit, "of_audit": of_audit, "control_spec_sha256": ctrl.spec_sha256,
           "host": host, "host_sha256": host_sha256(host), "decision": doc.decision,
           "headline": "", "flagged": flagged, "not_evaluated": list(doc.not_evaluated),
           "findings": findings, "notes": [], "gates": gates,
           "speed": speed_summary(gate("speed"), speed_doc),
           "quality": quality, "greedy": greedy,
           "grid_tie": None if grid_tie is None else grid_tie.verdict,
           "boundary": None if b is None else {
               "verdict": b.verdict, "cases": b.candidate_cases,
               "candidate_failures": b.candidate_failures, "control_failures": b.control_failures,
               "identical_text_cases": b.identical_text_cases},
           "preflight": dict(doc.preflight),
           "servers": None if servers is None else servers.verdict}
    findings += [_finding(n, g, gates[n]["expected"], out) for n in flagged for g in [doc.gates[n]] if g is not None]
    sp = out["speed"]
    if sp and "speed" not in flagged and isinstance(sp["win_pct"], (int, float)):
        above = [x for x in (sp["max_window_pct"], sp["max_archive_pct"]) if x is not None and x > sp["win_pct"]]
        if above:
            out["notes"].append(f"speed {sp['verdict']} as expected, but the control's spread (in-window up to "
                                f"{_pct(sp['max_window_pct'])}, archive {_pct(sp['max_archive_pct'])}) is above "
                                f"the {sp['win_pct']} % bar")
    where = f"on {host['hostname'] or 'an unnamed host'}"
    if flagged:
        what = ", ".join(f"{n} {gates[n]['verdict']}" for n in flagged)
        out["headline"] = f"A/A {where}: {len(flagged)} gate(s) flagged identical arms: {what}"
    else:
        out["headline"] = f"A/A {where}: nothing flagged on identical arms"
    if out["not_evaluated"]:
        out["headline"] += f" ({len(out['not_evaluated'])} gate(s) not evaluated: {', '.join(out['not_evaluated'])})"
    return out


# --------------------------------------------------------------- the log

@dataclass(frozen=True, kw_only=True)
class CalibrationEntry(Record):
    """One line of results/calibrations.jsonl: a finished calibration, keyed by control spec and host.

    Read back (``cite``) through ``from_json``, which checks the schema id and every field.
    """
    SCHEMA = CALIBRATION_LOG_SCHEMA

    time: str | None
    audit: str | None
    of_audit: str | None
    control_spec_sha256: str | None
    host: dict
    host_sha256: str
    decision: str
    headline: str
    flagged: list
    summary_path: str
    summary_sha256: str
    decision_path: str
    decision_sha256: str
    schema: str = CALIBRATION_LOG_SCHEMA

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "raw"}


# decision.json's ``calibration_ref``: the reader's record is the one the decision writes
CalibrationRef = CalibrationCitation


def append(path: str | os.PathLike, entry: CalibrationEntry) -> None:
    append_record(path, entry.to_json())


def cite(records: Sequence[Mapping[str, Any]], control_spec_sha256: str | None,
         host_sha: str) -> CalibrationRef | None:
    """The latest calibration of this control spec on this host; None when there is none.

    Latest by its recorded time, a tie going to the later line (a log is
    appended in time order, but lines from two machines' clocks need not be).
    """
    if not control_spec_sha256:
        return None
    # the log is shared by every calibration: a line of another schema is not one of these, and is passed over
    entries = [CalibrationEntry.from_json(r, where=f"calibration log line {n + 1}") for n, r in enumerate(records)
               if r.get("schema") == CALIBRATION_LOG_SCHEMA]
    hits = [(e.time or "", n, e) for n, e in enumerate(entries)
            if e.control_spec_sha256 == control_spec_sha256 and e.host_sha256 == host_sha]
    if not hits:
        return None
    e = max(hits, key=lambda h: (h[0], h[1]))[2]
    return CalibrationRef(path=str(e.summary_path), sha256=str(e.summary_sha256), time=e.time, audit=e.audit,
                          headline=e.headline or "", flagged=list(e.flagged))


def lookup(path: str | os.PathLike | None,
           control: LaunchReceipt | Mapping[str, Any]) -> CalibrationRef | None:
    """``cite`` on the log at ``path`` for the control whose launch receipt is given."""
    if not path:
        return None
    control_receipt = as_record(LaunchReceipt, control, where="launch control")
    assert control_receipt is not None
    return cite(read_log(path), control_receipt.spec_sha256, host_sha256(host_facts(control_receipt)))


def calibrated_audit(config: Mapping[str, Any] | None) -> str | None:
    """The audit a calibration config calibrates (``calibration.of``); None outside a calibration."""
    return ((config or {}).get("calibration") or {}).get("of")
