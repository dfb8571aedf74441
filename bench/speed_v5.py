"""win2-v5's simulated outcomes at the noise GPU hosts showed: the table docs/speed.md prints.

For each start component (a start's own offset, sd in % of the control: 1.4, 1.9, 2.25) with per-repeat
noise 2.5 %, 2 deciding cells and 3 repeats (the GPU examples' bracket), the registered design
(``gates.WIN2_V5``, max_starts from the schema unless ``--max-starts``), with no host evidence and with a
calibration's worth (``--evidence-df``): false WIN and false LOSS on identical arms, NO_WIN on identical arms,
LOSS for a -3 % change, WIN for a +3 % one, NO_WIN for a +2 % one (a gain of the bar called no win), the mean
starts and minutes at ``--start-s`` seconds a start, and the longest bracket. The simulation is the one the
decision reports its rates with (``gates.win2_v5_rates``); tests/test_rules_win2v5.py checks it against the
registered rule run one bracket at a time. The targets: false WIN and LOSS <= 5 % each, A/A NO_WIN,
-3 % LOSS and +3 % WIN >= 80 %, +2 % NO_WIN <= 10 %. docs/speed.md's table is this at the schema's
max_starts (61) and, for comparison, ``--max-starts 31 --evidence-df 0``.

Usage: .venv/bin/python bench/speed_v5.py [--n 2000] [--max-starts 31] [--start-s 25] [--evidence-df 0 20]
           [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pairaudit import gates  # noqa: E402
from pairaudit.core import defaults  # noqa: E402

START_SDS = (1.4, 1.9, 2.25)
REP_SD, CELLS, REPEATS = 2.5, 2, 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="simulated brackets per true gain")
    ap.add_argument("--max-starts", type=int, default=defaults.section("speed")["max_starts"])
    ap.add_argument("--start-s", type=float, default=25.0, help="seconds a start, for the minutes")
    ap.add_argument("--evidence-df", type=int, nargs="*", default=[0, 20])
    ap.add_argument("--json", default=None, help="also write every result here")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    rows = []
    print(f"win2-v5 (registered {gates.WIN2_V5}), max_starts {a.max_starts}, per repeat {REP_SD} %, {CELLS} cells x "
          f"{REPEATS} repeats, {a.n} brackets per gain, minutes at {a.start_s:g} s a start\n")
    print("| start sd % | host evidence df | false WIN | false LOSS | A/A NO_WIN | -3 % LOSS | +3 % WIN | "
          "+2 % NO_WIN | mean starts A/A / +3 / -3 | mean min A/A | longest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for ev in a.evidence_df:
        for sd in START_SDS:
            r = gates.win2_v5_rates(rep_sd=REP_SD, start_sd=sd, cells=CELLS, repeats=REPEATS,
                                    max_starts=a.max_starts, guards=["decode_tps"], evidence_df=ev, n=a.n)
            by = r["by_gain"]
            rows.append(r)
            longest = max(v["max_starts_run"] for v in by.values())
            print(f"| {sd:g} | {ev} | {100 * r['false_win']:.1f} | {100 * r['false_loss']:.1f} | "
                  f"{100 * r['null_no_win']:.1f} | {100 * r['power_loss']:.1f} | {100 * r['power']:.1f} | "
                  f"{100 * r['bar_no_win']:.1f} | {by['+0']['mean_starts']:.1f} / {by['+3']['mean_starts']:.1f} / "
                  f"{by['-3']['mean_starts']:.1f} | {by['+0']['mean_starts'] * a.start_s / 60:.1f} | {longest} |",
                  flush=True)
    print(f"\n{time.monotonic() - t0:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
