"""win2-v1 and win2-v2: one OFF/ON/OFF speed bracket (control, candidate, control) -> WIN | NO_WIN |
LOSS | INCONCLUSIVE.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pairaudit.core.stats import paired_t_interval
from pairaudit.gates.common import registered_params
from pairaudit.gates.speed.design import _nums

WIN2_V1 = {"win_pct": 2.0, "level": 0.95, "guard_loss_repeats": 2}


def _win2_metric(triples: Sequence[Sequence[float]], lower_is_better: bool,
                 win_pct: float, level: float) -> dict:
    t = np.asarray(triples, dtype=float)
    before, cand, after = t[:, 0], t[:, 1], t[:, 2]
    control = (before + after) / 2.0
    spread = np.abs(before - after)
    sign = -1.0 if lower_is_better else 1.0
    # "gain" is oriented so that positive always means the candidate is better.
    gain = sign * (cand - control)
    c_mean = float(control.mean())
    gain_pct = 100.0 * float(gain.mean()) / abs(c_mean) if c_mean != 0 else math.nan
    mean, lo, hi = paired_t_interval(cand - control, level)
    glo, ghi = sorted((sign * lo, sign * hi))
    if gain_pct > win_pct and glo > 0:
        verdict = "WIN"
    elif gain_pct < -win_pct and ghi < 0:
        verdict = "LOSS"
    else:
        verdict = "NO_WIN"
    worse_than_spread = [bool(-g > s) for g, s in zip(gain, spread)]
    spread_pct = [100.0 * float(s) / abs(float(c)) if c != 0 else math.nan
                  for s, c in zip(spread, control)]
    return {
        "lower_is_better": lower_is_better,
        "control": control.tolist(), "candidate": cand.tolist(),
        "control_before": before.tolist(), "control_after": after.tolist(),
        "diff": (cand - control).tolist(),
        "point_gain_pct": gain_pct,
        "t_interval": {"mean": mean, "lo": lo, "hi": hi, "level": level},
        "control_spread": spread.tolist(),
        "control_spread_pct": spread_pct,
        "max_control_spread_pct": max(spread_pct),
        "win_pct": win_pct,
        "worse_than_spread": worse_than_spread,
        "verdict": verdict,
    }


def canonical_repr(x: Any) -> str:
    """Order-independent text of a clock cap (a number, string or dict of cap facts)."""
    return json.dumps(x, sort_keys=True, default=repr)


def win2_v1(
    series: Mapping[str, Sequence[Sequence[float]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    win_pct: float = 2.0,
    level: float = 0.95,
    clock_caps: Sequence[Any] | None = None,
    expected_clock_cap: Any = None,
    throttled: bool = False,
    lower_is_better: Iterable[str] = (),
    guard_loss_repeats: int = 2,
    archive_spread_pct: float | None = None,
) -> dict:
    """win2-v1: OFF/ON/OFF speed decision paired by repeat.

    series: metric -> per repeat r a triple (control_before, candidate,
    control_after). Control_r = mean of the brackets. Per metric: point gain
    % = 100 * mean oriented (candidate - control) / |mean control|, and the
    ``level`` paired-t interval of candidate - control over repeats.

    - primary: WIN if gain > win_pct and the interval excludes 0 on the
      better side; LOSS if the mirror holds (a demonstrated slowdown of more
      than the bar — our reading; the seed only names WIN); else NO_WIN.
    - guards: only cause LOSS, when worse than control by more than that
      repeat's control spread |before - after| in >= guard_loss_repeats of 3
      repeats (registered: 2 of 3). With R != 3 repeats the same fraction
      is kept: ceil(guard_loss_repeats * R / 3) repeats (2 of 2, 4 of 5).
      Under pure noise (iid normal starts) one guard flags a repeat with
      probability atan(sqrt(3/4))/pi = 0.23, so 2 of 3 gives about 13 %
      false LOSS per guard: the seed's price for a guard that can only block.
    - reported: same per-metric verdict, recorded, never decides.
    - INCONCLUSIVE first of all when clock_caps (one per start) are not all
      equal, differ from expected_clock_cap, or throttled is set: the control
      must be a same-clock control. Fewer than 2 repeats: INCONCLUSIVE.
    The in-window control spread (% of control) is reported beside the bar;
    archive_spread_pct (day-to-day, from the control archive) is passed
    through when known. The bar is a parameter, never raised silently.
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    params, dev, reasons = registered_params(
        {"win_pct": win_pct, "level": level, "guard_loss_repeats": guard_loss_repeats}, WIN2_V1)
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib))
    roles = [primary] + guards + reported
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {roles}")
    missing = [m for m in roles if m not in series]
    if missing:
        raise ValueError(f"metrics {missing} absent from series")
    lengths = {m: len(series[m]) for m in roles}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"metrics have different repeat counts: {lengths}")
    for m in roles:
        for tr in series[m]:
            if len(tr) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in tr):
                raise ValueError(f"{m}: each repeat must be 3 finite numbers (before, candidate, after), got {tr!r}")
    n_rep = lengths[primary]

    out: dict[str, Any] = {"rule": "win2-v1", "params": params, "deviations": dev,
                           "repeats": n_rep, "clock_caps": list(clock_caps) if clock_caps is not None else None,
                           "expected_clock_cap": expected_clock_cap, "throttled": bool(throttled),
                           "archive_spread_pct": archive_spread_pct}
    incon = []
    if clock_caps is not None and len({canonical_repr(c) for c in clock_caps}) > 1:
        incon.append(f"starts ran under different clock caps {list(clock_caps)}")
    if clock_caps is not None and expected_clock_cap is not None and any(
            canonical_repr(c) != canonical_repr(expected_clock_cap) for c in clock_caps):
        incon.append(f"clock caps {list(clock_caps)} differ from the configured {expected_clock_cap!r}")
    if throttled:
        incon.append("throttling was flagged inside the bracket")
    if n_rep < 2:
        incon.append(f"{n_rep} repeat(s): no paired-t interval")
        out.update(verdict="INCONCLUSIVE", reasons=reasons + incon, primary=None, guards={}, reported={})
        return out

    prim = _win2_metric(series[primary], primary in lib, win_pct, level)
    g_res = {}
    guard_losses = []
    needed = max(1, math.ceil(guard_loss_repeats * n_rep / 3 - 1e-9))
    out["guard_loss_needed"] = needed
    for g in guards:
        r = _win2_metric(series[g], g in lib, win_pct, level)
        n_worse = sum(r["worse_than_spread"])
        r["repeats_worse_than_spread"] = n_worse
        r["guard_verdict"] = "LOSS" if n_worse >= needed else "OK"
        g_res[g] = r
        if r["guard_verdict"] == "LOSS":
            guard_losses.append(f"guard {g}: candidate worse than the control spread in "
                                f"{n_worse} of {n_rep} repeats (>= {needed})")
    rep = {m: _win2_metric(series[m], m in lib, win_pct, level) for m in reported}
    out.update(primary=prim, guards=g_res, reported=rep)

    ti = prim["t_interval"]
    summary = (f"primary {primary}: point gain {prim['point_gain_pct']:+.3f} % vs bar {win_pct} %, "
               f"{int(level * 100)} % paired-t [{ti['lo']:.6g}, {ti['hi']:.6g}] on candidate-control; "
               f"in-window control/control spread max {prim['max_control_spread_pct']:.3f} %"
               + (f", archive spread {archive_spread_pct:.3f} %" if archive_spread_pct is not None else ""))
    if incon:
        verdict = "INCONCLUSIVE"
        reasons += incon
    elif guard_losses or prim["verdict"] == "LOSS":
        verdict = "LOSS"
        reasons += guard_losses
        if prim["verdict"] == "LOSS":
            reasons.append(f"primary {primary} is worse by more than {win_pct} % with the interval excluding 0")
    elif prim["verdict"] == "WIN":
        verdict = "WIN"
    else:
        verdict = "NO_WIN"
        reasons.append("speed gain not shown (gain <= bar or interval includes 0)")
    reasons.append(summary)
    for m, r in rep.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    out.update(verdict=verdict, reasons=reasons)
    return out


# Registered values. start_noise_pct is the start-to-start noise (sd of one
# start's mean, % of the control) the rule assumes a host may have even when
# the window's one s1-s3 difference does not show it: that difference is a
# single degree of freedom, so a window whose two controls happen to agree
# says little about the next start. 3 % is the largest per-start offset the
# rule is calibrated against (bench/speed_noise.py).
WIN2_V2 = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "start_noise_pct": 3.0,
           "power_gain_pct": 10.0}


WIN2_V2_RATE_WINDOWS = 2000   # simulated windows behind the error rates a decision reports


WIN2_V2_RATE_SEED = 0


def _z(p: float) -> float:
    from scipy.stats import norm  # here: scipy.stats costs a second at the workflow's load

    return float(norm.ppf(p))


def _v2_metric(x: np.ndarray, lower_is_better: bool) -> dict:
    """Per window and cell, one metric: gain, s1-s3 difference and within-start variance, in % of control.

    x: (windows, cells, repeats, 3) with the starts (s1, s2, s3) last. Values
    are relative to the cell's control mean over all repeats of s1 and s3,
    oriented so that a positive gain is always better. A control mean of 0
    (e.g. accepted drafts without speculation) gives 0 for a 0 value and
    +-100 % otherwise (any drafting beats none).
    """
    c = (x[..., 0] + x[..., 2]).mean(axis=-1) / 2.0                      # (W, C)
    cz = c[..., None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(cz != 0, 100.0 * (x / np.where(cz != 0, cz, 1.0) - 1.0),
                       np.where(x == 0, 0.0, 100.0 * np.sign(x)))
    if lower_is_better:
        rel = -rel
    m = rel.mean(axis=-2)                                                  # (W, C, 3)
    gain = m[..., 1] - (m[..., 0] + m[..., 2]) / 2.0
    d13 = m[..., 0] - m[..., 2]
    r = x.shape[-2]
    within = rel.var(axis=-2, ddof=1).mean(axis=-1) if r > 1 else np.zeros_like(gain)
    return {"gain": gain, "d13": d13, "within": within, "control_mean": c}


def _v2_noise(mt: dict, repeats: int, floor: float) -> dict:
    """The window's noise for one metric: per-repeat sd, start-level sd seen in s1-s3, and what is used."""
    rep_var = mt["within"].mean(axis=-1)                                   # (W,)
    start_var = np.maximum(0.0, (mt["d13"] ** 2).mean(axis=-1) / 2.0 - rep_var / repeats)
    used_var = np.maximum(start_var, floor ** 2)
    return {"rep_sd": np.sqrt(rep_var), "start_sd": np.sqrt(start_var), "start_sd_used": np.sqrt(used_var),
            "rep_var": rep_var, "used_var": used_var}


def _win2_v2_core(metrics: Mapping[str, np.ndarray], *, primary: str, guards: Sequence[str],
                  lower_is_better: Iterable[str], win_pct: float, alpha_win: float, alpha_loss: float,
                  start_noise_pct: float) -> dict:
    """win2-v2 over many windows at once: arrays of shape (windows, cells, repeats, 3) per metric.

    The simulation (bench/speed_noise.py) and the error rates a decision
    reports run exactly this function; ``win2_v2`` calls it with one window.
    """
    lib = set(lower_is_better)
    x = np.asarray(metrics[primary], dtype=float)
    n_cells, repeats = x.shape[1], x.shape[2]
    per = {m: _v2_metric(np.asarray(metrics[m], dtype=float), m in lib) for m in [primary, *guards]}
    noise = {m: _v2_noise(per[m], repeats, start_noise_pct) for m in per}
    z_win = _z(1.0 - alpha_win)
    # One loss test per cell and metric (primary and guards), each at alpha_loss / tests:
    # under identical arms the chance that any of them fires stays below alpha_loss.
    n_tests = n_cells * len(per)
    z_loss = _z(1.0 - alpha_loss / n_tests)
    p, pn = per[primary], noise[primary]
    # Pooled over the cells, the gain's variance keeps the whole start-level
    # part (a start's offset is shared by every cell it runs) and divides the
    # per-repeat part by cells x repeats; s2 - (s1 + s3) / 2 has 1.5 x the
    # variance of one start's mean.
    pooled = p["gain"].mean(axis=-1)
    pooled_se = np.sqrt(1.5 * (pn["used_var"] + pn["rep_var"] / (repeats * n_cells)))
    half = z_win * pooled_se
    lo = pooled - half
    consistent = (p["gain"] > win_pct).all(axis=-1)
    win = (lo > 0) & (pooled > win_pct) & consistent
    loss_by = {}
    for m in per:
        se = np.sqrt(1.5 * (noise[m]["used_var"] + noise[m]["rep_var"] / repeats))[:, None]
        g = per[m]["gain"]
        loss_by[m] = (g < -win_pct) & (g + z_loss * se < 0)                # (W, C)
    loss = np.zeros(x.shape[0], dtype=bool)
    for m in per:
        loss |= loss_by[m].any(axis=-1)
    decided = half <= win_pct
    verdict = np.where(loss, "LOSS", np.where(win, "WIN", np.where(decided, "NO_WIN", "INCONCLUSIVE")))
    return {"verdict": verdict, "per": per, "noise": noise, "pooled_gain": pooled, "pooled_se": pooled_se,
            "half_width": half, "lo": lo, "consistent": consistent, "loss_by": loss_by,
            "z_win": z_win, "z_loss": z_loss, "n_loss_tests": n_tests}



# win2-v2 reports its own simulated error rates, so its simulation lives beside it.
def simulate_windows(rng: np.random.Generator, n: int, *, cells: int, repeats: int, rep_sd: float,
                     start_sd: float, gain_pct: float = 0.0, metrics: Sequence[str] = ("primary",),
                     zero: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """n synthetic brackets, (n, cells, repeats, 3) per metric, base 100.

    Noise in % of the mean: ``start_sd`` per start, shared by every cell,
    repeat and metric of that start (a server start that runs slow runs slow
    throughout); ``rep_sd`` per start, cell, repeat and metric, independent.
    The candidate start s2 is ``gain_pct`` % faster in every metric. Metrics
    in ``zero`` are 0 everywhere (accepted drafts of a non-speculative pair).
    """
    off = rng.normal(0.0, start_sd, (n, 1, 1, 3))
    scale = np.array([1.0, 1.0 + gain_pct / 100.0, 1.0])
    out = {}
    for m in metrics:
        if m in zero:
            out[m] = np.zeros((n, cells, repeats, 3))
            continue
        e = rng.normal(0.0, rep_sd, (n, cells, repeats, 3))
        out[m] = 100.0 * (1.0 + (off + e) / 100.0) * scale
    return out


def win2_v2_rates(*, rep_sd: float, start_sd: float, cells: int, repeats: int, guards: Sequence[str] = (),
                  zero_guards: Sequence[str] = (), win_pct: float = 2.0, alpha_win: float = 0.05,
                  alpha_loss: float = 0.05, start_noise_pct: float = 3.0, power_gain_pct: float = 10.0,
                  n: int = WIN2_V2_RATE_WINDOWS, seed: int = WIN2_V2_RATE_SEED) -> dict:
    """Seeded simulated error rates of win2-v2 at one noise level (the model of simulate_windows).

    false_win / false_loss: identical arms; power: the candidate ``power_gain_pct`` % better.
    Guards carry the same noise as the primary.
    """
    kw: dict[str, Any] = dict(primary="primary", guards=list(guards), lower_is_better=(), win_pct=win_pct,
              alpha_win=alpha_win, alpha_loss=alpha_loss, start_noise_pct=start_noise_pct)
    names = ["primary", *guards]
    rng = np.random.default_rng(seed)
    null = _win2_v2_core(simulate_windows(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                          metrics=names, zero=zero_guards), **kw)["verdict"]
    alt = _win2_v2_core(simulate_windows(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                         gain_pct=power_gain_pct, metrics=names, zero=zero_guards), **kw)["verdict"]
    return {"rep_sd_pct": rep_sd, "start_sd_pct": start_sd, "cells": cells, "repeats": repeats, "windows": n,
            "seed": seed, "false_win": float((null == "WIN").mean()), "false_loss": float((null == "LOSS").mean()),
            "null_inconclusive": float((null == "INCONCLUSIVE").mean()),
            "power_gain_pct": power_gain_pct, "power": float((alt == "WIN").mean())}


def win2_v2_needed(*, rep_sd: float, start_sd_used: float, cells: int, repeats: int, win_pct: float,
                   alpha_win: float = 0.05) -> dict:
    """How many repeats, or brackets, would make the one-sided half-width reach the bar at this noise.

    The start-level part does not shrink with repeats (every repeat of a
    start shares its offset): when it alone exceeds the bar, more repeats
    cannot help and only more brackets (s1, s2, s3 starts, pooled) can.
    """
    z = _z(1.0 - alpha_win)
    budget = (win_pct / z) ** 2 / 1.5             # allowed variance of the start-level mean
    start_var, rep_var = start_sd_used ** 2, rep_sd ** 2
    if start_var >= budget:
        repeats_needed = None
    else:
        repeats_needed = max(repeats, math.ceil(rep_var / (cells * (budget - start_var)) - 1e-9))
    total = start_var + rep_var / (cells * repeats)
    brackets = max(1, math.ceil(total / budget - 1e-9)) if budget > 0 else None
    return {"repeats_needed": repeats_needed, "brackets_needed": brackets,
            "half_width_pct": z * math.sqrt(1.5 * total)}



def win2_v2(
    cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    decide: Iterable[str] | None = None,
    lower_is_better: Iterable[str] = (),
    win_pct: float = 2.0,
    alpha_win: float = 0.05,
    alpha_loss: float = 0.05,
    start_noise_pct: float = 3.0,
    power_gain_pct: float = 10.0,
    with_rates: bool = True,
) -> dict:
    """win2-v2: the OFF/ON/OFF speed decision over every deciding cell at once.

    cells: cell -> metric -> per repeat (s1, s2, s3). decide: the deciding
    cells (default: all); the others get their own reported verdict. All
    values are % of the cell's control mean (s1 and s3 over every repeat),
    oriented so that a positive gain is better.

    Per cell and metric: gain = mean(s2) - (mean(s1) + mean(s3)) / 2, the
    s1-s3 difference and the within-start variance of the repeats. The
    window's noise (per metric, pooled over the deciding cells): per-repeat
    sd from the within-start variance, start-level sd from the s1-s3
    differences beyond what the repeats explain. The start-level sd used is
    the larger of that and ``start_noise_pct`` (one s1-s3 difference is one
    degree of freedom, so an agreeing pair of controls does not show a quiet
    host). Var(gain) = 1.5 x (start var + repeat var / repeats).

    - WIN: the cells' mean primary gain exceeds the bar, its one-sided
      (1 - alpha_win) lower bound exceeds 0 (the start-level variance is kept
      whole: a start's offset is shared by its cells), and every deciding
      cell's gain exceeds the bar.
    - LOSS: in some deciding cell the primary or a guard is worse than the
      bar and its upper bound, at alpha_loss divided by the number of such
      tests (cells x metrics), is below 0: a slowdown the window's noise does
      not explain. A guard cannot make a WIN.
    - otherwise NO_WIN when the window resolves the bar (one-sided half-width
      <= win_pct), else INCONCLUSIVE, with the repeats (or brackets) it
      would need.
    Clock checks are the stage's (speed.decision.decide), not this function's. The
    result names the window's noise and, when ``rates``, the rule's
    simulated false WIN / false LOSS / power at that noise and at the noise
    it assumes (``with_rates``).
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    registered = dict(WIN2_V2)
    params, dev, reasons = registered_params({"win_pct": win_pct, "alpha_win": alpha_win, "alpha_loss": alpha_loss,
                                    "start_noise_pct": start_noise_pct, "power_gain_pct": power_gain_pct},
                                   registered)
    names = list(cells)
    decide = names if decide is None else [c for c in names if c in set(decide)]
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib),
                  decision_cells=list(decide))
    roles = [primary] + guards + reported
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {roles}")
    if not decide:
        raise ValueError("win2-v2 needs at least one deciding cell")
    reps = set()
    for c in names:
        missing = [m for m in roles if m not in cells[c]]
        if missing:
            raise ValueError(f"cell {c}: metrics {missing} absent from series")
        for m in roles:
            reps.add(len(cells[c][m]))
            for tr in cells[c][m]:
                if len(tr) != 3 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in tr):
                    raise ValueError(f"{c}/{m}: each repeat must be 3 finite numbers (s1, s2, s3), got {tr!r}")
    if len(reps) != 1:
        raise ValueError(f"cells and metrics have different repeat counts: {sorted(reps)}")
    n_rep = reps.pop()
    out: dict[str, Any] = {"rule": "win2-v2", "params": params, "deviations": dev, "repeats": n_rep}
    if n_rep < 2:
        out.update(verdict="INCONCLUSIVE", reasons=reasons + [f"{n_rep} repeat(s): no within-start noise"],
                   cells={}, noise=None, rates=None)
        return out
    kw: dict[str, Any] = dict(primary=primary, guards=guards, lower_is_better=lib, win_pct=win_pct, alpha_win=alpha_win,
              alpha_loss=alpha_loss, start_noise_pct=start_noise_pct)

    def arr(cs, m):
        return np.asarray([[cells[c][m] for c in cs]], dtype=float)      # (1, C, R, 3)

    core = _win2_v2_core({m: arr(decide, m) for m in [primary, *guards]}, **kw)
    pn = core["noise"][primary]
    noise: dict[str, Any] = {"rep_sd_pct": float(pn["rep_sd"][0]), "start_sd_pct": float(pn["start_sd"][0]),
             "start_sd_used_pct": float(pn["start_sd_used"][0]),
             "s1_s3_diff_pct": _nums(core["per"][primary]["d13"]),
             "guards": {g: {"rep_sd_pct": float(core["noise"][g]["rep_sd"][0]),
                            "start_sd_pct": float(core["noise"][g]["start_sd"][0])} for g in guards}}
    need = win2_v2_needed(rep_sd=noise["rep_sd_pct"], start_sd_used=noise["start_sd_used_pct"],
                          cells=len(decide), repeats=n_rep, win_pct=win_pct, alpha_win=alpha_win)
    gain, half = float(core["pooled_gain"][0]), float(core["half_width"][0])
    verdict = str(core["verdict"][0])
    per_cell: dict[str, dict[str, Any]] = {}
    for j, c in enumerate(decide):
        cell_loss = [m for m in core["loss_by"] if core["loss_by"][m][0, j]]
        cg = float(core["per"][primary]["gain"][0, j])
        per_cell[c] = {"decides": True, "primary": {"point_gain_pct": cg,
                                                    "s1_s3_diff_pct": float(core["per"][primary]["d13"][0, j]),
                                                    "within_sd_pct": math.sqrt(float(core["per"][primary]["within"][0, j]))},
                       "guards": {g: {"point_gain_pct": float(core["per"][g]["gain"][0, j]),
                                      "guard_verdict": "LOSS" if g in cell_loss else "OK"} for g in guards},
                       "losses": cell_loss,
                       "verdict": "LOSS" if cell_loss else ("ABOVE_BAR" if cg > win_pct else "NOT_ABOVE_BAR")}
    # Cells that do not decide, and reported metrics: the same test, recorded only.
    for c in [c for c in names if c not in decide]:
        one = _win2_v2_core({m: arr([c], m) for m in [primary, *guards]}, **kw)
        per_cell[c] = {"decides": False, "verdict": str(one["verdict"][0]),
                       "primary": {"point_gain_pct": float(one["pooled_gain"][0]),
                                   "s1_s3_diff_pct": float(one["per"][primary]["d13"][0, 0])},
                       "guards": {g: {"point_gain_pct": float(one["per"][g]["gain"][0, 0]),
                                      "guard_verdict": "LOSS" if one["loss_by"][g][0, 0] else "OK"} for g in guards}}
    rep_res = {}
    for m in reported:
        one = _win2_v2_core({m: arr(decide, m)}, **{**kw, "primary": m, "guards": []})
        rep_res[m] = {"verdict": str(one["verdict"][0]), "point_gain_pct": float(one["pooled_gain"][0]),
                      "lower_is_better": m in lib}
    summary = (f"primary {primary}: gain {gain:+.2f} % over {len(decide)} deciding cell(s) vs bar {win_pct} %, "
               f"one-sided {100 * (1 - alpha_win):g} % lower bound {gain - half:+.2f} % (half-width {half:.2f} %); "
               f"window noise: per repeat {noise['rep_sd_pct']:.2f} %, start to start {noise['start_sd_pct']:.2f} % "
               f"from s1-s3 (used {noise['start_sd_used_pct']:.2f} %, floor {start_noise_pct} %)")
    if verdict == "LOSS":
        for c, pc in per_cell.items():
            if pc.get("decides") and pc.get("losses"):
                reasons.append(f"{c}: {', '.join(pc['losses'])} worse than the bar beyond the window's noise "
                               f"(each loss test at {100 * alpha_loss / core['n_loss_tests']:.3g} %)")
    elif verdict == "WIN":
        reasons.append("gain above the bar in every deciding cell and its lower bound above 0")
    elif verdict == "NO_WIN":
        reasons.append("speed gain not shown, and the window resolves the bar (half-width <= bar)")
    else:
        how = (f"would need {need['repeats_needed']} repeats per start, or {need['brackets_needed']} brackets "
               "pooled" if need["repeats_needed"] is not None
               else "more repeats cannot help (the start-to-start part alone exceeds the bar); would need "
               f"{need['brackets_needed']} brackets pooled")
        reasons.append(f"too noisy to decide at the {win_pct} % bar: half-width {half:.2f} % > {win_pct} %; {how}")
    reasons.append(summary)
    if not core["consistent"][0] and verdict != "LOSS":
        low = [c for c in decide if per_cell[c]["primary"]["point_gain_pct"] <= win_pct]
        reasons.append(f"cells not above the bar: {low}")
    for m, r in rep_res.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    rates = None
    if with_rates:
        zero = [g for g in guards if all(v == 0 for c in decide for tr in cells[c][g] for v in tr)]
        common: dict[str, Any] = dict(cells=len(decide), repeats=n_rep, guards=guards, zero_guards=zero,
                                      win_pct=win_pct, alpha_win=alpha_win, alpha_loss=alpha_loss,
                                      start_noise_pct=start_noise_pct, power_gain_pct=power_gain_pct)
        rates = {"measured": win2_v2_rates(rep_sd=noise["rep_sd_pct"], start_sd=noise["start_sd_pct"], **common),
                 "assumed": win2_v2_rates(rep_sd=noise["rep_sd_pct"], start_sd=noise["start_sd_used_pct"], **common)}
        m_, a_ = rates["measured"], rates["assumed"]
        reasons.append(f"win2-v2 at this window's noise: false WIN {100 * m_['false_win']:.1f} %, false LOSS "
                       f"{100 * m_['false_loss']:.1f} %, WIN for a +{power_gain_pct:g} % change "
                       f"{100 * m_['power']:.1f} %; with start-to-start noise {a_['start_sd_pct']:.2f} %: "
                       f"{100 * a_['false_win']:.1f} % / {100 * a_['false_loss']:.1f} % / {100 * a_['power']:.1f} % "
                       f"({m_['windows']} simulated windows, seed {m_['seed']})")
    out.update(verdict=verdict, reasons=reasons, cells=per_cell, reported=rep_res, noise=noise, needed=need,
               pooled_gain_pct=gain, half_width_pct=half, lower_bound_pct=gain - half,
               loss_tests=core["n_loss_tests"], rates=rates)
    return out
