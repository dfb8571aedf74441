"""The ``pairaudit`` command: read an audit's decision, pair two lm-eval logs, size a dataset, export.

::

    pairaudit verdict [results/<audit> | decision.json] [--summary FILE]
    pairaudit pair CONTROL_SAMPLES CANDIDATE_SAMPLES [--metric exact_match] [--filter F]
                   [--max-net-loss 0] [--alpha 0.05] [--json]
    pairaudit size --loss PCT (--discordance D | --calibration results/calibrations.jsonl)
                   [--alpha 0.05] [--power 0.8] [--max-net-loss 0] [--json]
    pairaudit export [results/<audit>] [--lm-eval] [--vllm-bench]
    pairaudit audit --control URL --candidate URL [--datasets arith,algebra] [--limit N] [--audit NAME]
    pairaudit docs [--check]
    pairaudit plan [--configfile FILE ...] [--replace-workflow-config] [--window-min N] [--json]

Exit codes (``EXIT``): ``verdict`` PROMOTE 0, REJECT 1, HOLD 3, INCONCLUSIVE
4, and 2 when the decision is missing or refused (its content sha256 does
not match, it is not a decision); ``pair`` PASS 0, FAIL 1, HOLD 3, INVALID
4, and 2 when a log is refused; ``size`` and ``export`` 0, or 2 on bad
input; ``plan`` 0 when the plan fits (or no window is set), 1 when its
worst case exceeds the window, 2 on a config that does not load. Argument errors exit 2 (argparse). docs/interop.md has them all.
"""

from __future__ import annotations

import argparse
import sys

from . import audit, docs, export, pair, plan, size, verdict
from .codes import EXIT, REFUSED

__all__ = ["EXIT", "REFUSED", "main", "parser"]

COMMANDS = {"verdict": verdict, "pair": pair, "size": size, "export": export, "audit": audit, "docs": docs,
            "plan": plan}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pairaudit", description="pairaudit's decision, pairing and sizing tools "
                                 "(docs/interop.md)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, mod in COMMANDS.items():
        # the module docstring's first line; HELP where docstrings are stripped (python -OO)
        p = sub.add_parser(name, help=mod.HELP, description=(mod.__doc__ or mod.HELP).strip().splitlines()[0])
        mod.add_arguments(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
