"""The quality rules on one dataset's paired table.

quality-v2 (the default): PASS | FAIL | INCONCLUSIVE | INVALID, a
non-inferiority rule on the Tango score bound of the candidate's loss.
quality-v1 (registered before it, still selectable): PASS | HOLD | FAIL | INVALID.

Both stated in full, with their clauses and history, in docs/rules.md."""

from __future__ import annotations

from typing import Any, Mapping

from pairaudit.core.stats import (MDE_POWER, loss_upper_bound, mcnemar_exact_p, minimum_detectable_loss,
                                  noninferiority_items, noninferiority_pass)
from pairaudit.gates.common import registered_params

QUALITY_V1 = {"max_net_loss": 0, "alpha": 0.05}
# margin_pct: the loss (percentage points of accuracy) the audit must rule out; level: the one-sided
# confidence of that claim over all the audit's datasets together (Bonferroni); alpha: the McNemar FAIL clause
QUALITY_V2 = {"margin_pct": 3.0, "level": 0.95, "alpha": 0.05}


def _record(rule: str, verdict: str, reasons: list, params: dict, dev: dict, table: Mapping[str, Any],
            c_only: Any, k_only: Any, net: int, p: float) -> dict:
    """The fields every quality rule's result shares: its verdict and the paired table it read."""
    return {"rule": rule, "verdict": verdict, "reasons": reasons, "params": params, "deviations": dev,
            "n": table.get("n"), "control_correct": table.get("control_correct"),
            "candidate_correct": table.get("candidate_correct"), "control_only": c_only, "candidate_only": k_only,
            "net": net, "mcnemar_p": p}


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
    params, dev, reasons = registered_params({"max_net_loss": max_net_loss, "alpha": alpha}, QUALITY_V1)
    c_only = list(table["control_only"])
    k_only = list(table["candidate_only"])
    net = len(k_only) - len(c_only)
    # Recompute rather than trust a stored p, so the verdict follows the counts.
    p = mcnemar_exact_p(len(c_only), len(k_only))

    invalid = _invalid(table)
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
    return {**_record("quality-v1", verdict, reasons, params, dev, table, c_only, k_only, net, p), "mde": mde}


def _invalid(table: Mapping[str, Any]) -> list[str]:
    """Why the arms are not comparable (both rules' INVALID clause): bodies differ, an answer unnatural or missing."""
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
    return invalid + _who_ran_out(table.get("unnatural_finish_indices") or {})


def _who_ran_out(unnatural: Mapping[str, Any]) -> list[str]:
    """Which arm's unnatural finishes the other arm does not share: an answer cut where the other arm's answer to
    the same item ended by itself says the arm runs on, not that max_tokens is too small for the task. Said beside
    INVALID, never instead of it: the rule cannot score an answer that was cut."""
    ctrl = set(unnatural.get("control", []))
    cand = set(unnatural.get("candidate", []))
    lines = []
    for arm, mine, other, theirs in (("candidate", cand, "control", ctrl), ("control", ctrl, "candidate", cand)):
        alone = sorted(mine - theirs)
        if not alone:
            continue
        line = f"{arm} alone did not finish naturally at indices {_ids(alone)}: the {other}'s answers to them ended by themselves"
        if not theirs:
            line += (f" (every {other} answer did), so max_tokens is enough for the task as the {other} does it "
                     f"and the {arm} runs on; the boundary gate and the greedy diagnostics show whether it loops")
        lines.append(line)
    both = sorted(ctrl & cand)
    if both:
        lines.append(f"both arms ran out at indices {_ids(both)}: max_tokens may be too small for these items")
    return lines


def per_dataset_level(level: float, datasets: int) -> float:
    """Bonferroni: each of the audit's D datasets is bounded at 1 - (1 - level) / D, so all hold at ``level``."""
    return 1.0 - (1.0 - level) / datasets


def _ids(xs: list) -> str:
    """Item indices for a reason line: all of a few, the first ten of many."""
    return str(xs) if len(xs) <= 10 else f"[{', '.join(map(str, xs[:10]))}, ... ({len(xs)} in all)]"


def _pct(x: float) -> str:
    """A confidence level as a percentage, without float noise (0.975 -> '97.5')."""
    return f"{100 * x:.4g}"


def quality_v2(table: Mapping[str, Any], *, margin_pct: float = 3.0, level: float = 0.95, alpha: float = 0.05,
               datasets: int = 1) -> dict:
    """quality-v2 on one dataset's paired table: does the table rule out a loss of ``margin_pct`` points?

    loss = accuracy(control) - accuracy(candidate) = (b - c) / n, b the
    control-only and c the candidate-only items. Its upper confidence bound
    is Tango's score bound for a difference of paired proportions, at the
    per-dataset level 1 - (1 - level) / datasets (Bonferroni over the
    audit's ``datasets``, so every dataset's claim holds together at
    ``level``). Clauses, in order:

    INVALID when the arms are not comparable (as quality-v1);
    PASS when Tango's score test rejects loss >= margin (equivalently the
    bound is below the margin): a loss of the margin or more is ruled out;
    FAIL when the candidate is worse and the exact McNemar p < alpha (a
    significant loss, quality-v1's FAIL clause);
    INCONCLUSIVE otherwise: the loss the table cannot rule out, and about
    how many items would rule out the margin (``stats.noninferiority_items``
    at the table's discordance, for a candidate that loses nothing).
    """
    if isinstance(datasets, bool) or not isinstance(datasets, int) or datasets < 1:
        raise ValueError(f"datasets must be a positive integer, got {datasets!r}")
    params, dev, dev_reasons = registered_params({"margin_pct": margin_pct, "level": level, "alpha": alpha},
                                                 QUALITY_V2)
    reasons: list[str] = []
    c_only = list(table["control_only"])
    k_only = list(table["candidate_only"])
    b, c = len(c_only), len(k_only)
    n = int(table.get("n") or 0)
    net = c - b
    p = mcnemar_exact_p(b, c)
    each = per_dataset_level(level, datasets)
    margin = margin_pct / 100.0
    upper = loss_upper_bound(b, c, n, each) if n else 1.0
    loss = (b - c) / n if n else None
    passes = bool(n and noninferiority_pass(b, c, n, margin, each))
    bound = {"method": "Tango score bound (one-sided) on the paired loss, accuracy(control) - accuracy(candidate)",
             "level": each, "upper_pct": 100 * upper, "loss_pct": None if loss is None else 100 * loss,
             "margin_pct": margin_pct, "ruled_out": passes}
    multiplicity = {"method": "bonferroni", "datasets": datasets, "family_level": level, "per_dataset_level": each}
    observed = f"observed loss {100 * (loss or 0):+.1f} points (net {net:+d} of {n}: control-only {c_only}, "                f"candidate-only {k_only})"
    at = f"at {_pct(each)} %" + (f" ({_pct(level)} % over the audit's {datasets} datasets, Bonferroni)"
                                 if datasets > 1 else "")
    needed = None
    invalid = _invalid(table)
    if invalid:
        verdict = "INVALID"
        reasons += invalid
    elif passes:
        verdict = "PASS"
        better = f" (the candidate is at least {-100 * upper:.1f} points better)" if upper < 0 else ""
        reasons.append(f"loss >= {100 * upper:.1f} points ruled out {at}{better}, below the margin of "
                       f"{margin_pct:g} points (Tango score bound); {observed}")
        if net < 0 and p < alpha:
            reasons.append(f"the loss is significant (McNemar p={p:.4g} < alpha {alpha}) but ruled out below the "
                           "margin: a loss the margin accepts")
    elif net < 0 and p < alpha:
        verdict = "FAIL"
        reasons.append(f"candidate worse: net {net:+d} (control-only {_ids(c_only)}, candidate-only "
                       f"{_ids(k_only)}), McNemar p={p:.4g} < alpha {alpha}; loss up to {100 * upper:.1f} points "
                       f"{at}")
    else:
        verdict = "INCONCLUSIVE"
        disc = (b + c) / n if n else 0.0
        needed = noninferiority_items(margin, disc, level=each, power=MDE_POWER)
        many = (f"about {needed['items']} items would" if needed["items"] is not None
                else f"more than {needed['max_items']} items would be needed")
        reasons.append(f"cannot rule out a loss of {100 * upper:.1f} points with {n} items; {many} (margin "
                       f"{margin_pct:g} points, Tango score bound {at}; power {MDE_POWER:g} at the observed "
                       f"discordance {disc:.3g}, if the candidate loses nothing); {observed}, McNemar p={p:.4g}")
    # the verdict's reason first (the front page shows it), then any changed parameter
    reasons += dev_reasons
    mde = minimum_detectable_loss(n, min(n, b + c), alpha=alpha, power=MDE_POWER, max_net_loss=0)
    reasons.append(mde_reason(mde))
    return {
        **_record("quality-v2", verdict, reasons, params, dev, table, c_only, k_only, net, p),
        "loss_bound": bound,
        "multiplicity": multiplicity,
        "needed": needed,
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
