"""Registered decision rules: named, versioned, never loosened silently.

Every rule is a pure function returning a JSON-able dict::

    {"rule": "<registered name>",   # e.g. "quality-v1"
     "verdict": str,                # rule-specific vocabulary (below)
     "reasons": [str, ...],         # human-readable, names items/clauses
     "params": {...},               # thresholds actually used
     "deviations": {name: {"registered": x, "used": y}},  # non-default params
     ...evidence}

Thresholds are keyword parameters whose defaults are the registered values.
Passing a different value is allowed (a user may register a stricter bar),
but it is never silent: it appears under ``deviations`` and as a reason.

Verdict vocabularies:

- quality-v1:      PASS | HOLD | FAIL | INVALID
- grid-tie-v1:     PASS | STOP | INCONCLUSIVE (nothing compared, or a dataset not evaluated)
- determinism-v1:  PASS | STOP
- boundary-v1:     PASS | FAIL | INCONCLUSIVE (no candidate case at all, or a configuration error)
- win2-v1:         WIN | NO_WIN | LOSS | INCONCLUSIVE
- win2-v2:         WIN | NO_WIN | LOSS | INCONCLUSIVE (too noisy to decide at the bar)
- promotion-v1:    PROMOTE | HOLD | REJECT | INCONCLUSIVE
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .contracts import NATURAL_FINISH
from .stats import MDE_POWER, mcnemar_exact_p, minimum_detectable_loss, paired_t_interval


def _params(used: dict[str, Any], registered: dict[str, Any]) -> tuple[dict, dict, list[str]]:
    dev = {k: {"registered": registered[k], "used": used[k]}
           for k in registered if used[k] != registered[k]}
    reasons = [f"parameter {k}={v['used']!r} differs from the registered {v['registered']!r}"
               for k, v in dev.items()]
    return dict(used), dev, reasons


# ---------------------------------------------------------------- quality-v1

QUALITY_V1 = {"max_net_loss": 0, "alpha": 0.05}


def quality_v1(table: Mapping[str, Any], *, max_net_loss: int = 0, alpha: float = 0.05) -> dict:
    """quality-v1 on one dataset's paired table (``stats.paired_table`` output).

    INVALID when the arms are not comparable: request bodies differ, or any
    item did not finish naturally (finish_reason != "stop") or went
    unanswered in either arm. Otherwise net = candidate_only - control_only:
    PASS if net >= -max_net_loss; HOLD if worse but McNemar p >= alpha (an
    unresolved difference, not a proof of harm); FAIL if worse and p < alpha.

    Beside the verdict (never deciding): ``mde``, the smallest net loss this
    table's item count and observed discordance would FAIL with power 0.8
    (stats.minimum_detectable_loss), and one reason line saying so, so that
    a PASS or HOLD is read as "no loss of that size", not "no loss".
    """
    params, dev, reasons = _params({"max_net_loss": max_net_loss, "alpha": alpha}, QUALITY_V1)
    c_only = list(table["control_only"])
    k_only = list(table["candidate_only"])
    net = len(k_only) - len(c_only)
    # Recompute rather than trust a stored p, so the verdict follows the counts.
    p = mcnemar_exact_p(len(c_only), len(k_only))

    invalid = []
    if not table.get("bodies_identical", False):
        invalid.append("request bodies differ between arms at indices "
                       f"{list(table.get('body_mismatch_indices', []))}")
    for key, what in (("unnatural_finish_indices", "did not finish naturally"),
                      ("unanswered_indices", "unanswered")):
        per_arm = table.get(key) or {}
        for arm in ("control", "candidate"):
            bad = list(per_arm.get(arm, []))
            if bad:
                invalid.append(f"{arm} {what} at indices {bad}")

    if invalid:
        verdict = "INVALID"
        reasons += invalid
    elif net >= -max_net_loss:
        verdict = "PASS"
        reasons.append(f"net {net:+d} (candidate-only {k_only}, control-only {c_only}) "
                       f">= -{max_net_loss}")
    elif p >= alpha:
        verdict = "HOLD"
        reasons.append(f"unresolved difference: net {net:+d} (control-only {c_only}, "
                       f"candidate-only {k_only}), McNemar p={p:.4g} >= alpha {alpha}")
    else:
        verdict = "FAIL"
        reasons.append(f"candidate worse: net {net:+d} (control-only {c_only}, "
                       f"candidate-only {k_only}), McNemar p={p:.4g} < alpha {alpha}")
    n_items = int(table.get("n") or 0)
    mde = minimum_detectable_loss(n_items, min(n_items, len(c_only) + len(k_only)), alpha=alpha,
                                  power=MDE_POWER, max_net_loss=max_net_loss)
    reasons.append(mde_reason(mde))
    return {
        "rule": "quality-v1",
        "verdict": verdict,
        "reasons": reasons,
        "params": params,
        "deviations": dev,
        "n": table.get("n"),
        "control_correct": table.get("control_correct"),
        "candidate_correct": table.get("candidate_correct"),
        "control_only": c_only,
        "candidate_only": k_only,
        "net": net,
        "mcnemar_p": p,
        "mde": mde,
    }


def mde_reason(mde: Mapping[str, Any]) -> str:
    """One line: the smallest net loss the table could detect, or that it could detect none."""
    head = (f"detectable: at alpha {mde['alpha']} and power {100 * mde['target_power']:.0f} % (exact McNemar, "
            f"{mde['n']} items, observed discordance {mde['discordant']}/{mde['n']})")
    if mde.get("net_loss") is None:
        return f"{head}, no net loss of up to all {mde['n']} items would be found: this table cannot show a loss"
    return (f"{head}, a net loss of {mde['net_loss']} items ({100 * mde['rate']:.1f} % of the items) or more "
            "would be found; a smaller loss can go unseen")


# --------------------------------------------------------------- grid-tie-v1

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
        if off:
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
    params, dev, reasons = _params({"max_divergent": max_divergent}, GRID_TIE_V1)
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
    params, dev, reasons = _params({"max_divergent": max_divergent}, GRID_TIE_V1)
    counts = counts or {}
    missing = sorted(ds for ds, r in per_dataset.items() if r is None)
    datasets: dict[str, dict] = {}
    probes: list[dict] = []
    failed: list[str] = []
    unevaluated: list[str] = []
    unrecorded: list[str] = []
    for ds in sorted(ds for ds, r in per_dataset.items() if r is not None):
        rec = per_dataset[ds]
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


# ------------------------------------------------------------ determinism-v1

def determinism_v1(hashes_by_arm: Mapping[str, Sequence[str]]) -> dict:
    """determinism-v1: per arm, N repeats of one greedy request must hash alike.

    An arm with fewer than two repeats has not shown determinism and STOPs
    too (one hash proves nothing). Evidence per arm: repeats, distinct hashes.
    """
    arms, reasons, flagged = {}, [], []
    if not hashes_by_arm:
        reasons.append("no arm was repeated")
    for arm, hs in hashes_by_arm.items():
        hs = list(hs)
        distinct = sorted(set(hs))
        ok = len(hs) >= 2 and len(distinct) == 1
        arms[arm] = {"repeats": len(hs), "distinct_hashes": distinct, "deterministic": ok}
        if len(hs) < 2:
            flagged.append(arm)
            reasons.append(f"{arm}: only {len(hs)} repeat(s); determinism not shown")
        elif not ok:
            flagged.append(arm)
            reasons.append(f"{arm}: nondeterministic, {len(distinct)} distinct hashes over {len(hs)} repeats: {distinct}")
        else:
            reasons.append(f"{arm}: {len(hs)} identical repeats")
    verdict = "PASS" if hashes_by_arm and not flagged else "STOP"
    return {"rule": "determinism-v1", "verdict": verdict, "reasons": reasons,
            "params": {}, "deviations": {}, "arms": arms, "nondeterministic_arms": flagged}


# --------------------------------------------------------------- boundary-v1

# The capacity tail (max_model_len - 16 input, 16 output) is the case the
# boundary gate exists for; a boundary run without it is not the gate.
CAPACITY_TAIL_CASE = "tail-16"
BOUNDARY_REQUIRED_CASES = (CAPACITY_TAIL_CASE,)


def boundary_missing_cases(result: Mapping[str, Any]) -> list[str]:
    """Required boundary cases absent from a boundary-v1 result's candidate cases."""
    have = set(result.get("candidate_cases") or [])
    return [c for c in BOUNDARY_REQUIRED_CASES if c not in have]


def boundary_v1(cases: Sequence[Mapping[str, Any]]) -> dict:
    """boundary-v1: every candidate case correct with natural EOS.

    cases: ``[{"arm": "control"|"candidate", "case": str, "correct": bool,
    "finish_reason": str, "expected": str, "text": str, "config_error": str|None}]``.
    Control failures are listed beside the verdict and never excuse a
    candidate failure. A set with no candidate case has shown nothing:
    INCONCLUSIVE. A case the server refused as a request (``config_error``,
    e.g. HTTP 400 for a length over max_model_len) is a configuration error,
    not a model failure: it makes the verdict INCONCLUSIVE unless a real
    candidate failure elsewhere already FAILs.
    """
    fails = {"control": [], "candidate": []}
    seen = {"control": [], "candidate": []}
    config_errors = []
    texts: dict[str, dict[str, Any]] = {}
    for c in cases:
        arm = c.get("arm")
        if arm not in fails:
            raise ValueError(f"unknown arm {arm!r} in boundary case {c.get('case')!r}")
        seen[arm].append(c["case"])
        texts.setdefault(c["case"], {})[arm] = c.get("text")
        if c.get("config_error"):
            config_errors.append({"arm": arm, "case": c["case"], "config_error": c["config_error"]})
            continue
        ok = bool(c.get("correct")) and c.get("finish_reason") == NATURAL_FINISH
        if not ok:
            fails[arm].append({"case": c["case"], "correct": bool(c.get("correct")),
                               "finish_reason": c.get("finish_reason"),
                               "expected": c.get("expected"), "text": c.get("text")})
    reasons = [f"configuration error: {e['arm']} {e['case']} refused by the server: {e['config_error']}"
               for e in config_errors]
    for f in fails["candidate"]:
        reasons.append(f"candidate {f['case']}: correct={f['correct']} finish_reason={f['finish_reason']!r} "
                       f"expected {f['expected']!r} got {f['text']!r}")
    for f in fails["control"]:
        reasons.append(f"control {f['case']} also fails (reported beside; excuses nothing): "
                       f"correct={f['correct']} finish_reason={f['finish_reason']!r}")
    if not seen["candidate"]:
        verdict = "INCONCLUSIVE"
        reasons.append("no candidate boundary case was run")
    elif fails["candidate"]:
        verdict = "FAIL"
    elif config_errors:
        verdict = "INCONCLUSIVE"
        reasons.append(f"{len(config_errors)} case(s) not evaluated because of a configuration error; "
                       "fix the boundary lengths or the arm's max_model_len")
    else:
        verdict = "PASS"
        reasons.append(f"all {len(seen['candidate'])} candidate cases correct with natural EOS")
    identical = sorted(k for k, v in texts.items()
                       if "control" in v and "candidate" in v and v["control"] == v["candidate"])
    return {"rule": "boundary-v1", "verdict": verdict, "reasons": reasons, "params": {},
            "deviations": {}, "candidate_failures": fails["candidate"],
            "control_failures": fails["control"], "candidate_cases": seen["candidate"],
            "control_cases": seen["control"], "identical_text_cases": identical,
            "config_errors": config_errors}


# ------------------------------------------------------------------- win2-v1

WIN2_V1 = {"win_pct": 2.0, "level": 0.95, "guard_loss_repeats": 2}


def _win2_metric(triples: Sequence[Sequence[float]], lower_is_better: bool,
                 win_pct: float, level: float) -> dict:
    t = np.asarray(triples, dtype=float)
    before, cand, after = t[:, 0], t[:, 1], t[:, 2]
    control = (before + after) / 2.0
    spread = np.abs(before - after)
    sign = -1.0 if lower_is_better else 1.0
    # "gain" is oriented so that positive always means the candidate is better.
    gain = sign * (cand - control)
    c_mean = float(control.mean())
    gain_pct = 100.0 * float(gain.mean()) / abs(c_mean) if c_mean != 0 else math.nan
    mean, lo, hi = paired_t_interval(cand - control, level)
    glo, ghi = sorted((sign * lo, sign * hi))
    if gain_pct > win_pct and glo > 0:
        verdict = "WIN"
    elif gain_pct < -win_pct and ghi < 0:
        verdict = "LOSS"
    else:
        verdict = "NO_WIN"
    worse_than_spread = [bool(-g > s) for g, s in zip(gain, spread)]
    spread_pct = [100.0 * float(s) / abs(float(c)) if c != 0 else math.nan
                  for s, c in zip(spread, control)]
    return {
        "lower_is_better": lower_is_better,
        "control": control.tolist(), "candidate": cand.tolist(),
        "control_before": before.tolist(), "control_after": after.tolist(),
        "diff": (cand - control).tolist(),
        "point_gain_pct": gain_pct,
        "t_interval": {"mean": mean, "lo": lo, "hi": hi, "level": level},
        "control_spread": spread.tolist(),
        "control_spread_pct": spread_pct,
        "max_control_spread_pct": max(spread_pct),
        "win_pct": win_pct,
        "worse_than_spread": worse_than_spread,
        "verdict": verdict,
    }


def canonical_repr(x: Any) -> str:
    """Order-independent text of a clock cap (a number, string or dict of cap facts)."""
    return json.dumps(x, sort_keys=True, default=repr)


def win2_v1(
    series: Mapping[str, Sequence[Sequence[float]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    win_pct: float = 2.0,
    level: float = 0.95,
    clock_caps: Sequence[Any] | None = None,
    expected_clock_cap: Any = None,
    throttled: bool = False,
    lower_is_better: Iterable[str] = (),
    guard_loss_repeats: int = 2,
    archive_spread_pct: float | None = None,
) -> dict:
    """win2-v1: OFF/ON/OFF speed decision paired by repeat.

    series: metric -> per repeat r a triple (control_before, candidate,
    control_after). Control_r = mean of the brackets. Per metric: point gain
    % = 100 * mean oriented (candidate - control) / |mean control|, and the
    ``level`` paired-t interval of candidate - control over repeats.

    - primary: WIN if gain > win_pct and the interval excludes 0 on the
      better side; LOSS if the mirror holds (a demonstrated slowdown of more
      than the bar — our reading; the seed only names WIN); else NO_WIN.
    - guards: only cause LOSS, when worse than control by more than that
      repeat's control spread |before - after| in >= guard_loss_repeats of 3
      repeats (registered: 2 of 3). With R != 3 repeats the same fraction
      is kept: ceil(guard_loss_repeats * R / 3) repeats (2 of 2, 4 of 5).
      Under pure noise (iid normal starts) one guard flags a repeat with
      probability atan(sqrt(3/4))/pi = 0.23, so 2 of 3 gives about 13 %
      false LOSS per guard: the seed's price for a guard that can only block.
    - reported: same per-metric verdict, recorded, never decides.
    - INCONCLUSIVE first of all when clock_caps (one per start) are not all
      equal, differ from expected_clock_cap, or throttled is set: the control
      must be a same-clock control. Fewer than 2 repeats: INCONCLUSIVE.
    The in-window control spread (% of control) is reported beside the bar;
    archive_spread_pct (day-to-day, from the control archive) is passed
    through when known. The bar is a parameter, never raised silently.
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    params, dev, reasons = _params(
        {"win_pct": win_pct, "level": level, "guard_loss_repeats": guard_loss_repeats}, WIN2_V1)
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib))
    roles = [primary] + guards + reported
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {roles}")
    missing = [m for m in roles if m not in series]
    if missing:
        raise ValueError(f"metrics {missing} absent from series")
    lengths = {m: len(series[m]) for m in roles}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"metrics have different repeat counts: {lengths}")
    for m in roles:
        for tr in series[m]:
            if len(tr) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in tr):
                raise ValueError(f"{m}: each repeat must be 3 finite numbers (before, candidate, after), got {tr!r}")
    n_rep = lengths[primary]

    out: dict[str, Any] = {"rule": "win2-v1", "params": params, "deviations": dev,
                           "repeats": n_rep, "clock_caps": list(clock_caps) if clock_caps is not None else None,
                           "expected_clock_cap": expected_clock_cap, "throttled": bool(throttled),
                           "archive_spread_pct": archive_spread_pct}
    incon = []
    if clock_caps is not None and len({canonical_repr(c) for c in clock_caps}) > 1:
        incon.append(f"starts ran under different clock caps {list(clock_caps)}")
    if clock_caps is not None and expected_clock_cap is not None and any(
            canonical_repr(c) != canonical_repr(expected_clock_cap) for c in clock_caps):
        incon.append(f"clock caps {list(clock_caps)} differ from the configured {expected_clock_cap!r}")
    if throttled:
        incon.append("throttling was flagged inside the bracket")
    if n_rep < 2:
        incon.append(f"{n_rep} repeat(s): no paired-t interval")
        out.update(verdict="INCONCLUSIVE", reasons=reasons + incon, primary=None, guards={}, reported={})
        return out

    prim = _win2_metric(series[primary], primary in lib, win_pct, level)
    g_res = {}
    guard_losses = []
    needed = max(1, math.ceil(guard_loss_repeats * n_rep / 3 - 1e-9))
    out["guard_loss_needed"] = needed
    for g in guards:
        r = _win2_metric(series[g], g in lib, win_pct, level)
        n_worse = sum(r["worse_than_spread"])
        r["repeats_worse_than_spread"] = n_worse
        r["guard_verdict"] = "LOSS" if n_worse >= needed else "OK"
        g_res[g] = r
        if r["guard_verdict"] == "LOSS":
            guard_losses.append(f"guard {g}: candidate worse than the control spread in "
                                f"{n_worse} of {n_rep} repeats (>= {needed})")
    rep = {m: _win2_metric(series[m], m in lib, win_pct, level) for m in reported}
    out.update(primary=prim, guards=g_res, reported=rep)

    ti = prim["t_interval"]
    summary = (f"primary {primary}: point gain {prim['point_gain_pct']:+.3f} % vs bar {win_pct} %, "
               f"{int(level * 100)} % paired-t [{ti['lo']:.6g}, {ti['hi']:.6g}] on candidate-control; "
               f"in-window control/control spread max {prim['max_control_spread_pct']:.3f} %"
               + (f", archive spread {archive_spread_pct:.3f} %" if archive_spread_pct is not None else ""))
    if incon:
        verdict = "INCONCLUSIVE"
        reasons += incon
    elif guard_losses or prim["verdict"] == "LOSS":
        verdict = "LOSS"
        reasons += guard_losses
        if prim["verdict"] == "LOSS":
            reasons.append(f"primary {primary} is worse by more than {win_pct} % with the interval excluding 0")
    elif prim["verdict"] == "WIN":
        verdict = "WIN"
    else:
        verdict = "NO_WIN"
        reasons.append("speed gain not shown (gain <= bar or interval includes 0)")
    reasons.append(summary)
    for m, r in rep.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    out.update(verdict=verdict, reasons=reasons)
    return out


# ------------------------------------------------------------------- win2-v2

# Registered values. start_noise_pct is the start-to-start noise (sd of one
# start's mean, % of the control) the rule assumes a host may have even when
# the window's one s1-s3 difference does not show it: that difference is a
# single degree of freedom, so a window whose two controls happen to agree
# says little about the next start. 3 % is the largest per-start offset the
# rule is calibrated against (bench/speed_noise.py).
WIN2_V2 = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "start_noise_pct": 3.0,
           "power_gain_pct": 10.0}
WIN2_V2_RATE_WINDOWS = 2000   # simulated windows behind the error rates a decision reports
WIN2_V2_RATE_SEED = 0


def _z(p: float) -> float:
    from scipy.stats import norm  # here: scipy.stats costs a second at the workflow's load

    return float(norm.ppf(p))


def _v2_metric(x: np.ndarray, lower_is_better: bool) -> dict:
    """Per window and cell, one metric: gain, s1-s3 difference and within-start variance, in % of control.

    x: (windows, cells, repeats, 3) with the starts (s1, s2, s3) last. Values
    are relative to the cell's control mean over all repeats of s1 and s3,
    oriented so that a positive gain is always better. A control mean of 0
    (e.g. accepted drafts without speculation) gives 0 for a 0 value and
    +-100 % otherwise (any drafting beats none).
    """
    c = (x[..., 0] + x[..., 2]).mean(axis=-1) / 2.0                      # (W, C)
    cz = c[..., None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(cz != 0, 100.0 * (x / np.where(cz != 0, cz, 1.0) - 1.0),
                       np.where(x == 0, 0.0, 100.0 * np.sign(x)))
    if lower_is_better:
        rel = -rel
    m = rel.mean(axis=-2)                                                  # (W, C, 3)
    gain = m[..., 1] - (m[..., 0] + m[..., 2]) / 2.0
    d13 = m[..., 0] - m[..., 2]
    r = x.shape[-2]
    within = rel.var(axis=-2, ddof=1).mean(axis=-1) if r > 1 else np.zeros_like(gain)
    return {"gain": gain, "d13": d13, "within": within, "control_mean": c}


def _v2_noise(mt: dict, repeats: int, floor: float) -> dict:
    """The window's noise for one metric: per-repeat sd, start-level sd seen in s1-s3, and what is used."""
    rep_var = mt["within"].mean(axis=-1)                                   # (W,)
    start_var = np.maximum(0.0, (mt["d13"] ** 2).mean(axis=-1) / 2.0 - rep_var / repeats)
    used_var = np.maximum(start_var, floor ** 2)
    return {"rep_sd": np.sqrt(rep_var), "start_sd": np.sqrt(start_var), "start_sd_used": np.sqrt(used_var),
            "rep_var": rep_var, "used_var": used_var}


def _win2_v2_core(metrics: Mapping[str, np.ndarray], *, primary: str, guards: Sequence[str],
                  lower_is_better: Iterable[str], win_pct: float, alpha_win: float, alpha_loss: float,
                  start_noise_pct: float) -> dict:
    """win2-v2 over many windows at once: arrays of shape (windows, cells, repeats, 3) per metric.

    The simulation (bench/speed_noise.py) and the error rates a decision
    reports run exactly this function; ``win2_v2`` calls it with one window.
    """
    lib = set(lower_is_better)
    x = np.asarray(metrics[primary], dtype=float)
    n_cells, repeats = x.shape[1], x.shape[2]
    per = {m: _v2_metric(np.asarray(metrics[m], dtype=float), m in lib) for m in [primary, *guards]}
    noise = {m: _v2_noise(per[m], repeats, start_noise_pct) for m in per}
    z_win = _z(1.0 - alpha_win)
    # One loss test per cell and metric (primary and guards), each at alpha_loss / tests:
    # under identical arms the chance that any of them fires stays below alpha_loss.
    n_tests = n_cells * len(per)
    z_loss = _z(1.0 - alpha_loss / n_tests)
    p, pn = per[primary], noise[primary]
    # Pooled over the cells, the gain's variance keeps the whole start-level
    # part (a start's offset is shared by every cell it runs) and divides the
    # per-repeat part by cells x repeats; s2 - (s1 + s3) / 2 has 1.5 x the
    # variance of one start's mean.
    pooled = p["gain"].mean(axis=-1)
    pooled_se = np.sqrt(1.5 * (pn["used_var"] + pn["rep_var"] / (repeats * n_cells)))
    half = z_win * pooled_se
    lo = pooled - half
    consistent = (p["gain"] > win_pct).all(axis=-1)
    win = (lo > 0) & (pooled > win_pct) & consistent
    loss_by = {}
    for m in per:
        se = np.sqrt(1.5 * (noise[m]["used_var"] + noise[m]["rep_var"] / repeats))[:, None]
        g = per[m]["gain"]
        loss_by[m] = (g < -win_pct) & (g + z_loss * se < 0)                # (W, C)
    loss = np.zeros(x.shape[0], dtype=bool)
    for m in per:
        loss |= loss_by[m].any(axis=-1)
    decided = half <= win_pct
    verdict = np.where(loss, "LOSS", np.where(win, "WIN", np.where(decided, "NO_WIN", "INCONCLUSIVE")))
    return {"verdict": verdict, "per": per, "noise": noise, "pooled_gain": pooled, "pooled_se": pooled_se,
            "half_width": half, "lo": lo, "consistent": consistent, "loss_by": loss_by,
            "z_win": z_win, "z_loss": z_loss, "n_loss_tests": n_tests}


def simulate_windows(rng: np.random.Generator, n: int, *, cells: int, repeats: int, rep_sd: float,
                     start_sd: float, gain_pct: float = 0.0, metrics: Sequence[str] = ("primary",),
                     zero: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """n synthetic brackets, (n, cells, repeats, 3) per metric, base 100.

    Noise in % of the mean: ``start_sd`` per start, shared by every cell,
    repeat and metric of that start (a server start that runs slow runs slow
    throughout); ``rep_sd`` per start, cell, repeat and metric, independent.
    The candidate start s2 is ``gain_pct`` % faster in every metric. Metrics
    in ``zero`` are 0 everywhere (accepted drafts of a non-speculative pair).
    """
    off = rng.normal(0.0, start_sd, (n, 1, 1, 3))
    scale = np.array([1.0, 1.0 + gain_pct / 100.0, 1.0])
    out = {}
    for m in metrics:
        if m in zero:
            out[m] = np.zeros((n, cells, repeats, 3))
            continue
        e = rng.normal(0.0, rep_sd, (n, cells, repeats, 3))
        out[m] = 100.0 * (1.0 + (off + e) / 100.0) * scale
    return out


def win2_v2_rates(*, rep_sd: float, start_sd: float, cells: int, repeats: int, guards: Sequence[str] = (),
                  zero_guards: Sequence[str] = (), win_pct: float = 2.0, alpha_win: float = 0.05,
                  alpha_loss: float = 0.05, start_noise_pct: float = 3.0, power_gain_pct: float = 10.0,
                  n: int = WIN2_V2_RATE_WINDOWS, seed: int = WIN2_V2_RATE_SEED) -> dict:
    """Seeded simulated error rates of win2-v2 at one noise level (the model of simulate_windows).

    false_win / false_loss: identical arms; power: the candidate ``power_gain_pct`` % better.
    Guards carry the same noise as the primary.
    """
    kw = dict(primary="primary", guards=list(guards), lower_is_better=(), win_pct=win_pct,
              alpha_win=alpha_win, alpha_loss=alpha_loss, start_noise_pct=start_noise_pct)
    names = ["primary", *guards]
    rng = np.random.default_rng(seed)
    null = _win2_v2_core(simulate_windows(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                          metrics=names, zero=zero_guards), **kw)["verdict"]
    alt = _win2_v2_core(simulate_windows(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                         gain_pct=power_gain_pct, metrics=names, zero=zero_guards), **kw)["verdict"]
    return {"rep_sd_pct": rep_sd, "start_sd_pct": start_sd, "cells": cells, "repeats": repeats, "windows": n,
            "seed": seed, "false_win": float((null == "WIN").mean()), "false_loss": float((null == "LOSS").mean()),
            "null_inconclusive": float((null == "INCONCLUSIVE").mean()),
            "power_gain_pct": power_gain_pct, "power": float((alt == "WIN").mean())}


def win2_v2_needed(*, rep_sd: float, start_sd_used: float, cells: int, repeats: int, win_pct: float,
                   alpha_win: float = 0.05) -> dict:
    """How many repeats, or brackets, would make the one-sided half-width reach the bar at this noise.

    The start-level part does not shrink with repeats (every repeat of a
    start shares its offset): when it alone exceeds the bar, more repeats
    cannot help and only more brackets (s1, s2, s3 starts, pooled) can.
    """
    z = _z(1.0 - alpha_win)
    budget = (win_pct / z) ** 2 / 1.5             # allowed variance of the start-level mean
    start_var, rep_var = start_sd_used ** 2, rep_sd ** 2
    if start_var >= budget:
        repeats_needed = None
    else:
        repeats_needed = max(repeats, math.ceil(rep_var / (cells * (budget - start_var)) - 1e-9))
    total = start_var + rep_var / (cells * repeats)
    brackets = max(1, math.ceil(total / budget - 1e-9)) if budget > 0 else None
    return {"repeats_needed": repeats_needed, "brackets_needed": brackets,
            "half_width_pct": z * math.sqrt(1.5 * total)}


def _nums(a: np.ndarray) -> list:
    return [float(v) for v in np.ravel(a)]


def win2_v2(
    cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    decide: Iterable[str] | None = None,
    lower_is_better: Iterable[str] = (),
    win_pct: float = 2.0,
    alpha_win: float = 0.05,
    alpha_loss: float = 0.05,
    start_noise_pct: float = 3.0,
    power_gain_pct: float = 10.0,
    with_rates: bool = True,
) -> dict:
    """win2-v2: the OFF/ON/OFF speed decision over every deciding cell at once.

    cells: cell -> metric -> per repeat (s1, s2, s3). decide: the deciding
    cells (default: all); the others get their own reported verdict. All
    values are % of the cell's control mean (s1 and s3 over every repeat),
    oriented so that a positive gain is better.

    Per cell and metric: gain = mean(s2) - (mean(s1) + mean(s3)) / 2, the
    s1-s3 difference and the within-start variance of the repeats. The
    window's noise (per metric, pooled over the deciding cells): per-repeat
    sd from the within-start variance, start-level sd from the s1-s3
    differences beyond what the repeats explain. The start-level sd used is
    the larger of that and ``start_noise_pct`` (one s1-s3 difference is one
    degree of freedom, so an agreeing pair of controls does not show a quiet
    host). Var(gain) = 1.5 x (start var + repeat var / repeats).

    - WIN: the cells' mean primary gain exceeds the bar, its one-sided
      (1 - alpha_win) lower bound exceeds 0 (the start-level variance is kept
      whole: a start's offset is shared by its cells), and every deciding
      cell's gain exceeds the bar.
    - LOSS: in some deciding cell the primary or a guard is worse than the
      bar and its upper bound, at alpha_loss divided by the number of such
      tests (cells x metrics), is below 0: a slowdown the window's noise does
      not explain. A guard cannot make a WIN.
    - otherwise NO_WIN when the window resolves the bar (one-sided half-width
      <= win_pct), else INCONCLUSIVE, with the repeats (or brackets) it
      would need.
    Clock checks are the stage's (speeddecision.decide), not this function's. The
    result names the window's noise and, when ``rates``, the rule's
    simulated false WIN / false LOSS / power at that noise and at the noise
    it assumes (``with_rates``).
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    registered = dict(WIN2_V2)
    params, dev, reasons = _params({"win_pct": win_pct, "alpha_win": alpha_win, "alpha_loss": alpha_loss,
                                    "start_noise_pct": start_noise_pct, "power_gain_pct": power_gain_pct},
                                   registered)
    names = list(cells)
    decide = names if decide is None else [c for c in names if c in set(decide)]
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib),
                  decision_cells=list(decide))
    roles = [primary] + guards + reported
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {roles}")
    if not decide:
        raise ValueError("win2-v2 needs at least one deciding cell")
    reps = set()
    for c in names:
        missing = [m for m in roles if m not in cells[c]]
        if missing:
            raise ValueError(f"cell {c}: metrics {missing} absent from series")
        for m in roles:
            reps.add(len(cells[c][m]))
            for tr in cells[c][m]:
                if len(tr) != 3 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in tr):
                    raise ValueError(f"{c}/{m}: each repeat must be 3 finite numbers (s1, s2, s3), got {tr!r}")
    if len(reps) != 1:
        raise ValueError(f"cells and metrics have different repeat counts: {sorted(reps)}")
    n_rep = reps.pop()
    out: dict[str, Any] = {"rule": "win2-v2", "params": params, "deviations": dev, "repeats": n_rep}
    if n_rep < 2:
        out.update(verdict="INCONCLUSIVE", reasons=reasons + [f"{n_rep} repeat(s): no within-start noise"],
                   cells={}, noise=None, rates=None)
        return out
    kw = dict(primary=primary, guards=guards, lower_is_better=lib, win_pct=win_pct, alpha_win=alpha_win,
              alpha_loss=alpha_loss, start_noise_pct=start_noise_pct)

    def arr(cs, m):
        return np.asarray([[cells[c][m] for c in cs]], dtype=float)      # (1, C, R, 3)

    core = _win2_v2_core({m: arr(decide, m) for m in [primary, *guards]}, **kw)
    pn = core["noise"][primary]
    noise = {"rep_sd_pct": float(pn["rep_sd"][0]), "start_sd_pct": float(pn["start_sd"][0]),
             "start_sd_used_pct": float(pn["start_sd_used"][0]),
             "s1_s3_diff_pct": _nums(core["per"][primary]["d13"]),
             "guards": {g: {"rep_sd_pct": float(core["noise"][g]["rep_sd"][0]),
                            "start_sd_pct": float(core["noise"][g]["start_sd"][0])} for g in guards}}
    need = win2_v2_needed(rep_sd=noise["rep_sd_pct"], start_sd_used=noise["start_sd_used_pct"],
                          cells=len(decide), repeats=n_rep, win_pct=win_pct, alpha_win=alpha_win)
    gain, half = float(core["pooled_gain"][0]), float(core["half_width"][0])
    verdict = str(core["verdict"][0])
    per_cell = {}
    for j, c in enumerate(decide):
        cell_loss = [m for m in core["loss_by"] if core["loss_by"][m][0, j]]
        cg = float(core["per"][primary]["gain"][0, j])
        per_cell[c] = {"decides": True, "primary": {"point_gain_pct": cg,
                                                    "s1_s3_diff_pct": float(core["per"][primary]["d13"][0, j]),
                                                    "within_sd_pct": math.sqrt(float(core["per"][primary]["within"][0, j]))},
                       "guards": {g: {"point_gain_pct": float(core["per"][g]["gain"][0, j]),
                                      "guard_verdict": "LOSS" if g in cell_loss else "OK"} for g in guards},
                       "losses": cell_loss,
                       "verdict": "LOSS" if cell_loss else ("ABOVE_BAR" if cg > win_pct else "NOT_ABOVE_BAR")}
    # Cells that do not decide, and reported metrics: the same test, recorded only.
    for c in [c for c in names if c not in decide]:
        one = _win2_v2_core({m: arr([c], m) for m in [primary, *guards]}, **kw)
        per_cell[c] = {"decides": False, "verdict": str(one["verdict"][0]),
                       "primary": {"point_gain_pct": float(one["pooled_gain"][0]),
                                   "s1_s3_diff_pct": float(one["per"][primary]["d13"][0, 0])},
                       "guards": {g: {"point_gain_pct": float(one["per"][g]["gain"][0, 0]),
                                      "guard_verdict": "LOSS" if one["loss_by"][g][0, 0] else "OK"} for g in guards}}
    rep_res = {}
    for m in reported:
        one = _win2_v2_core({m: arr(decide, m)}, **{**kw, "primary": m, "guards": []})
        rep_res[m] = {"verdict": str(one["verdict"][0]), "point_gain_pct": float(one["pooled_gain"][0]),
                      "lower_is_better": m in lib}
    summary = (f"primary {primary}: gain {gain:+.2f} % over {len(decide)} deciding cell(s) vs bar {win_pct} %, "
               f"one-sided {100 * (1 - alpha_win):g} % lower bound {gain - half:+.2f} % (half-width {half:.2f} %); "
               f"window noise: per repeat {noise['rep_sd_pct']:.2f} %, start to start {noise['start_sd_pct']:.2f} % "
               f"from s1-s3 (used {noise['start_sd_used_pct']:.2f} %, floor {start_noise_pct} %)")
    if verdict == "LOSS":
        for c, pc in per_cell.items():
            if pc.get("decides") and pc.get("losses"):
                reasons.append(f"{c}: {', '.join(pc['losses'])} worse than the bar beyond the window's noise "
                               f"(each loss test at {100 * alpha_loss / core['n_loss_tests']:.3g} %)")
    elif verdict == "WIN":
        reasons.append("gain above the bar in every deciding cell and its lower bound above 0")
    elif verdict == "NO_WIN":
        reasons.append("speed gain not shown, and the window resolves the bar (half-width <= bar)")
    else:
        how = (f"would need {need['repeats_needed']} repeats per start, or {need['brackets_needed']} brackets "
               "pooled" if need["repeats_needed"] is not None
               else "more repeats cannot help (the start-to-start part alone exceeds the bar); would need "
               f"{need['brackets_needed']} brackets pooled")
        reasons.append(f"too noisy to decide at the {win_pct} % bar: half-width {half:.2f} % > {win_pct} %; {how}")
    reasons.append(summary)
    if not core["consistent"][0] and verdict != "LOSS":
        low = [c for c in decide if per_cell[c]["primary"]["point_gain_pct"] <= win_pct]
        reasons.append(f"cells not above the bar: {low}")
    for m, r in rep_res.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    rates = None
    if with_rates:
        zero = [g for g in guards if all(v == 0 for c in decide for tr in cells[c][g] for v in tr)]
        common = dict(cells=len(decide), repeats=n_rep, guards=guards, zero_guards=zero, win_pct=win_pct,
                      alpha_win=alpha_win, alpha_loss=alpha_loss, start_noise_pct=start_noise_pct,
                      power_gain_pct=power_gain_pct)
        rates = {"measured": win2_v2_rates(rep_sd=noise["rep_sd_pct"], start_sd=noise["start_sd_pct"], **common),
                 "assumed": win2_v2_rates(rep_sd=noise["rep_sd_pct"], start_sd=noise["start_sd_used_pct"], **common)}
        m_, a_ = rates["measured"], rates["assumed"]
        reasons.append(f"win2-v2 at this window's noise: false WIN {100 * m_['false_win']:.1f} %, false LOSS "
                       f"{100 * m_['false_loss']:.1f} %, WIN for a +{power_gain_pct:g} % change "
                       f"{100 * m_['power']:.1f} %; with start-to-start noise {a_['start_sd_pct']:.2f} %: "
                       f"{100 * a_['false_win']:.1f} % / {100 * a_['false_loss']:.1f} % / {100 * a_['power']:.1f} % "
                       f"({m_['windows']} simulated windows, seed {m_['seed']})")
    out.update(verdict=verdict, reasons=reasons, cells=per_cell, reported=rep_res, noise=noise, needed=need,
               pooled_gain_pct=gain, half_width_pct=half, lower_bound_pct=gain - half,
               loss_tests=core["n_loss_tests"], rates=rates)
    return out


# -------------------------------------------------------------- promotion-v1

# How each gate verdict bears on the decision. Unknown verdicts are treated as
# incomparable evidence, never as a pass.
_GATE_OUTCOME = {
    "PASS": "PROMOTE", "WIN": "PROMOTE",
    "FAIL": "REJECT", "LOSS": "REJECT",
    "HOLD": "HOLD", "STOP": "HOLD", "NO_WIN": "HOLD",
    "INVALID": "INCONCLUSIVE", "INCONCLUSIVE": "INCONCLUSIVE",
}
_PRECEDENCE = ("REJECT", "HOLD", "INCONCLUSIVE", "PROMOTE")


NO_CHANGE = "no change under audit"


def promotion_v1(gates: Mapping[str, Mapping[str, Any] | None], *, identical_arms: bool = False) -> dict:
    """promotion-v1: one decision from every gate's rule result.

    gates: name -> rule result (with "verdict") or None (not evaluated).
    Mapping of gate verdicts:

    - PASS, WIN -> may promote;
    - FAIL, LOSS -> REJECT;
    - HOLD, STOP, NO_WIN -> HOLD (NO_WIN: the speed gain is not shown, which
      is a finding of the measured bracket, not missing evidence);
    - INVALID, INCONCLUSIVE, None, missing/unknown verdict -> INCONCLUSIVE
      (incomplete or incomparable evidence).
    - a gate result with ``"informational": true`` (speed with config
      ``speed.informational``) gates only through REJECT: its LOSS/FAIL
      still rejects; any other verdict (WIN, NO_WIN, INCONCLUSIVE) gets the
      outcome INFORMATIONAL, is reported, and neither allows nor blocks. A
      decision of only informational gates is INCONCLUSIVE.

    Precedence REJECT > HOLD > INCONCLUSIVE > PROMOTE: a failure found
    anywhere rejects whatever else is missing; a concern found by an
    evaluated gate stands even if other evidence is incomplete (completing it
    cannot lift the concern); a missing gate never allows PROMOTE. No gates
    at all is INCONCLUSIVE. Every gate gets one reason line.

    identical_arms (control and candidate are the same server spec, and the
    decision is not an A/A calibration): INCONCLUSIVE, "no change under
    audit", whatever the gates say -- there is no change to promote or to
    reject, and a gate that flags something there flagged noise. The gates'
    own verdict is kept as ``gate_verdict``.
    """
    per_gate, reasons, not_evaluated, informational = {}, [], [], []
    by_outcome: dict[str, list[str]] = {k: [] for k in _PRECEDENCE}
    for name, res in gates.items():
        if res is None:
            v, rule, outcome = None, None, "INCONCLUSIVE"
            not_evaluated.append(name)
            reasons.append(f"{name}: not evaluated")
        else:
            v, rule = res.get("verdict"), res.get("rule")
            outcome = _GATE_OUTCOME.get(v, "INCONCLUSIVE")
            if res.get("informational") is True and outcome != "REJECT":
                outcome = "INFORMATIONAL"
            why = "; ".join(res.get("reasons", [])[:3])
            reasons.append(f"{name}: {rule or 'rule?'} {v} -> {outcome}" + (f" ({why})" if why else "")
                           + ("" if v in _GATE_OUTCOME else " [unknown verdict]"))
        per_gate[name] = {"rule": rule, "verdict": v, "outcome": outcome}
        if outcome == "INFORMATIONAL":
            informational.append(name)
        else:
            by_outcome[outcome].append(name)
    if not gates:
        verdict = "INCONCLUSIVE"
        reasons.append("no gates were given")
    elif not any(by_outcome.values()):
        verdict = "INCONCLUSIVE"
        reasons.append("only informational gates were given")
    else:
        verdict = next(k for k in _PRECEDENCE if by_outcome[k])
    gate_verdict = verdict
    if identical_arms is True:
        verdict = "INCONCLUSIVE"
        reasons.insert(0, f"{NO_CHANGE}: control and candidate are the same server spec (same spec_sha256); "
                          f"the gates alone would give {gate_verdict}, which says nothing about a change")
    return {"rule": "promotion-v1", "verdict": verdict, "reasons": reasons, "params": {},
            "deviations": {}, "gates": per_gate, "not_evaluated": not_evaluated,
            "gate_verdict": gate_verdict, "no_change": identical_arms is True,
            "rejecting": by_outcome["REJECT"], "holding": by_outcome["HOLD"],
            "inconclusive": by_outcome["INCONCLUSIVE"], "informational": informational}
