"""The speed gate: win2-v4 (default), win2-v3, win2-v2 or win2-v1 over the bracket's series, with the stage's deviations.

``speed.rule`` selects the registered rule: win2-v4 (gates.win2_v4, the
default; docs/speed.md) decides over the alternating bracket's starts,
sequentially, with the start-to-start noise of this window and the host's
evidence (:mod:`pairaudit.speed.evidence`), spending alpha over the looks
O'Brien-Fleming-type; win2-v3 (gates.win2_v3) is the same bracket at
alpha / looks per look; win2-v2 (gates.win2_v2) decides
one bracket with the noise floored at ``start_noise_pct``; win2-v1
(gates.win2_v1) pairs by repeat per cell. v2 and v1 are kept unchanged and
selectable, and reported as deviations.

The gate's fields: the ``gate`` and ``win2`` entries of the speed decision
(:mod:`pairaudit.speed.bracket`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from pairaudit import gates
from pairaudit.core.settings import SpeedSettings
from pairaudit.speed.clock import clock_findings
from pairaudit.speed.metrics import LOWER_IS_BETTER, START_ROLES, series_for

# the registered speed rules, the default first (speed.rule selects): a view of gates.REGISTERED, not a table
RULES = gates.rules_of("speed")


def _per_cell_rule(cell_verdicts: Mapping[str, Mapping[str, Any]]) -> gates.Rule:
    """The one registered per-cell rule that decided ``cell_verdicts`` (each result names it); ValueError else."""
    names = sorted({str(v.get("rule")) for v in cell_verdicts.values()})
    if len(names) != 1:
        raise ValueError(f"the cells were decided by {names or 'no rule'}: the gate combines one rule's verdicts")
    spec = gates.rule(names[0], "speed")
    if spec.pooled:
        raise ValueError(f"{spec.name} decides over every deciding cell at once: it has no per-cell verdicts to combine")
    return spec


def combine(cell_verdicts: Mapping[str, Mapping[str, Any]], decision_cells: Sequence[str], *,
            informational: bool, clock: Mapping[str, Any] | None = None, rule: gates.Rule | None = None) -> dict:
    """The speed gate over the decision cells' results of a rule that decides each cell on its own (win2-v1; see
    module docstring). ``rule``: that rule (``gates.REGISTERED``); by default the one the cells' results name."""
    spec = _per_cell_rule(cell_verdicts) if rule is None else rule
    verdicts = {c: cell_verdicts[c]["verdict"] for c in cell_verdicts}
    dec = [verdicts[c] for c in decision_cells]
    if "LOSS" in dec:
        verdict = "LOSS"
    elif "INCONCLUSIVE" in dec or not dec:
        verdict = "INCONCLUSIVE"
    elif all(v == "WIN" for v in dec):
        verdict = "WIN"
    else:
        verdict = "NO_WIN"
    reasons = [f"{c} ({'decides' if c in decision_cells else 'reported only'}): {verdicts[c]}; "
               + "; ".join(cell_verdicts[c]["reasons"][:2]) for c in cell_verdicts]
    if informational:
        reasons.append("speed is informational (config speed.informational): only a LOSS gates the decision")
    first = cell_verdicts[decision_cells[0]] if decision_cells else {}
    return {"rule": spec.name, "verdict": verdict, "reasons": reasons, "params": first.get("params", {}),
            "deviations": first.get("deviations", {}), "informational": bool(informational),
            "decision_cells": list(decision_cells), "cells": verdicts,
            "clock_check": None if clock is None else clock.get("verdict")}


def _rule_deviations(spec: gates.Rule, res: Mapping[str, Any]) -> list[dict]:
    devs = [{"gate": "speed", "what": f"rule.{k}", "detail": f"{spec.name} {k}={v['used']!r} instead of the "
             f"registered {v['registered']!r}"} for k, v in (res.get("deviations") or {}).items()]
    default = gates.default_rule("speed")
    if spec.name != default.name:
        devs.append({"gate": "speed", "what": "rule", "detail": f"speed.rule {spec.name} instead of the default "
                     f"{default.name} ({spec.need('why_not')})"})
    return devs


def _decide_per_cell(spec: gates.Rule, series: Mapping[str, Mapping], speed: SpeedSettings,
                     clock: Mapping[str, Any], archive_pct: Mapping[str, float | None],
                     incon: list[str]) -> tuple[dict, dict]:
    """A rule that decides each cell on its own (win2-v1); the gate combines the deciding cells' verdicts."""
    caps = [json.dumps(c, sort_keys=True) for c in clock["caps"]]
    win2 = {}
    for c in speed.cells:
        name, s = c.name, series[c.name]
        missing = sorted({m for m, reps in s.items() for tr in reps for x in tr if x is None})
        if missing:
            win2[name] = {"rule": spec.name, "verdict": "INCONCLUSIVE", "params": {}, "deviations": {},
                          "reasons": [f"metric(s) {missing} have no value in some repeat (0 rounds or 0 "
                                      "decode seconds): nothing to compare"]}
            continue
        res = spec.apply(s, speed.rule_params, primary=speed.primary, guards=list(speed.guards),
                         reported=list(speed.reported), clock_caps=caps,
                         lower_is_better=[m for m in speed.metrics if m in LOWER_IS_BETTER],
                         throttled=bool(clock.get("slowdowns")), archive_spread_pct=archive_pct.get(name))
        # win2-v1 itself sees cap mismatches and that a GPU slowed down; which slowdown, for how
        # many microseconds, and the rest of the clock findings are the stage's.
        if incon:
            res["verdict"] = "INCONCLUSIVE"
            res["reasons"][:0] = incon
        if clock["mismatch"]:
            res["reasons"].insert(0, f"starts differ in clock cap facts {clock['mismatch']}")
        win2[name] = res
    gate = combine(win2, speed.deciding, informational=speed.informational, clock=clock, rule=spec)
    return win2, gate


def _rule_pooled(spec: gates.Rule, series: Mapping[str, Mapping], speed: SpeedSettings, usable: Sequence[str],
                 deciding: Sequence[str], lib: Sequence[str], evidence: Mapping[str, Any] | None,
                 sweep: Mapping[str, Any]) -> dict:
    """A pooled rule over the usable cells; with the host's evidence, its error rates at this noise (win2-v4,
    win2-v3). ``sweep``: the shared-control bracket's ``arms`` and ``candidate``, or nothing."""
    guards = list(speed.guards)
    res = spec.apply({n: series[n] for n in usable}, speed.rule_params, decide=deciding, primary=speed.primary,
                     guards=guards, reported=list(speed.reported), lower_is_better=lib,
                     max_starts=speed.max_starts, evidence=evidence, **sweep)
    if "evidence" not in spec.takes:
        return res   # win2-v2 states its own rates
    if res.get("more_starts"):
        return res   # the rates are the finished bracket's: a look that grows it states none
    nz = res["noise"]
    zero = [g for g in guards if all(v == 0 for c in deciding for tr in series[c][g] for v in tr)]
    # The simulation adds the per-repeat noise to each start's own offset, so it takes the start component:
    # the sd of a start's value less what its repeats (pooled over the deciding cells) already put in it.
    # Passing the start value's sd counted the repeat noise twice.
    start_sd = start_component_sd(nz["start_sd_used_pct"], nz["rep_sd_pct"], len(deciding), res["repeats"])
    nz["start_component_sd_pct"] = start_sd
    common = dict(rep_sd=nz["rep_sd_pct"], start_sd=start_sd, cells=len(deciding), repeats=res["repeats"],
                  max_starts=speed.max_starts, guards=guards, zero_guards=zero,
                  evidence_df=int(nz["evidence_df"] or 0))
    if "alpha_futility" in spec.params:
        params = {k: res["params"][k] for k in spec.params if k in res["params"]}
        # 1000 brackets: the sized bracket's simulation costs a second or two per hundred on one core
        r = res["rates"] = gates.win2_v5_rates(**common, n=1000, **params)
        extra = f", NO_WIN for a +{speed.win_pct:g} % one {100 * r['bar_no_win']:.1f} %"
    else:
        spend = {k: res["params"][k] for k in ("spending", "loss_pooled_share") if k in res["params"]}
        r = res["rates"] = gates.win2_v3_rates(**common, win_pct=speed.win_pct,
                                               start_noise_pct=speed.start_noise_pct, **spend)
        extra = ""
    res["reasons"].append(
        f"{spec.name} at this noise (start to start {start_sd:.2f} % of a start's own, per repeat "
        f"{nz['rep_sd_pct']:.2f} %, up to {speed.max_starts} starts): false WIN {100 * r['false_win']:.1f} %, "
        f"false LOSS {100 * r['false_loss']:.1f} %, NO_WIN on identical arms {100 * r['null_no_win']:.1f} %, WIN for "
        f"a +{r['power_gain_pct']:g} % change {100 * r['power']:.1f} %, LOSS for a -{r['power_gain_pct']:g} % one "
        f"{100 * r['power_loss']:.1f} %{extra} ({r['windows']} simulated brackets, seed {r['seed']})")
    return res


def start_component_sd(start_value_sd: float, rep_sd: float, cells: int, repeats: int) -> float:
    """A start's own offset (sd, %): its value's sd less the repeat noise its mean over cells x repeats holds."""
    return math.sqrt(max(0.0, start_value_sd ** 2 - rep_sd ** 2 / max(1, cells * repeats)))


def _decide_pooled(spec: gates.Rule, series: Mapping[str, Mapping], speed: SpeedSettings, clock: Mapping[str, Any],
                   archive_pct: Mapping[str, float | None], incon: list[str],
                   evidence: Mapping[str, Any] | None = None,
                   sweep: Mapping[str, Any] | None = None) -> tuple[dict, dict]:
    """win2-v2 or win2-v3: one verdict over every deciding cell at once, the stage's findings before it."""
    deciding = speed.deciding
    missing = {name: sorted({m for m, reps in series[name].items() for tr in reps for x in tr if x is None})
               for name in series}
    usable = [n for n in series if not missing[n]]
    blocked = [n for n in deciding if missing[n]]
    res: dict[str, Any]
    if blocked or not usable:
        res = {"rule": spec.name, "verdict": "INCONCLUSIVE", "params": {}, "deviations": {}, "cells": {},
               "noise": None, "rates": None, "more_starts": False,
               "reasons": [f"{n}: metric(s) {missing[n]} have no value in some repeat (0 rounds or 0 decode "
                           "seconds): nothing to compare" for n in blocked]}
    else:
        res = _rule_pooled(spec, series, speed, usable, deciding, [m for m in speed.metrics if m in LOWER_IS_BETTER],
                           evidence, sweep or {})
    if clock["mismatch"]:
        incon = [f"starts differ in clock cap facts {clock['mismatch']}", *incon]
    if incon:
        res["verdict"] = "INCONCLUSIVE"
        res["more_starts"] = False  # more starts under the same clock findings cannot make them comparable
        res["reasons"][:0] = incon
    per_cell = dict(res.get("cells") or {})
    for n in series:
        if missing[n]:
            per_cell[n] = {"decides": n in deciding, "verdict": "INCONCLUSIVE",
                           "reasons": [f"metric(s) {missing[n]} have no value in some repeat"]}
        per_cell[n]["archive_spread_pct"] = archive_pct.get(n)
    win2 = {n: {"rule": spec.name, **per_cell[n]} for n in series}
    reasons = list(res["reasons"])
    if speed.informational:
        reasons.append("speed is informational (config speed.informational): only a LOSS gates the decision")
    gate = {"rule": spec.name, "verdict": res["verdict"], "reasons": reasons, "params": res.get("params", {}),
            "deviations": res.get("deviations", {}), "informational": speed.informational,
            "decision_cells": deciding, "cells": {n: win2[n].get("verdict") for n in win2},
            "clock_check": clock.get("verdict"), **{k: res.get(k) for k in spec.carries}}
    if sweep:
        gate["sweep"] = res.get("sweep") or {"candidate": sweep["candidate"]}
    return win2, gate


def decide(results: Mapping[str, Mapping[str, Any]], speed: SpeedSettings | Mapping[str, Any], clock: Mapping[str, Any],
           archive_pct: Mapping[str, float | None] | None = None, *, starts: Sequence[str] | None = None,
           evidence: Mapping[str, Any] | None = None, arms: Sequence[str] | None = None,
           candidate: str | None = None, start_cost_s: float | None = None) -> tuple[dict, dict, dict]:
    """(win2 per cell, series per cell, gate) from ``results[start][cell]["pooled"]`` under ``speed.rule``.

    ``speed``: the section's record (a mapping ``SpeedSettings.to_json`` wrote is read back into one).

    Clock findings (``clock_findings``) make the gate INCONCLUSIVE under either
    rule; the gate carries ``stage_deviations`` (list of {gate, what,
    detail}): an accepted unverifiable clock, a non-default rule, rule
    parameters off their registered values. ``arms`` and ``candidate``: one
    candidate of a shared-control bracket (a sequential rule only), decided
    over its windows. ``start_cost_s``: this bracket's mean wall time a start;
    an undecided bracket that knows how many starts would decide says how
    many minutes they would take.
    """
    speed = SpeedSettings.of(speed)
    spec = gates.rule(speed.rule, "speed")
    names = list(starts) if starts is not None else [st for st, _, _ in START_ROLES]
    series = {c.name: series_for({st: results[st][c.name] for st in names}, speed.metrics, names)
              for c in speed.cells}
    incon, devs = clock_findings(clock, speed)
    sweep = None if arms is None else {"arms": list(arms), "candidate": candidate, "start_names": names}
    if sweep is not None and spec.name not in gates.SEQUENTIAL_RULES:
        raise ValueError(f"a shared-control bracket is decided by {' or '.join(gates.SEQUENTIAL_RULES)}, "
                         f"not {spec.name}")
    if spec.pooled:
        win2, gate = _decide_pooled(spec, series, speed, clock, archive_pct or {}, incon, evidence, sweep)
    else:
        win2, gate = _decide_per_cell(spec, series, speed, clock, archive_pct or {}, incon)
    rule_res = gate if spec.pooled else next((w for w in win2.values() if w.get("deviations")), {})
    _say_minutes(gate, start_cost_s)
    gate["stage_deviations"] = devs + _rule_deviations(spec, rule_res)
    for d in devs:
        gate["reasons"].append(f"deviation: {d['detail']}")
    return win2, series, gate


def _say_minutes(gate: dict, start_cost_s: float | None) -> None:
    """An undecided, stopped bracket: the starts that would decide it, in minutes at this bracket's start cost."""
    if gate.get("verdict") != "INCONCLUSIVE" or gate.get("more_starts") or not start_cost_s:
        return
    need = (gate.get("plan") or {}).get("starts_needed") or (gate.get("needed") or {}).get("starts_needed")
    if not need:
        return
    minutes = need * start_cost_s / 60.0
    if isinstance(gate.get("needed"), dict):
        gate["needed"]["minutes"] = minutes
        gate["needed"]["start_cost_s"] = start_cost_s
    gate["reasons"].insert(1 if gate["reasons"] else 0,
                           f"what would decide: about {need} starts, about {minutes:.0f} min at this bracket's "
                           f"{start_cost_s:.0f} s a start (speed.max_starts, or a calibration of this host: "
                           "pairaudit size --speed)")
