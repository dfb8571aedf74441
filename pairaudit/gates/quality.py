"""quality-v1: one dataset's paired table -> PASS | HOLD | FAIL | INVALID.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

from typing import Any, Mapping

from pairaudit.core.stats import MDE_POWER, mcnemar_exact_p, minimum_detectable_loss
from pairaudit.gates.common import registered_params

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
    params, dev, reasons = registered_params({"max_net_loss": max_net_loss, "alpha": alpha}, QUALITY_V1)
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
