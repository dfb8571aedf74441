"""Measure the workflow's overhead on the embedded default audit, in one run.

Runs ``snakemake --cores 4 promotion`` on config/config.yaml in a scratch copy
of the project (so the checkout's results/ is untouched), then prints:
  * wall time of the audit;
  * servers' busy time: the union of the intervals during which some server
    was answering a journaled request (sampled + greedy), and the overhead
    (wall - busy) / wall  (goal: <= 5 %);
  * how much of the wall time went to starting servers (from their logs);
  * the no-op rerun time (goal: < 3 s).

Usage: .venv/bin/python bench/audit_overhead.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
COPY = ["Snakefile", "rules", "scripts", "config", "profiles", "envs", "pairaudit", "report"]


def scratch_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / name)
    return root


def run(project: Path, *args) -> float:
    t0 = time.perf_counter()
    subprocess.run([SNAKEMAKE, "--cores", "4", *args], cwd=project, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _interval(timings: dict | None) -> tuple[float, float] | None:
    try:
        start = dt.datetime.fromisoformat(timings["started_at"]).timestamp()
        return start, start + float(timings["elapsed_s"])
    except (KeyError, TypeError, ValueError):
        return None


def request_intervals(results: Path) -> list[tuple[float, float]]:
    """Every request a server answered: sampled and greedy journals, preflight calls, divergence probes."""
    timings = []
    for journal in results.glob("journal/**/*.jsonl"):
        for line in journal.read_text().splitlines():
            try:
                timings.append(json.loads(line).get("timings"))
            except json.JSONDecodeError:
                continue
    for pre in results.glob("preflight/*.json"):
        for probe in json.loads(pre.read_text()).get("probes", []):
            timings += [{"started_at": c.get("started_at"), "elapsed_s": c.get("elapsed_s")}
                        for c in probe.get("calls", [])]
    for div in results.glob("divergence/*.json"):
        for probes in json.loads(div.read_text()).get("probes", {}).values():
            timings += [p.get("timings") for p in probes]
    return [iv for iv in map(_interval, timings) if iv is not None]


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def startup_seconds(results: Path) -> tuple[int, float]:
    """(server starts, seconds from process start to healthy) read from the launch records the jobs keep."""
    starts, seconds = 0, 0.0
    for log in results.glob("logs/servers/*.log"):
        starts += len(re.findall(r"^=== pairaudit launch", log.read_text(errors="replace"), flags=re.M))
    for rec in results.glob("launch/*.json"):
        seconds += json.loads(rec.read_text())["run"].get("ready_s") or 0.0
    per_start = seconds / max(1, len(list(results.glob("launch/*.json"))))
    return starts, starts * per_start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, help="run in this directory and keep it")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="pairaudit-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    project = scratch_project(root / "project")
    wall = run(project, "promotion")
    audit = re.search(r"^audit:\s*(\S+)", (project / "config" / "config.yaml").read_text(), re.M).group(1)
    results = project / "results" / audit
    busy = union_length(request_intervals(results))
    starts, start_s = startup_seconds(results)
    noop = run(project, "promotion")
    decision = json.loads((results / "promotion" / "decision.json").read_text())
    print(f"\n| measure | value |\n|---|---|")
    print(f"| audit wall time | {wall:.1f} s |")
    print(f"| servers busy answering requests (union) | {busy:.1f} s |")
    print(f"| overhead (wall - busy) / wall | {100 * (wall - busy) / wall:.1f} % (goal <= 5 %) |")
    print(f"| server starts / est. time to healthy | {starts} / {start_s:.1f} s |")
    print(f"| no-op rerun | {noop:.2f} s (goal < 3 s) |")
    print(f"| decision | {decision['decision']} |")
    for name, ds in decision.get("datasets", {}).items():
        print(f"| {name} | control {ds.get('control_correct')}/{ds.get('n')}, candidate "
              f"{ds.get('candidate_correct')}/{ds.get('n')}, quality-v1 {ds.get('verdict')} |")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
