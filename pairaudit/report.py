"""Promotion stage (DESIGN stage 9): one decision, the report people read, a manifest.

Everything here except :func:`plot_paired` and :func:`promotion_stage` is a
pure function on plain JSON-able dicts. The decision itself is
``rules.promotion_v1`` over a fixed set of gates; this module only collects
the gates, keeps the evidence beside them and writes it down. It never
adjusts a score: the paired tables are shown as the paired stage made them.

Gates (``gates_from`` + ``preflight_gates``), in this order::

    quality:<dataset>      rules.quality_v1 (stored in paired/<dataset>.json)
    grid_tie:<dataset>     rules.grid_tie_v1     (divergence stage)
    determinism:<dataset>  rules.determinism_v1  (divergence stage; or one
                           gate "determinism" when a single result is given)
    boundary               rules.boundary_v1     (boundary_gate stage)
    speed                  rules.win2_v1         (speed_decision stage)
    preflight:<arm>        the preflight stage's PASS/FAIL, see below

A gate whose stage is not built or did not run is present with value None:
promotion-v1 lists it under ``not_evaluated`` and counts it INCONCLUSIVE, so
the decision can never be PROMOTE on partial evidence.

Preflight policy (our reading; promotion-v1's precedence is kept). A FAILed
preflight means the arm's API did not behave as the audit assumes, so its
evidence cannot be compared: it enters as an INCONCLUSIVE gate
(``{"rule": "preflight", "verdict": "INCONCLUSIVE", "stage_verdict": "FAIL"}``).
Under promotion-v1's precedence REJECT > HOLD > INCONCLUSIVE > PROMOTE, a
REJECT or HOLD found by an evaluated gate still stands: a broken rehearsal
cannot lift a measured failure (the direction is conservative either way,
since none of these outcomes ships the change). Otherwise the decision is
INCONCLUSIVE. A missing preflight document is a None gate, like any other.

decision.json (``decide``; ``promotion_stage`` adds ``provenance``)::

    {"schema": "pairaudit.decision/v1", "rule": "promotion-v1",
     "decision": "PROMOTE" | "HOLD" | "REJECT" | "INCONCLUSIVE",
     "reasons": [str, ...],          # promotion-v1: one line per gate, in gate order
     "deciding_gates": [str, ...],   # the gates whose outcome is the decision
     "gates": {name: None | {"rule", "verdict", "outcome", "reasons": [every reason],
                             "deviations": {...}, ...key numbers of that rule}},
     "not_evaluated": [str, ...],
     "datasets": {name: {"format", "n", "indices", "control_correct", "candidate_correct",
                         "control_only": [int], "candidate_only": [int], "net", "mcnemar_p",
                         "exact_text_matches", "natural_finish": {arm: int},
                         "bodies_identical", "verdict", "bootstrap": {...} | None}},
     "arms": {arm: {"mode", "spec_sha256", "env", "command", "model", "served_model_name",
                    "model_sha256", "max_model_len", "url", "packages", "machine",
                    "preflight": "PASS" | "FAIL" | None}},
     "switch_diff": [{"name", "control", "candidate"}],   # None = not set by that arm
     "notes": [str, ...],            # comparability facts that do not decide (e.g. model differs)
     "preflight": {arm: "PASS" | "FAIL" | None}}

manifest.json (``manifest``)::

    {"schema": "pairaudit.manifest/v1", "artifacts": [{"path", "sha256", "bytes"}, ...]}  # sorted by path

Later-stage artifacts read by ``promotion_stage(later=...)``. Those stages
are not built yet; this is the contract proposed here (one place to change:
``LATER_SCHEMAS``)::

    later = {"divergence": [path, ...], "boundary": path, "speed": path}   # any key may be absent
    divergence: {"schema": "pairaudit.divergence/v1", "dataset": str,
                 "grid_tie": <grid_tie_v1>, "determinism": <determinism_v1> | None, ...}
    boundary:   {"schema": "pairaudit.boundary_gate/v1", "gate": <boundary_v1>, ...}
    speed:      {"schema": "pairaudit.speed_decision/v1", "gate": <win2_v1>, ...}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import rules
from .artifacts import (
    ArtifactError,
    _atomic_write,
    check_schema,
    provenance,
    read_json,
    sha256_file,
    write_json,
)

DECISION_SCHEMA = "pairaudit.decision/v1"
MANIFEST_SCHEMA = "pairaudit.manifest/v1"
PAIRED_SCHEMA = "pairaudit.paired/v1"
LAUNCH_SCHEMA = "pairaudit.launch/v1"
PREFLIGHT_SCHEMA = "pairaudit.preflight/v1"
LATER_SCHEMAS = {
    "divergence": "pairaudit.divergence/v1",
    "boundary": "pairaudit.boundary_gate/v1",
    "speed": "pairaudit.speed_decision/v1",
}
ARMS = ("control", "candidate")

# Which registered rule each later gate must carry: a win2 result handed in
# as "boundary" would otherwise be judged by the wrong vocabulary.
_EXPECTED_RULE = {
    "quality": "quality-v1",
    "grid_tie": "grid-tie-v1",
    "determinism": "determinism-v1",
    "boundary": "boundary-v1",
    "speed": "win2-v1",
}

NOT_ADJUSTED = (
    "Nothing is adjusted. Scores are the scorer's strict verdicts: a strict-extractor miss stays a "
    "miss, no diagnostic or rerun replaces a primary answer or score, and a net difference whose "
    "McNemar p is above alpha is an unresolved difference, not evidence of equivalence. The "
    "measured differences are kept visible above."
)


# ------------------------------------------------------------------ gates

def _check_rule(kind: str, name: str, res: Mapping[str, Any] | None) -> None:
    if res is None:
        return
    if not isinstance(res, Mapping):
        raise ValueError(f"gate {name}: expected a rule result dict, got {type(res).__name__}")
    want = _EXPECTED_RULE[kind]
    if res.get("rule") != want:
        raise ValueError(f"gate {name}: expected a {want} result, got rule {res.get('rule')!r}")


def check_quality(name: str, doc: Mapping[str, Any]) -> dict:
    """The stored quality-v1 result of one paired doc, checked against its own table.

    The verdict is recomputed from the table with the parameters the paired
    stage recorded: a hand-edited verdict, or a table edited after the rule
    ran, is an error rather than a quiet PASS.
    """
    if doc.get("dataset") not in (None, name):
        raise ValueError(f"paired doc keyed {name!r} is for dataset {doc.get('dataset')!r}")
    q, table = doc.get("quality"), doc.get("table")
    if not isinstance(q, Mapping) or not isinstance(table, Mapping):
        raise ValueError(f"paired {name}: needs both 'table' and 'quality'")
    _check_rule("quality", f"quality:{name}", q)
    again = rules.quality_v1(table, **(q.get("params") or {}))
    for key in ("verdict", "control_only", "candidate_only"):
        if q.get(key) != again[key]:
            raise ValueError(f"paired {name}: stored quality {key} {q.get(key)!r} disagrees with "
                             f"quality-v1 recomputed from its table ({again[key]!r})")
    return dict(q)


def _per_dataset(kind: str, given: Any, datasets: Sequence[str]) -> dict[str, Any]:
    """``kind:<dataset>`` gates from a mapping dataset -> result; absent -> None."""
    given = given or {}
    extra = sorted(set(given) - set(datasets))
    if extra:
        # Evidence for a dataset that has no paired result cannot be placed.
        raise ValueError(f"{kind} results for datasets without a paired result: {extra}")
    out = {}
    for ds in datasets:
        res = given.get(ds)
        _check_rule(kind, f"{kind}:{ds}", res)
        out[f"{kind}:{ds}"] = res
    return out


def gates_from(paired: Mapping[str, Mapping[str, Any]], *, divergence: Mapping[str, Any] | None = None,
               determinism: Any = None, boundary: Mapping[str, Any] | None = None,
               speed: Mapping[str, Any] | None = None) -> dict[str, dict | None]:
    """Every evidence gate, in a fixed order, None where not evaluated.

    paired: dataset -> paired doc (its stored quality-v1 is checked, see
    check_quality). divergence: dataset -> grid_tie_v1 result. determinism:
    None, one determinism_v1 result (gate ``determinism``) or dataset ->
    result (gates ``determinism:<dataset>``; the divergence stage repeats a
    greedy request per dataset). boundary: boundary_v1. speed: win2_v1.
    """
    datasets = sorted(paired)
    gates: dict[str, dict | None] = {f"quality:{ds}": check_quality(ds, paired[ds]) for ds in datasets}
    gates.update(_per_dataset("grid_tie", divergence, datasets))
    if isinstance(determinism, Mapping) and "rule" not in determinism:
        gates.update(_per_dataset("determinism", determinism, datasets))
    else:
        _check_rule("determinism", "determinism", determinism)
        gates["determinism"] = determinism
    _check_rule("boundary", "boundary", boundary)
    _check_rule("speed", "speed", speed)
    gates["boundary"] = boundary
    gates["speed"] = speed
    return gates


def preflight_gates(preflight: Mapping[str, Mapping[str, Any] | None]) -> dict[str, dict | None]:
    """``preflight:<arm>`` gates; FAIL enters as INCONCLUSIVE (see module docstring)."""
    out: dict[str, dict | None] = {}
    for arm in ARMS:
        doc = preflight.get(arm)
        if doc is None:
            out[f"preflight:{arm}"] = None
            continue
        v = doc.get("verdict")
        if v == "PASS":
            verdict, reasons = "PASS", [f"all {len(doc.get('probes') or [])} probes passed"]
        else:
            # Anything but an explicit PASS (FAIL, missing, garbled) is not comparable evidence.
            failed = doc.get("failed_probe")
            why = next((p.get("reason") for p in doc.get("probes") or []
                        if p.get("name") == failed), None)
            verdict = "INCONCLUSIVE"
            reasons = [f"{arm} preflight {v} at probe {failed!r}" + (f": {why}" if why else "")
                       + "; its evidence cannot be compared"]
        out[f"preflight:{arm}"] = {"rule": "preflight", "verdict": verdict, "stage_verdict": v,
                                   "failed_probe": doc.get("failed_probe"), "reasons": reasons}
    return out


def _key_numbers(res: Mapping[str, Any]) -> dict:
    """The few numbers a reader needs beside a gate verdict, per rule."""
    rule = res.get("rule")
    if rule == "quality-v1":
        keys = ("n", "control_correct", "candidate_correct", "control_only", "candidate_only",
                "net", "mcnemar_p", "params")
        return {k: res.get(k) for k in keys}
    if rule == "grid-tie-v1":
        return {"n_divergent": res.get("n_divergent"), "failed_clauses": res.get("failed_clauses"),
                "unevaluated_clauses": res.get("unevaluated_clauses"),
                "probe_verdicts": {str(p.get("index")): p.get("verdict") for p in res.get("probes") or []}}
    if rule == "determinism-v1":
        return {"nondeterministic_arms": res.get("nondeterministic_arms"),
                "repeats": {a: v.get("repeats") for a, v in (res.get("arms") or {}).items()}}
    if rule == "boundary-v1":
        return {"candidate_cases": res.get("candidate_cases"),
                "candidate_failures": [f.get("case") for f in res.get("candidate_failures") or []],
                "control_failures": [f.get("case") for f in res.get("control_failures") or []],
                "identical_text_cases": res.get("identical_text_cases")}
    if rule == "win2-v1":
        prim = res.get("primary") or {}
        return {"primary": (res.get("params") or {}).get("primary"), "repeats": res.get("repeats"),
                "point_gain_pct": prim.get("point_gain_pct"), "t_interval": prim.get("t_interval"),
                "win_pct": prim.get("win_pct"), "max_control_spread_pct": prim.get("max_control_spread_pct"),
                "guard_verdicts": {g: r.get("guard_verdict") for g, r in (res.get("guards") or {}).items()}}
    if rule == "preflight":
        return {"stage_verdict": res.get("stage_verdict"), "failed_probe": res.get("failed_probe")}
    return {}


# --------------------------------------------------------------- decision

def env_diff(control_env: Mapping[str, Any], candidate_env: Mapping[str, Any]) -> list[dict]:
    """Switches whose value differs between arms; None = that arm does not set it (server default)."""
    names = sorted(set(control_env) | set(candidate_env))
    return [{"name": k, "control": control_env.get(k), "candidate": candidate_env.get(k)}
            for k in names if control_env.get(k) != candidate_env.get(k)]


def _arm_summary(rec: Mapping[str, Any], pre: Mapping[str, Any] | None) -> dict:
    keys = ("mode", "spec_sha256", "env", "command", "command_identity", "model", "served_model_name",
            "model_sha256", "max_model_len", "url", "speculative", "packages", "machine")
    out = {k: rec.get(k) for k in keys}
    out["preflight"] = None if pre is None else pre.get("verdict")
    return out


def _comparability_notes(arms: Mapping[str, dict]) -> list[str]:
    """Facts about the two arms that a reader must see; they do not decide (no registered rule)."""
    c, k = arms["control"], arms["candidate"]
    notes = []
    for key, what in (("model", "model"), ("model_sha256", "model sha256"),
                      ("max_model_len", "max_model_len")):
        if c.get(key) != k.get(key):
            notes.append(f"{what} differs between arms: control {c.get(key)!r}, candidate {k.get(key)!r}")
    if c.get("spec_sha256") and c.get("spec_sha256") == k.get("spec_sha256"):
        notes.append("control and candidate have the same spec_sha256: the arms are the same server spec, "
                     "so this audit compares a configuration with itself")
    if (c.get("machine") or {}).get("hostname") != (k.get("machine") or {}).get("hostname"):
        notes.append("the arms' launch receipts come from different hosts")
    return notes


def _dataset_summary(doc: Mapping[str, Any]) -> dict:
    t, q = doc["table"], doc["quality"]
    return {"format": doc.get("format"), "n": t.get("n"), "indices": t.get("indices"),
            "control_correct": t.get("control_correct"), "candidate_correct": t.get("candidate_correct"),
            "control_only": t.get("control_only"), "candidate_only": t.get("candidate_only"),
            "net": t.get("net"), "mcnemar_p": q.get("mcnemar_p"),
            "exact_text_matches": t.get("exact_text_matches"), "natural_finish": t.get("natural_finish"),
            "bodies_identical": t.get("bodies_identical"), "verdict": q.get("verdict"),
            "bootstrap": doc.get("bootstrap")}


def decide(paired: Mapping[str, Mapping[str, Any]], launch: Mapping[str, Mapping[str, Any]],
           preflight: Mapping[str, Mapping[str, Any] | None], **later: Any) -> dict:
    """decision.json (schema in the module docstring) by promotion-v1.

    paired: dataset -> paired doc; launch: arm -> launch record (both arms
    required: evidence without a receipt has no server to attribute it to);
    preflight: arm -> preflight doc (a missing arm is a None gate);
    later: divergence=, determinism=, boundary=, speed= as for gates_from.
    """
    unknown = set(later) - {"divergence", "determinism", "boundary", "speed"}
    if unknown:
        raise TypeError(f"decide() got unknown later gates {sorted(unknown)}")
    missing = [a for a in ARMS if a not in launch]
    if missing or set(launch) - set(ARMS):
        raise ValueError(f"launch receipts must be exactly {list(ARMS)}, got {sorted(launch)}")
    gates = gates_from(paired, **later)
    gates.update(preflight_gates(preflight))
    prom = rules.promotion_v1(gates)

    gate_docs: dict[str, dict | None] = {}
    for name, res in gates.items():
        if res is None:
            gate_docs[name] = None
            continue
        gate_docs[name] = {"rule": res.get("rule"), "verdict": res.get("verdict"),
                           "outcome": prom["gates"][name]["outcome"],
                           "reasons": list(res.get("reasons") or []),
                           "deviations": res.get("deviations") or {}, **_key_numbers(res)}
    arms = {a: _arm_summary(launch[a], preflight.get(a)) for a in ARMS}
    return {
        "schema": DECISION_SCHEMA,
        "rule": prom["rule"],
        "decision": prom["verdict"],
        "reasons": prom["reasons"],
        "deciding_gates": [g for g, v in prom["gates"].items() if v["outcome"] == prom["verdict"]],
        "gates": gate_docs,
        "not_evaluated": prom["not_evaluated"],
        "datasets": {ds: _dataset_summary(paired[ds]) for ds in sorted(paired)},
        "arms": arms,
        "switch_diff": env_diff(arms["control"].get("env") or {}, arms["candidate"].get("env") or {}),
        "notes": _comparability_notes(arms),
        "preflight": {a: arms[a]["preflight"] for a in ARMS},
    }


# --------------------------------------------------------------- markdown

def _cell(v: Any) -> str:
    """One Markdown table cell: pipes and newlines would break the row."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def _code(v: Any) -> str:
    return "`" + _cell(v).replace("`", "'") + "`"


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _idx(xs: Sequence[int] | None) -> str:
    xs = list(xs or [])
    if not xs:
        return "none"
    return ("index " if len(xs) == 1 else "indices ") + ", ".join(str(x) for x in xs)


def _p(p: Any) -> str:
    return "n/a" if p is None else f"{p:.4g}"


def _cmd(c: Any) -> str:
    if isinstance(c, (list, tuple)):
        return " ".join(str(x) for x in c)
    return "(attach)" if c is None else str(c)


def _arms_section(decision: Mapping[str, Any]) -> list[str]:
    arms = decision["arms"]
    c, k = arms["control"], arms["candidate"]
    out = ["## Arms", "", _row(["", "control (OFF)", "candidate (ON)"]), _row(["---"] * 3)]
    for label, key in (("mode", "mode"), ("model", "model"), ("served model name", "served_model_name"),
                       ("model sha256", "model_sha256"), ("max_model_len", "max_model_len"),
                       ("speculative", "speculative"), ("spec sha256", "spec_sha256"),
                       ("preflight", "preflight")):
        out.append(_row([label, _cell(c.get(key)), _cell(k.get(key))]))
    out.append(_row(["command", _code(_cmd(c.get("command")) if c.get("mode") != "attach" else c.get("url")),
                     _code(_cmd(k.get("command")) if k.get("mode") != "attach" else k.get("url"))]))
    out += ["", "### Environment switches that differ", ""]
    diff = decision.get("switch_diff") or []
    if not diff:
        out.append("None: both arms set the same environment switches.")
    else:
        out += [_row(["Switch", "control", "candidate"]), _row(["---"] * 3)]
        unset = "(unset: server default)"
        for d in diff:
            out.append(_row([_code(d["name"]),
                             unset if d["control"] is None else _code(d["control"]),
                             unset if d["candidate"] is None else _code(d["candidate"])]))
    same = sorted(set(c.get("env") or {}) & set(k.get("env") or {}) - {d["name"] for d in diff})
    if same:
        out += ["", "Set identically in both arms: " + ", ".join(f"{_code(s)}={_code(c['env'][s])}" for s in same)]
    for note in decision.get("notes") or []:
        out += ["", f"**Note:** {note}"]
    return out


def _preflight_section(preflight: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    out = ["## Preflight", "", _row(["Arm", "verdict", "failed probe", "probes passed", "reason"]),
           _row(["---"] * 5)]
    for arm in ARMS:
        doc = preflight.get(arm)
        if doc is None:
            out.append(_row([arm, "not run", "", "", ""]))
            continue
        probes = doc.get("probes") or []
        failed = doc.get("failed_probe")
        why = next((p.get("reason") for p in probes if p.get("name") == failed), "") if failed else ""
        out.append(_row([arm, doc.get("verdict"), _cell(failed or ""),
                         f"{sum(bool(p.get('pass')) for p in probes)}/{len(probes)}", _cell(why or "")]))
    return out


def _paired_section(paired: Mapping[str, Mapping[str, Any]]) -> list[str]:
    head = ["Dataset", "control", "candidate", "control-only correct", "candidate-only correct",
            "exact text matches", "natural finish (control, candidate)", "McNemar p", "quality-v1"]
    out = ["## Paired results", "", _row(head), _row(["---"] * len(head))]
    tot = {"n": 0, "c": 0, "k": 0, "co": 0, "ko": 0, "x": 0, "fc": 0, "fk": 0}
    for ds in sorted(paired):
        t, q = paired[ds]["table"], paired[ds]["quality"]
        n = t["n"]
        nf = t.get("natural_finish") or {}
        out.append(_row([_cell(ds), f"{t['control_correct']}/{n}", f"{t['candidate_correct']}/{n}",
                         _idx(t["control_only"]), _idx(t["candidate_only"]),
                         f"{t.get('exact_text_matches')}/{n}",
                         f"{nf.get('control')}/{n}, {nf.get('candidate')}/{n}",
                         _p(q.get("mcnemar_p")), q.get("verdict")]))
        for key, v in (("n", n), ("c", t["control_correct"]), ("k", t["candidate_correct"]),
                       ("co", len(t["control_only"])), ("ko", len(t["candidate_only"])),
                       ("x", t.get("exact_text_matches") or 0), ("fc", nf.get("control") or 0),
                       ("fk", nf.get("candidate") or 0)):
            tot[key] += v
    if len(paired) > 1:
        # Counts only: a pooled McNemar p over datasets is not a registered rule.
        out.append(_row(["**Total**", f"{tot['c']}/{tot['n']}", f"{tot['k']}/{tot['n']}", tot["co"], tot["ko"],
                         f"{tot['x']}/{tot['n']}", f"{tot['fc']}/{tot['n']}, {tot['fk']}/{tot['n']}", "", ""]))
    out.append("")
    bad = [ds for ds in sorted(paired) if not paired[ds]["table"].get("bodies_identical")]
    out.append("All paired request bodies match." if not bad else
               "Request bodies differ between arms for: " + ", ".join(bad) + " (quality-v1 INVALID there).")
    out.append("")
    for ds in sorted(paired):
        b = paired[ds].get("bootstrap")
        if b:
            out.append(f"- {ds}: paired bootstrap of accuracy(candidate) - accuracy(control) = {b['diff']:+.4f}, "
                       f"{int(b['level'] * 100)} % interval [{b['lo']:+.4f}, {b['hi']:+.4f}] "
                       f"(n_boot {b['n_boot']}, seed {b['seed']}); reported only, it does not decide.")
    return out


def _indices_section(paired: Mapping[str, Mapping[str, Any]]) -> list[str]:
    out = ["## Item indices", ""]
    for ds in sorted(paired):
        t = paired[ds]["table"]
        out.append(f"### {ds} ({paired[ds].get('format')}, n={t['n']})")
        out.append("")
        out.append(f"- items: {', '.join(map(str, t.get('indices') or [])) or 'none'}")
        out.append(f"- control-only correct: {_idx(t['control_only'])}")
        out.append(f"- candidate-only correct: {_idx(t['candidate_only'])}")
        out.append(f"- exact text matches: {_idx(t.get('exact_text_match_indices'))}")
        out.append(f"- request body mismatches: {_idx(t.get('body_mismatch_indices'))}")
        for key, what in (("unnatural_finish_indices", "did not finish naturally"),
                          ("unanswered_indices", "unanswered"), ("error_indices", "transport/HTTP error")):
            per = t.get(key) or {}
            for arm in ARMS:
                if per.get(arm):
                    out.append(f"- {arm} {what}: {_idx(per[arm])}")
        out.append("")
    return out


def _gates_section(decision: Mapping[str, Any]) -> list[str]:
    out = ["## Gates (promotion-v1)", "", _row(["Gate", "rule", "verdict", "outcome"]), _row(["---"] * 4)]
    for name, g in decision["gates"].items():
        out.append(_row([name, "—", "not evaluated", "INCONCLUSIVE"]) if g is None else
                   _row([name, g["rule"], g["verdict"] + (f" (stage {g['stage_verdict']})"
                                                          if g.get("stage_verdict") not in (None, g["verdict"]) else ""),
                         g["outcome"]]))
    for name, g in decision["gates"].items():
        if g is None:
            continue
        out += ["", f"**{name}** ({g['rule']} {g['verdict']}):"]
        out += [f"- {_cell(r)}" for r in g["reasons"]] or ["- (no reasons recorded)"]
        for k, d in (g.get("deviations") or {}).items():
            out.append(f"- deviation: {k} = {d.get('used')!r} (registered {d.get('registered')!r})")
    out += ["", "### Not evaluated", ""]
    ne = decision.get("not_evaluated") or []
    out += [f"- {n}" for n in ne] if ne else ["Every gate was evaluated."]
    if ne:
        out += ["", "A gate that was not evaluated counts as incomplete evidence: the decision cannot be PROMOTE."]
    return out


def render_markdown(decision: Mapping[str, Any], paired: Mapping[str, Mapping[str, Any]],
                    launch: Mapping[str, Mapping[str, Any]],
                    preflight: Mapping[str, Mapping[str, Any] | None]) -> str:
    """The report people read: decision and every reason first, then the evidence.

    ``launch`` is accepted for symmetry with decide(); the arms section reads
    the summary decide() already took from it, so the report and
    decision.json cannot disagree about an arm.
    """
    del launch  # see docstring
    deciding = decision.get("deciding_gates") or []
    # Gates that also fall short of PROMOTE but are outranked by the decision:
    # a reader must see them too (fixing the deciding gate does not clear them).
    others = [f"{n} ({'not evaluated' if g is None else g['outcome']})" for n, g in decision["gates"].items()
              if n not in deciding and (g is None or g["outcome"] != "PROMOTE")]
    out = [f"# pairaudit decision: {decision['decision']}", "",
           f"Rule {decision['rule']} (PROMOTE only if every gate passes; precedence REJECT > HOLD > "
           f"INCONCLUSIVE > PROMOTE). Deciding gates: {', '.join(deciding) or 'none'}."]
    if others:
        out += ["", "Also short of PROMOTE: " + ", ".join(others) + "."]
    out += ["", "## Reasons", ""]
    out += [f"- {_cell(r)}" for r in decision["reasons"]]
    out.append("")
    out += _arms_section(decision) + [""]
    out += _preflight_section(preflight) + [""]
    out += _paired_section(paired) + [""]
    out += _indices_section(paired)
    out += _gates_section(decision) + [""]
    out += ["## What is not adjusted", "", NOT_ADJUSTED, ""]
    prov = decision.get("provenance")
    if prov:
        out += ["## Inputs", "", _row(["path", "sha256"]), _row(["---"] * 2)]
        out += [_row([_code(p), _code(h)]) for p, h in sorted((prov.get("consumed") or {}).items())]
        out += ["", f"Code version {_code(prov.get('code_version'))}, created {prov.get('created_at')}.", ""]
    return "\n".join(out)


# ----------------------------------------------------------- manifest, plot

def manifest(paths: Sequence[str | os.PathLike]) -> dict:
    """sha256 and size of every artifact, sorted by path (duplicates listed once)."""
    arts = [{"path": p, "sha256": sha256_file(p), "bytes": os.path.getsize(p)}
            for p in sorted({str(p) for p in paths})]
    return {"schema": MANIFEST_SCHEMA, "artifacts": arts}


OUTCOME_COLORS = {"both correct": "#4c9a5b", "control only": "#d9822b",
                  "candidate only": "#3b75af", "neither": "#b0b0b0"}


def paired_counts(table: Mapping[str, Any]) -> dict[str, int]:
    """The four paired outcomes of one table; they sum to n."""
    return {"both correct": table["both_correct"], "control only": len(table["control_only"]),
            "candidate only": len(table["candidate_only"]), "neither": table["neither_correct"]}


def plot_paired(paired: Mapping[str, Mapping[str, Any]], out_png: str | os.PathLike) -> None:
    """Stacked bars of paired outcomes per dataset, written as PNG.

    Uses a bare Figure on the Agg canvas instead of pyplot, so no global
    backend or figure state is touched (Snakemake jobs and tests share a process).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = sorted(paired)
    fig = Figure(figsize=(max(4.0, 1.6 * len(names) + 2.0), 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bottoms = [0] * len(names)
    counts = [paired_counts(paired[ds]["table"]) for ds in names]
    for outcome, color in OUTCOME_COLORS.items():
        vals = [c[outcome] for c in counts]
        bars = ax.bar(range(len(names)), vals, bottom=bottoms, color=color, label=outcome)
        for b, v, y0 in zip(bars, vals, bottoms):
            if v:
                ax.text(b.get_x() + b.get_width() / 2, y0 + v / 2, str(v), ha="center", va="center", fontsize=8)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{ds}\n({paired[ds]['quality'].get('verdict')})" for ds in names])
    ax.set_ylabel("items")
    ax.set_title("Paired outcomes per dataset (control vs candidate)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")


# ------------------------------------------------------------------ stage

def _load_keyed(paths: Sequence[str | os.PathLike], schema: str, key: str) -> dict[str, dict]:
    """Read artifacts, check their schema, key them by a field; a duplicate key is an error."""
    out: dict[str, dict] = {}
    for p in paths:
        doc = check_schema(read_json(p), schema, p)
        k = doc.get(key)
        if not isinstance(k, str) or not k:
            raise ArtifactError(f"{p}: no {key!r}")
        if k in out:
            raise ArtifactError(f"{p}: a second artifact for {key} {k!r}")
        out[k] = doc
    return out


def _load_later(later: Mapping[str, Any] | None) -> tuple[dict, list[str]]:
    """Later-stage artifacts -> decide() keywords, plus the paths read."""
    later = dict(later or {})
    unknown = set(later) - set(LATER_SCHEMAS)
    if unknown:
        raise ValueError(f"unknown later stages {sorted(unknown)} (known: {sorted(LATER_SCHEMAS)})")
    kw: dict[str, Any] = {}
    paths: list[str] = []
    if later.get("divergence"):
        docs = _load_keyed(later["divergence"], LATER_SCHEMAS["divergence"], "dataset")
        kw["divergence"] = {ds: d.get("grid_tie") for ds, d in docs.items()}
        # Determinism is evaluated per dataset inside the divergence stage.
        kw["determinism"] = {ds: d.get("determinism") for ds, d in docs.items()}
        paths += [str(p) for p in later["divergence"]]
    for stage in ("boundary", "speed"):
        if later.get(stage):
            p = later[stage]
            kw[stage] = check_schema(read_json(p), LATER_SCHEMAS[stage], p).get("gate")
            paths.append(str(p))
    return kw, paths


def promotion_stage(paired_paths: Sequence[str | os.PathLike], launch_paths: Sequence[str | os.PathLike],
                    preflight_paths: Sequence[str | os.PathLike], out_decision: str | os.PathLike,
                    out_report: str | os.PathLike, out_manifest: str | os.PathLike,
                    out_plot: str | os.PathLike, *, later: Mapping[str, Any] | None = None) -> None:
    """Read every input, decide, and write decision.json, the report, the plot and the manifest.

    The manifest is written last and lists every input plus the three other
    outputs (it cannot hash itself).
    """
    paired = _load_keyed(paired_paths, PAIRED_SCHEMA, "dataset")
    launch = _load_keyed(launch_paths, LAUNCH_SCHEMA, "arm")
    preflight = _load_keyed(preflight_paths, PREFLIGHT_SCHEMA, "arm")
    later_kw, later_paths = _load_later(later)
    inputs = [str(p) for p in (*paired_paths, *launch_paths, *preflight_paths)] + later_paths

    decision = decide(paired, launch, preflight, **later_kw)
    decision["provenance"] = provenance(inputs, params={"rule": "promotion-v1",
                                                        "datasets": sorted(paired), "arms": list(ARMS)})
    plot_paired(paired, out_plot)
    write_json(out_decision, decision)
    _atomic_write(Path(out_report), render_markdown(decision, paired, launch, preflight))
    write_json(out_manifest, manifest([*inputs, str(out_decision), str(out_report), str(out_plot)]))
