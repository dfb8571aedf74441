"""Write an audit's evidence in lm-eval's and vLLM bench's formats, beside its artifacts.

``pairaudit export [results/<audit>] [--lm-eval] [--vllm-bench]``

lm-eval: ``exports/lm-eval/<arm>/samples_<dataset>.jsonl`` and
``results.json`` (``pairaudit.interop.lmeval``); vLLM: the speed bracket's
starts as ``exports/vllm-bench/<start>-<arm>/<cell>.json``, a sweep's under
``<bracket>/`` (``pairaudit.interop.vllm_bench``). Both by default. The artifacts are read
through their content-hash checks and never changed. Exit 0; 2 when an
artifact is missing or refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pairaudit.core import artifacts
from pairaudit.core.contracts import SWEEP_PATHS, SWEEP_SUMMARY
from pairaudit.interop import lmeval, vllm_bench

from .codes import OK, REFUSED
from .verdict import default_audit_dir

HELP = "write the audit's answers as lm-eval sample logs and its speed starts as vllm bench serve results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("audit", nargs="?", default=None, help="results/<audit> (default: that of config/config.yaml)")
    p.add_argument("--lm-eval", action="store_true", help="only the lm-eval export")
    p.add_argument("--vllm-bench", action="store_true", help="only the vllm bench serve export")


def run(args: argparse.Namespace) -> int:
    root = Path(args.audit) if args.audit else default_audit_dir()
    both = not (args.lm_eval or args.vllm_bench)
    try:
        if both or args.lm_eval:
            for arm, ex in lmeval.export_audit(root).items():
                print(f"lm-eval {arm}: {ex.results} and {len(ex.samples)} sample log(s): "
                      + ", ".join(ex.samples.values()))
        if both or args.vllm_bench:
            if not vllm_bench.has_speed(root):
                print(f"vllm bench: no speed decision under {root}: the speed stage has not run (skipped)")
            else:
                bench = vllm_bench.export_audit(root)
                for start, cells in bench.written.items():
                    print(f"vllm bench {start}: " + ", ".join(cells.values()))
                for why in bench.skipped:
                    print(f"vllm bench: skipped: {why}")
    except (artifacts.ArtifactError, lmeval.LmEvalLogError, vllm_bench.VllmBenchExportError, OSError) as exc:
        print(f"pairaudit export: {exc}", file=sys.stderr)
        return REFUSED
    return OK


def after_run(audit_dirs: list[str | Path], since: float) -> str:
    """The exports of every audit whose decision a finished run wrote (the workflow's ``onsuccess``).

    Written beside the primary artifacts under ``exports/``, which no stage
    reads; one line per audit says where they went or why not.
    """
    lines = []
    for root in map(Path, audit_dirs):
        decision = root / "promotion" / "decision.json"
        # a sweep's run ends on its summary: its answers are exported for every arm, its brackets bracket by bracket
        summary = root / SWEEP_PATHS[SWEEP_SUMMARY]
        sweep = summary.is_file() and summary.stat().st_mtime >= since
        if not sweep and (not decision.is_file() or decision.stat().st_mtime < since):
            continue
        try:
            arms = lmeval.export_audit(root)
            written = [f"lm-eval: {len(ex.samples)} sample log(s) per arm" for ex in list(arms.values())[:1]]
            if vllm_bench.has_speed(root):
                bench = vllm_bench.export_audit(root)
                written.append(f"vllm bench serve: {sum(len(c) for c in bench.written.values())} result file(s)")
            lines.append(f"exports of {root}: {'; '.join(written)} under {root / 'exports'}")
        except (artifacts.ArtifactError, lmeval.LmEvalLogError, vllm_bench.VllmBenchExportError, OSError) as exc:
            lines.append(f"exports of {root}: not written ({exc}); `pairaudit export {root}` retries")
    return "\n".join(lines)
