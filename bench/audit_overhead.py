"""Measure the workflow's overhead on the embedded default audit, in one run.

Runs ``snakemake --cores 4 promotion`` on config/config.yaml in a scratch copy
of the project (so the checkout's results/ is untouched), then prints:
  * wall time of the audit;
  * servers' busy time: the union of the intervals during which some server
    was answering a request of the audit (preflight probes, sampled, boundary
    cases, greedy runs, divergence probes, speed streams), and the overhead
    (wall - busy) / wall  (goal: <= 10 %, 5 % the aim);
  * the server starts per phase and each start's time to healthy;
  * the no-op rerun: its time (goal: < 2 s) and the jobs it plans (goal: 0).

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


def _timed(rec: dict) -> dict | None:
    """A record's (started_at, seconds) whichever way its stage wrote them."""
    if isinstance(rec.get("timings"), dict):
        return rec["timings"]
    if rec.get("started_at") and rec.get("e2el_s") is not None:
        return {"started_at": rec["started_at"], "elapsed_s": rec["e2el_s"]}
    return None


def _records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def request_intervals(results: Path) -> list[tuple[float, float]]:
    """Every request a server answered: journals (sampled, greedy, probes, boundary), preflight, speed streams."""
    timings = []
    for journal in results.glob("journal/**/*.jsonl"):
        for rec in _records(journal):
            if "probes" in rec:  # a preflight record: its probes' calls
                for probe in rec["probes"]:
                    timings += [{"started_at": c.get("started_at"), "elapsed_s": c.get("elapsed_s")}
                                for c in probe.get("calls", [])]
            else:
                timings.append(_timed(rec))
    for streams in results.glob("speed/streams.jsonl"):
        timings += [_timed(r) for r in _records(streams)[1:]]
    return [iv for iv in map(_interval, [t for t in timings if t]) if iv is not None]


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def starts_per_phase(results: Path) -> dict[str, list[float]]:
    """Seconds to healthy of every server start, by phase (the audit's log of starts, the speed bracket)."""
    phases: dict[str, list[float]] = {}
    log = results / "servers" / "starts.jsonl"
    if log.exists():
        for rec in _records(log):
            if rec.get("event") == "ready":
                phases.setdefault(rec["phase"], []).append(rec.get("ready_s") or 0.0)
    speed = results / "speed" / "decision.json"
    if "speed" not in phases and speed.exists():  # audits from before the starts log held the bracket
        phases["speed"] = [(s.get("server") or {}).get("ready_s") or 0.0
                           for s in json.loads(speed.read_text()).get("starts", [])]
    return phases


def planned_jobs(project: Path) -> int:
    out = subprocess.run([SNAKEMAKE, "--cores", "4", "-n", "promotion"], cwd=project, capture_output=True,
                         text=True, check=True).stdout
    return len(re.findall(r"^(?:local)?rule \w+:", out, flags=re.M))


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
    phases = starts_per_phase(results)
    noop = run(project, "promotion")
    noop_jobs = planned_jobs(project)
    decision = json.loads((results / "promotion" / "decision.json").read_text())
    print("\n| measure | value |\n|---|---|")
    print(f"| audit wall time | {wall:.1f} s |")
    print(f"| servers busy answering requests (union) | {busy:.1f} s |")
    print(f"| overhead (wall - busy) / wall | {100 * (wall - busy) / wall:.1f} % (goal <= 10 %, aim 5 %) |")
    total = sum(len(v) for v in phases.values())
    print(f"| server starts | {total} (goal <= 8) |")
    for phase, ready in phases.items():
        print(f"| {phase} phase: starts / time to healthy | {len(ready)} / "
              f"{', '.join(f'{x:.1f}' for x in ready)} s |")
    print(f"| no-op rerun | {noop:.2f} s, {noop_jobs} jobs (goal < 2 s, 0 jobs) |")
    print(f"| decision | {decision['decision']} |")
    for name, ds in decision.get("datasets", {}).items():
        print(f"| {name} | control {ds.get('control_correct')}/{ds.get('n')}, candidate "
              f"{ds.get('candidate_correct')}/{ds.get('n')}, quality-v1 {ds.get('verdict')} |")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
