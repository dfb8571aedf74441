"""Measure the code sandbox: per-program overhead and MBPP scoring throughput, bwrap vs fallback.

Prints, for each mechanism that runs here (bubblewrap, then the unshare
fallback):
  * the median wall time of a trivial program (``pass``) in the sandbox, and its
    overhead over a bare ``python -c pass`` of the same interpreter (also the
    bare ``python -I -S -c pass`` the sandbox itself starts);
  * all 257 sanitized-MBPP reference programs scored through
    ``scoring.score_records`` with 2 sandbox workers: wall time, programs per
    second, and that every one passed (goal: < 30 s on 2 cores).
Then one JSON line with every number.

Usage: .venv/bin/python bench/sandbox.py [--repeat N] [--workers 2] [--mechanisms bwrap,fallback]
Reads ../shared/datasets (or PAIRAUDIT_SHARED_DATASETS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pairaudit.datasets.formats import load_source, normalize  # noqa: E402
from pairaudit.quality import (  # noqa: E402
    sandbox,
    scoring,  # noqa: E402
)


def mbpp_items() -> list[dict]:
    base = Path(os.environ.get("PAIRAUDIT_SHARED_DATASETS") or REPO.parent / "shared" / "datasets")
    path = base / "mbpp" / "sanitized-test.jsonl"
    if not path.is_file():
        sys.exit(f"MBPP data absent: {path}")
    rows, _ = load_source({"local": str(path)}, cache_dir=Path("/nonexistent"))
    return normalize("mbpp", rows)


def interleaved(fns: dict, repeat: int) -> dict:
    """Median wall seconds of each callable, run in turn so load changes hit all of them alike."""
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mechanisms", default="bwrap,fallback")
    args = ap.parse_args()
    items = mbpp_items()
    doc = {"name": "mbpp", "format": "mbpp", "items": items}
    sampled = [{"index": it["index"], "error": None,
                "response": {"choices": [{"message": {"content": f"```python\n{it['reference']['code']}\n```"},
                                          "finish_reason": "stop"}]}} for it in items]
    report = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "repeat": args.repeat,
              "workers": args.workers, "programs": len(items), "mechanisms": {}}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared: numbers are noisy)")
    for mech in args.mechanisms.split(","):
        chosen = sandbox.choose(mech)
        if chosen.get("unavailable") or chosen["mechanism"] != mech:
            print(f"{mech}: unavailable ({chosen['fallback_reason']})")
            continue
        py = chosen["python"]
        probe = sandbox.run_python("pass", mechanism=mech)
        assert probe["status"] == "passed", probe
        med = interleaved({
            "bare": lambda: subprocess.run([py, "-c", "pass"], check=True),
            "bare_IS": lambda: subprocess.run([py, "-I", "-S", "-c", "pass"], check=True),
            "sandboxed": lambda: sandbox.run_python("pass", mechanism=mech),
        }, args.repeat)
        bare_plain, bare_isolated, trivial = med["bare"], med["bare_IS"], med["sandboxed"]
        os.environ[sandbox.MECHANISM_ENV] = mech
        try:
            t0 = time.perf_counter()
            recs = scoring.score_records(doc, sampled, workers=args.workers)
            wall = time.perf_counter() - t0
        finally:
            os.environ.pop(sandbox.MECHANISM_ENV, None)
        passed = sum(r["correct"] for r in recs)
        used = {r["sandbox"]["mechanism"] for r in recs}
        row = {"python": py, "isolation": probe["isolation"], "bare_python_c_pass_ms": bare_plain * 1e3,
               "bare_python_IS_c_pass_ms": bare_isolated * 1e3, "sandboxed_pass_ms": trivial * 1e3,
               "overhead_vs_bare_ms": (trivial - bare_plain) * 1e3,
               "overhead_vs_bare_IS_ms": (trivial - bare_isolated) * 1e3,
               "mbpp_wall_s": wall, "mbpp_programs_per_s": len(items) / wall, "mbpp_passed": passed,
               "mechanism_recorded": sorted(used)}
        report["mechanisms"][mech] = row
        print(f"{mech}: isolation {','.join(probe['isolation'])}")
        print(f"  bare `python -c pass` {bare_plain * 1e3:.1f} ms, bare `python -I -S -c pass` "
              f"{bare_isolated * 1e3:.1f} ms, sandboxed `pass` {trivial * 1e3:.1f} ms "
              f"-> overhead {(trivial - bare_plain) * 1e3:+.1f} ms per program "
              f"({(trivial - bare_isolated) * 1e3:+.1f} ms against `-I -S`)")
        print(f"  MBPP references: {passed}/{len(items)} passed in {wall:.1f} s with {args.workers} workers "
              f"= {len(items) / wall:.1f} programs/s (goal < 30 s)")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
