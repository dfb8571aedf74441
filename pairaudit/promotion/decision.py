"""Promotion decision: the gates from every stage's stored rule result, and promotion-v1 over them.

Pure functions on the artifacts' records (``core.readers``; a JSON dict
given instead is read through its record). The decision itself is
``gates.promotion_v1`` over a fixed set of gates; this module only collects
the gates and keeps the evidence beside them. It never adjusts a score.

Gates (``gates_from`` + ``preflight_gates``), in this order::

    quality:<dataset>      gates.quality_v2, or quality_v1 when configured (stored in
                           paired/<dataset>.json)
    grid_tie               gates.grid_tie_audit over every dataset's grid_tie_v1
                           record (divergence stage): one gate, because the
                           registered cap counts divergent prompts over the audit
    determinism:<dataset>  gates.determinism_v1  (divergence stage; or one
                           gate "determinism" when a single result is given)
    boundary               gates.boundary_v1     (boundary_gate stage; a PASS
                           without the max_model_len - 16 case counts INCONCLUSIVE)
    speed                  gates.win2_v1         (speed_decision stage)
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


decision.json: ``contracts.Decision``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypeVar

from pairaudit import gates
from pairaudit.core.contracts import ARMS, DECISION_SCHEMA, Decision
from pairaudit.core.readers import (
    BoundaryGateDoc,
    DecisionDoc,
    BoundaryResult,
    DeterminismResult,
    GridTieResult,
    LaunchReceipt,
    Paired,
    PooledResult,
    RESULT_RECORDS,
    Preflight,
    QualityResult,
    Record,
    SpeedDecisionDoc,
    Win2V1Result,
    RuleResult,
    as_record,
)

R = TypeVar("R", bound=Record)

# Which registered rules each later gate may carry (gates.REGISTERED, by the gate each decides): a win2
# result handed in as "boundary" would otherwise be judged by the wrong vocabulary.
_EXPECTED_RULE = {kind: gates.rules_of(kind) for kind in ("quality", "grid_tie", "determinism", "boundary", "speed")}


# ------------------------------------------------------------------ gates

def rule_result(res: RuleResult | Mapping[str, Any], where: str = "rule result") -> RuleResult:
    """``res`` through the record of the gate its registered rule decides (``RuleResult`` for another rule)."""
    if isinstance(res, RuleResult):
        return res
    common = RuleResult.from_json(res, where=where)
    spec = gates.REGISTERED[common.rule] if common.rule in gates.REGISTERED else None
    if spec is None:
        return common      # preflight: the decision's own gate, not a registered rule
    kind = "speed-pooled" if spec.decides == "speed" and spec.pooled else spec.decides
    return RESULT_RECORDS[kind].from_json(res, where=where) if kind in RESULT_RECORDS else common


def _check_rule(kind: str, name: str, res: Mapping[str, Any] | None) -> None:
    if res is None:
        return
    if not isinstance(res, Mapping):
        raise ValueError(f"gate {name}: expected a rule result dict, got {type(res).__name__}")
    want = _EXPECTED_RULE[kind]
    rule = rule_result(res, where=f"gate {name}").rule   # its fields checked by its rule's record
    if rule not in want:
        raise ValueError(f"gate {name}: expected a {' or '.join(want)} result, got rule {rule!r}")


def _bounds_a_family(rule: str) -> bool:
    """The registered quality rule ``rule`` bounds each dataset over the audit's family of datasets (it takes
    their number: quality-v2's Bonferroni); ValueError for a rule the registry does not hold."""
    return "datasets" in gates.rule(rule, "quality").takes


def check_quality(name: str, doc: Paired | Mapping[str, Any], datasets: int | None = None) -> dict:
    """The stored quality result of one paired doc, checked against its own table.

    The verdict is recomputed from the table with the rule and parameters the
    paired stage recorded: a hand-edited verdict, or a table edited after the
    rule ran, is an error rather than a quiet PASS. ``datasets``: how many
    datasets the decision judges; a quality-v2 result bounded for another
    family size is an error too (its claim would not hold over this audit).
    """
    paired = as_record(Paired, doc, where=f"paired {name}")
    assert paired is not None
    if paired.dataset != name:
        raise ValueError(f"paired doc keyed {name!r} is for dataset {paired.dataset!r}")
    q = paired.quality
    _check_rule("quality", f"quality:{name}", q.raw)
    table = paired.table.raw
    family = int((q.multiplicity or {"datasets": 1})["datasets"] or 1)
    again = gates.apply_quality(q.rule, table, q.params, datasets=family)
    # after a server failure the paired stage keeps the rule's own verdict as stage_verdict
    stored = {"verdict": q.stage_verdict if paired.arm_failed and q.stage_verdict is not None else q.verdict,
              "control_only": q.control_only, "candidate_only": q.candidate_only}
    for key, value in stored.items():
        if value != again[key]:
            raise ValueError(f"paired {name}: stored quality {key} {q.raw[key]!r} disagrees with "
                             f"{q.rule} recomputed from its table ({again[key]!r})")
    out = q.as_dict()
    if _bounds_a_family(q.rule) and datasets is not None and family != datasets and not paired.arm_failed:
        # The claim must hold over the datasets this decision judges: bounded for another family size
        # (a paired doc made for a different dataset list), the rule is applied again at this one.
        out = gates.apply_quality(q.rule, table, q.params, datasets=datasets)
        out["reasons"] = list(out["reasons"]) + [
            f"the paired stage bounded this dataset for {family} dataset(s); the decision judges {datasets}, so "
            "the rule was applied again at that family size (Bonferroni)"]
    if q.mde is None:
        # A paired doc made before the detectable-loss field: the same rule states it now.
        out["mde"] = again["mde"]
        out["reasons"] = list(out["reasons"]) + [gates.mde_reason(again["mde"])]
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
    """The one audit-wide grid-tie gate from the per-dataset records (gates.grid_tie_audit).

    None (not evaluated) when no dataset has a record; a dataset without one
    makes the audit's grid-tie INCONCLUSIVE, naming it. The per-dataset
    records stay the evidence; the cap and "nothing compared" are the audit's.
    """
    per = {k.split(":", 1)[1]: v for k, v in _per_dataset("grid_tie", divergence, datasets).items()}
    if all(v is None for v in per.values()):
        return None
    return gates.grid_tie_audit(per, counts=counts)


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
    missing = gates.boundary_missing_cases(res)
    if not missing:
        return dict(res)
    b = rule_result(res, where="gate boundary")
    out = {**res, "missing_cases": missing, "stage_verdict": b.verdict}
    why = (f"{b.rule} not applied in full: required case(s) {missing} (max_model_len - 16 input, 16 output) "
           "were not run")
    if b.verdict == "PASS":
        out.update(verdict="INCONCLUSIVE", reasons=[why] + b.reasons)
    else:
        out["reasons"] = b.reasons + [why]
    return out


def gates_from(paired: Mapping[str, Paired | Mapping[str, Any]], *, divergence: Mapping[str, Any] | None = None,
               divergence_counts: Mapping[str, Mapping[str, Any]] | None = None,
               determinism: Any = None, boundary: Mapping[str, Any] | None = None,
               speed: Mapping[str, Any] | None = None) -> dict[str, dict | None]:
    """Every evidence gate, in a fixed order, None where not evaluated.

    paired: dataset -> paired doc (its stored quality result is checked, see
    check_quality). divergence: dataset -> grid_tie_v1 record, combined into
    the one audit-wide gate ``grid_tie`` (grid_tie_gate); divergence_counts:
    dataset -> {"selected", "compared"} for records that lack their own.
    determinism: None, one determinism_v1 result (gate ``determinism``) or
    dataset -> result (gates ``determinism:<dataset>``; the divergence stage
    repeats a greedy request per dataset). boundary: boundary_v1 (see
    boundary_gate). speed: win2_v1.
    """
    datasets = sorted(paired)
    gates: dict[str, dict | None] = {f"quality:{ds}": check_quality(ds, paired[ds], len(datasets))
                                     for ds in datasets}
    gates["grid_tie"] = grid_tie_gate(divergence, datasets, counts=divergence_counts)
    if isinstance(determinism, Mapping) and "rule" not in determinism:
        gates.update(_per_dataset("determinism", determinism, datasets))
    else:
        _check_rule("determinism", "determinism", determinism)
        gates["determinism"] = determinism
    _check_rule("speed", "speed", speed)
    gates["boundary"] = boundary_gate(boundary)
    gates["speed"] = dict(speed) if speed is not None else None
    return gates


def preflight_gates(preflight: Mapping[str, Preflight | Mapping[str, Any] | None]) -> dict[str, dict | None]:
    """``preflight:<arm>`` gates; FAIL enters as INCONCLUSIVE (see module docstring)."""
    out: dict[str, dict | None] = {}
    for arm in ARMS:
        doc = as_record(Preflight, preflight[arm] if arm in preflight else None, where=f"preflight {arm}")
        if doc is None:
            out[f"preflight:{arm}"] = None
            continue
        v = doc.verdict
        if v == "PASS":
            verdict, reasons = "PASS", [f"all {len(doc.probes)} probes passed"]
        else:
            # Anything but an explicit PASS (FAIL, missing, garbled) is not comparable evidence.
            failed = doc.failed_probe
            why = next((p.reason for p in doc.probes if p.name == failed), None)
            verdict = "INCONCLUSIVE"
            reasons = [f"{arm} preflight {v} at probe {failed!r}" + (f": {why}" if why else "")
                       + "; its evidence cannot be compared"]
        out[f"preflight:{arm}"] = {"rule": "preflight", "verdict": verdict, "stage_verdict": v,
                                   "failed_probe": doc.failed_probe, "reasons": reasons}
    return out


def _key_numbers(res: Mapping[str, Any]) -> dict:
    """The few numbers a reader needs beside a gate verdict, per rule (read through the rule's record)."""
    r = rule_result(res, where=f"gate result {res['rule'] if 'rule' in res else ''}".strip())
    if isinstance(r, QualityResult):
        return {"n": r.n, "control_correct": r.control_correct, "candidate_correct": r.candidate_correct,
                "control_only": r.control_only, "candidate_only": r.candidate_only, "net": r.net,
                "mcnemar_p": r.mcnemar_p, "params": r.params, "mde": r.mde, "loss_bound": r.loss_bound,
                "multiplicity": r.multiplicity, "needed": r.needed}
    if isinstance(r, GridTieResult):
        return {"scope": r.scope, "n_divergent": r.n_divergent, "selected": r.selected, "compared": r.compared,
                "max_divergent": r.params.get("max_divergent"), "failed_clauses": r.failed_clauses,
                "unevaluated_clauses": r.unevaluated_clauses, "not_evaluated_datasets": r.not_evaluated_datasets,
                "counts_unrecorded_datasets": r.counts_unrecorded_datasets, "datasets": r.datasets,
                "probe_verdicts": {(f"{p.dataset}:" if p.dataset else "") + str(p.index): p.verdict
                                   for p in r.probes}}
    if isinstance(r, DeterminismResult):
        return {"nondeterministic_arms": r.nondeterministic_arms,
                "repeats": {a: v.get("repeats") for a, v in r.arms.items()}}
    if isinstance(r, BoundaryResult):
        return {"stage_verdict": r.stage_verdict, "missing_cases": r.missing_cases,
                "candidate_cases": r.candidate_cases,
                "candidate_failures": [f.get("case") for f in r.candidate_failures],
                "control_failures": [f.get("case") for f in r.control_failures],
                "identical_text_cases": r.identical_text_cases}
    if isinstance(r, Win2V1Result):
        prim = r.primary
        return {"primary": r.params.get("primary"), "repeats": r.repeats,
                "point_gain_pct": prim.get("point_gain_pct"), "t_interval": prim.get("t_interval"),
                "win_pct": prim.get("win_pct"), "max_control_spread_pct": prim.get("max_control_spread_pct"),
                "guard_verdicts": {g: v.get("guard_verdict") for g, v in r.guards.items()}}
    if isinstance(r, PooledResult):
        return {"primary": r.params.get("primary"), "repeats": r.repeats, "starts": r.starts,
                "point_gain_pct": r.pooled_gain_pct, "lower_bound_pct": r.lower_bound_pct,
                "half_width_pct": r.half_width_pct, "win_pct": r.params.get("win_pct"),
                "noise": r.noise, "rates": r.rates, "needed": r.needed,
                "stage_deviations": r.stage_deviations if "stage_deviations" in r.raw else None}
    if r.rule == "preflight":
        return {"stage_verdict": r.stage_verdict, "failed_probe": res["failed_probe"]}
    return {}


# --------------------------------------------------------------- decision

def env_diff(control_env: Mapping[str, Any], candidate_env: Mapping[str, Any]) -> list[dict]:
    """Switches whose value differs between arms; None = that arm does not set it (server default)."""
    names = sorted(set(control_env) | set(candidate_env))
    return [{"name": k, "control": control_env.get(k), "candidate": candidate_env.get(k)}
            for k in names if control_env.get(k) != candidate_env.get(k)]


def _arm_summary(rec: LaunchReceipt, pre: Preflight | None) -> dict:
    out = {"mode": rec.mode, "spec_sha256": rec.spec_sha256, "env": rec.env, "command": rec.command,
           "command_identity": rec.command_identity, "model": rec.model, "served_model_name": rec.served_model_name,
           "model_sha256": rec.model_sha256, "max_model_len": rec.max_model_len, "url": rec.url,
           "speculative": rec.speculative, "packages": rec.packages, "server_packages": rec.server_packages,
           "machine": rec.machine}
    # what the server itself reported at launch (/version, the /v1/models card)
    server = rec.server or {}
    out["server_version"] = server.get("version")
    out["server_model_root"] = server.get("root")
    out["preflight"] = None if pre is None else pre.verdict
    return out


def _comparability_notes(arms: Mapping[str, dict]) -> list[str]:
    """Facts about the two arms that a reader must see; they do not decide (no registered rule)."""
    c, k = arms["control"], arms["candidate"]
    notes = []
    for key, what in (("model", "model"), ("model_sha256", "model sha256"),
                      ("max_model_len", "max_model_len"), ("server_version", "server version (/version)"),
                      ("server_model_root", "served model root (/v1/models)")):
        if c[key] != k[key]:
            notes.append(f"{what} differs between arms: control {c[key]!r}, candidate {k[key]!r}")
    if c["spec_sha256"] and c["spec_sha256"] == k["spec_sha256"]:
        notes.append("control and candidate have the same spec_sha256: the arms are the same server spec, "
                     "so this audit compares a configuration with itself")
    if (c["machine"] or {}).get("hostname") != (k["machine"] or {}).get("hostname"):
        notes.append("the arms' launch receipts come from different hosts")
    return notes


def identical_arms(arms: Mapping[str, Mapping[str, Any]]) -> bool:
    """Both arms are the same server spec: no change is under audit."""
    c, k = arms["control"]["spec_sha256"], arms["candidate"]["spec_sha256"]
    return bool(c) and c == k


def decision_deviations(results: Mapping[str, Mapping[str, Any] | None], *, calibration: bool = False,
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
    for name, res in results.items():
        if res is None:
            out.append({"gate": name, "what": "not evaluated",
                        "detail": "its stage did not run or is disabled: the gate was not applied, so the "
                                  "decision cannot be PROMOTE"})
            continue
        r = rule_result(res, where=f"gate {name}")
        for k, d in r.deviations.items():
            detail = (f"used {d.get('used')!r}, registered {d.get('registered')!r}" if isinstance(d, Mapping)
                      else repr(d))
            out.append({"gate": name, "what": f"parameter {k}", "detail": detail})
        if name.startswith("quality:") and r.rule != gates.QUALITY_RULES[0]:
            out.append({"gate": name, "what": "rule",
                        "detail": f"rules.quality.rule {r.rule} instead of the default {gates.QUALITY_RULES[0]} "
                                  f"({gates.rule(r.rule, 'quality').need('why_not')})"})
        if r.informational is True:
            out.append({"gate": name, "what": "informational",
                        "detail": f"configured informational (speed.informational: true): only a LOSS of this "
                                  f"gate gates the decision; its verdict {r.verdict} neither allowed nor "
                                  "blocked PROMOTE"})
        if r.not_evaluated_datasets:
            out.append({"gate": name, "what": "datasets not evaluated",
                        "detail": f"no record for datasets {r.not_evaluated_datasets}"})
        if r.counts_unrecorded_datasets:
            out.append({"gate": name, "what": "comparison counts not recorded",
                        "detail": f"selected/compared counts missing for datasets {r.counts_unrecorded_datasets}"})
        # a stage's own loosenings (e.g. the speed bracket's accepted unverifiable clock), as it listed them
        for d in r.stage_deviations:
            out.append({"gate": name, "what": str(d.get("what")), "detail": str(d.get("detail"))})
        if r.missing_cases:
            out.append({"gate": name, "what": "required cases missing",
                        "detail": f"cases {r.missing_cases} were not run (the stage said "
                                  f"{r.stage_verdict}); counted as {r.verdict}"})
    if calibration:
        out.append({"gate": "promotion", "what": "calibration",
                    "detail": "decided in A/A calibration mode: identical arms are decided by their gates (what "
                              "they flag is false-alarm evidence), not made INCONCLUSIVE"})
    elif no_change:
        out.append({"gate": "promotion", "what": gates.NO_CHANGE,
                    "detail": "identical arms: the decision is INCONCLUSIVE whatever the gates say"})
    return out


def _dataset_summary(doc: Paired, gate: Mapping[str, Any] | None = None) -> dict:
    """One dataset's line of decision.json: the table's counts and the quality gate as the decision applied it."""
    t = doc.table
    q = doc.quality if gate is None else rule_result(gate, where=f"gate quality:{doc.dataset}")
    assert isinstance(q, QualityResult)
    return {"format": doc.format, "n": t.n, "indices": t.indices, "rule": q.rule,
            "loss_bound": q.loss_bound, "needed": (q.needed or {}).get("items"),
            "control_correct": t.control_correct, "candidate_correct": t.candidate_correct,
            "control_only": t.control_only, "candidate_only": t.candidate_only,
            "net": t.net, "mcnemar_p": q.mcnemar_p,
            "exact_text_matches": t.exact_text_matches, "natural_finish": t.natural_finish,
            "bodies_identical": t.bodies_identical, "verdict": q.verdict,
            "mde": q.mde, "bootstrap": doc.bootstrap}


def multiplicity(results: Mapping[str, Mapping[str, Any] | None]) -> dict | None:
    """How the quality gates' claims hold together over the audit's datasets (decision.json ``multiplicity``).

    quality-v2 bounds each of D datasets at 1 - (1 - level) / D (Bonferroni),
    so "no dataset loses the margin or more" holds at ``level`` for the audit,
    not only per dataset. quality-v1 makes no such claim (None for it). The
    FAIL clause (McNemar at alpha per dataset) is not adjusted: an audit of D
    datasets rejects a harmless change more often than alpha, never less.
    """
    qs = [q for n, r in results.items() if n.startswith("quality:") and r is not None
          for q in [rule_result(r, where=f"gate {n}")]
          if isinstance(q, QualityResult) and _bounds_a_family(q.rule)]
    if not qs:
        return None
    m = qs[0].multiplicity
    if m is None:
        raise ValueError(f"a {qs[0].rule} result without its multiplicity: {qs[0].reasons[:1]}")
    return {"gates": "quality", "method": m["method"], "datasets": m["datasets"],
            "family_level": m["family_level"], "per_dataset_level": m["per_dataset_level"],
            "statement": (f"each dataset's loss bound is at {100 * m['per_dataset_level']:.4g} % (Bonferroni "
                          f"over {m['datasets']} dataset(s)), so every ruled-out loss holds together at "
                          f"{100 * m['family_level']:.4g} %; the McNemar FAIL clause is per dataset, "
                          "unadjusted")}


def decide(paired: Mapping[str, Paired | Mapping[str, Any]], launch: Mapping[str, LaunchReceipt | Mapping[str, Any]],
           preflight: Mapping[str, Preflight | Mapping[str, Any] | None], *, calibration: bool = False,
           **later: Any) -> Decision:
    """decision.json (schema in the module docstring and ``contracts.Decision``) by promotion-v1.

    paired: dataset -> paired doc; launch: arm -> launch record (both arms
    required: evidence without a receipt has no server to attribute it to);
    preflight: arm -> preflight doc (a missing arm is a None gate); each a
    record (``core.readers``) or its JSON dict, read through the record.
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
    papers = {ds: _record(Paired, doc, f"paired {ds}") for ds, doc in paired.items()}
    receipts = {a: _record(LaunchReceipt, launch[a], f"launch {a}") for a in ARMS}
    rehearsals = {a: as_record(Preflight, preflight[a] if a in preflight else None, where=f"preflight {a}")
                  for a in ARMS}
    servers = later.pop("servers", None)
    # named apart from the gates module, whose rules decide over them
    results = gates_from(papers, **later)
    if servers is not None:
        results["servers"] = servers
    results.update(preflight_gates(rehearsals))
    arms = {a: _arm_summary(receipts[a], rehearsals[a]) for a in ARMS}
    same = identical_arms(arms)
    prom = gates.default_rule("promotion").apply(results, identical_arms=same and not calibration)

    gate_docs: dict[str, dict | None] = {}
    for name, res in results.items():
        if res is None:
            gate_docs[name] = None
            continue
        r = rule_result(res, where=f"gate {name}")
        gate_docs[name] = {"rule": r.rule, "verdict": r.verdict, "outcome": prom["gates"][name]["outcome"],
                           "reasons": list(r.reasons), "deviations": r.deviations, **_key_numbers(res)}
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
        "deviations": decision_deviations(results, calibration=calibration, no_change=prom["no_change"]),
        "gates": gate_docs,
        "not_evaluated": prom["not_evaluated"],
        "multiplicity": multiplicity(results),
        "datasets": {ds: _dataset_summary(papers[ds], results[f"quality:{ds}"]) for ds in sorted(papers)},
        "arms": arms,
        "switch_diff": env_diff(arms["control"]["env"] or {}, arms["candidate"]["env"] or {}),
        "notes": _comparability_notes(arms),
        "preflight": {a: arms[a]["preflight"] for a in ARMS},
    }


def _record(cls: type[R], doc: R | Mapping[str, Any], where: str) -> R:
    out = as_record(cls, doc, where=where)
    assert out is not None
    return out


def speed_primary(doc: SpeedDecisionDoc | Mapping[str, Any]) -> str | None:
    speed = as_record(SpeedDecisionDoc, doc, where="speed decision")
    return None if speed is None else speed.primary


_BOUNDARY_SIDE = ("text", "extracted", "correct", "finish_reason", "prompt_tokens", "max_tokens", "ttft_s",
                  "input_tokens_per_s", "config_error")


def boundary_evidence(doc: BoundaryGateDoc | Mapping[str, Any] | None) -> list[dict] | None:
    """Every boundary case for decision.json: planted values and, per arm, answer, finish reason, TTFT."""
    b = as_record(BoundaryGateDoc, doc, where="boundary gate")
    if b is None:
        return None
    return [{"case": c.case, "planted": c.planted, "expected": c.expected, "identical_text": c.identical_text,
             **{arm: (None if side is None else {k: getattr(side, k) for k in _BOUNDARY_SIDE})
                for arm, side in (("control", c.control), ("candidate", c.candidate))}}
            for c in b.cases]


def speed_evidence(doc: SpeedDecisionDoc | Mapping[str, Any] | None) -> dict | None:
    """The speed table for decision.json: per cell its verdict and the primary metric's s1/s2/s3 per repeat."""
    speed = as_record(SpeedDecisionDoc, doc, where="speed decision")
    if speed is None:
        return None
    primary = speed.primary
    win2 = speed.win2 or {}
    cells = {}
    for cell, metrics in (speed.series or {}).items():
        w = win2[cell] if cell in win2 else None
        prim = {} if w is None else w.primary
        cells[cell] = {"verdict": None if w is None else w.verdict,
                       "repeats_s1_s2_s3": metrics[primary] if primary in metrics else None,
                       "point_gain_pct": prim.get("point_gain_pct"), "t_interval": prim.get("t_interval"),
                       "max_control_spread_pct": prim.get("max_control_spread_pct")}
    return {"primary": primary, "win_pct": speed.win_pct, "hosts": speed.hosts, "cells": cells}


# The decision rules a decision.json may name (gates.REGISTERED, the "promotion" gate), by the name it
# records: the word it states must be what its rule makes of the gates it holds.
DECISION_RULES = gates.rules_of("promotion")


class DecisionMismatch(ValueError):
    """A decision.json whose decision word does not follow from its own gates (the message names both)."""

    def __init__(self, message: str, *, stated: Any = None, derived: Any = None):
        super().__init__(message)
        self.stated, self.derived = stated, derived


def rederive(decision: DecisionDoc | Mapping[str, Any]) -> dict:
    """What the rule ``decision`` names makes of the gates it holds.

    Each gate enters as it was decided: its verdict, its rule, and whether
    it counted as informational (its recorded outcome says so, and only a
    non-REJECT outcome can be one). Identical arms outside calibration make
    the decision INCONCLUSIVE, as at decision time. Returns the rule's
    result; ``DecisionMismatch`` when the rule is not a registered one.
    """
    doc = as_record(DecisionDoc, decision, where="decision")
    assert doc is not None
    if doc.rule not in DECISION_RULES:
        raise DecisionMismatch(f"decision rule {doc.rule!r} is not a registered decision rule "
                               f"({', '.join(DECISION_RULES)}): its decision cannot be checked", stated=doc.decision)
    entered: dict[str, Mapping[str, Any] | None] = {
        name: None if g is None else {"verdict": g.verdict, "rule": g.rule,
                                      "informational": g.outcome == "INFORMATIONAL", "reasons": list(g.reasons)}
        for name, g in doc.gates.items()}
    same = doc.identical_arms is True and doc.calibration is not True
    return gates.rule(doc.rule, "promotion").apply(entered, identical_arms=same)


def check_decision_word(decision: DecisionDoc | Mapping[str, Any]) -> dict:
    """Refuse (``DecisionMismatch``) a decision word, or a gate outcome, its own gates do not give.

    Returns the re-derived result when the stated decision, the stated
    ``gate_verdict`` (where recorded) and every gate's stated outcome agree
    with what the named rule makes of the gates.
    """
    derived = rederive(decision)
    doc = as_record(DecisionDoc, decision, where="decision")
    assert doc is not None
    stated = doc.decision
    problems = []
    if stated != derived["verdict"]:
        problems.append(f"it states {stated} but its gates under {doc.rule} give {derived['verdict']}")
    if "gate_verdict" in doc.raw and doc.gate_verdict != derived["gate_verdict"]:
        problems.append(f"its gate_verdict is {doc.gate_verdict} but its gates give {derived['gate_verdict']}")
    for name, g in doc.gates.items():
        if g is not None and g.outcome != derived["gates"][name]["outcome"]:
            problems.append(f"gate {name} states the outcome {g.outcome} but its verdict "
                            f"{g.verdict} gives {derived['gates'][name]['outcome']}")
    if problems:
        raise DecisionMismatch("the decision does not follow from its gates: " + "; ".join(problems),
                               stated=stated, derived=derived["verdict"])
    return derived
