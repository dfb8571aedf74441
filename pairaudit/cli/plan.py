"""How long an audit will hold this host: its time plan per phase and arm, before any server starts.

``pairaudit plan [--configfile FILE ...] [--replace-workflow-config] [--window-min N] [--json]`` reads the
config as ``snakemake`` does (``config/config.yaml``, then each ``--configfile``), runs the load checks
(``pairaudit.configcheck``), and prints the plan the workflow prints at the start of every run
(``pairaudit.timeplan.plan``): each phase's expected and worst-case time, from this host's own record of
earlier audits of the same servers (``results/*/servers/starts.jsonl``) or from stated assumptions.
``--window-min`` (or the config's ``window_min``) checks the worst case against a window. Nothing is
started and nothing is written. Exit 0 when the plan fits (or no window is set), 1 when the window is too
short (the message names the phase to shrink and by how much), 2 on a config that does not load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .codes import OK, REFUSED

HELP = "the audit's time plan (expected and worst case per phase and arm) and its window check, before any server starts"
TOO_LONG = 1   # the plan's worst case does not fit the window


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configfile", action="append", default=[], type=Path, help="as snakemake --configfile")
    p.add_argument("--replace-workflow-config", action="store_true", help="as snakemake's flag of that name")
    p.add_argument("--base-dir", type=Path, default=Path("."), help="the workflow directory (default: .)")
    p.add_argument("--window-min", type=float, default=None, help="the booked window in minutes (config window_min)")
    p.add_argument("--json", action="store_true", help="the plan artifact's JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    from snakemake.utils import validate
    from snakemake_interface_common.exceptions import WorkflowError

    from pairaudit import configcheck
    from pairaudit.plans import change
    from pairaudit.timeplan import plan as timeplan

    base = args.base_dir
    try:
        config = configcheck.load_like_snakemake(base / "config" / "config.yaml", args.configfile,
                                                 args.replace_workflow_config)
        if args.window_min is not None:
            config["window_min"] = args.window_min
        derived = change.derive_arms(config)
        if derived:
            raise configcheck.ConfigCheckError(configcheck.format_problems(derived))
        validate(config, str(base / "config" / "schema.yaml"))
    except (configcheck.ConfigCheckError, WorkflowError) as exc:
        print(exc, file=sys.stderr)
        return REFUSED
    result = configcheck.check_config(config, base_dir=base)
    if result.problems:
        print(configcheck.format_problems(result.problems), file=sys.stderr)
        return REFUSED
    configcheck.check_window(config, result)
    if result.plan is None:   # check_window plans every config that passed the checks
        raise AssertionError("no plan for a config that passed its checks")
    if args.json:
        print(json.dumps(result.plan.to_json(), indent=1))
    else:
        print(timeplan.render_text(result.plan))
    if result.problems:
        print(configcheck.format_problems(result.problems), file=sys.stderr)
        return TOO_LONG
    return OK
