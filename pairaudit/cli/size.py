"""Items per dataset for quality-v1 (exact McNemar) to see a net loss at alpha with a given power.

``pairaudit size --loss PCT (--discordance D | --calibration results/calibrations.jsonl [--of AUDIT])
[--alpha 0.05] [--power 0.8] [--max-net-loss 0] [--json]``

The model (``pairaudit.quality.sizing``): each item is discordant (one arm
right, the other wrong) with probability D, the discordance; the net loss
is (b - c) / n, control-only minus candidate-only items over the items;
quality-v1 sees the loss when it FAILs the table (b - c > max_net_loss and
exact McNemar p < alpha). The power is summed exactly over the binomial
outcomes. ``--calibration`` takes D per dataset from the latest A/A
calibration in the log (two starts of the control against each other),
raised to the loss where it is smaller (a loss of L needs D >= L). Exit 0;
2 on bad input or an unreadable calibration.
"""

from __future__ import annotations

import argparse
import json
import sys

from pairaudit.core import stats
from pairaudit.quality import sizing

from .codes import OK, REFUSED

HELP = "items per dataset the exact McNemar test of quality-v1 needs to see a net loss (exact binomial power)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loss", type=float, required=True, metavar="PCT", help="net loss to see, percentage points")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--discordance", type=float, metavar="D", help="expected fraction of discordant items (0..1]")
    src.add_argument("--calibration", metavar="FILE", help="take D per dataset from the latest calibration in FILE")
    p.add_argument("--of", dest="of_audit", metavar="AUDIT", help="with --calibration: the calibration of this audit")
    p.add_argument("--alpha", type=float, default=0.05, help="quality-v1's McNemar level (0.05)")
    p.add_argument("--power", type=float, default=stats.MDE_POWER, help="target power (0.8)")
    p.add_argument("--max-net-loss", type=int, default=0, help="quality-v1's tolerated net loss in items (0)")
    p.add_argument("--max-items", type=int, default=sizing.DEFAULT_MAX_ITEMS, help="largest count looked at")
    p.add_argument("--json", action="store_true", help="print the plan(s) as JSON")


def _line(label: str, plan: sizing.SizePlan) -> str:
    head = (f"{label}: a net loss of {plan.loss_pct:g} points at discordance {plan.discordance:.4g}, alpha "
            f"{plan.alpha:g}, power {plan.power:g}")
    if plan.items is None:
        return f"{head}: more than {plan.scan_limit} items"
    dip = ("" if plan.first_items == plan.items else
           f"; {plan.first_items} items first reach it ({plan.first_power:.4f}), but a count between dips below")
    return f"{head}: {plan.items} items (power {plan.items_power:.4f}){dip}"


def run(args: argparse.Namespace) -> int:
    kw = dict(alpha=args.alpha, power=args.power, max_net_loss=args.max_net_loss, max_items=args.max_items)
    try:
        if args.discordance is not None:
            if args.of_audit:
                raise sizing.SizingError("--of goes with --calibration")
            plans = {"items": sizing.items_needed(args.loss, args.discordance, **kw)}
            source = None
        else:
            cal = sizing.calibrated_discordance(args.calibration, of_audit=args.of_audit)
            if not cal.datasets:
                raise sizing.SizingError(f"{cal.summary_path}: the calibration paired no dataset")
            plans, source = {}, cal
            for ds in sorted(cal.datasets):
                rate = cal.rate(ds) or 0.0
                plans[ds] = sizing.items_needed(args.loss, max(rate, args.loss / 100), **kw)
    except sizing.SizingError as exc:
        print(f"pairaudit size: {exc}", file=sys.stderr)
        return REFUSED
    if args.json:
        out = {k: v.to_json() for k, v in plans.items()}
        if source is not None:
            out = {"calibration": {"log": source.log, "time": source.time, "audit": source.audit,
                                   "of_audit": source.of_audit, "summary": source.summary_path,
                                   "discordant": {d: list(v) for d, v in source.datasets.items()}}, "datasets": out}
        print(json.dumps(out, indent=1))
        return OK
    if source is not None:
        print(f"discordance from the A/A calibration {source.audit} ({source.time}, {source.summary_path}):")
        for ds, plan in plans.items():
            d, n = source.datasets[ds]
            raised = " (raised to the loss)" if d / n < args.loss / 100 else ""
            print(f"  {_line(f'{ds} ({d}/{n} discordant{raised})', plan)}")
        print("An A/A calibration measures two starts of one server: a candidate that changes answers is "
              "discordant more often, and needs more items.")
    else:
        print(_line("items per dataset", plans["items"]))
    return OK
