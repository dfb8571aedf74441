"""determinism-v1: greedy repeats of each arm are identical -> PASS | STOP.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

from typing import Mapping, Sequence


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
