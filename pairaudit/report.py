"""Promotion stage: one decision, the report people read, a manifest.

Everything here except :func:`plot_paired` and :func:`promotion_stage` is a
pure function on plain JSON-able dicts. The decision itself is
``rules.promotion_v1`` over a fixed set of gates; this module only collects
the gates, keeps the evidence beside them and writes it down. It never
adjusts a score: the paired tables are shown as the paired stage made them.

Gates (``gates_from`` + ``preflight_gates``), in this order::

    quality:<dataset>      rules.quality_v1 (stored in paired/<dataset>.json)
    grid_tie               rules.grid_tie_audit over every dataset's grid_tie_v1
                           record (divergence stage): one gate, because the
                           registered cap counts divergent prompts over the audit
    determinism:<dataset>  rules.determinism_v1  (divergence stage; or one
                           gate "determinism" when a single result is given)
    boundary               rules.boundary_v1     (boundary_gate stage; a PASS
                           without the max_model_len - 16 case counts INCONCLUSIVE)
    speed                  rules.win2_v1         (speed_decision stage)
    preflight:<arm>        the preflight stage's PASS/FAIL, see below

A gate whose stage is not built or did not run is present with value None:
promotion-v1 lists it under ``not_evaluated`` and counts it INCONCLUSIVE, so
the decision can never be PROMOTE on partial evidence.

Identical arms (the same launch ``spec_sha256``) are INCONCLUSIVE, "no change
under audit", whatever the gates say, unless the decision is made in
calibration mode (``decide(..., calibration=True)``: an A/A run whose gate
verdicts are the host's false-alarm evidence).

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
                                     # (identical arms: "no change under audit: ..." first)
     "deciding_gates": [str, ...],   # the gates whose outcome is the decision; ["arms"] for identical arms
     "gate_verdict": str,            # what the gates alone give (differs only for identical arms)
     "identical_arms": bool,         # control and candidate have the same spec_sha256
     "calibration": bool,            # decided in A/A calibration mode
     "deviations": [{"gate", "what", "detail"}],   # every loosening (decision_deviations): gates not
                                     # evaluated, non-registered parameters, informational gates,
                                     # gates applied to part of their evidence, calibration
     "gates": {name: None | {"rule", "verdict", "outcome", "reasons": [every reason],
                             "deviations": {...}, ...key numbers of that rule}},
     "not_evaluated": [str, ...],
     "datasets": {name: {"format", "n", "indices", "control_correct", "candidate_correct",
                         "control_only": [int], "candidate_only": [int], "net", "mcnemar_p",
                         "exact_text_matches", "natural_finish": {arm: int},
                         "bodies_identical", "verdict",
                         "mde": stats.minimum_detectable_loss | None,   # smallest detectable net loss
                         "bootstrap": {...} | None}},
     "arms": {arm: {"mode", "spec_sha256", "env", "command", "model", "served_model_name",
                    "model_sha256", "max_model_len", "url", "packages", "machine",
                    "preflight": "PASS" | "FAIL" | None}},
     "switch_diff": [{"name", "control", "candidate"}],   # None = not set by that arm
     "notes": [str, ...],            # comparability facts that do not decide (e.g. model differs)
     "preflight": {arm: "PASS" | "FAIL" | None},
     "calibration_ref": None | {"path", "sha256", "time", "audit", "headline", "flagged"},
                                     # added by promotion_stage: the latest A/A calibration of the same
                                     # control spec on the same host (pairaudit/calibration.py); it never
                                     # changes the decision, and None is stated in the report
     "evidence": {                   # added by promotion_stage from the later stages' artifacts
       "boundary_cases": None | [{"case", "planted", "expected", "identical_text",
                                  arm: None | {"text", "extracted", "correct", "finish_reason", "prompt_tokens",
                                               "max_tokens", "ttft_s", "input_tokens_per_s", "config_error"}}],
       "speed": None | {"primary", "win_pct", "hosts", "cells": {cell: {"verdict", "repeats_s1_s2_s3",
                                                                        "point_gain_pct", "t_interval",
                                                                        "max_control_spread_pct"}}}}}

manifest.json (``manifest``)::

    {"schema": "pairaudit.manifest/v1", "artifacts": [{"path", "sha256", "bytes"}, ...]}  # sorted by path

Later-stage artifacts read by ``promotion_stage(later=...)`` (one place to
change: ``LATER_SCHEMAS``; the speed decision's other fields are documented
in ``pairaudit/speed.py``, and the figures read ``series``, ``bar``,
``win2``, ``spread`` and ``archive.path`` from it)::

    later = {"divergence": [path, ...], "boundary": path, "speed": path}   # any key may be absent
    divergence: {"schema": "pairaudit.divergence/v1", "dataset": str, "items": [index, ...],
                 "divergences": [greedy.divergence_records], "grid_tie": <grid_tie_v1>,
                 "determinism": <determinism_v1> | None, ...}
                (items + divergences give the selected/compared counts, greedy.comparison_counts)
    boundary:   {"schema": "pairaudit.boundary_gate/v1", "gate": <boundary_v1>, ...}
    speed:      {"schema": "pairaudit.speed_decision/v1", "gate": <win2_v1>, ...}

The HTML report's items (``promotion_stage``'s optional outputs): the report
as one HTML page (``markdown_html``), the front-page block ``summary.rst``
(included by ``report/workflow.rst``), the paired-outcomes figure (per item
when score files are given), divergence positions and top-2 margins in grid
steps, the boundary cases side by side, speed per repeat with the bracket
and the win bar, and the control archive. A stage without an artifact gets a
"not run" figure and section; nothing crashes on its absence.

results/ledger.jsonl (``ledger_entry``; append-only, one line per completed decision)::

    {"schema": "pairaudit.ledger/v1", "time", "audit", "decision", "calibration", "reasons", "not_evaluated",
     "config_sha256",                       # canonical JSON of the workflow config
     "inputs": {path: sha256},              # = decision provenance.consumed
     "candidate": {"spec_sha256", "env", "switches_sha256", "model", "url"},
     "control_spec_sha256", "decision_path", "decision_sha256", "code_version"}

Earlier decisions are matched on ``candidate.spec_sha256`` (the launch
receipt's identity hash: command, env switches, model), not on the audit name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from markdown_it import MarkdownIt

from . import calibration as calib
from . import failures, greedy, rules
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
SCORES_SCHEMA = "pairaudit.scores/v1"
LATER_SCHEMAS = {
    "divergence": "pairaudit.divergence/v1",
    "boundary": "pairaudit.boundary_gate/v1",
    "speed": "pairaudit.speed_decision/v1",
    "answers": "pairaudit.phase/v1",
}
ARMS = ("control", "candidate")

# Which registered rule each later gate must carry: a win2 result handed in
# as "boundary" would otherwise be judged by the wrong vocabulary.
_EXPECTED_RULE = {
    "quality": "quality-v1",
    "grid_tie": "grid-tie-v1",
    "determinism": "determinism-v1",
    "boundary": "boundary-v1",
    "speed": ("win2-v2", "win2-v1"),   # speed.rule selects; win2-v2 is the default
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
    if res.get("rule") not in (want if isinstance(want, tuple) else (want,)):
        raise ValueError(f"gate {name}: expected a {' or '.join(want) if isinstance(want, tuple) else want} "
                         f"result, got rule {res.get('rule')!r}")


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
    # after a server failure the paired stage keeps the rule's own verdict as stage_verdict
    stored = {**q, "verdict": q.get("stage_verdict", q.get("verdict"))} if doc.get("arm_failed") else q
    for key in ("verdict", "control_only", "candidate_only"):
        if stored.get(key) != again[key]:
            raise ValueError(f"paired {name}: stored quality {key} {q.get(key)!r} disagrees with "
                             f"quality-v1 recomputed from its table ({again[key]!r})")
    out = dict(q)
    if out.get("mde") is None:
        # A paired doc made before the detectable-loss field: the same rule states it now.
        out["mde"] = again["mde"]
        out["reasons"] = list(out.get("reasons") or []) + [rules.mde_reason(again["mde"])]
    return out


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


def grid_tie_gate(divergence: Mapping[str, Any] | None, datasets: Sequence[str], *,
                  counts: Mapping[str, Mapping[str, Any]] | None = None) -> dict | None:
    """The one audit-wide grid-tie gate from the per-dataset records (rules.grid_tie_audit).

    None (not evaluated) when no dataset has a record; a dataset without one
    makes the audit's grid-tie INCONCLUSIVE, naming it. The per-dataset
    records stay the evidence; the cap and "nothing compared" are the audit's.
    """
    per = {k.split(":", 1)[1]: v for k, v in _per_dataset("grid_tie", divergence, datasets).items()}
    if all(v is None for v in per.values()):
        return None
    return rules.grid_tie_audit(per, counts=counts)


def boundary_gate(res: Mapping[str, Any] | None) -> dict | None:
    """boundary-v1 as the decision counts it: a PASS without the capacity tail case is not the gate.

    The schema refuses a boundary config without the max_model_len - 16 tail;
    a result made without it anyway (an older or hand-made artifact) enters
    as INCONCLUSIVE with ``stage_verdict`` PASS and the missing cases named.
    A FAIL stands as it is: a failure found is a failure.
    """
    _check_rule("boundary", "boundary", res)
    if res is None:
        return None
    missing = rules.boundary_missing_cases(res)
    if not missing:
        return dict(res)
    out = {**res, "missing_cases": missing, "stage_verdict": res.get("verdict")}
    why = (f"boundary-v1 not applied in full: required case(s) {missing} (max_model_len - 16 input, 16 output) "
           "were not run")
    if res.get("verdict") == "PASS":
        out.update(verdict="INCONCLUSIVE", reasons=[why] + list(res.get("reasons") or []))
    else:
        out["reasons"] = list(res.get("reasons") or []) + [why]
    return out


def gates_from(paired: Mapping[str, Mapping[str, Any]], *, divergence: Mapping[str, Any] | None = None,
               divergence_counts: Mapping[str, Mapping[str, Any]] | None = None,
               determinism: Any = None, boundary: Mapping[str, Any] | None = None,
               speed: Mapping[str, Any] | None = None) -> dict[str, dict | None]:
    """Every evidence gate, in a fixed order, None where not evaluated.

    paired: dataset -> paired doc (its stored quality-v1 is checked, see
    check_quality). divergence: dataset -> grid_tie_v1 record, combined into
    the one audit-wide gate ``grid_tie`` (grid_tie_gate); divergence_counts:
    dataset -> {"selected", "compared"} for records that lack their own.
    determinism: None, one determinism_v1 result (gate ``determinism``) or
    dataset -> result (gates ``determinism:<dataset>``; the divergence stage
    repeats a greedy request per dataset). boundary: boundary_v1 (see
    boundary_gate). speed: win2_v1.
    """
    datasets = sorted(paired)
    gates: dict[str, dict | None] = {f"quality:{ds}": check_quality(ds, paired[ds]) for ds in datasets}
    gates["grid_tie"] = grid_tie_gate(divergence, datasets, counts=divergence_counts)
    if isinstance(determinism, Mapping) and "rule" not in determinism:
        gates.update(_per_dataset("determinism", determinism, datasets))
    else:
        _check_rule("determinism", "determinism", determinism)
        gates["determinism"] = determinism
    _check_rule("speed", "speed", speed)
    gates["boundary"] = boundary_gate(boundary)
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
                "net", "mcnemar_p", "params", "mde")
        return {k: res.get(k) for k in keys}
    if rule == "grid-tie-v1":
        return {"scope": res.get("scope"), "n_divergent": res.get("n_divergent"),
                "selected": res.get("selected"), "compared": res.get("compared"),
                "max_divergent": (res.get("params") or {}).get("max_divergent"),
                "failed_clauses": res.get("failed_clauses"),
                "unevaluated_clauses": res.get("unevaluated_clauses"),
                "not_evaluated_datasets": res.get("not_evaluated_datasets"),
                "counts_unrecorded_datasets": res.get("counts_unrecorded_datasets"),
                "datasets": res.get("datasets"),
                "probe_verdicts": {(f"{p['dataset']}:" if p.get("dataset") else "") + str(p.get("index")):
                                   p.get("verdict") for p in res.get("probes") or []}}
    if rule == "determinism-v1":
        return {"nondeterministic_arms": res.get("nondeterministic_arms"),
                "repeats": {a: v.get("repeats") for a, v in (res.get("arms") or {}).items()}}
    if rule == "boundary-v1":
        return {"stage_verdict": res.get("stage_verdict"), "missing_cases": res.get("missing_cases"),
                "candidate_cases": res.get("candidate_cases"),
                "candidate_failures": [f.get("case") for f in res.get("candidate_failures") or []],
                "control_failures": [f.get("case") for f in res.get("control_failures") or []],
                "identical_text_cases": res.get("identical_text_cases")}
    if rule == "win2-v1":
        prim = res.get("primary") or {}
        return {"primary": (res.get("params") or {}).get("primary"), "repeats": res.get("repeats"),
                "point_gain_pct": prim.get("point_gain_pct"), "t_interval": prim.get("t_interval"),
                "win_pct": prim.get("win_pct"), "max_control_spread_pct": prim.get("max_control_spread_pct"),
                "guard_verdicts": {g: r.get("guard_verdict") for g, r in (res.get("guards") or {}).items()}}
    if rule == "win2-v2":
        return {"primary": (res.get("params") or {}).get("primary"), "repeats": res.get("repeats"),
                "point_gain_pct": res.get("pooled_gain_pct"), "lower_bound_pct": res.get("lower_bound_pct"),
                "half_width_pct": res.get("half_width_pct"), "win_pct": (res.get("params") or {}).get("win_pct"),
                "noise": res.get("noise"), "rates": res.get("rates"), "needed": res.get("needed"),
                "stage_deviations": res.get("stage_deviations")}
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
            "model_sha256", "max_model_len", "url", "speculative", "packages", "server_packages", "machine")
    out = {k: rec.get(k) for k in keys}
    # what the server itself reported at launch (/version, the /v1/models card)
    server = rec.get("server") or {}
    out["server_version"] = server.get("version")
    out["server_model_root"] = server.get("root")
    out["preflight"] = None if pre is None else pre.get("verdict")
    return out


def _comparability_notes(arms: Mapping[str, dict]) -> list[str]:
    """Facts about the two arms that a reader must see; they do not decide (no registered rule)."""
    c, k = arms["control"], arms["candidate"]
    notes = []
    for key, what in (("model", "model"), ("model_sha256", "model sha256"),
                      ("max_model_len", "max_model_len"), ("server_version", "server version (/version)"),
                      ("server_model_root", "served model root (/v1/models)")):
        if c.get(key) != k.get(key):
            notes.append(f"{what} differs between arms: control {c.get(key)!r}, candidate {k.get(key)!r}")
    if c.get("spec_sha256") and c.get("spec_sha256") == k.get("spec_sha256"):
        notes.append("control and candidate have the same spec_sha256: the arms are the same server spec, "
                     "so this audit compares a configuration with itself")
    if (c.get("machine") or {}).get("hostname") != (k.get("machine") or {}).get("hostname"):
        notes.append("the arms' launch receipts come from different hosts")
    return notes


def identical_arms(arms: Mapping[str, Mapping[str, Any]]) -> bool:
    """Both arms are the same server spec: no change is under audit."""
    c, k = arms["control"].get("spec_sha256"), arms["candidate"].get("spec_sha256")
    return bool(c) and c == k


def decision_deviations(gates: Mapping[str, Mapping[str, Any] | None], *, calibration: bool = False,
                        no_change: bool = False) -> list[dict]:
    """Every loosening of the registered gates, as ``{"gate", "what", "detail"}``, in gate order.

    A gate not evaluated; a rule parameter other than the registered value;
    a gate that is informational (only its LOSS gates: ``speed.informational``);
    a gate applied to part of its evidence (grid-tie datasets not evaluated,
    boundary cases missing); and the calibration mode of the decision itself.
    Nothing here changes the decision: it makes what the decision rests on
    visible beside it.
    """
    out: list[dict] = []
    for name, res in gates.items():
        if res is None:
            out.append({"gate": name, "what": "not evaluated",
                        "detail": "its stage did not run or is disabled: the gate was not applied, so the "
                                  "decision cannot be PROMOTE"})
            continue
        for k, d in (res.get("deviations") or {}).items():
            detail = (f"used {d.get('used')!r}, registered {d.get('registered')!r}" if isinstance(d, Mapping)
                      else repr(d))
            out.append({"gate": name, "what": f"parameter {k}", "detail": detail})
        if res.get("informational") is True:
            out.append({"gate": name, "what": "informational",
                        "detail": f"configured informational (speed.informational: true): only a LOSS of this "
                                  f"gate gates the decision; its verdict {res.get('verdict')} neither allowed nor "
                                  "blocked PROMOTE"})
        if res.get("not_evaluated_datasets"):
            out.append({"gate": name, "what": "datasets not evaluated",
                        "detail": f"no record for datasets {res['not_evaluated_datasets']}"})
        if res.get("counts_unrecorded_datasets"):
            out.append({"gate": name, "what": "comparison counts not recorded",
                        "detail": f"selected/compared counts missing for datasets {res['counts_unrecorded_datasets']}"})
        # a stage's own loosenings (e.g. the speed bracket's accepted unverifiable clock), as it listed them
        for d in res.get("stage_deviations") or []:
            if isinstance(d, Mapping):
                out.append({"gate": name, "what": str(d.get("what")), "detail": str(d.get("detail"))})
        if res.get("missing_cases"):
            out.append({"gate": name, "what": "required cases missing",
                        "detail": f"cases {res['missing_cases']} were not run (the stage said "
                                  f"{res.get('stage_verdict')}); counted as {res.get('verdict')}"})
    if calibration:
        out.append({"gate": "promotion", "what": "calibration",
                    "detail": "decided in A/A calibration mode: identical arms are decided by their gates (what "
                              "they flag is false-alarm evidence), not made INCONCLUSIVE"})
    elif no_change:
        out.append({"gate": "promotion", "what": rules.NO_CHANGE,
                    "detail": "identical arms: the decision is INCONCLUSIVE whatever the gates say"})
    return out


def _dataset_summary(doc: Mapping[str, Any], mde: Mapping[str, Any] | None = None) -> dict:
    t, q = doc["table"], doc["quality"]
    return {"format": doc.get("format"), "n": t.get("n"), "indices": t.get("indices"),
            "control_correct": t.get("control_correct"), "candidate_correct": t.get("candidate_correct"),
            "control_only": t.get("control_only"), "candidate_only": t.get("candidate_only"),
            "net": t.get("net"), "mcnemar_p": q.get("mcnemar_p"),
            "exact_text_matches": t.get("exact_text_matches"), "natural_finish": t.get("natural_finish"),
            "bodies_identical": t.get("bodies_identical"), "verdict": q.get("verdict"),
            "mde": mde if mde is not None else q.get("mde"), "bootstrap": doc.get("bootstrap")}


def decide(paired: Mapping[str, Mapping[str, Any]], launch: Mapping[str, Mapping[str, Any]],
           preflight: Mapping[str, Mapping[str, Any] | None], *, calibration: bool = False,
           **later: Any) -> dict:
    """decision.json (schema in the module docstring) by promotion-v1.

    paired: dataset -> paired doc; launch: arm -> launch record (both arms
    required: evidence without a receipt has no server to attribute it to);
    preflight: arm -> preflight doc (a missing arm is a None gate);
    later: divergence=, divergence_counts=, determinism=, boundary=, speed=
    as for gates_from. Identical arms (same spec_sha256) are INCONCLUSIVE,
    "no change under audit", unless ``calibration`` (an A/A run, where the
    gates' verdicts are the host's false-alarm evidence).
    """
    unknown = set(later) - {"divergence", "divergence_counts", "determinism", "boundary", "speed", "servers"}
    if unknown:
        raise TypeError(f"decide() got unknown later gates {sorted(unknown)}")
    missing = [a for a in ARMS if a not in launch]
    if missing or set(launch) - set(ARMS):
        raise ValueError(f"launch receipts must be exactly {list(ARMS)}, got {sorted(launch)}")
    if not isinstance(calibration, bool):
        raise TypeError(f"calibration must be a bool, got {calibration!r}")
    servers = later.pop("servers", None)
    gates = gates_from(paired, **later)
    if servers is not None:
        gates["servers"] = servers
    gates.update(preflight_gates(preflight))
    arms = {a: _arm_summary(launch[a], preflight.get(a)) for a in ARMS}
    same = identical_arms(arms)
    prom = rules.promotion_v1(gates, identical_arms=same and not calibration)

    gate_docs: dict[str, dict | None] = {}
    for name, res in gates.items():
        if res is None:
            gate_docs[name] = None
            continue
        gate_docs[name] = {"rule": res.get("rule"), "verdict": res.get("verdict"),
                           "outcome": prom["gates"][name]["outcome"],
                           "reasons": list(res.get("reasons") or []),
                           "deviations": res.get("deviations") or {}, **_key_numbers(res)}
    return {
        "schema": DECISION_SCHEMA,
        "rule": prom["rule"],
        "decision": prom["verdict"],
        "reasons": prom["reasons"],
        # Identical arms: the arms themselves decide, not any gate.
        "deciding_gates": (["arms"] if prom["no_change"] else
                           [g for g, v in prom["gates"].items() if v["outcome"] == prom["verdict"]]),
        "gate_verdict": prom["gate_verdict"],
        "identical_arms": same,
        "calibration": calibration,
        "deviations": decision_deviations(gates, calibration=calibration, no_change=prom["no_change"]),
        "gates": gate_docs,
        "not_evaluated": prom["not_evaluated"],
        "datasets": {ds: _dataset_summary(paired[ds], (gates.get(f"quality:{ds}") or {}).get("mde"))
                     for ds in sorted(paired)},
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


# --------------------------------------------------------------- front page

# What a gate's outcome does to the decision, in words: the gate's own verdict
# (PASS, STOP, WIN ...) is shown beside it, never re-labelled as a decision.
_EFFECT = {"PROMOTE": "no objection", "REJECT": "rejects", "HOLD": "holds", "INCONCLUSIVE": "incomplete",
           "INFORMATIONAL": "informational only"}
REASON_CHARS = 140  # one line in a table cell; the gate's details keep every reason in full


def slug(text: str) -> str:
    """The anchor GitHub and markdown_html give a heading: lowercase, punctuation dropped, spaces -> '-'."""
    import re

    return re.sub(r"[^a-z0-9 _-]", "", text.strip().lower()).replace(" ", "-")


def _gate_heading(name: str) -> str:
    return f"Gate {name}"


def _one_line(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def gate_rows(decision: Mapping[str, Any]) -> list[dict]:
    """One row per gate for the front page: name, verdict, effect, first reason, evidence artifact."""
    rows = []
    for name, g in decision["gates"].items():
        kind, _, ds = name.partition(":")
        evidence = {"quality": f"paired/{ds}.json", "grid_tie": f"divergence/{ds}.json",
                    "determinism": f"divergence/{ds}.json" if ds else "divergence/",
                    "boundary": "boundary/gate.json", "speed": "speed/decision.json",
                    "preflight": f"preflight/{ds}.json"}.get(kind)
        if g is None:
            rows.append({"gate": name, "verdict": "not evaluated", "effect": _EFFECT["INCONCLUSIVE"],
                         "reason": "its stage produced no result", "evidence": evidence})
            continue
        verdict = g.get("verdict") or "?"
        if g.get("stage_verdict") not in (None, verdict):
            verdict += f" (stage {g['stage_verdict']})"
        rows.append({"gate": name, "verdict": verdict, "effect": _EFFECT.get(g.get("outcome"), g.get("outcome")),
                     "reason": _one_line(_headline(g)), "evidence": evidence})
    return rows


def _headline(g: Mapping[str, Any]) -> str:
    """The reason that explains the gate's verdict: for a flagged determinism gate, a flagged arm's line
    (its first line may be the other arm's clean repeats); otherwise the first reason."""
    reasons = [str(r) for r in g.get("reasons") or []]
    if not reasons:
        return "(no reason recorded)"
    flagged = g.get("nondeterministic_arms") or []
    if g.get("rule") == "determinism-v1" and flagged:
        return next((r for r in reasons if r.split(":", 1)[0] in flagged), reasons[0])
    return reasons[0]


def deviations(decision: Mapping[str, Any]) -> list[dict]:
    """decision.json's ``deviations`` ({gate, what, detail}) when present; absent or malformed -> []."""
    devs = decision.get("deviations")
    if not isinstance(devs, list):
        return []
    return [d for d in devs if isinstance(d, Mapping)]


def _banner(decision: Mapping[str, Any]) -> list[str]:
    deciding = decision.get("deciding_gates") or []
    # Gates that also fall short of PROMOTE but are outranked by the decision:
    # a reader must see them too (fixing the deciding gate does not clear them).
    others = [f"{n} ({'not evaluated' if g is None else g['outcome']})" for n, g in decision["gates"].items()
              if n not in deciding and (g is None or g["outcome"] != "PROMOTE")]
    line = (f"> **{decision['decision']}** — deciding gates: {', '.join(deciding) or 'none'}. "
            f"Rule {decision['rule']}: PROMOTE only if every gate passes; precedence REJECT > HOLD > "
            f"INCONCLUSIVE > PROMOTE.")
    out = [line]
    if others:
        out += [">", "> Also short of PROMOTE: " + ", ".join(others) + "."]
    return out


def _deviations_box(decision: Mapping[str, Any]) -> list[str]:
    devs = deviations(decision)
    if not devs:
        return []
    out = ["> **Deviations** from the registered procedure (they do not change a score; read them before the "
           "verdict):", ">", "> " + _row(["Gate", "what", "detail"]), "> " + _row(["---"] * 3)]
    out += ["> " + _row([_cell(d.get("gate", "")), _cell(d.get("what", "")), _cell(d.get("detail", ""))])
            for d in devs]
    return out


def calibration_line(decision: Mapping[str, Any], summary: Mapping[str, Any] | None = None) -> str:
    """The front page's calibration line: the calibration this decision cites, or that there is none.

    ``summary``: this decision's own calibration summary (a calibration run),
    whose headline comes first; the cited one is then the previous one.
    """
    ctrl = decision["arms"]["control"]
    host = (ctrl.get("machine") or {}).get("hostname")
    ref = decision.get("calibration_ref")
    which = "previous calibration" if summary is not None else "latest calibration"
    if ref:
        cited = (f"The {which} of this control on this host: {ref.get('headline')} ({ref.get('time')}, "
                 f"{_code(ref.get('path'))}, sha256 {_code(str(ref.get('sha256'))[:12])}); it does not change "
                 "the decision.")
    else:
        cited = (f"No {'earlier ' if summary is not None else ''}calibration of this control on this host "
                 f"(control spec {_code(str(ctrl.get('spec_sha256'))[:12])}, host {_code(host)})"
                 + ("." if summary is not None else ": `snakemake --cores 4 calibrate` runs one."))
    if summary is None:
        return cited
    return f"This decision is the A/A calibration of audit {_code(summary.get('of_audit'))}: {summary['headline']}. " + cited


def calibration_markdown(summary: Mapping[str, Any] | None) -> list[str]:
    """The calibration run's section: what every gate flagged on A vs A, with the host's noise beside."""
    if summary is None:
        return []
    out = ["## A/A calibration", "", f"**{_cell(summary['headline'])}.** Control and candidate are the same server "
           f"spec ({_code(str(summary.get('control_spec_sha256'))[:12])}) on host {_code(summary['host'].get('hostname'))}: "
           "every gate that flags something here is a false alarm of this host and this control.", ""]
    out += [f"- {_cell(f)}" for f in summary.get("findings") or []]
    out += [f"- note: {_cell(n)}" for n in summary.get("notes") or []]
    out += ["", _row(["Gate", "verdict", "expected on A vs A", "flagged", "reason"]), _row(["---"] * 5)]
    for name, g in summary["gates"].items():
        out.append(_row([_cell(name), _cell(g["verdict"] or "not evaluated"), _cell("/".join(g["expected"] or []) or "-"),
                         "**yes**" if g["flagged"] else "no", _cell(_one_line(g["reason"]))]))
    sp = summary.get("speed")
    if sp:
        out += ["", f"Speed ({sp.get('rule')}, bar {sp.get('win_pct')} %): {sp.get('verdict')}, pooled gain "
                f"{_num(sp.get('pooled_gain_pct'), 2)} %.", "",
                _row(["cell", "in-window control spread per repeat %", "max %", "archive spread before %",
                      "archive starts", "archive spread with this window %"]), _row(["---"] * 6)]
        for cell, c in sp["cells"].items():
            w = c.get("window_pct")
            out.append(_row([_cell(cell), ", ".join(_num(x, 1) for x in (w if isinstance(w, list) else [w])),
                             _num(c.get("window_max_pct"), 1), _num(c.get("archive_pct"), 1),
                             _cell(c.get("archive_n")), _num(c.get("archive_with_window_pct"), 1)]))
    out += ["", _row(["Dataset", "n", "control-only", "candidate-only", "McNemar p", "exact text matches",
                      "quality-v1"]), _row(["---"] * 7)]
    for ds, q in summary["quality"].items():
        out.append(_row([_cell(ds), _cell(q["n"]), _idx(q["control_only"]), _idx(q["candidate_only"]),
                         _p(q["mcnemar_p"]), _cell(q["exact_text_matches"]), _cell(q["verdict"])]))
    if summary.get("greedy"):
        out += ["", _row(["Dataset", "greedy selected", "compared", "diverged (server against itself)",
                          "determinism-v1"]), _row(["---"] * 5)]
        for ds, g in summary["greedy"].items():
            out.append(_row([_cell(ds), _cell(g["selected"]), _cell(g["compared"]), _idx(g["diverged"]),
                             _cell(g["determinism"])]))
    b = summary.get("boundary")
    out += ["", "Boundary: " + ("not run" if b is None else
                                f"{b['verdict']} over cases {_cell(b.get('cases'))}; control failures "
                                f"{_cell([f.get('case') if isinstance(f, Mapping) else f for f in b.get('control_failures') or []])}")
            + ". Preflight: " + ", ".join(f"{a} {v}" for a, v in summary["preflight"].items())
            + f". Servers: {summary.get('servers')}."]
    return out


def _gates_table(decision: Mapping[str, Any]) -> list[str]:
    out = ["## Gates", "", _row(["Gate", "verdict", "effect on the decision", "reason", "evidence"]),
           _row(["---"] * 5)]
    for r in gate_rows(decision):
        link = f"[details](#{slug(_gate_heading(r['gate']))})"
        ev = link + (f" · {_code(r['evidence'])}" if r["evidence"] else "")
        out.append(_row([_cell(r["gate"]), _cell(r["verdict"]), r["effect"], _cell(r["reason"]), ev]))
    ne = decision.get("not_evaluated") or []
    out += ["", (f"Not evaluated: {', '.join(ne)} (incomplete evidence: the decision cannot be PROMOTE)."
                 if ne else "Every gate was evaluated.")]
    return out


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
            "McNemar p", "natural finish (control, candidate)", "exact text matches", "quality-v1"]
    out = ["## Paired results", "", _row(head), _row(["---"] * len(head))]
    tot = {"n": 0, "c": 0, "k": 0, "co": 0, "ko": 0, "x": 0, "fc": 0, "fk": 0}
    for ds in sorted(paired):
        t, q = paired[ds]["table"], paired[ds]["quality"]
        n = t["n"]
        nf = t.get("natural_finish") or {}
        out.append(_row([_cell(ds), f"{t['control_correct']}/{n}", f"{t['candidate_correct']}/{n}",
                         _idx(t["control_only"]), _idx(t["candidate_only"]), _p(q.get("mcnemar_p")),
                         f"{nf.get('control')}/{n}, {nf.get('candidate')}/{n}",
                         f"{t.get('exact_text_matches')}/{n}", q.get("verdict")]))
        for key, v in (("n", n), ("c", t["control_correct"]), ("k", t["candidate_correct"]),
                       ("co", len(t["control_only"])), ("ko", len(t["candidate_only"])),
                       ("x", t.get("exact_text_matches") or 0), ("fc", nf.get("control") or 0),
                       ("fk", nf.get("candidate") or 0)):
            tot[key] += v
    if len(paired) > 1:
        # Counts only: a pooled McNemar p over datasets is not a registered rule.
        out.append(_row(["**Total**", f"{tot['c']}/{tot['n']}", f"{tot['k']}/{tot['n']}", tot["co"], tot["ko"],
                         "", f"{tot['fc']}/{tot['n']}, {tot['fk']}/{tot['n']}", f"{tot['x']}/{tot['n']}", ""]))
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


def _gate_details(decision: Mapping[str, Any]) -> list[str]:
    """Every reason of every gate, one heading each (the front page's evidence links land here)."""
    out = ["## Gate details", ""]
    for name, g in decision["gates"].items():
        out += [f"### {_gate_heading(name)}", ""]
        if g is None:
            out += ["Not evaluated: its stage produced no result. A gate that was not evaluated counts as "
                    "incomplete evidence: the decision cannot be PROMOTE.", ""]
            continue
        out.append(f"Rule {g['rule']}, verdict **{g['verdict']}**"
                   + (f" (stage {g['stage_verdict']})" if g.get("stage_verdict") not in (None, g["verdict"]) else "")
                   + f"; effect on the decision: {_EFFECT.get(g['outcome'], g['outcome'])}.")
        out.append("")
        out += [f"- {_cell(r)}" for r in g["reasons"]] or ["- (no reasons recorded)"]
        for k, d in (g.get("deviations") or {}).items():
            out.append(f"- deviation: {k} = {d.get('used')!r} (registered {d.get('registered')!r})")
        out.append("")
    return out


def render_markdown(decision: Mapping[str, Any], paired: Mapping[str, Mapping[str, Any]],
                    launch: Mapping[str, Mapping[str, Any]],
                    preflight: Mapping[str, Mapping[str, Any] | None],
                    calibration_summary: Mapping[str, Any] | None = None) -> str:
    """The report people read: a front page read at a glance, then the details.

    Front page: the decision as a banner (with the deciding gates and every
    other gate short of PROMOTE), a "Deviations" box when decision.json lists
    any, one table row per gate (verdict, its effect on the decision, its first
    reason, a link to its details and its artifact), and the paired table per
    dataset, with the calibration line (calibration_line) above the gates.
    Below: arms, preflight, item indices, every reason of every gate.

    ``launch`` is accepted for symmetry with decide(); the arms section reads
    the summary decide() already took from it, so the report and
    decision.json cannot disagree about an arm.
    """
    del launch  # see docstring
    out = [f"# pairaudit decision: {decision['decision']}", ""] + _banner(decision) + [""]
    box = _deviations_box(decision)
    if box:
        out += box + [""]
    out += [f"**Calibration:** {calibration_line(decision, calibration_summary)}", ""]
    out += _gates_table(decision) + [""]
    out += _paired_section(paired) + [""]
    out += ["## Details", "",
            "Below: [arms and switches](#arms), [preflight](#preflight), [item indices](#item-indices), "
            "[every reason of every gate](#gate-details), [what is not adjusted](#what-is-not-adjusted), "
            "then the boundary cases, the speed bracket and earlier decisions.", ""]
    out += _arms_section(decision) + [""]
    out += _preflight_section(preflight) + [""]
    out += _indices_section(paired)
    out += _gate_details(decision)
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


def item_outcomes(table: Mapping[str, Any], correct: Mapping[str, Mapping[int, bool]]) -> dict[int, str]:
    """Index -> paired outcome, from each arm's per-item scores; checked against the paired table.

    correct: arm -> {index: correct}. A score file that disagrees with the
    table's control-only / candidate-only sets or counts is an error: the
    figure must show the evidence the decision used.
    """
    out: dict[int, str] = {}
    for i in table.get("indices") or []:
        c, k = bool(correct["control"].get(i)), bool(correct["candidate"].get(i))
        out[i] = ("both correct" if c and k else "control only" if c else "candidate only" if k else "neither")
    got = {o: sorted(i for i, v in out.items() if v == o) for o in OUTCOME_COLORS}
    if (got["control only"] != sorted(table["control_only"]) or got["candidate only"] != sorted(table["candidate_only"])
            or len(got["both correct"]) != table["both_correct"] or len(got["neither"]) != table["neither_correct"]):
        raise ArtifactError("per-item scores disagree with the paired table (control-only "
                            f"{got['control only']} vs {table['control_only']}, candidate-only {got['candidate only']} "
                            f"vs {table['candidate_only']})")
    return out


def plot_paired(paired: Mapping[str, Mapping[str, Any]], out_png: str | os.PathLike,
                items: Mapping[str, Mapping[int, str]] | None = None) -> None:
    """Stacked bars of paired outcomes per dataset, and with ``items`` one coloured cell per item; PNG.

    Uses a bare Figure on the Agg canvas instead of pyplot, so no global
    backend or figure state is touched (Snakemake jobs and tests share a process).
    """
    names = sorted(paired)
    per_item = bool(items) and all(ds in items for ds in names)
    fig = _figure(max(4.0, 1.6 * len(names) + 2.0) + (6.0 if per_item else 0.0), max(4.0, 0.5 * len(names) + 2.5))
    ax = fig.add_subplot(1, 2, 1) if per_item else fig.add_subplot(1, 1, 1)
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
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Paired outcomes per dataset (control vs candidate)")
    if per_item:
        ax2 = fig.add_subplot(1, 2, 2)
        width = max(len(items[ds]) for ds in names) or 1
        for row, ds in enumerate(names):
            for col, idx in enumerate(sorted(items[ds])):
                outcome = items[ds][idx]
                ax2.add_patch(_rect((col, row), OUTCOME_COLORS[outcome]))
                if outcome in ("control only", "candidate only") or len(items[ds]) <= 20:
                    ax2.text(col + 0.5, row + 0.5, str(idx), ha="center", va="center", fontsize=6)
        ax2.set_xlim(0, max(width, 10))  # a few items stay squares, not wide bars
        ax2.set_xticks([])
        ax2.set_ylim(len(names), 0)
        ax2.set_yticks([r + 0.5 for r in range(len(names))])
        ax2.set_yticklabels(names)
        ax2.set_xlabel("items in index order (discordant ones and small sets labelled with their index)")
        ax2.set_title("Per item")
        ax2.legend(handles=[_rect((0, 0), c, label=o) for o, c in OUTCOME_COLORS.items()],
                   loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, out_png)


def _rect(xy, color, label=None):
    from matplotlib.patches import Rectangle

    return Rectangle(xy, 1, 1, facecolor=color, edgecolor="white", label=label)


def load_item_outcomes(paired: Mapping[str, Mapping[str, Any]],
                       score_paths: Sequence[str | os.PathLike]) -> dict[str, dict[int, str]]:
    """dataset -> index -> outcome from the score files the paired stage consumed (checked by hash)."""
    from .artifacts import check_consumed, read_jsonl

    correct: dict[str, dict[str, dict[int, bool]]] = {}
    for p in score_paths:
        header, records = read_jsonl(p)
        check_schema(header, SCORES_SCHEMA, p)
        ds, arm = header.get("dataset"), header.get("arm")
        if ds not in paired or arm not in ARMS:
            raise ArtifactError(f"{p}: scores for {ds}/{arm}, which has no paired result")
        check_consumed(paired[ds], [p], where=f"paired {ds}")
        correct.setdefault(ds, {})[arm] = {r["index"]: bool(r.get("correct")) for r in records}
    return {ds: item_outcomes(paired[ds]["table"], arms) for ds, arms in correct.items()
            if set(arms) == set(ARMS)}


# ------------------------------------------------------------- later figures

def _figure(width: float, height: float):
    # A bare Figure on the Agg canvas: no pyplot global state (see plot_paired).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, out_png: str | os.PathLike) -> None:
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")


def plot_not_run(out_png: str | os.PathLike, title: str, why: str) -> None:
    """A figure slot whose stage did not run: says so instead of drawing an empty axis."""
    fig = _figure(6.0, 2.0)
    fig.text(0.5, 0.62, f"{title}: not run", ha="center", va="center", fontsize=13, weight="bold")
    fig.text(0.5, 0.32, why, ha="center", va="center", fontsize=9, wrap=True)
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")


def _top2_margin(top: Sequence[Sequence[float]] | None) -> float | None:
    vals = sorted((float(v) for _, v in top or []), reverse=True)
    return vals[0] - vals[1] if len(vals) >= 2 else None


def divergence_points(docs: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    """One row per diverged greedy item: where it diverged and how close the top-2 were.

    Margins are top-1 minus top-2 log-probability of each arm's probe on the
    shared prefix (the arm's own top-20 at the divergent position); ``step``
    is the grid step grid-tie-v1 found for that probe (None when it found
    none), so ``margin / step`` <= 1 reads as a one-step tie.
    """
    rows = []
    for ds in sorted(docs):
        doc = docs[ds]
        probes = {arm: {p.get("index"): p for p in (doc.get("probes") or {}).get(arm) or []} for arm in ARMS}
        gt = doc.get("grid_tie") or {}
        gt_probes = {p.get("index"): p for p in gt.get("probes") or []}
        for d in doc.get("divergences") or []:
            if not d.get("diverged"):
                continue
            i = d.get("index")
            g = gt_probes.get(i) or {}
            rows.append({
                "dataset": ds, "index": i, "position": d.get("first_divergence"),
                "control_len": d.get("control_len"), "candidate_len": d.get("candidate_len"),
                "control_token_id": d.get("control_token_id"), "candidate_token_id": d.get("candidate_token_id"),
                "control_margin": _top2_margin((probes["control"].get(i) or {}).get("top20")),
                "candidate_margin": _top2_margin((probes["candidate"].get(i) or {}).get("top20")),
                "step": g.get("step"), "gap_in_steps": g.get("gap_in_steps"),
                "verdict": g.get("verdict") or gt.get("verdict"),
            })
    return rows


def plot_divergence(docs: Mapping[str, Mapping[str, Any]], out_png: str | os.PathLike) -> list[dict]:
    """Left: first-divergence position per item against its output length. Right: top-2 margins in BF16 steps."""
    rows = divergence_points(docs)
    greedy_n = {ds: len(docs[ds].get("divergences") or []) for ds in docs}
    if not rows:
        plot_not_run(out_png, "Greedy divergence",
                     "no greedy item diverged (" + ", ".join(f"{ds}: 0/{n}" for ds, n in sorted(greedy_n.items()))
                     + " greedy items differ)")
        return rows
    fig = _figure(10.0, 4.0)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = sorted(docs)
    for j, ds in enumerate(names):
        mine = [r for r in rows if r["dataset"] == ds]
        if not mine:
            continue
        ax1.scatter([r["position"] for r in mine], [max(r["control_len"] or 0, r["candidate_len"] or 0) for r in mine],
                    label=f"{ds} ({len(mine)}/{greedy_n[ds]} diverged)", color=f"C{j}")
        for r in mine:
            ax1.annotate(str(r["index"]), (r["position"], max(r["control_len"] or 0, r["candidate_len"] or 0)),
                         fontsize=7, xytext=(3, 3), textcoords="offset points")
    lim = max([max(r["control_len"] or 0, r["candidate_len"] or 0) for r in rows] + [1])
    ax1.plot([0, lim], [0, lim], color="#999", lw=0.8, ls=":")
    ax1.set_xlabel("first differing token (position in the output)")
    ax1.set_ylabel("output length (longer arm)")
    ax1.set_title("Where greedy outputs diverge")
    ax1.legend(fontsize=7)
    xs = list(range(len(rows)))
    for arm, marker, color in (("control", "s", "#d9822b"), ("candidate", "o", "#3b75af")):
        ys = [(r[f"{arm}_margin"] / r["step"]) if r["step"] and r[f"{arm}_margin"] is not None else float("nan")
              for r in rows]
        ax2.scatter(xs, ys, marker=marker, color=color, label=f"{arm} top-1 − top-2", zorder=3)
    ax2.axhline(1.0, color="#c0392b", ls="--", lw=1, label="one BF16 step")
    no_step = [x for x, r in zip(xs, rows) if not r["step"]]
    for x in no_step:
        ax2.annotate("no grid step", (x, 0), fontsize=7, rotation=90, va="bottom", ha="center", color="#c0392b")
    ax2.set_xticks(xs)
    ax2.set_xticklabels([f"{r['dataset']}\n#{r['index']}\n{r['verdict']}" for r in rows], fontsize=7)
    ax2.set_ylabel("margin / grid step")
    ax2.set_ylim(bottom=-0.1)
    ax2.set_title("Top-2 margin at the divergent position")
    ax2.legend(fontsize=7)
    _save(fig, out_png)
    return rows


def _speed_primary(doc: Mapping[str, Any]) -> str | None:
    return (doc.get("bar") or {}).get("primary") or ((doc.get("gate") or {}).get("params") or {}).get("primary")


def plot_speed(doc: Mapping[str, Any], out_png: str | os.PathLike) -> None:
    """Per cell: s1, s2, s3 of every repeat for the primary metric, and the win bar above the control mean."""
    primary = _speed_primary(doc)
    series = doc.get("series") or {}
    bar = doc.get("bar") or {}
    win_pct = float(bar.get("win_pct") or 2.0)
    lower = primary in (bar.get("lower_is_better") or [])
    cells = [c for c in series if primary in (series[c] or {})]
    if not cells:
        plot_not_run(out_png, "Speed bracket", f"the speed decision carries no series for its primary metric {primary!r}")
        return
    fig = _figure(max(5.0, 3.6 * len(cells)), 4.0)
    verdicts = (doc.get("gate") or {}).get("cells") or {}
    for j, cell in enumerate(cells):
        ax = fig.add_subplot(1, len(cells), j + 1)
        reps = series[cell][primary]
        for r, trio in enumerate(reps):
            s1, s2, s3 = (float("nan") if v is None else float(v) for v in trio)
            ctrl = (s1 + s3) / 2
            ax.plot([r - 0.2, r + 0.2], [s1, s3], color="#999", lw=0.8, zorder=1)
            ax.scatter([r - 0.2], [s1], marker="s", color="#d9822b", label="s1 control" if r == 0 else None, zorder=3)
            ax.scatter([r], [s2], marker="o", color="#3b75af", s=50, label="s2 candidate" if r == 0 else None, zorder=3)
            ax.scatter([r + 0.2], [s3], marker="s", color="#a0522d", label="s3 control" if r == 0 else None, zorder=3)
            edge = ctrl * (1 - win_pct / 100) if lower else ctrl * (1 + win_pct / 100)
            ax.fill_between([r - 0.3, r + 0.3], [ctrl] * 2, [edge] * 2, color="#c0392b", alpha=0.15,
                            label=f"{win_pct:g} % bar over control mean" if r == 0 else None)
            ax.hlines(ctrl, r - 0.3, r + 0.3, color="#555", lw=1, label="control mean (s1+s3)/2" if r == 0 else None)
        w = (doc.get("win2") or {}).get(cell) or {}
        prim = w.get("primary") or {}
        gain = prim.get("point_gain_pct")
        ax.set_title(f"{cell}: {verdicts.get(cell) or w.get('verdict') or '?'}"
                     + (f" (gain {gain:+.2f} %)" if isinstance(gain, (int, float)) else ""), fontsize=9)
        ax.set_xticks(range(len(reps)))
        ax.set_xticklabels([f"repeat {r + 1}" for r in range(len(reps))])
        ax.set_xlim(-0.5, len(reps) - 0.5)
        ax.set_ylabel(f"{primary} ({'lower' if lower else 'higher'} is better)")
        if j == 0:
            ax.legend(fontsize=7)
    _save(fig, out_png)


def read_jsonl_lines(path: str | os.PathLike) -> list[dict]:
    """Every parsable line of an append-only JSONL file; a cut last line (crash) is skipped."""
    import json

    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        return []
    return out


def archive_rows(speed_doc: Mapping[str, Any], archive: Sequence[Mapping[str, Any]]) -> dict[str, list[dict]]:
    """cell -> archived control starts comparable with this audit's: same cell, same config hash, a value."""
    primary = _speed_primary(speed_doc)
    spread = speed_doc.get("spread") or {}
    out = {}
    for cell in speed_doc.get("series") or {}:
        want = (spread.get(cell) or {}).get("config_hash")
        out[cell] = [dict(a) for a in archive if a.get("cell") == cell
                     and (want is None or a.get("config_hash") == want)
                     and isinstance((a.get("metrics") or {}).get(primary), (int, float))]
    return out


def plot_control_archive(speed_doc: Mapping[str, Any], archive: Sequence[Mapping[str, Any]],
                         out_png: str | os.PathLike) -> None:
    """Every archived control start's primary metric per cell, this audit's starts marked."""
    primary = _speed_primary(speed_doc)
    audit = speed_doc.get("audit")
    cells = list(speed_doc.get("series") or {})
    by_cell = archive_rows(speed_doc, archive)
    if not any(by_cell.values()):
        plot_not_run(out_png, "Control archive", "no archived control start carries the primary metric yet")
        return
    fig = _figure(max(5.0, 3.6 * len(cells)), 4.0)
    spread = speed_doc.get("spread") or {}
    for j, cell in enumerate(cells):
        ax = fig.add_subplot(1, len(cells), j + 1)
        rows = by_cell[cell]
        xs = list(range(len(rows)))
        ys = [a["metrics"][primary] for a in rows]
        mine = [a.get("audit") == audit for a in rows]
        ax.scatter([x for x, m in zip(xs, mine) if not m], [y for y, m in zip(ys, mine) if not m],
                   color="#999", label="earlier control starts")
        ax.scatter([x for x, m in zip(xs, mine) if m], [y for y, m in zip(ys, mine) if m],
                   color="#d9822b", marker="s", label=f"this audit ({audit})")
        sp = spread.get(cell) or {}
        arch = sp.get("archive_pct")
        win = sp.get("win_pct") or (speed_doc.get("bar") or {}).get("win_pct")
        ax.set_title(f"{cell}: archive spread "
                     + (f"{arch:.2f} %" if isinstance(arch, (int, float)) else "n/a (< 2 starts)")
                     + (f" vs {win:g} % bar" if isinstance(win, (int, float)) else ""), fontsize=9)
        ax.set_xlabel("archived control start (in append order)")
        ax.set_ylabel(f"{primary} (mean over repeats)")
        if j == 0:
            ax.legend(fontsize=7)
    _save(fig, out_png)


def boundary_markdown(doc: Mapping[str, Any] | None) -> list[str]:
    """Boundary cases side by side (control | candidate), from the boundary gate artifact.

    Reads ``cases: [{"case", "expected", "identical_text", "control": side,
    "candidate": side}]`` as pairaudit/boundary.py documents it.
    """
    out = ["## Long-context boundary (boundary-v1)", ""]
    if doc is None:
        return out + ["Not run: the boundary stage has not produced `boundary/gate.json` for this audit, so the "
                      "boundary gate is not evaluated (the decision cannot be PROMOTE)."]
    gate = doc.get("gate") or {}
    out += [f"Verdict: **{gate.get('verdict')}**", ""] + [f"- {_cell(r)}" for r in gate.get("reasons") or []]
    mml = doc.get("max_model_len") or {}
    if mml:
        out += ["", "max_model_len: " + ", ".join(f"{arm} {mml.get(arm)}" for arm in ARMS)]
    cases = [c for c in doc.get("cases") or [] if isinstance(c, Mapping)]
    if cases:
        def side(c: Mapping, arm: str) -> list[str]:
            s = c.get(arm)
            if not isinstance(s, Mapping):
                return ["not run", "", "", "", ""]
            text = s.get("text") or s.get("config_error") or s.get("error") or "(no text)"
            return [_code(str(text)[:120]), _cell(s.get("correct")), _cell(s.get("finish_reason")),
                    _cell(f"{s.get('prompt_tokens')} + {s.get('max_tokens')}"), _num(s.get("ttft_s"))]

        head = ["case", "expected"] + [f"{arm} {f}" for arm in ARMS
                                       for f in ("answer", "correct", "finish", "tokens in + out", "TTFT s")]
        head += ["same text"]
        out += ["", _row(head), _row(["---"] * len(head))]
        for c in cases:
            out.append(_row([_cell(c.get("case")), _code(c.get("expected"))] + side(c, "control")
                            + side(c, "candidate") + [_cell(c.get("identical_text"))]))
    longs = [(arm, fl) for arm, fl in (doc.get("first_long") or {}).items()
             if isinstance(fl, Mapping) and fl.get("ttft_s") is not None]
    if longs:
        out.append("")
    for arm, fl in longs:
        out.append(f"- {arm}: first long request ({fl.get('case')}, {fl.get('prompt_tokens')} tokens) "
                   f"TTFT {fl['ttft_s']:.3f} s, {fl.get('input_tokens_per_s') or 0:.1f} input tokens/s")
    return out


_BOUNDARY_SIDE = ("text", "extracted", "correct", "finish_reason", "prompt_tokens", "max_tokens", "ttft_s",
                  "input_tokens_per_s", "config_error")


def boundary_evidence(doc: Mapping[str, Any] | None) -> list[dict] | None:
    """Every boundary case for decision.json: planted values and, per arm, answer, finish reason, TTFT."""
    if doc is None:
        return None
    return [{"case": c.get("case"), "planted": c.get("planted"), "expected": c.get("expected"),
             "identical_text": c.get("identical_text"),
             **{arm: ({k: c[arm].get(k) for k in _BOUNDARY_SIDE} if isinstance(c.get(arm), Mapping) else None)
                for arm in ARMS}}
            for c in doc.get("cases") or [] if isinstance(c, Mapping)]


def speed_evidence(doc: Mapping[str, Any] | None) -> dict | None:
    """The speed table for decision.json: per cell its verdict and the primary metric's s1/s2/s3 per repeat."""
    if doc is None:
        return None
    primary = _speed_primary(doc)
    win2 = doc.get("win2") or {}
    cells = {}
    for cell, metrics in (doc.get("series") or {}).items():
        prim = (win2.get(cell) or {}).get("primary") or {}
        cells[cell] = {"verdict": (win2.get(cell) or {}).get("verdict"),
                       "repeats_s1_s2_s3": (metrics or {}).get(primary),
                       "point_gain_pct": prim.get("point_gain_pct"), "t_interval": prim.get("t_interval"),
                       "max_control_spread_pct": prim.get("max_control_spread_pct")}
    return {"primary": primary, "win_pct": (doc.get("bar") or {}).get("win_pct"),
            "hosts": doc.get("hosts"), "cells": cells}


def _num(v: Any, digits: int = 3) -> str:
    return "n/a" if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:.{digits}f}"


def _speed_repeat_rows(doc: Mapping[str, Any], primary: str) -> list[str]:
    """Per cell and repeat: s1, s2, s3 of the primary metric, the control mean and the candidate's ratio to it."""
    out = [_row(["cell", "repeat", f"s1 control {primary}", f"s2 candidate {primary}", f"s3 control {primary}",
                 "control mean", "candidate / control", "s1-s3 spread / control"]), _row(["---"] * 8)]
    for cell, metrics in (doc.get("series") or {}).items():
        for r, trio in enumerate((metrics or {}).get(primary) or [], start=1):
            s1, s2, s3 = (trio + [None] * 3)[:3]
            nums = all(isinstance(v, (int, float)) for v in (s1, s2, s3))
            ctrl = (s1 + s3) / 2 if nums else None
            ratio = s2 / ctrl if nums and ctrl else None
            spread = abs(s1 - s3) / ctrl if nums and ctrl else None
            out.append(_row([_cell(cell), r, _num(s1), _num(s2), _num(s3), _num(ctrl), _num(ratio),
                             "n/a" if spread is None else f"{100 * spread:.1f} %"]))
    return out


def _speed_bench_rows(doc: Mapping[str, Any]) -> list[str]:
    """`vllm bench serve`'s summary per cell and start (medians; ITL is per streamed chunk, not per token)."""
    head = ["cell", "start", "completed", "failed", "output tok/s", "median TTFT ms", "median TPOT ms",
            "median ITL ms", "p99 ITL ms", "median E2EL ms"]
    out = [_row(head), _row(["---"] * len(head))]
    for cell, starts in (doc.get("bench_serve") or {}).items():
        for start, b in (starts or {}).items():
            if not isinstance(b, Mapping):
                continue
            med = lambda k, q="median": (b.get(k) or {}).get(q)  # noqa: E731
            out.append(_row([_cell(cell), _cell(start), _cell(b.get("completed")), _cell(b.get("failed")),
                             _num(b.get("output_throughput"), 2), _num(med("ttft_ms"), 1), _num(med("tpot_ms"), 1),
                             _num(med("itl_ms"), 2), _num(med("itl_ms", "p99"), 1), _num(med("e2el_ms"), 0)]))
    return out


def speed_markdown(doc: Mapping[str, Any] | None) -> list[str]:
    out = ["## Speed (win2-v1)", ""]
    if doc is None:
        return out + ["Not run: the speed stage has not produced `speed/decision.json` for this audit, so the "
                      "speed gate is not evaluated (the decision cannot be PROMOTE)."]
    gate = doc.get("gate") or {}
    out[0] = f"## Speed ({gate.get('rule') or 'win2-v1'})"
    out += [f"Verdict: **{gate.get('verdict')}**" + (" (informational: only a LOSS gates)"
                                                      if gate.get("informational") else ""), ""]
    out += [f"- {_cell(r)}" for r in gate.get("reasons") or []]
    spread = doc.get("spread") or {}
    if spread:
        out += ["", _row(["cell", "in-window control spread (max %)", "archive spread before this window %",
                          "archive starts", "win bar %"]), _row(["---"] * 5)]
        for cell, sp in spread.items():
            w = sp.get("window_pct")
            vals = [v for v in (w if isinstance(w, list) else [w]) if isinstance(v, (int, float))]
            # A repeat without a value (no rounds measured) has no spread: not zero, just absent.
            wmax = sp.get("window_max_pct", max(vals) if vals else None)
            out.append(_row([_cell(cell), _num(wmax, 1), _num(sp.get("archive_pct"), 1),
                             _cell(sp.get("archive_n")), _cell(sp.get("win_pct"))]))
    primary = _speed_primary(doc)
    if primary and doc.get("series"):
        how = ("win2-v2 compares s2 with s1 and s3 over all repeats and deciding cells"
               if gate.get("rule") == "win2-v2" else "win2-v1 pairs s2 with the mean of s1 and s3")
        out += ["", f"Primary metric `{primary}` per repeat ({how}):", ""]
        out += _speed_repeat_rows(doc, primary)
    if doc.get("bench_serve"):
        out += ["", "Client timings per start, as `vllm bench serve` reports them:", ""] + _speed_bench_rows(doc)
    return out


# ------------------------------------------------------------------ ledger

LEDGER_SCHEMA = "pairaudit.ledger/v1"


def ledger_entry(decision: Mapping[str, Any], launch: Mapping[str, Mapping[str, Any]], *, audit: str | None,
                 config: Any, decision_path: str) -> dict:
    """One line of results/ledger.jsonl: what was decided, on which evidence, for which candidate."""
    from .client import sha256_json

    cand = launch.get("candidate") or {}
    prov = decision.get("provenance") or {}
    return {
        "schema": LEDGER_SCHEMA,
        "time": prov.get("created_at"),
        "audit": audit,
        "decision": decision["decision"],
        "calibration": decision.get("calibration") is True,   # an A/A run (pairaudit/calibration.py)
        "reasons": list(decision.get("reasons") or []),
        "not_evaluated": list(decision.get("not_evaluated") or []),
        "config_sha256": None if config is None else sha256_json(config),
        "inputs": dict(prov.get("consumed") or {}),
        # The candidate's identity is its launch spec hash (command, env
        # switches, model): the same change audited again matches, whatever
        # the audit name.
        "candidate": {"spec_sha256": cand.get("spec_sha256"), "env": cand.get("env"),
                      "switches_sha256": sha256_json(cand.get("env") or {}), "model": cand.get("model"),
                      "url": cand.get("url")},
        "control_spec_sha256": (launch.get("control") or {}).get("spec_sha256"),
        "decision_path": decision_path,
        "decision_sha256": sha256_file(decision_path),
        "code_version": prov.get("code_version"),
    }


def earlier_decisions(ledger: Sequence[Mapping[str, Any]], candidate_spec_sha256: str | None) -> list[dict]:
    return [dict(e) for e in ledger if e.get("schema") == LEDGER_SCHEMA
            and (e.get("candidate") or {}).get("spec_sha256") == candidate_spec_sha256]


def append_ledger(path: str | os.PathLike, entry: Mapping[str, Any]) -> None:
    """Append one line and fsync; never rewrites what is there (a sweep stays visible)."""
    import json

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "ab") as f:
        if f.tell() > 0:
            with open(p, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":  # a crash cut the last line: start a fresh one
                    f.write(b"\n")
        f.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def ledger_markdown(earlier: Sequence[Mapping[str, Any]], spec: str | None) -> list[str]:
    out = ["## Earlier decisions for this candidate", ""]
    if not earlier:
        return out + [f"None: this is the first decision recorded in the ledger for candidate spec {_code(spec)}."]
    out += [f"{len(earlier)} earlier decision(s) for candidate spec {_code(spec)} — a sweep repeated until the score "
            "looked better shows up here:", "",
            _row(["time", "audit", "decision", "config sha256", "not evaluated"]), _row(["---"] * 5)]
    for e in earlier:
        out.append(_row([_cell(e.get("time")), _cell(e.get("audit")), e.get("decision"),
                         _code(str(e.get("config_sha256"))[:12]), _cell(", ".join(e.get("not_evaluated") or []))]))
    return out


# ------------------------------------------------------------------ html

# Only in-page anchors and relative paths: a report never links out of itself.
_LOCAL_LINK = re.compile(r"#[A-Za-z0-9_-]+|[A-Za-z0-9_][A-Za-z0-9_./-]*")


def _ids_and_boxes(state) -> None:
    # Headings get the anchor ids the gate table links to; the first top-level
    # quote of a page is the verdict banner, later ones are notices (deviations).
    boxes = 0
    for k, tok in enumerate(state.tokens):
        if tok.type == "heading_open":
            tok.attrSet("id", slug(state.tokens[k + 1].content))
        elif tok.type == "blockquote_open" and tok.level == 0:
            tok.meta["box"] = "banner" if boxes == 0 else "notice"
            boxes += 1


def _markdown_renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.validateLink = lambda url: bool(_LOCAL_LINK.fullmatch(url))
    md.core.ruler.push("pairaudit_ids_and_boxes", _ids_and_boxes)
    md.add_render_rule("blockquote_open", lambda self, tokens, k, options, env:
                       f'<div class="box {tokens[k].meta.get("box", "notice")}">\n')
    md.add_render_rule("blockquote_close", lambda self, tokens, k, options, env: "</div>\n")
    return md


VERDICT_COLORS = {"PROMOTE": "#2e7d32", "HOLD": "#ef6c00", "REJECT": "#c62828"}


def markdown_html(md: str, *, title: str, verdict: str | None = None) -> str:
    """The Markdown this module writes as one self-contained page (markdown-it, CommonMark + tables, no raw
    HTML, only in-page and relative links); ``verdict`` colours the banner."""
    import html

    lines = md.splitlines()
    if verdict and lines and lines[0].startswith("# pairaudit decision"):
        lines = lines[1:]  # the coloured banner below says it
    body = _markdown_renderer().render("\n".join(lines)).rstrip("\n").split("\n")
    color = VERDICT_COLORS.get(verdict or "", "#616161")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:1.5em;max-width:75em}table{border-collapse:collapse;"
            "margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;font-size:.9em;text-align:left;"
            "vertical-align:top}td:last-child{white-space:nowrap}code{font-size:.85em;word-break:break-all}"
            f"#decision{{background:{color};color:#fff;padding:.4em .8em;border-radius:4px;font-size:1.6em;"
            "font-weight:bold}"
            f".box{{padding:.3em .8em;margin:.6em 0;border-radius:4px}}.banner{{border-left:.5em solid {color};"
            "background:#f5f5f5}.notice{border:2px solid #b71c1c;background:#fff3f3}"
            "h2{border-bottom:1px solid #ddd;margin-top:1.4em}</style></head><body>\n"
            + (f"<div id=\"decision\" data-decision=\"{html.escape(verdict)}\">Decision: {html.escape(verdict)}</div>\n"
               if verdict else "")
            + "\n".join(body) + "\n</body></html>\n")


# Where each kind of gate's evidence sits in the Snakemake report (report/workflow.rst's categories).
_RST_CATEGORY = {"quality": "2. Quality", "grid_tie": "3. Greedy divergence", "determinism": "3. Greedy divergence",
                 "boundary": "4. Boundary", "speed": "5. Speed", "preflight": "1. Decision"}


def _rst_esc(t: Any) -> str:
    return (str(t).replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("_", "\\_")
            .replace("|", "\\|"))


def _rst_table(head: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int] = ()) -> list[str]:
    """A docutils list-table (cells already escaped; an empty cell is written as a space)."""
    out = [".. list-table::", "   :header-rows: 1"] + ([f"   :widths: {' '.join(map(str, widths))}"] if widths else [])
    out.append("")
    for r in [list(head), *rows]:
        out.append(f"   * - {r[0] or ' '}")
        out += [f"     - {c or ' '}" for c in r[1:]]
    return out + [""]


def summary_rst(decision: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]],
                calibration_summary: Mapping[str, Any] | None = None) -> str:
    """The report's front page block (included by report/workflow.rst), read at a glance.

    The decision as a banner, a Deviations box when decision.json lists any,
    the gates (verdict, effect, first reason, the category holding the
    evidence) and the paired table per dataset; the full report is item 1.
    """
    deciding = decision.get("deciding_gates") or []
    out = [f".. admonition:: Decision: {decision['decision']}", "   :class: pairaudit-decision", "",
           f"   Deciding gates: {_rst_esc(', '.join(deciding) or 'none')}. Rule {decision['rule']}: PROMOTE only "
           f"if every gate passes; precedence REJECT > HOLD > INCONCLUSIVE > PROMOTE.", ""]
    others = [f"{n} ({'not evaluated' if g is None else g['outcome']})" for n, g in decision["gates"].items()
              if n not in deciding and (g is None or g["outcome"] != "PROMOTE")]
    if others:
        out += ["   Also short of PROMOTE: " + _rst_esc(", ".join(others)) + ".", ""]
    devs = deviations(decision)
    if devs:
        out += [".. warning:: **Deviations** from the registered procedure:", ""]
        out += [f"   - {_rst_esc(d.get('gate', ''))}: {_rst_esc(d.get('what', ''))} — {_rst_esc(d.get('detail', ''))}"
                for d in devs]
        out.append("")
    # backquotes are literals in the Markdown line, not reST references
    out += [f"**Calibration:** {_rst_esc(calibration_line(decision, calibration_summary).replace('`', ''))}", ""]
    rows = []
    for r in gate_rows(decision):
        cat = _RST_CATEGORY.get(r["gate"].partition(":")[0])
        rows.append([_rst_esc(r["gate"]), _rst_esc(r["verdict"]), _rst_esc(r["effect"]), _rst_esc(r["reason"]),
                     f"`{cat}`_" if cat else ""])
    out += ["**Gates**", ""] + _rst_table(["Gate", "verdict", "effect on the decision", "reason", "evidence"], rows,
                                          widths=(14, 10, 10, 50, 16))
    ds_rows = []
    for ds, t in (decision.get("datasets") or {}).items():
        n = t.get("n")
        nf = t.get("natural_finish") or {}
        ds_rows.append([_rst_esc(ds), f"{t.get('control_correct')}/{n}", f"{t.get('candidate_correct')}/{n}",
                        _rst_esc(_idx(t.get("control_only"))), _rst_esc(_idx(t.get("candidate_only"))),
                        _p(t.get("mcnemar_p")), f"{nf.get('control')}/{n}, {nf.get('candidate')}/{n}",
                        _rst_esc(t.get("verdict"))])
    if ds_rows:
        out += ["**Paired results**", ""] + _rst_table(
            ["Dataset", "control", "candidate", "control-only correct", "candidate-only correct", "McNemar p",
             "natural finish (control, candidate)", "quality-v1"], ds_rows)
    ne = decision.get("not_evaluated") or []
    out += ["Not evaluated (the decision cannot be PROMOTE): " + (_rst_esc(", ".join(ne)) if ne else "none") + "."]
    out += ["", f"Earlier decisions for this candidate in the ledger: {len(earlier)}"
            + (" (" + _rst_esc(", ".join(f"{e.get('audit')}: {e.get('decision')}" for e in earlier)) + ")"
               if earlier else "") + ". Every reason of every gate: `1. Decision`_.", ""]
    return "\n".join(out)


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


def _load_later(later: Mapping[str, Any] | None) -> tuple[dict, list[str], dict]:
    """Later-stage artifacts -> decide() keywords, the paths read, and the documents themselves."""
    later = dict(later or {})
    unknown = set(later) - set(LATER_SCHEMAS)
    if unknown:
        raise ValueError(f"unknown later stages {sorted(unknown)} (known: {sorted(LATER_SCHEMAS)})")
    kw: dict[str, Any] = {}
    paths: list[str] = []
    docs: dict[str, Any] = {}
    if later.get("divergence"):
        docs["divergence"] = _load_keyed(later["divergence"], LATER_SCHEMAS["divergence"], "dataset")
        kw["divergence"] = {ds: d.get("grid_tie") for ds, d in docs["divergence"].items()}
        # The artifact's own items and divergence records say what was compared.
        kw["divergence_counts"] = {ds: greedy.comparison_counts(d["items"], d["divergences"])
                                   for ds, d in docs["divergence"].items()
                                   if isinstance(d.get("items"), list) and isinstance(d.get("divergences"), list)}
        # Determinism is evaluated per dataset inside the divergence stage.
        kw["determinism"] = {ds: d.get("determinism") for ds, d in docs["divergence"].items()}
        paths += [str(p) for p in later["divergence"]]
    bracket_failure = None
    for stage in ("boundary", "speed"):
        if later.get(stage):
            p = later[stage]
            docs[stage] = check_schema(read_json(p), LATER_SCHEMAS[stage], p)
            kw[stage] = docs[stage].get("gate")
            paths.append(str(p))
            if stage == "speed":
                bracket_failure = docs[stage].get("failure")
            if docs[stage].get("not_run"):  # its gate says why; there is nothing to draw
                del docs[stage]
    if later.get("answers"):
        # each arm's answers phase: a server that failed under the audit is evidence (failures.py);
        # so is one that failed under the speed bracket, where its answers phase did not
        docs["answers"] = _load_keyed(later["answers"], LATER_SCHEMAS["answers"], "arm")
        per_arm = {arm: (docs["answers"].get(arm) or {}).get("failure") for arm in ARMS}
        if bracket_failure and per_arm.get(bracket_failure.get("arm")) is None:
            per_arm[bracket_failure["arm"]] = bracket_failure
        kw["servers"] = failures.server_failure_v1(per_arm)
        paths += [str(p) for p in later["answers"]]
    return kw, paths, docs


def promotion_stage(paired_paths: Sequence[str | os.PathLike], launch_paths: Sequence[str | os.PathLike],
                    preflight_paths: Sequence[str | os.PathLike], out_decision: str | os.PathLike,
                    out_report: str | os.PathLike, out_manifest: str | os.PathLike,
                    out_plot: str | os.PathLike, *, later: Mapping[str, Any] | None = None,
                    out_html: str | os.PathLike | None = None, out_summary: str | os.PathLike | None = None,
                    out_divergence_plot: str | os.PathLike | None = None,
                    out_boundary: str | os.PathLike | None = None,
                    out_speed_plot: str | os.PathLike | None = None,
                    out_archive_plot: str | os.PathLike | None = None,
                    score_paths: Sequence[str | os.PathLike] = (),
                    ledger_path: str | os.PathLike | None = None, audit: str | None = None,
                    config: Any = None, calibration: bool = False,
                    calibrations_path: str | os.PathLike | None = None,
                    out_calibration: str | os.PathLike | None = None) -> None:
    """Read every input, decide, and write decision.json, the reports, the figures and the manifest.

    The manifest is written after every other output and lists every input
    plus those outputs (it cannot hash itself). The ledger line is appended
    last, once the decision is complete; the earlier ledger lines for the
    same candidate spec are listed in the report. A stage that did not run
    (no artifact in ``later``) gets a figure and a section saying so.

    ``calibrations_path`` (results/calibrations.jsonl) is read as the ledger
    is, at decision time: the latest calibration of the same control spec on
    the same host is cited as ``calibration_ref``. ``calibration`` (an A/A
    run, pairaudit/calibration.py) also writes its summary to
    ``out_calibration``, shows it in the reports, and appends it to the log
    after the ledger line.
    """
    if calibration and not out_calibration:
        raise ValueError("a calibration decision needs out_calibration for its summary")
    paired = _load_keyed(paired_paths, PAIRED_SCHEMA, "dataset")
    launch = _load_keyed(launch_paths, LAUNCH_SCHEMA, "arm")
    preflight = _load_keyed(preflight_paths, PREFLIGHT_SCHEMA, "arm")
    later_kw, later_paths, later_docs = _load_later(later)
    archive: list[dict] = []
    speed = later_docs.get("speed")
    archive_path = ((speed or {}).get("archive") or {}).get("path")
    if archive_path and Path(archive_path).exists():
        archive = read_jsonl_lines(archive_path)
        later_paths.append(str(archive_path))  # hashed as read now: other audits keep appending to it
    items = load_item_outcomes(paired, score_paths) if score_paths else None
    inputs = [str(p) for p in (*paired_paths, *launch_paths, *preflight_paths, *score_paths)] + later_paths

    decision = decide(paired, launch, preflight, calibration=calibration, **later_kw)
    decision["evidence"] = {"boundary_cases": boundary_evidence(later_docs.get("boundary")),
                            "speed": speed_evidence(speed)}
    decision["provenance"] = provenance(inputs, params={"rule": "promotion-v1", "calibration": calibration,
                                                        "datasets": sorted(paired), "arms": list(ARMS)})
    ref = calib.lookup(calibrations_path, launch["control"])
    decision["calibration_ref"] = None if ref is None else ref.to_json()
    summary = None
    if calibration:
        summary = calib.summarize(decision, audit=audit,
                                  of_audit=((config or {}).get("calibration") or {}).get("of"),
                                  speed_doc=speed, divergence_docs=later_docs.get("divergence"))
    spec = (launch.get("candidate") or {}).get("spec_sha256")
    earlier = earlier_decisions(read_jsonl_lines(ledger_path), spec) if ledger_path else []

    outputs = [str(out_decision), str(out_report), str(out_plot)]
    plot_paired(paired, out_plot, items)
    if out_divergence_plot:
        if later_docs.get("divergence"):
            plot_divergence(later_docs["divergence"], out_divergence_plot)
        else:
            plot_not_run(out_divergence_plot, "Greedy divergence", "the divergence stage produced no artifact")
        outputs.append(str(out_divergence_plot))
    if out_speed_plot:
        if speed:
            plot_speed(speed, out_speed_plot)
        else:
            plot_not_run(out_speed_plot, "Speed bracket", "no speed/decision.json: the speed gate is not evaluated")
        outputs.append(str(out_speed_plot))
    if out_archive_plot:
        if speed:
            plot_control_archive(speed, archive, out_archive_plot)
        else:
            plot_not_run(out_archive_plot, "Control archive", "the speed stage has not run, so no control start "
                                                              "was archived for this audit")
        outputs.append(str(out_archive_plot))
    write_json(out_decision, decision)
    if summary is not None:
        write_json(out_calibration, summary)
        outputs.append(str(out_calibration))
    md = render_markdown(decision, paired, launch, preflight, calibration_summary=summary)
    md += "\n" + "\n".join(calibration_markdown(summary) + ([""] if summary else [])
                           + boundary_markdown(later_docs.get("boundary")) + [""] + speed_markdown(speed) + [""]
                           + ledger_markdown(earlier, spec)) + "\n"
    _atomic_write(Path(out_report), md)
    title = f"pairaudit decision ({audit or 'audit'}): {decision['decision']}"
    if out_html:
        _atomic_write(Path(out_html), markdown_html(md, title=title, verdict=decision["decision"]))
        outputs.append(str(out_html))
    if out_boundary:
        _atomic_write(Path(out_boundary), markdown_html("\n".join(boundary_markdown(later_docs.get("boundary"))),
                                                        title="Boundary cases"))
        outputs.append(str(out_boundary))
    if out_summary:
        _atomic_write(Path(out_summary), summary_rst(decision, earlier, summary))
        outputs.append(str(out_summary))
    write_json(out_manifest, manifest([*inputs, *outputs]))
    if ledger_path:
        append_ledger(ledger_path, ledger_entry(decision, launch, audit=audit, config=config,
                                                decision_path=str(out_decision)))
    if summary is not None and calibrations_path:
        calib.append(calibrations_path, calib.CalibrationEntry(
            time=decision["provenance"].get("created_at"), audit=audit, of_audit=summary["of_audit"],
            control_spec_sha256=summary["control_spec_sha256"], host=summary["host"],
            host_sha256=summary["host_sha256"], decision=summary["decision"], headline=summary["headline"],
            flagged=summary["flagged"], summary_path=str(out_calibration), summary_sha256=sha256_file(out_calibration),
            decision_path=str(out_decision), decision_sha256=sha256_file(out_decision)))
