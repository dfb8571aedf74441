"""Measure the workflow's overhead on the embedded default audit, in one run.

Runs ``snakemake --cores 4 promotion`` on config/config.yaml in a scratch copy
of the project (so the checkout's results/ is untouched), then prints:
  * wall time of the audit;
  * servers' busy time: the union of the intervals during which some server
    was answering a request of the audit (preflight probes, sampled, boundary
    cases, greedy runs, divergence probes, speed streams), and the overhead
    (wall - busy) / wall  (goal: <= 10 %, 5 % the aim);
  * the server starts per phase and each start's time to healthy;
  * the no-op rerun: its time (goal: < 2 s) and the jobs it plans (goal: 0);
  * where the rest of the wall time went: every instant of the audit is put in
    the first class that holds it (a request in flight; a server starting; a
    phase job with its server up and no request in flight; a job between its
    launch by Snakemake and its script's first log line, i.e. interpreter
    start and imports; another job's script running, by rule; nothing running
    at all), from the job logs, Snakemake's log, the starts log and the
    request intervals.

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
    start = rec.get("started_at") or rec.get("wave_started_at")  # older speed streams: their wave's start
    if start and rec.get("e2el_s") is not None:
        return {"started_at": start, "elapsed_s": rec["e2el_s"]}
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


LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
SNAKE_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
PHASE_RULES = ("answers", "diagnostics", "speed")


def _local(stamp: str, fmt: str) -> float:
    return time.mktime(time.strptime(stamp, fmt))


def script_intervals(results: Path) -> dict[str, tuple[float, float]]:
    """Each job log's first and last timestamped line: the script's own run (after its imports)."""
    out = {}
    for path in results.glob("logs/**/*.log"):
        if "servers" in path.parts:
            continue
        stamps = [m.group(1) for m in map(LOG_LINE.match, path.read_text(errors="replace").splitlines()) if m]
        if stamps:
            a, b = (_local(x[:19], "%Y-%m-%d %H:%M:%S") + int(x[20:]) / 1000 for x in (stamps[0], stamps[-1]))
            out[str(path.relative_to(results / "logs"))] = (a, b)
    return out


def snakemake_jobs(project: Path) -> list[tuple[str, str | None, float, float | None]]:
    """(rule, log path under logs/, launched, finished) of every job in the audit's Snakemake log."""
    logs = sorted((project / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        return []
    jobs: dict[str, list] = {}
    stamp = None
    current = None
    for line in logs[0].read_text(errors="replace").splitlines():
        m = SNAKE_STAMP.match(line.strip())
        if m:
            stamp = _local(m.group(1), "%a %b %d %H:%M:%S %Y")
            continue
        if m := re.match(r"^(?:local)?rule (\w+):", line):
            current = {"rule": m.group(1), "log": None, "start": stamp, "end": None}
        elif current and (m := re.match(r"^\s+log: (\S+?),?(?:\s|$)", line)):
            current["log"] = m.group(1).split("/logs/", 1)[-1]
        elif current and (m := re.match(r"^\s+jobid: (\d+)", line)):
            jobs[m.group(1)] = current
            current = None
        elif m := re.match(r"^Finished jobid: (\d+)", line):
            if m.group(1) in jobs:
                jobs[m.group(1)]["end"] = stamp
    return [(j["rule"], j["log"], j["start"], j["end"]) for j in jobs.values()]


def server_up(results: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Intervals of servers starting (start to healthy) and of servers up (healthy to stopped)."""
    starting, up, ready_at = [], [], {}
    for rec in _records(results / "servers" / "starts.jsonl"):
        at = dt.datetime.fromisoformat(rec["at"]).timestamp()
        key = (rec.get("phase"), rec.get("arm"), rec.get("pid"))
        if rec.get("event") == "ready":
            starting.append((at - float(rec.get("ready_s") or 0.0), at))
            ready_at[key] = at
        elif rec.get("event") == "stopped" and key in ready_at:
            up.append((ready_at.pop(key), at))
    return starting, up


def breakdown(project: Path, results: Path, busy: list[tuple[float, float]], step: float = 0.05) -> dict[str, float]:
    """Seconds of the audit's wall time in each class (see the module docstring), first class wins."""
    jobs = snakemake_jobs(project)
    scripts = script_intervals(results)
    starting, up = server_up(results)
    launching, running, phase_running = [], {}, []
    for rule, logpath, start, end in jobs:
        script = scripts.get(logpath or "")
        if start is None:
            continue
        if script:
            launching.append((start, script[0]))
            (phase_running if rule in PHASE_RULES else running.setdefault(rule, [])).append(script)
        elif end is not None:
            running.setdefault(rule, []).append((start, end))
    t0 = min(s for _, _, s, _ in jobs if s is not None)
    t1 = max([e for *_, e in jobs if e is not None] + [b for _, b in scripts.values()])
    classes = [("request in flight", busy), ("server starting", starting),
               ("phase job, server up, no request", [iv for iv in phase_running]),
               ("job launch: interpreter and imports", launching)]
    classes += [(f"job script: {rule}", ivs) for rule, ivs in sorted(running.items())]
    totals = {name: 0.0 for name, _ in classes} | {"nothing running": 0.0}
    t = t0
    while t < t1:
        for name, ivs in classes:
            if any(a <= t < b for a, b in ivs):
                totals[name] += step
                break
        else:
            totals["nothing running"] += step
        t += step
    totals["(audit span from Snakemake's log)"] = t1 - t0
    return totals


def planned_jobs(project: Path) -> int:
    out = subprocess.run([SNAKEMAKE, "--cores", "4", "-n", "promotion"], cwd=project, capture_output=True,
                         text=True, check=True).stdout
    return len(re.findall(r"^(?:local)?rule \w+:", out, flags=re.M))


def _audit_results(project: Path) -> Path:
    audit = re.search(r"^audit:\s*(\S+)", (project / "config" / "config.yaml").read_text(), re.M).group(1)
    return project / "results" / audit


def print_breakdown(project: Path, results: Path) -> None:
    print("\n| where the wall time went | seconds |\n|---|---|")
    for name, seconds in breakdown(project, results, request_intervals(results)).items():
        if seconds >= 0.05:
            print(f"| {name} | {seconds:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, help="run in this directory and keep it")
    ap.add_argument("--breakdown-only", type=Path, metavar="DIR",
                    help="print only where the wall time went, of an audit kept earlier with --keep DIR")
    args = ap.parse_args()
    if args.breakdown_only:
        project = args.breakdown_only / "project"
        print_breakdown(project, _audit_results(project))
        return
    root = args.keep or Path(tempfile.mkdtemp(prefix="pairaudit-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    project = scratch_project(root / "project")
    wall = run(project, "promotion")
    results = _audit_results(project)
    intervals = request_intervals(results)
    busy = union_length(intervals)
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
              f"{ds.get('candidate_correct')}/{ds.get('n')}, {ds.get('rule') or 'quality'} {ds.get('verdict')} |")
    print_breakdown(project, results)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
