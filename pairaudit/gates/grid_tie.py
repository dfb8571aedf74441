"""grid-tie-v1: every greedy divergence must be a tie on the BF16 logit grid -> PASS | STOP | INCONCLUSIVE.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from pairaudit.gates.common import registered_params

GRID_TIE_V1 = {"max_divergent": 3}


GRID_TIE_REGISTRATION = "pp4-r12-logit-grid-tie"


PROBE_CLAUSES = (
    "finite_values",
    "full_top_list",
    "unrounded_fp32",
    "candidate_token_is_top",
    "both_tokens_present",
    "grid_step_power_of_two",
    "all_gaps_on_grid",
    "gap_within_one_step",
    "equal_prefix_lengths",
)


COUNT_CLAUSE = "at_most_3_divergent"


TOP_N = 20  # the top-k the greedy stage requests (vLLM's max_logprobs)


ROUNDED_DECIMALS = 4  # the decimal rounding of the evidence the registration rejects


EPS32 = 2.0 ** -23  # FP32 machine epsilon; ulp(x) <= EPS32 * |x| for normal x


FP32_TOL_FACTOR = 1.0


CLAMP_FLOOR = -9999.0  # vLLM clamps -inf logprobs to -9999.0


RESIDUAL_COLUMNS = ["token_a", "token_b", "gap", "multiple", "residual", "tolerance"]


def fp32_gap_tolerance(a: float, b: float) -> float:
    """FP32 error bound for the gap a - b of two served FP32 logprobs.

    Derivation. A served logprob is l_i = fl32(z_i - C): the head logit z_i
    (already on the BF16 grid when the head is BF16) minus a log-partition C
    that is common to every token of the row. The error of C is common, so it
    cancels exactly in l_a - l_b; what remains is each value's own final
    rounding, at most ulp(l)/2 each. We subtract in float64, where the
    difference of two FP32 numbers is exact, so

        |(l_a - l_b) - (z_a - z_b)| <= (ulp(a) + ulp(b)) / 2.

    A consumer that subtracts in FP32 adds ulp(a - b)/2 <= ulp(max|.|)/2
    (both logprobs are <= 0, so |a - b| <= max(|a|, |b|)). Bounding each ulp
    by EPS32*|x| gives the registered tolerance

        tol(a, b) = 1 * EPS32 * (|a| + |b|)   ( >= ulp(a) + ulp(b) ),

    i.e. about twice the single-rounding bound: enough for the observed
    0.5000000596 (= 0.5 + 2^-24) representation of a 0.5 gap, and six orders
    of magnitude below a 1e-3 off-grid offset. The tolerance depends only on
    the two values compared, never on the divergence margin or on the
    residuals found, so it cannot be widened to rescue a set.
    """
    return FP32_TOL_FACTOR * EPS32 * (abs(a) + abs(b))


def _check_top(top: Any, name: str) -> list[str]:
    bad: list[str] = []
    if not isinstance(top, list) or not top:
        return [f"{name} must be a non-empty list of [token_id, logprob]"]
    if len(top) > 20:
        bad.append(f"{name} has {len(top)} entries (> 20)")
    seen = set()
    for e in top:
        if not isinstance(e, (list, tuple)) or len(e) != 2:
            bad.append(f"{name} entry {e!r} is not [token_id, logprob]")
            continue
        tid, v = e
        if isinstance(tid, bool) or not isinstance(tid, int):
            bad.append(f"{name} token id {tid!r} is not an int")
        elif tid in seen:
            bad.append(f"{name} repeats token id {tid}")
        seen.add(tid)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            bad.append(f"{name} value {v!r} for token {tid} is not a number")
        elif not math.isfinite(v):
            bad.append(f"{name} value for token {tid} is nonfinite ({v})")
        elif v <= CLAMP_FLOOR:
            bad.append(f"{name} value for token {tid} is clamped ({v})")
        elif v > 0:
            bad.append(f"{name} value for token {tid} is positive ({v}), not a logprob")
    return bad


def _validate_probe(p: Mapping[str, Any]) -> list[str]:
    bad: list[str] = []
    for k in ("control_token_id", "candidate_token_id", "control_prefix_len", "candidate_prefix_len"):
        v = p.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            bad.append(f"{k} must be a non-negative int, got {v!r}")
    if not bad and p["control_token_id"] == p["candidate_token_id"]:
        bad.append("control and candidate token ids are equal: not a divergence")
    bad += _check_top(p.get("candidate_top"), "candidate_top")
    bad += _check_top(p.get("control_top"), "control_top")
    return bad


def required_top_len(probe: Mapping[str, Any]) -> int:
    """Entries a full top list has: the 20 requested, or the whole vocabulary when it is smaller."""
    v = probe.get("vocab_size")
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return min(TOP_N, v)
    return TOP_N


def is_fp32(v: float) -> bool:
    """v is exactly a float32 value (JSON carries served FP32 logprobs exactly)."""
    return float(np.float32(v)) == v


def at_decimals(v: float, places: int = ROUNDED_DECIMALS) -> bool:
    """v is what rounding to ``places`` decimals leaves, kept as float64 or cast back to float32.

    A served FP32 logprob is z - C with a log-partition C of no short decimal
    form. Of the FP32 values within 1e-4 of a 4-decimal number only the
    nearest one passes, so a value of magnitude below 16 (the top of any
    list is above -ln(vocabulary), about -11) passes by chance about once in
    a hundred, and a whole list essentially never; rounded evidence always
    does. (Below -1024 FP32 spacing exceeds 1e-4 and every value passes,
    which is why the clause asks it of every value of the list.)
    """
    r = round(v, places)
    return float(r) == v or float(np.float32(r)) == v


def _top_list_facts(top: Sequence[Sequence[Any]]) -> dict:
    vals = [float(v) for _, v in top]
    return {"n": len(vals),
            "not_fp32": [int(t) for t, v in top if not is_fp32(float(v))],
            "all_at_4_decimals": bool(vals) and all(at_decimals(v) for v in vals)}


def _evidence_clauses(probe: Mapping[str, Any], rec: dict, clauses: dict, reasons: list[str]) -> None:
    """full_top_list and unrounded_fp32 over both top lists (well formed by now)."""
    need = required_top_len(probe)
    rec["required_top_len"] = need
    facts = {name: _top_list_facts(probe[name]) for name in ("candidate_top", "control_top")}
    short = {name: f["n"] for name, f in facts.items() if f["n"] < need}
    clauses["full_top_list"] = not short
    for name, n in short.items():
        reasons.append(f"full_top_list: {name} has {n} entries, fewer than the {need} requested: sparse "
                       "evidence (the all-pairs grid check needs every entry)")
    rec["all_values_fp32_exact"] = not facts["candidate_top"]["not_fp32"]
    rec["control_values_fp32_exact"] = not facts["control_top"]["not_fp32"]
    rec["rounded_lists"] = [name for name, f in facts.items() if f["all_at_4_decimals"]]
    bad = []
    for name, f in facts.items():
        if f["not_fp32"]:
            bad.append(f"{name} values of tokens {f['not_fp32'][:5]}"
                       + (f" and {len(f['not_fp32']) - 5} more" if len(f["not_fp32"]) > 5 else "")
                       + " are not FP32-exact (served FP32 logprobs survive JSON exactly)")
        if f["all_at_4_decimals"]:
            bad.append(f"{name}: every value is representable at {ROUNDED_DECIMALS} decimals: rounded evidence")
    clauses["unrounded_fp32"] = not bad
    reasons += [f"unrounded_fp32: {b}; rounded artifacts cannot pass" for b in bad]


def _nearest_power_of_two(g: float) -> int:
    lo = math.floor(math.log2(g))
    return min((lo, lo + 1), key=lambda k: abs(g - 2.0 ** k))


def grid_tie_probe(probe: Mapping[str, Any]) -> dict:
    """Evaluate one divergent greedy prompt under grid-tie-v1 (see grid_tie_v1).

    Clause values are True (passes), False (fails) or None (cannot be
    evaluated because an earlier fact is missing); only all-True passes.
    """
    rec: dict[str, Any] = {
        "index": probe.get("index"),
        "control_token_id": probe.get("control_token_id"),
        "candidate_token_id": probe.get("candidate_token_id"),
        "control_prefix_len": probe.get("control_prefix_len"),
        "candidate_prefix_len": probe.get("candidate_prefix_len"),
        "candidate_top": probe.get("candidate_top"),
        "control_top": probe.get("control_top"),
        "vocab_size": probe.get("vocab_size"),
    }
    clauses: dict[str, bool | None] = dict.fromkeys(PROBE_CLAUSES)
    reasons: list[str] = []
    bad = _validate_probe(probe)
    clauses["finite_values"] = not bad
    if bad:
        reasons += [f"finite_values: {b}" for b in bad]
        reasons.append("other clauses not evaluated on malformed evidence")
        return _finish_probe(rec, clauses, reasons)

    # Sparse or rounded evidence STOPs, but the other clauses are still
    # evaluated and recorded: a reader sees everything the record shows.
    _evidence_clauses(probe, rec, clauses, reasons)
    cand_id, ctrl_id = probe["candidate_token_id"], probe["control_token_id"]
    ids = [int(t) for t, _ in probe["candidate_top"]]
    vals = [float(v) for _, v in probe["candidate_top"]]
    value = dict(zip(ids, vals))
    top_value = max(vals)
    rec["n_candidate_top"] = len(ids)
    rec["n_control_top"] = len(probe["control_top"])
    rec["top_value"] = top_value
    rec["top_token_ids"] = [t for t, v in zip(ids, vals) if v == top_value]
    rec["candidate_token_value"] = value.get(cand_id)
    rec["control_token_value"] = value.get(ctrl_id)

    # Exact equality: log-softmax is monotone under rounding, so the greedy
    # argmax always carries the maximal served value; a tie is allowed.
    clauses["candidate_token_is_top"] = cand_id in value and value[cand_id] == top_value
    if not clauses["candidate_token_is_top"]:
        reasons.append(
            "candidate_token_is_top: candidate token "
            + (f"{cand_id} has {value[cand_id]!r} < top {top_value!r}" if cand_id in value
               else f"{cand_id} is absent from its own top-{len(ids)}"))
    missing = [t for t in (cand_id, ctrl_id) if t not in value]
    clauses["both_tokens_present"] = not missing
    if missing:
        reasons.append(f"both_tokens_present: token(s) {missing} absent from the candidate top-{len(ids)}")
    clauses["equal_prefix_lengths"] = probe["control_prefix_len"] == probe["candidate_prefix_len"]
    if not clauses["equal_prefix_lengths"]:
        reasons.append(f"equal_prefix_lengths: control {probe['control_prefix_len']} "
                       f"!= candidate {probe['candidate_prefix_len']} tokens")

    # All pairwise gaps, exact in float64, each with its own FP32 tolerance.
    pairs = []
    for i in range(len(vals)):
        for j in range(i + 1, len(vals)):
            a, b = vals[i], vals[j]
            pairs.append((ids[i], ids[j], abs(a - b), fp32_gap_tolerance(a, b)))
    max_tol = max((t for *_, t in pairs), default=0.0)
    rec["max_tolerance"] = max_tol
    # A gap within FP32 error of zero is a tie, not a step: taking it as the
    # step would be exactly the fine-GCD rescue the rule forbids.
    positive = [p for p in pairs if p[2] > p[3]]
    step = None
    rec.update(min_positive_gap=None, min_gap_pair=None, step_tolerance=None,
               step=None, step_exponent=None)
    if not positive:
        clauses["grid_step_power_of_two"] = False
        reasons.append("grid_step_power_of_two: no positive gap (all values equal within FP32 "
                       "error); no grid is inferred from an all-equal set")
    else:
        ta, tb, g, gtol = min(positive, key=lambda p: p[2])
        k = _nearest_power_of_two(g)
        rec.update(min_positive_gap=g, min_gap_pair=[ta, tb], step_tolerance=gtol,
                   step_exponent=k, step_residual=g - 2.0 ** k)
        is_pow2 = abs(g - 2.0 ** k) <= gtol
        # A step inside the FP32 noise would make every gap "on grid":
        # demand it stand clear of twice the largest tolerance.
        resolvable = 2.0 ** k > 2.0 * max_tol
        rec["step_resolvable"] = resolvable
        if is_pow2:
            # Use the exact power of two from here on: the measured gap only
            # identified it, so no step error accumulates over multiples.
            step = 2.0 ** k
            rec["step"] = step
        clauses["grid_step_power_of_two"] = is_pow2 and k <= 0 and resolvable
        if not is_pow2:
            reasons.append(f"grid_step_power_of_two: smallest positive gap {g!r} (tokens {ta},{tb}) "
                           f"is not a power of two within {gtol:.3g} (nearest 2^{k})")
        elif k > 0:
            reasons.append(f"grid_step_power_of_two: step 2^{k} = {2.0 ** k} exceeds 1")
        elif not resolvable:
            reasons.append(f"grid_step_power_of_two: step 2^{k} is not resolvable above "
                           f"FP32 error {max_tol:.3g}")

    residuals = []
    if step is None:
        reasons.append("all_gaps_on_grid: not evaluated without a power-of-two step")
        rec.update(residuals=None, max_residual=None, worst_pair=None)
    else:
        worst, worst_ratio = None, -1.0
        for ta, tb, g, tol in pairs:
            n = round(g / step)
            r = g - n * step
            residuals.append([ta, tb, g, n, r, tol])
            ratio = abs(r) / tol if tol > 0 else (math.inf if r != 0 else 0.0)
            if ratio > worst_ratio:
                worst, worst_ratio = residuals[-1], ratio
        off = [r for r in residuals if abs(r[4]) > r[5]]
        clauses["all_gaps_on_grid"] = not off
        rec.update(residuals=residuals, max_residual=max(abs(r[4]) for r in residuals) if residuals else 0.0,
                   worst_pair=dict(zip(RESIDUAL_COLUMNS, worst)) if worst else None,
                   n_off_grid_pairs=len(off))
        if off and worst is not None:
            w = worst
            reasons.append(f"all_gaps_on_grid: {len(off)} of {len(residuals)} gaps off the 2^{rec['step_exponent']} "
                           f"grid; worst tokens {w[0]},{w[1]} gap {w[2]!r} residual {w[4]:.3g} > tol {w[5]:.3g}")
    rec["residual_columns"] = RESIDUAL_COLUMNS

    # The compared gap: candidate top value minus the control's token value,
    # both read from the candidate's own top-20.
    rec["gap"] = rec["gap_tolerance"] = None
    rec["candidate_to_top_gap"] = (top_value - value[cand_id]) if cand_id in value else None
    if ctrl_id in value:
        gap = top_value - value[ctrl_id]
        gtol = fp32_gap_tolerance(top_value, value[ctrl_id])
        rec["gap"], rec["gap_tolerance"] = gap, gtol
        if step is not None:
            rec["gap_in_steps"] = gap / step
            clauses["gap_within_one_step"] = gap <= step + gtol
            if not clauses["gap_within_one_step"]:
                reasons.append(f"gap_within_one_step: gap {gap!r} = {gap / step:.4g} steps of {step} "
                               f"(> 1 step + {gtol:.3g})")
        else:
            reasons.append("gap_within_one_step: not evaluated without a step")
    else:
        reasons.append(f"gap_within_one_step: not evaluated, control token {ctrl_id} absent")
    return _finish_probe(rec, clauses, reasons)


def _finish_probe(rec: dict, clauses: dict, reasons: list[str]) -> dict:
    failed = [c for c in PROBE_CLAUSES if clauses[c] is False]
    unevaluated = [c for c in PROBE_CLAUSES if clauses[c] is None]
    rec.update(clauses=clauses, failed_clauses=failed, unevaluated_clauses=unevaluated,
               verdict="PASS" if all(clauses[c] is True for c in PROBE_CLAUSES) else "STOP",
               reasons=reasons)
    return rec


PROBE_INPUT_KEYS = ("index", "control_token_id", "candidate_token_id", "candidate_top", "control_top",
                    "control_prefix_len", "candidate_prefix_len", "vocab_size")


def _count(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {v!r}")
    return v


def _check_counts(selected: int | None, compared: int | None, n_probes: int) -> None:
    if selected is not None and compared is not None and compared > selected:
        raise ValueError(f"compared {compared} > selected {selected}")
    if selected is not None and n_probes > selected:
        raise ValueError(f"{n_probes} divergent prompts but only {selected} items selected")


def grid_tie_v1(probes: Sequence[Mapping[str, Any]], *, max_divergent: int = 3,
                selected: int | None = None, compared: int | None = None) -> dict:
    """grid-tie-v1 (registered as "pp4-r12-logit-grid-tie") over one dataset's divergences.

    This is the per-dataset record; the decision applies the rule over the
    whole audit with :func:`grid_tie_audit` (the divergent-prompt cap counts
    every dataset together). One probe record per divergent greedy prompt::

        {"index": int, "control_token_id": int, "candidate_token_id": int,
         "candidate_top": [[token_id, logprob], ...],   # 20, unrounded FP32
         "control_top":   [[token_id, logprob], ...],
         "control_prefix_len": int, "candidate_prefix_len": int,
         "vocab_size": int (optional; a vocabulary under 20 needs only that many entries)}

    selected / compared: how many items the greedy selection held and how
    many of them both arms' greedy outputs were compared on (an item whose
    greedy run failed is not compared; it is a probe with no evidence and
    STOPs). Unknown counts are None.

    Per probe (clause names as recorded):

    - finite_values: both top lists well formed (<= 20 [int, number] pairs,
      unique ids), every value finite, > -9999 (the server's -inf clamp) and
      <= 0; token ids and prefix lengths non-negative ints; the two compared
      ids differ. Malformed evidence stops before anything else is computed.
    - full_top_list: both top lists have the 20 entries requested (or the
      whole vocabulary, when ``vocab_size`` says it is smaller). A shorter
      list is sparse evidence: the all-pairs clause would have almost nothing
      to check (a 2-entry list has one gap).
    - unrounded_fp32: every value of both lists is FP32-exact, and no list
      is entirely representable at 4 decimals: the registration demands
      unrounded values, so rounded artifacts cannot pass (a BF16 top-20
      rounded to 4 decimals keeps its 0.5 gaps and would pass every other
      clause).
    - candidate_token_is_top: the candidate's token carries the maximal value
      of the candidate's own top list (exact; ties allowed).
    - both_tokens_present: both compared ids are in the candidate top list.
    - grid_step_power_of_two: the smallest positive pairwise gap (a gap within
      FP32 tolerance of 0 is a tie) equals 2^k within its pair's FP32
      tolerance, k <= 0, and 2^k exceeds twice the largest pairwise tolerance
      (otherwise the grid test would be vacuous). No positive gap -> fails:
      no grid is inferred from an all-equal set.
    - all_gaps_on_grid: every pairwise gap is an integer multiple of the
      exact 2^k within that pair's tolerance. No finer common divisor is ever
      searched for.
    - gap_within_one_step: top value minus the control token's value (both
      from the candidate top list) <= 2^k + tolerance.
    - equal_prefix_lengths: the forced prefixes have equal token counts.

    Dataset level: at_most_3_divergent (len(probes) <= max_divergent; the
    audit applies the same cap to all datasets together). Verdict: STOP on
    any failed clause; else INCONCLUSIVE when nothing was compared
    (compared == 0, or no probe and no counts given: zero divergences shown
    on zero comparisons is not evidence); else PASS.

    Tolerance: see fp32_gap_tolerance. Mixed-binade evidence: the step is the
    finest gap observed across the whole list, so values from a coarser
    binade are checked against the finer step (they are multiples of it and
    pass) while a lone value from a finer binade whose gaps are odd multiples
    of a half coarse step is off the observed grid and STOPs; a control token
    one coarse step below the top counts as two fine steps and STOPs. This is
    the conservative direction the registration allows ("sparse or
    mixed-binade evidence may conservatively STOP").
    """
    params, dev, reasons = registered_params({"max_divergent": max_divergent}, GRID_TIE_V1)
    selected, compared = _count("selected", selected), _count("compared", compared)
    _check_counts(selected, compared, len(probes))
    idx = [p.get("index") for p in probes]
    dup = sorted({i for i in idx if idx.count(i) > 1}, key=repr)
    if dup:
        raise ValueError(f"duplicate probe indices {dup}")
    results = [grid_tie_probe(p) for p in probes]
    count_ok = len(probes) <= max_divergent
    failed, unevaluated = _collect_probe_failures(results, reasons, prefix="")
    if not count_ok:
        failed.append(COUNT_CLAUSE)
        reasons.append(f"{COUNT_CLAUSE}: {len(probes)} divergent prompts > {max_divergent}")
    nothing = compared == 0 or (compared is None and not probes)
    counts = f"{_n(selected)} selected, {_n(compared)} compared"
    if failed:
        verdict = "STOP"
    elif nothing:
        verdict = "INCONCLUSIVE"
        reasons.append(f"nothing compared: {counts}; no divergence shown is not evidence of none")
    else:
        verdict = "PASS"
        reasons.append(f"no divergent prompts ({counts})" if not probes else
                       f"all {len(probes)} divergences are one-step ties on the FP32-rounded binary grid "
                       f"({counts})")
    return {
        "rule": "grid-tie-v1",
        "registered_as": GRID_TIE_REGISTRATION,
        "scope": "dataset",
        "verdict": verdict,
        "reasons": reasons,
        "params": params,
        "deviations": dev,
        "failed_clauses": failed,
        "unevaluated_clauses": unevaluated,
        "clauses": {COUNT_CLAUSE: count_ok},
        "n_divergent": len(probes),
        "selected": selected,
        "compared": compared,
        "nothing_compared": nothing,
        "tolerance_model": "tol(a,b) = 1 * 2^-23 * (|a| + |b|) per pair; exact 2^k step",
        "probes": results,
    }


def _n(v: int | None) -> str:
    return "?" if v is None else str(v)


def _collect_probe_failures(results: Sequence[dict], reasons: list[str], *, prefix: str) -> tuple[list, list]:
    failed: list[str] = []
    unevaluated: list[str] = []
    for r in results:
        if r["verdict"] != "PASS":
            # Every STOP has at least one failed clause; unevaluated ones are
            # consequences (e.g. no step, so no grid check) and listed apart.
            reasons.append(f"{prefix}index {r['index']}: STOP on {r['failed_clauses']}")
            reasons += [f"{prefix}index {r['index']}: {x}" for x in r["reasons"]]
            failed += [c for c in r["failed_clauses"] if c not in failed]
            unevaluated += [c for c in r["unevaluated_clauses"] if c not in unevaluated]
    return failed, unevaluated


def grid_tie_audit(per_dataset: Mapping[str, Mapping[str, Any] | None], *, max_divergent: int | None = None,
                   counts: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """grid-tie-v1 as registered: over every divergent prompt of the audit, all datasets together.

    per_dataset: dataset -> that dataset's grid_tie_v1 record, or None when
    its divergence stage did not run. Every probe is evaluated again from the
    inputs its record keeps (so a record made under an older or edited rule
    cannot carry a PASS), and the cap ``at_most_3_divergent`` counts the
    divergent prompts of all datasets: three datasets with three passing
    flips each are nine flips and STOP. counts: dataset -> {"selected",
    "compared"} for records that do not carry their own (taken from the
    divergence artifact, see ``greedy.comparison_counts``).

    Verdict, in this order:

    - STOP: any probe fails a clause, or more than max_divergent divergent
      prompts over the audit;
    - INCONCLUSIVE: a dataset's divergence did not run (named), or nothing
      was compared over the audit (the reason gives the selected and
      compared counts; an empty greedy selection in every dataset cannot
      pass), or no record at all;
    - PASS otherwise.

    max_divergent: None takes the value the per-dataset records used (they
    must agree); a value other than the registered 3 is a deviation.
    """
    if max_divergent is None:
        used = {int((r.get("params") or {}).get("max_divergent", GRID_TIE_V1["max_divergent"]))
                for r in per_dataset.values() if r is not None}
        if len(used) > 1:
            raise ValueError(f"datasets were evaluated with different max_divergent {sorted(used)}")
        max_divergent = used.pop() if used else GRID_TIE_V1["max_divergent"]
    params, dev, reasons = registered_params({"max_divergent": max_divergent}, GRID_TIE_V1)
    counts = counts or {}
    missing = sorted(ds for ds, r in per_dataset.items() if r is None)
    datasets: dict[str, dict] = {}
    probes: list[dict] = []
    failed: list[str] = []
    unevaluated: list[str] = []
    unrecorded: list[str] = []
    present = {ds: r for ds, r in per_dataset.items() if r is not None}
    for ds in sorted(present):
        rec = present[ds]
        if rec.get("rule") != "grid-tie-v1":
            raise ValueError(f"grid_tie:{ds}: expected a grid-tie-v1 record, got {rec.get('rule')!r}")
        inputs = [{k: p.get(k) for k in PROBE_INPUT_KEYS} for p in rec.get("probes") or []]
        idx = [p["index"] for p in inputs]
        dup = sorted({i for i in idx if idx.count(i) > 1}, key=repr)
        if dup:
            raise ValueError(f"grid_tie:{ds}: duplicate probe indices {dup}")
        given = counts.get(ds) or {}
        sel = _count(f"{ds} selected", rec.get("selected") if rec.get("selected") is not None
                     else given.get("selected"))
        com = _count(f"{ds} compared", rec.get("compared") if rec.get("compared") is not None
                     else given.get("compared"))
        _check_counts(sel, com, len(inputs))
        if com is None:
            unrecorded.append(ds)
        results = [{"dataset": ds, **grid_tie_probe(p)} for p in inputs]
        f, u = _collect_probe_failures(results, reasons, prefix=f"{ds} ")
        failed += [c for c in f if c not in failed]
        unevaluated += [c for c in u if c not in unevaluated]
        probes += results
        datasets[ds] = {"selected": sel, "compared": com, "n_divergent": len(inputs),
                        "recorded_verdict": rec.get("verdict"),
                        "probe_verdicts": {str(r["index"]): r["verdict"] for r in results}}
    n_div = len(probes)
    count_ok = n_div <= max_divergent
    if not count_ok:
        failed.append(COUNT_CLAUSE)
        per = ", ".join(f"{ds} {d['n_divergent']}" for ds, d in datasets.items() if d["n_divergent"])
        reasons.append(f"{COUNT_CLAUSE}: {n_div} divergent prompts over the audit ({per}) > {max_divergent}")
    selected = sum(d["selected"] or 0 for d in datasets.values())
    # A dataset whose counts were not recorded still shows a comparison for
    # every probe that passed (both arms answered and were compared there).
    compared = sum(d["compared"] if d["compared"] is not None
                   else sum(v == "PASS" for v in d["probe_verdicts"].values()) for d in datasets.values())
    tally = (f"{selected} items selected, {compared} compared over {len(datasets)} dataset(s)"
             + (f" (counts not recorded for {unrecorded})" if unrecorded else ""))
    if failed:
        verdict = "STOP"
    elif not datasets:
        verdict = "INCONCLUSIVE"
        reasons.append("no grid-tie record for any dataset")
    elif missing:
        verdict = "INCONCLUSIVE"
        reasons.append(f"grid-tie not evaluated for datasets {missing}: their divergence stage did not run")
    elif compared == 0:
        verdict = "INCONCLUSIVE"
        reasons.append(f"nothing compared: {tally}"
                       + ("; the greedy selection is empty, so grid-tie cannot pass" if selected == 0 else ""))
    else:
        verdict = "PASS"
        reasons.append(("no divergent prompts" if not n_div else
                        f"all {n_div} divergent prompts are one-step ties on the FP32-rounded binary grid "
                        f"(<= {max_divergent} over the audit)") + f"; {tally}")
    if missing and failed:
        reasons.append(f"grid-tie not evaluated for datasets {missing}: their divergence stage did not run")
    return {
        "rule": "grid-tie-v1",
        "registered_as": GRID_TIE_REGISTRATION,
        "scope": "audit",
        "verdict": verdict,
        "reasons": reasons,
        "params": params,
        "deviations": dev,
        "failed_clauses": failed,
        "unevaluated_clauses": unevaluated,
        "clauses": {COUNT_CLAUSE: count_ok},
        "n_divergent": n_div,
        "selected": selected,
        "compared": compared,
        "nothing_compared": bool(datasets) and compared == 0,
        "not_evaluated_datasets": missing,
        "counts_unrecorded_datasets": unrecorded,
        "datasets": datasets,
        "tolerance_model": "tol(a,b) = 1 * 2^-23 * (|a| + |b|) per pair; exact 2^k step",
        "probes": probes,
    }
