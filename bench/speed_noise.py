"""Simulated error rates of the speed gate under win2-v1 and win2-v2, side by side.

Identical arms (false WIN, false LOSS) and a candidate that is truly +10 %
faster (power), for every noise model the speed gate must survive:
independent per-repeat noise of 1-5 % and per-start offsets of 1-3 % (plus
1 % per repeat). A per-start offset is shared by every cell, repeat and
metric of that start (``gates.simulate_windows``). Each window is a whole
gate as the stage composes it: R repeats, the deciding cells of the embedded
default (2), and its guards (accepted drafts per round, 0 without
speculation, and client decode tok/s, as noisy as the primary).

win2-v2 runs through ``gates.speed._win2_v2_core``, the function the registered
rule itself calls. win2-v1 is vectorized here (the registered function takes
one cell at a time); the first ``--check`` windows of every setting are also
run through ``gates.win2_v1`` and ``speeddecision.combine`` and must give the same
gate verdicts, else the script stops.

Usage: .venv/bin/python bench/speed_noise.py [--windows 5000] [--repeats 3] [--cells 2] [--seed 2026]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats as st

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pairaudit import gates  # noqa: E402
from pairaudit.speed import decision as speeddecision  # noqa: E402

GUARDS = ["accepted_per_round", "decode_tps"]
ZERO = ["accepted_per_round"]
METRICS = ["pooled_rate_tps", *GUARDS]
# (label, per-repeat sd %, per-start sd %)
MODELS = [("independent 1 %", 1.0, 0.0), ("independent 2 %", 2.0, 0.0), ("independent 3 %", 3.0, 0.0),
          ("independent 4 %", 4.0, 0.0), ("independent 5 %", 5.0, 0.0),
          ("start 1 % + repeat 1 %", 1.0, 1.0), ("start 2 % + repeat 1 %", 1.0, 2.0),
          ("start 3 % + repeat 1 %", 1.0, 3.0)]
POWER_GAIN = 10.0


def v1_gate(w: dict, *, win_pct: float = 2.0, level: float = 0.95) -> np.ndarray:
    """win2-v1 per cell (gates.win2_v1) and the stage's gate over the cells (speeddecision.combine), vectorized."""
    x = w["pooled_rate_tps"]                                   # (W, C, R, 3)
    n_rep = x.shape[2]
    control = (x[..., 0] + x[..., 2]) / 2.0
    diff = x[..., 1] - control
    gain_pct = 100.0 * diff.mean(axis=-1) / np.abs(control.mean(axis=-1))
    half = st.t.ppf((1 + level) / 2, n_rep - 1) * diff.std(axis=-1, ddof=1) / math.sqrt(n_rep)
    lo, hi = diff.mean(axis=-1) - half, diff.mean(axis=-1) + half
    win = (gain_pct > win_pct) & (lo > 0)
    loss = (gain_pct < -win_pct) & (hi < 0)
    needed = max(1, math.ceil(2 * n_rep / 3 - 1e-9))
    for g in GUARDS:
        y = w[g]
        spread = np.abs(y[..., 0] - y[..., 2])
        worse = -(y[..., 1] - (y[..., 0] + y[..., 2]) / 2.0) > spread
        loss |= worse.sum(axis=-1) >= needed
    cell = np.where(loss, "LOSS", np.where(win, "WIN", "NO_WIN"))
    return np.where((cell == "LOSS").any(axis=-1), "LOSS",
                    np.where((cell == "WIN").all(axis=-1), "WIN", "NO_WIN"))


def v2_gate(w: dict) -> np.ndarray:
    return gates.speed._win2_v2_core(w, primary="pooled_rate_tps", guards=GUARDS, lower_is_better=(),
                               **{k: gates.WIN2_V2[k] for k in ("win_pct", "alpha_win", "alpha_loss",
                                                                "start_noise_pct")})["verdict"]


def check_v1(w: dict, got: np.ndarray, n: int) -> None:
    """The vectorized win2-v1 must equal the registered function composed by the stage."""
    cells = [f"c{j}" for j in range(w["pooled_rate_tps"].shape[1])]
    for i in range(min(n, len(got))):
        per = {c: gates.win2_v1({m: w[m][i, j].tolist() for m in METRICS}, primary="pooled_rate_tps",
                                guards=GUARDS) for j, c in enumerate(cells)}
        want = speeddecision.combine(per, cells, informational=False)["verdict"]
        if want != got[i]:
            raise SystemExit(f"vectorized win2-v1 disagrees with gates.win2_v1 at window {i}: {got[i]} != {want}")


def rates(v: np.ndarray) -> dict:
    return {k: float((v == k).mean()) for k in ("WIN", "LOSS", "NO_WIN", "INCONCLUSIVE")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--check", type=int, default=100, help="windows per setting re-run through gates.win2_v1")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    rng = np.random.default_rng(args.seed)
    print(f"{args.windows} windows per setting, {args.cells} deciding cells, R={args.repeats}, guards {GUARDS} "
          f"({', '.join(ZERO)} = 0), power at +{POWER_GAIN:g} %, seed {args.seed}")
    print(f"win2-v2 registered: {gates.WIN2_V2}")
    head = f"{'noise model':<24} {'rule':<8} {'false WIN':>9} {'false LOSS':>10} {'null INCONCL':>12} " \
           f"{'power WIN':>9} {'power LOSS':>10}"
    print(head)
    print("-" * len(head))
    for label, rep_sd, start_sd in MODELS:
        kw = dict(cells=args.cells, repeats=args.repeats, rep_sd=rep_sd, start_sd=start_sd, metrics=METRICS,
                  zero=ZERO)
        null = gates.simulate_windows(rng, args.windows, **kw)
        alt = gates.simulate_windows(rng, args.windows, gain_pct=POWER_GAIN, **kw)
        v1n, v1a = v1_gate(null), v1_gate(alt)
        check_v1(null, v1n, args.check)
        check_v1(alt, v1a, args.check)
        for name, vn, va in (("win2-v1", v1n, v1a), ("win2-v2", v2_gate(null), v2_gate(alt))):
            n_, a_ = rates(vn), rates(va)
            print(f"{label:<24} {name:<8} {100 * n_['WIN']:8.2f}% {100 * n_['LOSS']:9.2f}% "
                  f"{100 * n_['INCONCLUSIVE']:11.2f}% {100 * a_['WIN']:8.2f}% {100 * a_['LOSS']:9.2f}%")
    print(f"CPU time {time.process_time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
