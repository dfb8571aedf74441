"""The time plan against what the default audit takes on this host: a fresh clone's first run, then a second.

In a scratch copy of the project (the checkout's results/ is untouched), runs the embedded default audit
``--runs`` times (default 2), each under its own audit name (``timeplan-1``, ``timeplan-2``, ...) so every
run's records stay as the next run's history: the first run's plan has no history (a fresh clone: every step
assumed from the config), the second's is made from the first's starts. After each run it prints the plan
the run wrote at its start (``results/<audit>/plan/*.json``) against what each phase took
(``pairaudit.timeplan.actual``), and the ratio of the actual total to the planned expected total (the aim for
a second run: within 20 %).

Usage: .venv/bin/python bench/timeplan.py [--runs 2] [--keep DIR] [--cores 2] [--configfile FILE]
A full default audit takes about 10 minutes on 2 cores; each run is one. ``--configfile`` audits another
config instead of the default (``--replace-workflow-config``; a GPU example on a GPU host).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the scratch copy of the project the overhead bench makes (bench/ is on the path of a script run from it)
from audit_overhead import SNAKEMAKE, scratch_project  # noqa: E402


def one_run(project: Path, audit: str, cores: int, configfile: Path | None) -> float:
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(project)}
    extra = [] if configfile is None else ["--configfile", str(configfile.resolve()), "--replace-workflow-config"]
    subprocess.run([SNAKEMAKE, "--cores", str(cores), "promotion", *extra, "--config", f"audit={audit}"],
                   cwd=project, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def report(project: Path, audit: str, wall: float) -> dict:
    from pairaudit.timeplan import actual, plan as timeplan

    cwd = os.getcwd()
    os.chdir(project)
    try:
        found = timeplan.latest_plan(audit)
        if found is None:
            raise SystemExit(f"{audit}: no plan was written")
        path, plan = found
        end = (project / "results" / audit / "promotion" / "decision.json").stat().st_mtime
        pa = actual.planned_actual(plan, path, f"results/{audit}/servers/starts.jsonl", now=end)
    finally:
        os.chdir(cwd)
    src = "assumed (no history)" if not plan.history else ("history" if not plan.assumed else "history + assumed")
    print(f"\n{audit}: snakemake wall {wall:.0f} s; plan from {src}")
    print(f"  {'phase':<12}{'expected':>10}{'worst':>10}{'actual':>10}{'act/exp':>9}  starts (planned, actual)")
    for r in (*pa.phases, pa.total):
        ratio = r.actual_s / r.expected_s if r.expected_s else float("nan")
        print(f"  {r.phase:<12}{r.expected_s:>9.0f}s{r.worst_s:>9.0f}s{r.actual_s:>9.0f}s{ratio:>9.2f}  "
              f"{r.planned_starts}, {r.actual_starts}")
    return {"audit": audit, "expected_s": pa.total.expected_s, "actual_s": pa.total.actual_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="run in this directory and keep it")
    ap.add_argument("--configfile", type=Path, help="audit this config instead of config/config.yaml")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="pairaudit-timeplan-"))
    project = scratch_project(root) if not (root / "Snakefile").exists() else root
    out = []
    try:
        for i in range(1, args.runs + 1):
            audit = f"timeplan-{i}"
            out.append(report(project, audit, one_run(project, audit, args.cores, args.configfile)))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    for r in out:
        print(f"{r['audit']}: actual {r['actual_s']:.0f} s against {r['expected_s']:.0f} s expected "
              f"({100 * (r['actual_s'] / r['expected_s'] - 1):+.0f} %)")


if __name__ == "__main__":
    main()
