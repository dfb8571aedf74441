"""Simulated error rates of win2-v4 and win2-v3 (the sequential alternating bracket) beside win2-v2, at measured noise.

The noise levels are the ones measured on an H200 with the reference server
before its engine got a process of its own (per repeat / start to start, in
% of the control): 7.2 / 0 (floored), 5.4 / 30, 6.0 / 8.4, 4.1 / 1.5,
2.9 / 3.2, 7.6 / 0; the two-process server on the H200 (per repeat 2.7 and
2.0, start to start 1.0 and 0.8: the decomposition of its measured windows);
plus a quiet GPU host (0.5 / 0.3) and the CPU default's (about 3 / 2). A prompt effect of 5 % per repeat (the same prompts at the
same repeat index decode at their own speed, in every start) is added to
every setting: win2-v4 and win2-v3 pair it away, win2-v2 counts it as repeat noise.

Per setting: identical arms (false WIN, false LOSS, NO_WIN), a planted +3 %
(WIN) and -3 % (LOSS), and the mean number of starts each sequential rule
used, with and without host evidence (an earlier A/A window of the same
control: 13 control starts, 12 degrees of freedom, simulated under the same
noise). The registered functions run here
(``gates.sequential_verdicts`` over ``gates.simulate_sequences``); win2-v2 on
the first three starts of the same brackets.

Usage: .venv/bin/python bench/speed_sequential.py [--windows 4000] [--max-starts 9] [--seed 2026]
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
from pairaudit.gates.speed import _win2_v2_core  # noqa: E402

SETTINGS = [  # (label, per-repeat sd %, start-to-start sd %)
    ("H200, 128 tok x1 (a)", 7.2, 0.5), ("H200, 128 tok x1 (b)", 5.4, 30.0), ("H200 A/A, 128 tok", 6.0, 8.4),
    ("H200 A/A, 512 tok x2 (a)", 4.1, 1.5), ("H200 A/A, 512 tok x2 (b)", 2.9, 3.2), ("H200 A/A, c4", 7.6, 0.5),
    ("H200 two-process server (a)", 2.7, 1.0), ("H200 two-process server (b)", 2.0, 0.8),
    ("quiet GPU", 0.5, 0.3), ("CPU default", 3.0, 2.0),
]
PROMPT_SD = 5.0
F_ALPHA = 0.05
GUARDS = ["decode_tps"]
EVIDENCE_DF = 12
SEQUENTIAL = {"win2-v4": {"spending": "obf", "loss_pooled_share": 0.5},
              "win2-v3": {"spending": "bonferroni", "loss_pooled_share": None}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=4000)
    ap.add_argument("--max-starts", type=int, default=9)
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    t0 = time.perf_counter()
    kw = dict(primary="primary", guards=GUARDS, lower_is_better=(), win_pct=2.0, alpha_win=0.05, alpha_loss=0.05,
              start_noise_pct=3.0, min_df=2, evidence_f_alpha=F_ALPHA)
    print(f"win2-v4 and win2-v3 up to {a.max_starts} starts vs win2-v2 (3 starts); {a.windows} brackets per cell of the table, "
          f"{a.cells} deciding cells, {a.repeats} repeats, prompt effect {PROMPT_SD} %, seed {a.seed}\n")
    head = ("| noise (per repeat / start) | rule | evidence | false WIN | false LOSS | NO_WIN on A/A | WIN at +3 % "
            "| LOSS at -3 % | mean starts |")
    print(head)
    print("|" + "---|" * 9)
    worst = 0.0
    for label, rep, start in SETTINGS:
        rng = np.random.default_rng(a.seed)
        sims = {g: gates.simulate_sequences(rng, a.windows, cells=a.cells, repeats=a.repeats, rep_sd=rep,
                                            start_sd=start, max_starts=a.max_starts, gain_pct=g, prompt_sd=PROMPT_SD,
                                            metrics=["primary", *GUARDS]) for g in (0.0, 3.0, -3.0)}
        v2 = {g: _win2_v2_core({m: x[..., :3] for m, x in s.items()}, primary="primary", guards=GUARDS,
                               lower_is_better=(), win_pct=2.0, alpha_win=0.05, alpha_loss=0.05,
                               start_noise_pct=3.0)["verdict"] for g, s in sims.items()}
        print(f"| {label}: {rep:g} / {start:g} % | win2-v2 | - | {100 * (v2[0.0] == 'WIN').mean():.2f} % | "
              f"{100 * (v2[0.0] == 'LOSS').mean():.2f} % | {100 * (v2[0.0] == 'NO_WIN').mean():.1f} % | "
              f"{100 * (v2[3.0] == 'WIN').mean():.1f} % | {100 * (v2[-3.0] == 'LOSS').mean():.1f} % | 3 |")
        for ev_df in (0, EVIDENCE_DF):
            ev = None
            if ev_df:
                # an earlier A/A window of the same host per bracket: ev_df + 1 control starts
                ctrl = gates.simulate_sequences(rng, a.windows, cells=a.cells, repeats=a.repeats, rep_sd=rep,
                                                start_sd=start, max_starts=ev_df + 1, prompt_sd=PROMPT_SD,
                                                metrics=["primary", *GUARDS])
                ev = {}
                for m, x in ctrl.items():
                    pv, cv, df = gates.evidence_from_controls(x)
                    ev[m] = {"pooled": (pv, df), "cells": [(c, df) for c in cv]}
            for rule, spend in SEQUENTIAL.items():
                res = {g: gates.sequential_verdicts(s, max_starts=a.max_starts, evidence=ev, **kw, **spend)
                       for g, s in sims.items()}
                null, used = res[0.0]
                worst = max(worst, (null == "WIN").mean(), (null == "LOSS").mean())
                print(f"| | {rule} | {'A/A, ' + str(ev_df) + ' df' if ev_df else 'none'} | "
                      f"{100 * (null == 'WIN').mean():.2f} % | {100 * (null == 'LOSS').mean():.2f} % | "
                      f"{100 * (null == 'NO_WIN').mean():.1f} % | {100 * (res[3.0][0] == 'WIN').mean():.1f} % | "
                      f"{100 * (res[-3.0][0] == 'LOSS').mean():.1f} % | {used.mean():.2f} |")
    print(f"\nworst false WIN or LOSS of win2-v4 and win2-v3 over the table: {100 * worst:.2f} % (registered: at most 5 %); "
          f"{time.perf_counter() - t0:.1f} s")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
