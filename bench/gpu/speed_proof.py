"""The speed gate's proof on a GPU host, one detached run: A/A twice, the example twice, planted -3 % twice, +3 % once.

Every run is ``bench/speed_bracket.py`` (the speed stage itself, no answers
phase) on the same config, all appending to one control archive, so each
run's gate sees the host's earlier windows of the same control, as an audit
on that host would. In order:

1. ``example-1``: the config's change, first, because a large change decides
   without the host's evidence, and its control starts are the first
   evidence the A/A runs get;
2. ``aa-1``: the config's control against itself (must be NO_WIN);
3. ``slow-1``: the control against itself with a step delay in the candidate
   sized from aa-1's own milliseconds per decode round to slow it by 3 %
   (must be LOSS);
4. ``fast-1``: the delay in the control instead, the candidate 3 % faster
   (must be WIN);
5. ``aa-2``, ``slow-2``, ``example-2``: each a second time (the example must
   give the same verdict).

One of each comes first, so a budget that stops early still leaves every
verdict tried once.

A run that would start after ``--budget-s`` seconds is skipped and listed as
such. Writes ``summary.jsonl`` (one line per run) and each run's artifacts
under ``--out``, and prints a table at the end.

Usage: python3 bench/gpu/speed_proof.py --config config/examples/gpu-refserver.yaml --out DIR [--budget-s 1100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANT_PCT = 3.0


def run(name: str, cfg: str, out: Path, extra: list[str]) -> dict:
    summary = out / "summary.jsonl"
    before = summary.read_text().count("\n") if summary.exists() else 0
    t0 = time.monotonic()
    cmd = [sys.executable, str(REPO / "bench" / "speed_bracket.py"), "--config", cfg, "--out", str(out / name),
           "--archive", str(out / "control-archive.jsonl"), "--audit", name, "--summary", str(summary), *extra]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(extra) or 'the config as is'}", flush=True)
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    lines = summary.read_text().splitlines() if summary.exists() else []
    if rc != 0 or len(lines) <= before:
        res = {"audit": name, "verdict": "ERROR", "rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
        with open(summary, "a") as fh:
            fh.write(json.dumps(res) + "\n")
        print(f"  {name}: rc {rc}; log tail:\n" + "\n".join((out / f"{name}.log").read_text().splitlines()[-15:]),
              flush=True)
        return res
    res = json.loads(lines[-1])
    print(f"  {name}: {res['verdict']} after {res['starts']} starts, gain {res.get('pooled_gain_pct')}, "
          f"half-width {res.get('half_width_pct')}, {res['wall_s']} s", flush=True)
    return res


def ms_per_round(res: dict) -> float:
    vals = [v for per in (res.get("ms_per_round") or {}).values() for v in per if isinstance(v, (int, float))]
    if not vals:
        raise SystemExit("the first A/A measured no milliseconds per round: cannot size the planted delay")
    return sum(vals) / len(vals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/examples/gpu-refserver.yaml")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=1100.0)
    ap.add_argument("--only", default=None, help="comma-separated run names to run (default: all)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    only = set(a.only.split(",")) if a.only else None
    results: dict[str, dict] = {}
    # a driver started again on the same --out (e.g. with --only for the runs a first one missed) sizes its
    # planted delays from the A/A an earlier driver measured there
    summary = out / "summary.jsonl"
    for line in summary.read_text().splitlines() if summary.exists() else []:
        r = json.loads(line)
        if r.get("verdict") != "ERROR" and r.get("ms_per_round") and (only is None or r["audit"] not in only):
            results[r["audit"]] = r
    # the example first: its control is the A/As' and the slowdowns' control, and win2-v4 spends its
    # alpha O'Brien-Fleming-type only once the start-to-start variance has enough degrees of freedom
    plan: list[tuple[str, list[str] | None]] = [("example-1", []), ("aa-1", ["--aa"]), ("slow-1", None),
                                                ("fast-1", None), ("aa-2", ["--aa"]), ("slow-2", None),
                                                ("example-2", [])]
    for name, extra in plan:
        if only and name not in only:
            continue
        if time.monotonic() - t_start > a.budget_s:
            results[name] = {"audit": name, "verdict": "SKIPPED (budget)"}
            print(f"  {name}: skipped, {a.budget_s:g} s budget spent", flush=True)
            continue
        if extra is None:
            base = results.get("aa-1") or next((r for r in results.values() if r.get("ms_per_round")), None)
            if base is None:
                results[name] = {"audit": name, "verdict": "SKIPPED (no A/A to size the delay from)"}
                continue
            ms = ms_per_round(base)
            # the candidate slower by PLANT_PCT: rate ratio 1 / (1 + d / t) = 1 - p; the control slower
            # instead (the candidate faster by PLANT_PCT): (t + d) / t = 1 + p
            if name.startswith("slow"):
                d_us = 1000.0 * ms * (1.0 / (1.0 - PLANT_PCT / 100.0) - 1.0)
                extra = ["--plant-delay-us", str(round(d_us)), "--plant-in", "candidate"]
            else:
                d_us = 1000.0 * ms * PLANT_PCT / 100.0
                extra = ["--plant-delay-us", str(round(d_us)), "--plant-in", "control"]
        results[name] = run(name, a.config, out, extra)
    print(f"\nall runs: {time.monotonic() - t_start:.0f} s", flush=True)
    print("| run | verdict | starts | gain % | half-width % | noise per repeat / start to start % (df) | wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        nz = r.get("noise") or {}
        g, h = r.get("pooled_gain_pct"), r.get("half_width_pct")
        print(f"| {name} | {r.get('verdict')} | {r.get('starts', '-')} | "
              f"{'-' if g is None else f'{g:+.2f}'} | {'-' if h is None else f'{h:.2f}'} | "
              f"{nz.get('rep_sd_pct', float('nan')):.2f} / {nz.get('start_sd_used_pct', float('nan')):.2f} "
              f"({nz.get('df_used')}) | {r.get('wall_s', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
