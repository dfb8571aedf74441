"""Pair two lm-eval sample logs by doc_id and judge them by the quality rule, with no server.

``pairaudit pair CONTROL_SAMPLES CANDIDATE_SAMPLES [--change FIELD ...] [--metric exact_match] [--filter F]
[--rule quality-v2] [--margin 3] [--level 0.95] [--max-net-loss 0] [--alpha 0.05] [--json]``

First, the two runs must be a pair: ``pair X X`` (one run twice) is refused,
and so are runs whose ``results_*.json`` (read beside each sample log)
record different model arguments, seeds, generation settings or task
versions, except the fields declared with ``--change`` (e.g. ``--change
model_args.base_url`` when the arms are two servers): the refusal names
every field that differs.

The two ``samples_<task>_<timestamp>.jsonl`` files lm-eval's ``--log_samples``
wrote (or pairaudit's export) are read on one filter and one 0/1 metric,
checked to hold the same documents, prompts, targets and generation
arguments (refused otherwise, naming the doc_ids), and paired by
``pairaudit.interop.lmeval.pair_logs``: the paired table, the exact McNemar
p, the paired bootstrap interval, the minimum detectable loss and
the quality rule's verdict, by the code the audit's paired stage runs. Exit: PASS
0, FAIL 1, HOLD 3 (quality-v1), INCONCLUSIVE and INVALID 4; 2 when a log is refused or the runs
are not a pair.
"""

from __future__ import annotations

import argparse
import json
import sys

from pairaudit import gates
from pairaudit.interop import lmeval

from .codes import EXIT, REFUSED

HELP = ("pair two lm-eval runs by doc_id (refused unless they differ only in --change): McNemar, bootstrap, "
        "the loss bound, quality-v2 (PASS 0, FAIL 1, INCONCLUSIVE 4, refused 2)")


def _registered(param: str) -> tuple[str, object]:
    """(rule, value): the first registered quality rule (the default first) that registers ``param``, and its value."""
    spec = next(gates.REGISTERED[n] for n in gates.QUALITY_RULES if param in gates.REGISTERED[n].params)
    return spec.name, spec.params[param]


def add_arguments(p: argparse.ArgumentParser) -> None:
    (margin_rule, margin), (level_rule, level) = _registered("margin_pct"), _registered("level")
    (loss_rule, max_net_loss), (_, alpha) = _registered("max_net_loss"), _registered("alpha")
    p.add_argument("control", metavar="CONTROL_SAMPLES", help="the control arm's samples_<task>_<timestamp>.jsonl")
    p.add_argument("candidate", metavar="CANDIDATE_SAMPLES", help="the candidate arm's sample log")
    p.add_argument("--metric", default=lmeval.METRIC, help="a 0/1 per-sample metric (default exact_match)")
    p.add_argument("--filter", default=None,
                   help="the filter whose lines are paired (default: the log's only one, else strict-match)")
    p.add_argument("--change", action="append", default=[], metavar="FIELD",
                   help="a results-file field the change under audit may differ in (repeatable), e.g. "
                        "model_args.base_url; every other recorded setting must be equal")
    p.add_argument("--rule", choices=gates.QUALITY_RULES, default=gates.default_rule("quality").name,
                   help="quality rule")
    p.add_argument("--margin", type=float, default=None, help=f"{margin_rule}'s margin, points (registered {margin:g})")
    p.add_argument("--level", type=float, default=None, help=f"{level_rule}'s one-sided confidence ({level:g})")
    p.add_argument("--max-net-loss", type=int, default=max_net_loss,
                   help=f"{loss_rule}'s tolerated net loss in items ({max_net_loss:g})")
    p.add_argument("--alpha", type=float, default=alpha, help=f"the McNemar level of the FAIL clause ({alpha:g})")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (0)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")


def report(res: lmeval.PairedLogs) -> str:
    t, q, b = res.table, res.quality, res.bootstrap
    n = t["n"]
    both, neither = t["both_correct"], t["neither_correct"]
    co, ko = len(t["control_only"]), len(t["candidate_only"])
    out = [f"pairaudit pair: task {res.control.task or '?'}, filter {res.control.filter}, metric "
           f"{res.control.metric}, {n} documents paired by doc_id",
           f"  control:   {res.control.path} (sha256 {res.control.sha256[:12]})",
           f"  candidate: {res.candidate.path} (sha256 {res.candidate.sha256[:12]})",
           "",
           "                      candidate right   candidate wrong",
           f"  control right       {both:>15}   {co:>15}",
           f"  control wrong       {ko:>15}   {neither:>15}",
           "",
           f"control {t['control_correct']}/{n}, candidate {t['candidate_correct']}/{n}, net {t['net']:+d} "
           f"(candidate-only {t['candidate_only']}, control-only {t['control_only']})",
           f"exact McNemar p = {q['mcnemar_p']:.4g} (two-sided, on {co} + {ko} discordant documents)"]
    if b:
        out.append(f"paired bootstrap, accuracy(candidate) - accuracy(control) = {b['diff']:+.4f}, "
                   f"{int(b['level'] * 100)} % interval [{b['lo']:+.4f}, {b['hi']:+.4f}] (n_boot {b['n_boot']}, "
                   f"seed {b['seed']}; reported, it does not decide)")
    mde = q.get("mde") or {}
    if mde.get("net_loss") is None:
        out.append(f"minimum detectable loss: none (these {n} documents cannot show a loss at alpha "
                   f"{q['params']['alpha']} with power 0.8)")
    else:
        out.append(f"minimum detectable loss: {mde['net_loss']} documents ({100 * mde['rate']:.1f} %) at alpha "
                   f"{q['params']['alpha']}, power 0.8; a smaller loss can go unseen")
    out += ["", f"{q['rule']}: {q['verdict']}"] + [f"  - {r}" for r in q["reasons"]]
    out += [f"not checked: {x}" for x in res.not_checked]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        res = lmeval.pair_logs(args.control, args.candidate, metric=args.metric, filter=args.filter,
                               rule=args.rule, margin_pct=args.margin, level=args.level,
                               max_net_loss=args.max_net_loss, alpha=args.alpha, n_boot=args.n_boot, seed=args.seed,
                               change=args.change)
    except (lmeval.LmEvalLogError, ValueError) as exc:
        print(f"pairaudit pair: refused: {exc}", file=sys.stderr)
        return REFUSED
    if args.json:
        print(json.dumps(res.to_json(), indent=1))
    else:
        print(report(res))
    return EXIT[res.quality["verdict"]]
