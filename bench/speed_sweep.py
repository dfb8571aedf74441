"""Simulated error rates of the shared-control speed bracket (win2-v4 per candidate) for 1 and 3 candidates.

Several candidates against one control run C, T1, C, T2, ..., Tn, C and then
T, C for each candidate still undecided, up to each candidate's own budget
(``max_starts`` 9: 4 candidate starts); each candidate is decided by win2-v4
over its own windows C-T-C, the bracket's other control starts pooled into
its start-to-start variance (``gates.sweep_layout``). The registered
functions run here: ``gates.sweep_verdicts`` over ``gates.simulate_sequences``.

Noise levels (per repeat / start to start, % of the control): the
two-process reference server on an H200 (2.7 / 1.0) and the CPU default's
(3 / 2), as in docs/speed.md's win2-v4 table, with a 5 % prompt effect per
repeat, 2 deciding cells, 3 repeats and a guard as noisy as the primary;
without host evidence, and with an earlier A/A window of 13 control starts
(12 degrees of freedom) per bracket.

Per candidate (T1 ... Tn in bracket order): false WIN and false LOSS with
every candidate identical to the control, WIN when every candidate is 3 %
faster, LOSS when every candidate is 3 % slower, and its mean candidate
starts on identical arms; per bracket: how often any candidate had a false
WIN or a false LOSS (the rates are per candidate, not family-wise), and the
mean starts of the whole bracket on identical arms beside what n separate
brackets of the same candidates ran.

Usage: .venv/bin/python bench/speed_sweep.py [--windows 4000] [--max-starts 9] [--seed 2026]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pairaudit import gates  # noqa: E402
from pairaudit.gates.speed import sweep_length, sweep_verdicts  # noqa: E402

SETTINGS = [("H200 two-process server", 2.7, 1.0), ("CPU default", 3.0, 2.0)]  # (label, per repeat %, start %)
PROMPT_SD = 5.0
GUARDS = ["decode_tps"]
EVIDENCE_DF = 12
EFFECT = 3.0


def evidence(rng: np.random.Generator, n: int, *, cells: int, repeats: int, rep: float, start: float) -> dict:
    """One earlier A/A window of EVIDENCE_DF + 1 control starts per bracket, under the same noise."""
    ctrl = gates.simulate_sequences(rng, n, cells=cells, repeats=repeats, rep_sd=rep, start_sd=start,
                                    max_starts=EVIDENCE_DF + 1, prompt_sd=PROMPT_SD, metrics=["primary", *GUARDS])
    out = {}
    for m, x in ctrl.items():
        pv, cv, df = gates.evidence_from_controls(x)
        out[m] = {"pooled": (pv, df), "cells": [(c, df) for c in cv]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=4000)
    ap.add_argument("--max-starts", type=int, default=9)
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    t0 = time.perf_counter()
    # win2-v4's registered parameters, as a sweep's decision uses them
    kw = dict(primary="primary", guards=GUARDS, lower_is_better=(), **gates.WIN2_V4)
    print(f"win2-v4 per candidate in a shared-control bracket, up to {a.max_starts} starts of each candidate's own "
          f"bracket; {a.windows} brackets per row, {a.cells} deciding cells, {a.repeats} repeats, prompt effect "
          f"{PROMPT_SD} %, seed {a.seed}\n")
    print("| noise (per repeat / start) | candidates | evidence | candidate | false WIN | false LOSS | WIN at +3 % "
          "| LOSS at -3 % | its starts on A/A | any false WIN / LOSS | bracket starts on A/A (separate) |")
    print("|" + "---|" * 11)
    worst = 0.0
    for label, rep, start in SETTINGS:
        for n_cand in (1, 3):
            cands = [f"T{k + 1}" for k in range(n_cand)]
            for ev_df in (0, EVIDENCE_DF):
                rng = np.random.default_rng(a.seed)
                length = sweep_length(n_cand, a.max_starts)
                res = {}
                for g in (0.0, EFFECT, -EFFECT):
                    sims = gates.simulate_sequences(rng, a.windows, cells=a.cells, repeats=a.repeats, rep_sd=rep,
                                                    start_sd=start, max_starts=length, gain_pct=g,
                                                    prompt_sd=PROMPT_SD, metrics=["primary", *GUARDS])
                    ev = evidence(rng, a.windows, cells=a.cells, repeats=a.repeats, rep=rep,
                                  start=start) if ev_df else None
                    res[g] = sweep_verdicts(sims, cands, max_starts=a.max_starts, evidence=ev, **kw)
                sim = res[0.0]
                null = sim.verdicts
                any_win = np.any([null[c] == "WIN" for c in cands], axis=0).mean()
                any_loss = np.any([null[c] == "LOSS" for c in cands], axis=0).mean()
                # separate brackets with the same candidate starts: each its own controls, one more than those
                separate = sum(2 * sim.windows[c] + 1 for c in cands).mean()
                for k, c in enumerate(cands):
                    fw, fl = (null[c] == "WIN").mean(), (null[c] == "LOSS").mean()
                    worst = max(worst, fw, fl)
                    first = k == 0
                    head = first and n_cand == 1 and not ev_df
                    print(f"| {label + f': {rep:g} / {start:g} %' if head else ''} | {n_cand if first else ''} | "
                          f"{('A/A, ' + str(ev_df) + ' df' if ev_df else 'none') if first else ''} | {c} | "
                          f"{100 * fw:.2f} % | {100 * fl:.2f} % | "
                          f"{100 * (res[EFFECT].verdicts[c] == 'WIN').mean():.1f} % | "
                          f"{100 * (res[-EFFECT].verdicts[c] == 'LOSS').mean():.1f} % | "
                          f"{sim.windows[c].mean():.2f} | "
                          + (f"{100 * any_win:.2f} % / {100 * any_loss:.2f} % | {sim.starts.mean():.2f} "
                             f"({separate:.2f}) |"
                             if first else "| |"))
    print(f"\nworst false WIN or LOSS of any candidate over the table: {100 * worst:.2f} % (registered: at most 5 % "
          f"per candidate); {time.perf_counter() - t0:.1f} s")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
