"""Items per dataset the quality rules need: quality-v2 to rule out its margin, or quality-v1 to see a loss.

``pairaudit size [--margin PCT] [--level 0.95] [--datasets D] [--discordance D | --calibration FILE [--of AUDIT]]
[--power 0.8] [--json]`` (quality-v2, the default rule): the items per dataset
for the Tango bound on the candidate's loss to fall below the margin with
the given power when the candidate loses nothing, at the per-dataset level
1 - (1 - level) / datasets (Bonferroni), by the arithmetic of the rule's own
"about M items would" (``stats.noninferiority_items``). Margin, level and
dataset count default to ``config/config.yaml`` here (else the registered
values); the discordance, when not given, is what the last audit in
``results/ledger.jsonl`` observed per dataset, else the host's latest A/A
calibration in ``results/calibrations.jsonl``, else a stated default (0.25).

``pairaudit size --speed [--decision FILE | --start-sd PCT] [--start-s S] [--max-starts N] [--json]``
(win2-v5, the default speed rule): the starts, and the minutes, a bracket needs to decide +-3 % at the
rule's registered power, from a finished bracket's record (a speed decision.json: an audit's or an A/A
calibration's; by default the newest under results/) or from a start-to-start sd given in % (the sd of a
start's value, what the record's noise calls ``start_sd_used_pct``). The arithmetic is the rule's own
(``gates.win2_v5_size``), with the record's degrees of freedom from the host's evidence.

``pairaudit size --loss PCT (--discordance D | --calibration results/calibrations.jsonl [--of AUDIT])
[--alpha 0.05] [--power 0.8] [--max-net-loss 0] [--json]`` (quality-v1's FAIL clause):

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

HELP = ("items per dataset quality-v2 needs to rule out its margin (default), quality-v1's McNemar test to see "
        "a net loss (--loss), or the starts the speed bracket needs to decide (--speed)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loss", type=float, metavar="PCT",
                   help="quality-v1: the net loss to see, percentage points (needs --discordance or --calibration)")
    p.add_argument("--margin", type=float, metavar="PCT", help="quality-v2: the loss to rule out (config's margin_pct)")
    p.add_argument("--level", type=float, help="quality-v2: the audit's one-sided confidence (config's, 0.95)")
    p.add_argument("--datasets", type=int, help="quality-v2: datasets in the audit, for Bonferroni (config's count)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--discordance", type=float, metavar="D", help="expected fraction of discordant items (0..1]")
    src.add_argument("--calibration", metavar="FILE", help="take D per dataset from the latest calibration in FILE")
    p.add_argument("--of", dest="of_audit", metavar="AUDIT", help="with --calibration: the calibration of this audit")
    p.add_argument("--alpha", type=float, default=0.05, help="quality-v1's McNemar level (0.05)")
    p.add_argument("--power", type=float, default=stats.MDE_POWER, help="target power (0.8)")
    p.add_argument("--max-net-loss", type=int, default=0, help="quality-v1's tolerated net loss in items (0)")
    p.add_argument("--max-items", type=int, default=sizing.DEFAULT_MAX_ITEMS, help="largest count looked at")
    p.add_argument("--speed", action="store_true", help="the speed bracket: starts and minutes to decide +-3 %%")
    p.add_argument("--decision", metavar="FILE", help="--speed: a finished bracket's speed decision.json")
    p.add_argument("--start-sd", type=float, metavar="PCT", help="--speed: the start-to-start sd (%%) instead")
    p.add_argument("--start-s", type=float, metavar="S", help="--speed: seconds a start (default: the record's)")
    p.add_argument("--max-starts", type=int, metavar="N", help="--speed: the bracket's cap (config's max_starts)")
    p.add_argument("--json", action="store_true", help="print the plan(s) as JSON")


def _line(label: str, plan: sizing.SizePlan) -> str:
    head = (f"{label}: a net loss of {plan.loss_pct:g} points at discordance {plan.discordance:.4g}, alpha "
            f"{plan.alpha:g}, power {plan.power:g}")
    if plan.items is None:
        return f"{head}: more than {plan.scan_limit} items"
    dip = ("" if plan.first_items == plan.items else
           f"; {plan.first_items} items first reach it ({plan.first_power:.4f}), but a count between dips below")
    return f"{head}: {plan.items} items (power {plan.items_power:.4f}){dip}"


def _config_quality() -> tuple[dict, int | None]:
    """rules.quality and the dataset count of config/config.yaml in this directory ({} and None without one)."""
    try:
        import yaml

        cfg = yaml.safe_load(open("config/config.yaml", encoding="utf-8")) or {}
    except (OSError, ValueError):
        return {}, None
    if not isinstance(cfg, dict):
        return {}, None
    quality = ((cfg.get("rules") or {}).get("quality") or {})
    return (quality if isinstance(quality, dict) else {}), (len(cfg.get("datasets") or []) or None)


def run_margin(args: argparse.Namespace) -> int:
    from pairaudit import gates

    quality, count = _config_quality()
    margin = args.margin if args.margin is not None else float(quality.get("margin_pct", gates.QUALITY_V2["margin_pct"]))
    level = args.level if args.level is not None else float(quality.get("level", gates.QUALITY_V2["level"]))
    family = args.datasets if args.datasets is not None else (count or 1)
    try:
        if not 0 < margin <= 100 or not 0.5 < level < 1 or family < 1:
            raise sizing.SizingError(f"need 0 < --margin <= 100, 0.5 < --level < 1, --datasets >= 1; got {margin}, "
                                     f"{level}, {family}")
        if args.discordance is not None:
            if not 0 <= args.discordance <= 1:
                raise sizing.SizingError(f"--discordance must be in [0, 1], got {args.discordance}")
            expected = sizing.ExpectedDiscordance("--discordance", {}, default=args.discordance)
        elif args.calibration:
            cal = sizing.calibrated_discordance(args.calibration, of_audit=args.of_audit)
            expected = sizing.ExpectedDiscordance(f"A/A calibration {cal.audit} ({cal.summary_path})",
                                                  {d: a / n for d, (a, n) in cal.datasets.items() if n})
        else:
            expected = sizing.expected_discordance(".")
    except sizing.SizingError as exc:
        print(f"pairaudit size: {exc}", file=sys.stderr)
        return REFUSED
    names: list[str | None] = list(sorted(expected.rates)) or [None]
    plans = {ds: sizing.margin_items(margin, expected.rate(ds), level, family, args.power) for ds in names}
    each = gates.per_dataset_level(level, family)
    if args.json:
        print(json.dumps({"rule": "quality-v2", "margin_pct": margin, "level": level, "datasets": family,
                          "per_dataset_level": each, "discordance_source": expected.source,
                          "plans": {ds or "items": p for ds, p in plans.items()}}, indent=1))
        return OK
    print(f"quality-v2: items per dataset to rule out a loss of {margin:g} points at {100 * each:.4g} % per dataset "
          f"({100 * level:.4g} % over {family} dataset(s), Bonferroni), power {args.power:g}, if the candidate loses "
          f"nothing; discordance from {expected.source}:")
    for ds, plan in plans.items():
        many = f"about {plan['items']} items" if plan["items"] is not None else f"more than {plan['max_items']} items"
        print(f"  {ds or 'each dataset'} (discordance {expected.rate(ds):.3g}): {many}")
    return OK


def _newest_speed_decision() -> str | None:
    import glob
    import os

    found = [p for p in glob.glob("results/**/speed/**/decision.json", recursive=True)
             if "candidates" not in p.split(os.sep)[1:2]]
    return max(found, key=os.path.getmtime) if found else None


def run_speed(args: argparse.Namespace) -> int:
    import numpy as np

    from pairaudit import gates
    from pairaudit.core import artifacts, defaults
    from pairaudit.speed.starts import start_cost_s

    reg = dict(gates.WIN2_V5)
    max_starts = args.max_starts or int(defaults.section("speed")["max_starts"])
    start_s, ev_df, source = args.start_s, 0, "--start-sd"
    cell_sds: list[float] = []
    doc: dict | None = None
    if args.start_sd is not None:
        if not 0 < args.start_sd < 100:
            print(f"pairaudit size: --start-sd must be in (0, 100), got {args.start_sd}", file=sys.stderr)
            return REFUSED
        sd = args.start_sd
    else:
        path = args.decision or _newest_speed_decision()
        if path is None:
            print("pairaudit size: --speed needs --decision FILE or --start-sd PCT (no speed decision under results/)",
                  file=sys.stderr)
            return REFUSED
        try:
            doc = artifacts.read_json(path)
            noise = (doc.get("gate") or {}).get("noise") or {}
            sd = float(noise["start_sd_used_pct"])
        except artifacts.ArtifactError as exc:
            print(f"pairaudit size: {exc}", file=sys.stderr)
            return REFUSED
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"pairaudit size: {path}: no start-to-start noise recorded ({exc})", file=sys.stderr)
            return REFUSED
        ev_df = int(noise.get("evidence_df") or 0)
        # WIN needs every deciding cell above the bar: with two or more, the bracket is sized for the weakest
        # (each cell's own start-to-start sd, as this window measured it)
        cells = [c for c in ((doc.get("gate") or {}).get("cells") or {}).values()
                 if isinstance(c, dict) and c.get("decides") and (c.get("primary") or {}).get("start_sd_pct")]
        cell_sds = [float(c["primary"]["start_sd_pct"]) for c in cells] if len(cells) > 1 else []
        start_s = start_s or start_cost_s(doc.get("starts") or [])
        source = f"{path} ({len(doc.get('starts') or [])} starts)"
    if args.max_starts is None and doc is not None:
        max_starts = int(((doc.get("params") or {}).get("max_starts")) or max_starts)
    pilot = gates.speed.pilot_of(int(reg["pilot_starts"]), max_starts)
    need = int(gates.win2_v5_size(sd ** 2, ev_df, pilot=pilot, max_looks=int(reg["max_looks"]), win_pct=reg["win_pct"],
                                  alpha_win=reg["alpha_win"], alpha_loss=reg["alpha_loss"],
                                  alpha_futility=reg["alpha_futility"], loss_pooled_share=reg["loss_pooled_share"],
                                  power=reg["power"], power_gain_pct=reg["power_gain_pct"],
                                  cell_var=np.array([[v ** 2 for v in cell_sds]]) if cell_sds else None)[0]) or None
    minutes = None if need is None or not start_s else need * start_s / 60.0
    out = {"rule": "win2-v5", "start_sd_pct": sd, "cell_start_sd_pct": cell_sds or None, "evidence_df": ev_df,
           "source": source,
           "power": reg["power"], "gain_pct": reg["power_gain_pct"], "starts_needed": need,
           "start_s": start_s, "minutes": minutes, "max_starts": max_starts,
           "fits": need is not None and need <= max_starts}
    if args.json:
        print(json.dumps(out, indent=1))
        return OK
    what = (f"more than {gates.speed.SIZE_LIMIT} starts" if need is None else
            f"about {need} starts" + ("" if minutes is None else f", about {minutes:.0f} min at {start_s:.0f} s a start"))
    print(f"win2-v5 at start-to-start {sd:.2f} % ({source}): {what} to decide +-{reg['power_gain_pct']:g} % at "
          f"{100 * reg['power']:.0f} % power.")
    if need is not None and need > max_starts:
        print(f"  max_starts {max_starts} is fewer: the bracket would stop at its pilot, INCONCLUSIVE. Raise "
              f"speed.max_starts to {need}, or calibrate this host (snakemake calibrate) so the host's evidence "
              "narrows the noise, or make speed informational for a change that is not about speed.")
    return OK


def run(args: argparse.Namespace) -> int:
    if args.speed:
        return run_speed(args)
    if args.loss is None:
        return run_margin(args)
    if args.discordance is None and not args.calibration:
        print("pairaudit size: --loss needs --discordance or --calibration", file=sys.stderr)
        return REFUSED
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
