"""The sequential rules over the alternating bracket: win2-v3 and win2-v4 (and their shared core).

Stated in full in docs/rules.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pairaudit.gates.common import registered_params
from pairaudit.gates.speed.design import (_check_cells, _nums, _q, _v3_gain, _v3_start_values, _v3_window_var,
                                          arm_factor, bracket_arms, gs_levels, look_level, log_bar, looks_for,
                                          obf_levels, obf_spent, pct_of_log)
from pairaudit.gates.speed.sweep import SweepLayout, sweep_layout

# ----------------------------------------------------------------- win2-v3
#
# Registered values. The bracket grows C, T, C, T, C ... up to max_starts, and
# the gate looks after every candidate/control pair; each look tests at
# alpha / looks (a union bound), so the false WIN and false LOSS rates of the
# whole sequence stay at or below alpha_win and alpha_loss. min_df: below this
# many degrees of freedom for the start-to-start variance the rule does not
# trust the estimate and uses start_noise_pct instead (the fallback).
WIN2_V3 = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "start_noise_pct": 3.0, "min_df": 2,
           "evidence_f_alpha": 0.05}
# win2-v4: win2-v3's bracket and statistics with two changes of how alpha is spent.
# spending "obf": each test's alpha is spent over the looks by the Lan-DeMets
# O'Brien-Fleming-type function instead of alpha / looks at every look: early
# looks are stricter, the last one is nearly at alpha (the union bound spent a
# quarter of it at each of four looks). loss_pooled_share: the loss test on the
# primary pooled over the cells (the one that sees a uniform slowdown) gets
# this share of alpha_loss, the per-cell tests split the rest, instead of an
# equal share for every test. Both keep the false WIN and false LOSS rates of
# the whole sequence at or below alpha_win and alpha_loss.
WIN2_V4 = {**WIN2_V3, "spending": "obf", "loss_pooled_share": 0.5}


def _v3_noise(win_var: np.ndarray, win_df: int, ev_var: np.ndarray | float | None, ev_df: int, *,
              floor: float, min_df: float, f_alpha: float) -> dict:
    """The start-to-start variance the gate uses: the window's, pooled with the host's evidence where they agree.

    Evidence (earlier windows of the same control on this host) is pooled
    unless the window's own variance is significantly larger (one-sided F
    test at ``f_alpha``): a candidate that makes the host noisier must not
    borrow a quiet history. Below ``min_df`` degrees of freedom the
    registered floor is the least variance used (the t quantile of the
    degrees of freedom seen still applies).
    """
    from scipy.stats import f as f_dist

    win_var = np.asarray(win_var, dtype=float)
    if ev_var is not None and ev_df > 0:
        ev = np.broadcast_to(np.asarray(ev_var, dtype=float), win_var.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(ev > 0, win_var / np.where(ev > 0, ev, 1.0), np.where(win_var > 0, np.inf, 1.0))
        crit = float(f_dist.ppf(1.0 - f_alpha, win_df, ev_df))
        pool = ratio <= crit
        var = np.where(pool, (win_df * win_var + ev_df * ev) / (win_df + ev_df), win_var)
        df = np.where(pool, win_df + ev_df, win_df)
    else:
        pool = np.zeros(win_var.shape, dtype=bool)
        var, df = win_var, np.full(win_var.shape, win_df)
    fallback = df < min_df
    used = np.where(fallback, np.maximum(var, floor ** 2), var)
    return {"var": var, "df": df, "pooled_evidence": pool, "fallback": fallback, "used_var": used}


# Below this many degrees of freedom of the start-to-start variance, win2-v4's group-sequential level
# is used only where it is stricter than alpha / looks: the levels are solved for a known variance,
# and applied to t statistics with few degrees of freedom they let through more than alpha (simulated:
# 5.5 % false WIN at 8 % start-to-start noise with no host evidence); at this many they do not.
GS_MIN_DF = 8


# The grid win2-v5's levels are solved on: its designs vary bracket by bracket (the size is re-estimated at
# every look), so each is solved anew; 241 points give the levels of 801 to 1e-5 relative at a tenth of the time.
DESIGN_GRID = 241


def design_level(alpha: float, design: tuple[tuple[float, ...], tuple[float, ...]]) -> float:
    """The level the last look of ``design`` spends: (each look's information, the fraction of the size
    planned at that look it had), alpha spent O'Brien-Fleming-type and never taken back."""
    infos, ts = design
    cum, spent = 0.0, []
    for t in ts:
        cum = max(cum, obf_spent(alpha, t))
        spent.append(cum)
    return gs_levels(tuple(infos), tuple(spent), DESIGN_GRID)[-1]


def _levels(alpha: float, looks: int, look: int, spending: str, df: np.ndarray,
            design: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> np.ndarray:
    """The level a test spends at this look, per window: its spending's, capped at alpha / looks on few df.

    ``design``: win2-v5's looks so far (``design_level``); else the looks after 3, 5, ... starts
    (``information_fractions``)."""
    df = np.asarray(df)
    level = look_level(alpha, looks, look, spending) if design is None else design_level(float(alpha), design)
    if spending == "bonferroni":
        return np.full(df.shape, level)
    return np.where(df >= GS_MIN_DF, level, min(level, alpha / looks))


# win2-v5's NO_WIN bound takes the start-to-start variance at the upper end of its one-sided 70 % interval
# (chi-square at the variance's degrees of freedom: this is the lower quantile it divides by). The bracket is
# sized from the same variance it tests with: a look is the last where the re-estimated size does not grow,
# that is where the variance reads low, and there a t bound at the variance itself called a gain of the bar
# NO_WIN more often than alpha_futility (simulated: 10.2-10.8 % for its 10 % at start to start 1.4-1.9 %; with
# the factor 8.0-8.9 %). The factor is 1.67 at 5 degrees of freedom, 1.23 at 20, 1.11 at 60; the sizing's
# A/A condition uses it too.
FUTILITY_VAR_LEVEL = 0.3


def futility_var_factor(df: np.ndarray | float) -> np.ndarray:
    """df / chi-square's FUTILITY_VAR_LEVEL quantile at df: the factor that takes a variance with df degrees of
    freedom to the upper end of its one-sided 1 - FUTILITY_VAR_LEVEL interval (towards 1 as df grows)."""
    from scipy.stats import chi2

    d = np.maximum(np.asarray(df, dtype=float), 1.0)
    return np.maximum(d / chi2.ppf(FUTILITY_VAR_LEVEL, d), 1.0)


def _quantiles(p: float | np.ndarray, df: np.ndarray) -> np.ndarray:
    """Student-t at the variance's degrees of freedom, the fallback's too.

    The fallback raises the variance to the floor but keeps the t quantile of
    the degrees of freedom actually seen: a host noisier than the floor then
    stays undecided at one bracket instead of deciding on a variance that a
    single control pair happened to understate.
    """
    from scipy.stats import t

    return np.asarray(t.ppf(p, np.maximum(df, 1)))


def _win2_v3_core(metrics: Mapping[str, np.ndarray], *, primary: str, guards: Sequence[str],
                  lower_is_better: Iterable[str], win_pct: float, alpha_win: float, alpha_loss: float,
                  start_noise_pct: float, min_df: int, evidence_f_alpha: float, looks: int,
                  evidence: Mapping[str, Mapping[str, Any]] | None = None, spending: str = "bonferroni",
                  loss_pooled_share: float | None = None, layout: SweepLayout | None = None,
                  alpha_futility: float | None = None,
                  design: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
                  moving_only: bool = False) -> dict:
    """win2-v3 / win2-v4 at one look over many windows: arrays (windows, cells, repeats, starts) per metric.

    ``evidence``: metric -> {"pooled": (var, df), "cells": [(var, df) or None per cell]} from the host's
    earlier windows of this control (variances in %^2 of the control; a var may be an array, one per
    window), or None. ``spending`` and ``loss_pooled_share``: how alpha is spent over the looks and over
    the loss tests (win2-v3: bonferroni and an equal share; win2-v4: obf and a share for the pooled test).
    ``layout``: one candidate of a shared-control bracket (``sweep_layout``): its gain, variance factor,
    look and start-to-start variance come from its own windows and the bracket's other control starts.
    win2-v5: ``alpha_futility`` makes NO_WIN a bound (the upper bound below the bar, at an interim look the
    whole interval within the bars), spent over the looks like the others, its standard error from the variance
    at the upper end of its one-sided interval (``futility_var_factor``); ``design`` (the planned looks'
    information fractions, this look's index) replaces the looks after 3, 5, ... starts; ``moving_only``
    splits alpha_loss only over the metrics that are not 0 everywhere (a guard that cannot move cannot lose).
    ``design`` (win2-v5): (each look's information so far, the fraction of its planned size each had), this
    look last; it is the last look when its fraction is 1.
    The simulation runs exactly this.
    """
    lib = set(lower_is_better)
    evidence = evidence or {}
    x = np.asarray(metrics[primary], dtype=float)
    n_cells, n_starts = x.shape[1], x.shape[-1]
    gain_of, var_of = (_v3_gain, _v3_window_var) if layout is None else (layout.gain, layout.window_var)
    if layout is not None and len(layout.arms) != n_starts:
        raise ValueError(f"the layout has {len(layout.arms)} starts, the series {n_starts}")
    fac = arm_factor(n_starts) if layout is None else layout.factor
    kw: dict[str, float] = dict(floor=start_noise_pct, min_df=min_df, f_alpha=evidence_f_alpha)
    vals = {m: _v3_start_values(np.asarray(metrics[m], dtype=float), m in lib) for m in [primary, *guards]}
    # pooled over the deciding cells: a start's offset is shared by every cell it runs
    pm = vals[primary].mean(axis=1)                                         # (W, S)
    pooled_gain = gain_of(pm)
    wv, wdf = var_of(pm)
    ev = evidence.get(primary, {}).get("pooled")
    pn = _v3_noise(wv, wdf, None if ev is None else ev[0], 0 if ev is None else int(ev[1]), **kw)
    se = np.sqrt(fac * pn["used_var"])
    look = (n_starts - 3) // 2 if layout is None else layout.n_windows - 1
    if design is not None:
        look, looks = len(design[0]) - 1, len(design[0])
    final = look == looks - 1 if design is None else design[1][-1] >= 1.0
    level_win = _levels(alpha_win, looks, look, spending, pn["df"], design)
    q_win = _quantiles(1.0 - level_win, pn["df"])
    half = q_win * se
    # the bar on the log scale: a win is a ratio above 1 + bar, a loss one below 1 - bar
    up, down = log_bar(win_pct), -log_bar(-win_pct) if win_pct < 100 else math.inf
    cell_gain = {m: gain_of(v) for m, v in vals.items()}                  # (W, C)
    consistent = (cell_gain[primary] > up).all(axis=-1)
    win = (pooled_gain - half > 0) & (pooled_gain > up) & consistent
    # one loss test per cell and metric, plus the primary pooled over the cells (it borrows every cell's
    # repeats and the host's evidence, so it sees a uniform slowdown no single cell can show alone)
    moving = [m for m in vals if m == primary or not moving_only or np.any(np.asarray(metrics[m]) != 0)]
    n_tests = n_cells * len(moving) + 1
    if loss_pooled_share is None:
        a_pool = a_cell = alpha_loss / n_tests
    else:
        a_pool, a_cell = alpha_loss * loss_pooled_share, alpha_loss * (1.0 - loss_pooled_share) / (n_tests - 1)
    level_pool = _levels(a_pool, looks, look, spending, pn["df"], design)
    q_pool_loss = _quantiles(1.0 - level_pool, pn["df"])
    pooled_loss = (pooled_gain < -down) & (pooled_gain + q_pool_loss * se < 0)
    loss_by, cell_noise, cell_levels = {}, {}, []
    for m, v in vals.items():
        cv, cdf = var_of(v)                                                 # (W, C)
        cells_ev = evidence.get(m, {}).get("cells")
        if cells_ev is not None:
            nz = [_v3_noise(cv[:, j], cdf, None if e is None else e[0], 0 if e is None else int(e[1]), **kw)
                  for j, e in enumerate(cells_ev)]
            cn = {k: np.stack([z[k] for z in nz], axis=-1) for k in ("var", "df", "fallback", "used_var")}
        else:
            cn = _v3_noise(cv, cdf, None, 0, **kw)
        level_cell = _levels(a_cell, looks, look, spending, cn["df"], design)
        cell_levels.append(level_cell.min(axis=-1))
        q_loss = _quantiles(1.0 - level_cell, cn["df"])
        g = cell_gain[m]
        loss_by[m] = (g < -down) & (g + q_loss * np.sqrt(fac * cn["used_var"]) < 0)
        cell_noise[m] = cn
    loss = pooled_loss.copy()
    for m in loss_by:
        loss |= loss_by[m].any(axis=-1)
    if alpha_futility is None:
        level_fut = None
        upper = lower = None
        decided = half <= up          # win2-v3, win2-v4: a precision test, not a bound on the gain
    else:
        # NO_WIN bounds the gain: its upper bound, at the futility level this look spends, is below the bar.
        # Before the last look the whole interval must also lie above -bar, so a slowdown goes on to LOSS.
        level_fut = _levels(alpha_futility, looks, look, spending, pn["df"], design)
        q_fut = _quantiles(1.0 - level_fut, pn["df"])
        se_fut = se * np.sqrt(futility_var_factor(pn["df"]))
        upper, lower = pooled_gain + q_fut * se_fut, pooled_gain - q_fut * se_fut
        decided = (upper < up) & (final | (lower > -down))
    verdict = np.where(loss, "LOSS", np.where(win, "WIN", np.where(decided, "NO_WIN", "INCONCLUSIVE")))
    return {"verdict": verdict, "values": vals, "pooled_values": pm, "pooled_gain": pooled_gain, "se": se,
            "half_width": half, "q_win": q_win, "noise": pn, "window_var": wv, "window_df": wdf,
            "cell_gain": cell_gain, "cell_noise": cell_noise, "consistent": consistent, "loss_by": loss_by,
            "pooled_loss": pooled_loss, "n_loss_tests": n_tests, "factor": fac, "n_starts": n_starts,
            "levels": {"win": level_win, "loss_pooled": level_pool, "loss_cell": np.min(cell_levels, axis=0),
                       **({} if level_fut is None else {"futility": level_fut})},
            "futility_upper": upper, "futility_lower": lower, "final_look": final, "look": look, "looks": looks,
            "moving": moving}


def _v3_pct(values: np.ndarray, gain: float) -> float:
    """A cell metric's gain in %: from the log scale where its values are all positive, else already linear."""
    return float(gain) if not np.isfinite(values).all() or (np.asarray(values) == 0).any() else pct_of_log(float(gain))


def repeat_noise_sd(x: np.ndarray) -> float:
    """Per-repeat noise in % of the control with the prompts' own speed removed (two-way residual sd).

    x: (cells, repeats, starts). Each repeat index is the same prompts in
    every start, so the repeat's mean over starts is that prompt's speed, not
    noise; what is left after removing it and each start's mean is.
    """
    out = []
    for cell in np.asarray(x, dtype=float):
        c = cell[:, 0::2].mean()
        if c == 0:
            continue
        rel = 100.0 * (cell / c - 1.0)
        r, s = rel.shape
        if r < 2 or s < 2:
            continue
        res = rel - rel.mean(axis=1, keepdims=True) - rel.mean(axis=0, keepdims=True) + rel.mean()
        out.append((res ** 2).sum() / ((r - 1) * (s - 1)))
    return math.sqrt(float(np.mean(out))) if out else 0.0


def win2_v3_needed(*, start_var: float, df: int | None, win_pct: float, alpha_win: float, looks: int,
                   limit: int = 41, spending: str = "bonferroni") -> int | None:
    """The smallest odd number of starts whose half-width would reach the bar at this start-to-start variance.

    win2-v3 judges every k at alpha / looks; win2-v4 at the level of k's own look among
    max(looks, looks_for(k)) looks: what a bracket growing to k starts would test at.
    """
    for k in range(3, limit + 1, 2):
        level = (alpha_win / looks if spending == "bonferroni"
                 else look_level(alpha_win, max(looks, looks_for(k)), looks_for(k) - 1, spending))
        q = _q(1.0 - level, None if df is None else max(df, k - 2))
        if q * math.sqrt(arm_factor(k) * start_var) <= log_bar(win_pct):
            return k
    return None


def _win2_sequential(
    rule: str,
    registered: Mapping[str, Any],
    cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    decide: Iterable[str] | None = None,
    lower_is_better: Iterable[str] = (),
    max_starts: int = 5,
    evidence: Mapping[str, Mapping[str, Any]] | None = None,
    win_pct: float = 2.0,
    alpha_win: float = 0.05,
    alpha_loss: float = 0.05,
    start_noise_pct: float = 3.0,
    min_df: int = 2,
    evidence_f_alpha: float = 0.05,
    spending: str = "bonferroni",
    loss_pooled_share: float | None = None,
    arms: Sequence[str] | None = None,
    candidate: str | None = None,
    start_names: Sequence[str] | None = None,
    alpha_futility: float | None = None,
    power: float = 0.85,
    power_gain_pct: float = 3.0,
    pilot_starts: int = 7,
    max_looks: int = 5,
) -> dict:
    """The alternating bracket (C, T, C, T, C ...) decided sequentially, paired by prompt (win2-v3, v4, v5).

    cells: cell -> metric -> per repeat, one value per start in run order
    (control first and last, alternating). evidence: metric -> {"pooled":
    {"var", "df"}, "cells": {cell: {"var", "df"}}} from the host's earlier
    windows of the same control (``pairaudit.speed.evidence``), or None.

    Per cell and metric each start's value is its mean over repeats in % of
    the cell's control mean (prompt effects are the same in every start and
    cancel); the gain is the mean of the candidate starts minus the mean of
    the control starts (alternating, so a linear drift cancels). The
    start-to-start variance is the within-arm variance of the start values,
    pooled with the evidence unless the window is significantly noisier;
    below ``min_df`` degrees of freedom ``start_noise_pct`` is the fallback.
    win2-v3: each of the looks_for(max_starts) looks tests at alpha / looks
    and every loss test gets an equal share; win2-v4: alpha is spent over the
    looks O'Brien-Fleming-type (``obf_levels``) and the pooled loss test gets
    ``loss_pooled_share`` of alpha_loss.

    - WIN: pooled gain over the deciding cells above the bar, its one-sided
      lower bound above 0, and every deciding cell above the bar.
    - LOSS: a deciding cell's primary or guard worse than the bar with its
      upper bound below 0 (each test at alpha_loss / (looks x cells x metrics)).
    - NO_WIN: neither, and the half-width is within the bar.
    - INCONCLUSIVE otherwise; ``more_starts`` says whether the bracket may
      still grow (fewer than max_starts starts so far).

    ``arms`` and ``candidate``: a shared-control bracket of several candidates
    (one arm name per start, ``sweep_layout``), decided for ``candidate``
    over its windows C-T-C: per run of adjacent windows the arm-mean
    difference, weighted by the run's candidate starts; sigma^2 from
    deviations within each run's arms and within the bracket's other control
    starts. ``max_starts`` is then the candidate's own budget: a bracket of
    max_starts starts, (max_starts - 1) / 2 candidate starts. ``start_names``:
    what the result calls the starts (s1, s2, ... by default).

    win2-v5 (``alpha_futility`` set): NO_WIN is the gain's upper bound below the bar (at an interim look,
    the whole interval within the bars), at alpha_futility spent over the looks; the two-arm bracket runs a
    pilot of ``pilot_starts``, is sized there from the variance alone (``win2_v5_size``: the starts at which
    the last look has ``power`` for an A/A NO_WIN, a +power_gain_pct WIN with every deciding cell above the bar
    and a -power_gain_pct LOSS), and looks at most
    ``max_looks`` times (``plan_looks``); a size beyond max_starts stops the bracket at the pilot. The result
    then carries ``plan`` and ``next_starts`` (the starts to run before the next look). In a shared-control
    bracket the looks stay one per candidate start, as win2-v4's.
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    used = {"win_pct": win_pct, "alpha_win": alpha_win, "alpha_loss": alpha_loss, "start_noise_pct": start_noise_pct,
            "min_df": min_df, "evidence_f_alpha": evidence_f_alpha, "spending": spending,
            "loss_pooled_share": loss_pooled_share, "alpha_futility": alpha_futility, "power": power,
            "power_gain_pct": power_gain_pct, "pilot_starts": pilot_starts, "max_looks": max_looks}
    params, dev, reasons = registered_params({k: used[k] for k in registered}, dict(registered))
    names = list(cells)
    decide = names if decide is None else [c for c in names if c in set(decide)]
    looks = looks_for(max_starts)
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib),
                  decision_cells=list(decide), max_starts=max_starts, looks=looks)
    n_rep, n_starts = _check_cells(cells, [primary, *guards, *reported], decide, rule)
    bracket_arms(n_starts)  # refuses an even or too short bracket
    layout = None
    if arms is None:
        if n_starts > max_starts:
            raise ValueError(f"{n_starts} starts exceed max_starts {max_starts}")
    else:
        if len(arms) != n_starts or candidate is None:
            raise ValueError(f"a shared-control bracket needs one arm per start ({n_starts}) and the candidate "
                             f"decided, got arms {list(arms)} and candidate {candidate!r}")
        layout = sweep_layout(arms, candidate)
        if layout.n_windows > looks:
            raise ValueError(f"{candidate}: {layout.n_windows} candidate starts exceed its budget of {looks} "
                             f"(max_starts {max_starts})")
    out: dict[str, Any] = {"rule": rule, "params": params, "deviations": dev, "repeats": n_rep,
                           "starts": n_starts if layout is None else len(layout.starts),
                           "arms": bracket_arms(n_starts) if layout is None else list(layout.arms)}
    if layout is not None:
        names_of = list(start_names) if start_names is not None else [f"s{k + 1}" for k in range(n_starts)]
        if len(names_of) != n_starts:
            raise ValueError(f"{len(names_of)} start names for {n_starts} starts")
        out["sweep"] = {"candidate": candidate, "bracket_starts": n_starts,
                        "windows": [[names_of[k] for k in w] for w in layout.windows],
                        "control_starts": [names_of[k] for k in layout.controls],
                        "pooled_control_starts": [names_of[k] for k in layout.others],
                        "runs": len(layout.runs), "variance_factor": layout.factor}

    def arr(cs, m):
        return np.asarray([[cells[c][m] for c in cs]], dtype=float)       # (1, C, R, S)

    def ev_for(cs):
        if not evidence:
            return None
        out_ev = {}
        for m, e in evidence.items():
            pooled = e.get("pooled")
            per = e.get("cells") or {}
            out_ev[m] = {"pooled": None if not pooled else (pooled["var"], pooled["df"]),
                         "cells": [None if c not in per else (per[c]["var"], per[c]["df"]) for c in cs]}
        return out_ev

    kw: dict[str, Any] = dict(lower_is_better=lib, win_pct=win_pct, alpha_win=alpha_win, alpha_loss=alpha_loss,
                              start_noise_pct=start_noise_pct, min_df=min_df, evidence_f_alpha=evidence_f_alpha,
                              looks=looks, spending=spending, loss_pooled_share=loss_pooled_share, layout=layout)
    v5 = alpha_futility is not None
    plan: dict[str, Any] | None = None
    next_starts: int | None = None
    if v5:
        kw.update(alpha_futility=alpha_futility, moving_only=True)
    if alpha_futility is not None and layout is None:
        pilot = pilot_of(pilot_starts, max_starts)
        series = {m: arr(decide, m) for m in [primary, *guards]}
        run = v5_run(series, upto=n_starts, max_starts=max_starts, pilot_starts=pilot_starts, max_looks=max_looks,
                     power=power, power_gain_pct=power_gain_pct, alpha_futility=alpha_futility,
                     evidence=ev_for(decide), primary=primary,
                     guards=guards, **{k: v for k, v in kw.items() if k not in ("looks", "layout", "alpha_futility",
                                                                                 "moving_only")})
        design = run.designs[0]
        done = run.looks[0]
        if design is None:
            # before the pilot there is no look: the numbers are reported, nothing is decided
            core = _win2_v3_core(series, primary=primary, guards=guards, evidence=ev_for(decide),
                                 **{**kw, "design": ((1.0,), (1.0,))})
            core["verdict"] = np.asarray(["INCONCLUSIVE"])
        elif done[-1]["starts"] != n_starts:
            raise ValueError(f"{rule}: {n_starts} starts is not a look of this bracket (its looks: "
                             f"{[d['starts'] for d in done]}, the next after {int(run.next_starts[0])} starts)")
        else:
            core = _win2_v3_core(series, primary=primary, guards=guards, evidence=ev_for(decide),
                                 **{**kw, "looks": len(design[0]), "design": design})
        if done and done[-1]["starts"] == n_starts:
            last = done[-1]
            plan = {"pilot_starts": pilot, "starts_needed": last["starts_needed"],
                    "planned_starts": last["planned_starts"], "pilot_start_sd_pct": done[0]["start_sd_used_pct"],
                    "power": power, "power_gain_pct": power_gain_pct, "max_starts": max_starts,
                    "max_looks": max_looks, "looks": done}
        next_starts = int(run.next_starts[0]) if bool(run.open[0]) else None
        looks = len(done) or 1
        params.update(looks=looks)
    else:
        core = _win2_v3_core({m: arr(decide, m) for m in [primary, *guards]}, primary=primary, guards=guards,
                             evidence=ev_for(decide), **kw)
    pn = core["noise"]
    ev_p = (evidence or {}).get(primary, {}).get("pooled")
    fallback = bool(pn["fallback"][0])
    source = ("fallback: the registered start_noise_pct (fewer than min_df degrees of freedom)" if fallback
              else "this window and the host's earlier windows of this control" if bool(pn["pooled_evidence"][0])
              else "this window alone" + (" (the host's evidence was quieter than this window: not pooled)"
                                          if ev_p else ""))
    noise: dict[str, Any] = {
        "rep_sd_pct": repeat_noise_sd(arr(decide, primary)[0]),
        "start_sd_pct": math.sqrt(float(core["window_var"][0])), "window_df": int(core["window_df"]),
        "evidence_sd_pct": None if not ev_p else math.sqrt(ev_p["var"]),
        "evidence_df": None if not ev_p else int(ev_p["df"]),
        "evidence_windows": None if not ev_p else ev_p.get("windows"),
        "start_sd_used_pct": math.sqrt(float(pn["used_var"][0])), "df_used": None if fallback else int(pn["df"][0]),
        "source": source, "start_values_pct": _nums(core["pooled_values"][0]),
    }
    # the gate tests on the log scale; what it reports is in % of the control
    lg, half = float(core["pooled_gain"][0]), float(core["half_width"][0])
    gain, lower = pct_of_log(lg), pct_of_log(lg - half)
    verdict = str(core["verdict"][0])
    if plan is not None or (v5 and layout is None):
        need = None if plan is None else plan["starts_needed"]
    else:
        need = win2_v3_needed(start_var=float(pn["used_var"][0]), df=None if fallback else int(pn["df"][0]),
                              win_pct=win_pct, alpha_win=alpha_win, looks=looks, spending=spending)
    per_cell: dict[str, dict[str, Any]] = {}
    for j, c in enumerate(decide):
        cell_loss = [m for m in core["loss_by"] if core["loss_by"][m][0, j]]
        cg = pct_of_log(float(core["cell_gain"][primary][0, j]))
        per_cell[c] = {"decides": True,
                       "primary": {"point_gain_pct": cg,
                                   "start_values_pct": _nums(core["values"][primary][0, j]),
                                   "start_sd_pct": math.sqrt(float(core["cell_noise"][primary]["var"][0, j]))},
                       "guards": {g: {"point_gain_pct": _v3_pct(core["values"][g][0, j], core["cell_gain"][g][0, j]),
                                      "guard_verdict": "LOSS" if g in cell_loss else "OK"} for g in guards},
                       "losses": cell_loss,
                       "verdict": "LOSS" if cell_loss else ("ABOVE_BAR" if cg > win_pct else "NOT_ABOVE_BAR")}
    for c in [c for c in names if c not in decide]:
        one = _win2_v3_core({m: arr([c], m) for m in [primary, *guards]}, primary=primary, guards=guards,
                            evidence=ev_for([c]), **kw)
        per_cell[c] = {"decides": False, "verdict": str(one["verdict"][0]),
                       "primary": {"point_gain_pct": pct_of_log(float(one["pooled_gain"][0])),
                                   "start_values_pct": _nums(one["pooled_values"][0])},
                       "guards": {g: {"point_gain_pct": _v3_pct(one["values"][g][0, 0], one["cell_gain"][g][0, 0]),
                                      "guard_verdict": "LOSS" if one["loss_by"][g][0, 0] else "OK"} for g in guards}}
    rep_res = {}
    for m in reported:
        one = _win2_v3_core({m: arr(decide, m)}, primary=m, guards=[], evidence=None, **kw)
        rep_res[m] = {"verdict": str(one["verdict"][0]), "point_gain_pct": pct_of_log(float(one["pooled_gain"][0])),
                      "lower_is_better": m in lib}
    lv = {k: float(v[0]) for k, v in core["levels"].items()}  # the strictest cell test's where cells differ
    a_pct = 100 * lv["win"]
    own = n_starts if layout is None else len(layout.starts)
    summary = (f"primary {primary}: gain {gain:+.2f} % over {len(decide)} deciding cell(s) and {own} starts "
               f"vs bar {win_pct} %, one-sided {100 - a_pct:.4g} % lower bound {lower:+.2f} % (half-width "
               f"{half:.2f} % on the log scale); noise: per repeat {noise['rep_sd_pct']:.2f} % (prompt effects removed), start to "
               f"start {noise['start_sd_pct']:.2f} % in this window ({noise['window_df']} df)"
               + (f", {noise['evidence_sd_pct']:.2f} % in the host's evidence ({noise['evidence_df']} df)"
                  if ev_p else ", no host evidence")
               + f"; used {noise['start_sd_used_pct']:.2f} % from {source}"
               + ("" if layout is None else
                  f"; {candidate}'s {layout.n_windows} window(s) against control starts "
                  f"{out['sweep']['control_starts']}, the bracket's other control starts "
                  f"{out['sweep']['pooled_control_starts'] or 'none'} pooled into the start-to-start variance"))
    if v5 and layout is None:
        more = verdict == "INCONCLUSIVE" and next_starts is not None
    else:
        more = verdict == "INCONCLUSIVE" and (n_starts + 2 <= max_starts if layout is None
                                              else layout.n_windows + 1 <= looks)
    if verdict == "LOSS":
        if bool(core["pooled_loss"][0]):
            reasons.append(f"primary {primary} pooled over the deciding cells: {gain:+.2f} %, worse than the bar "
                           f"beyond the noise (this test at {100 * lv['loss_pooled']:.3g} % at this look)")
        for c, pc in per_cell.items():
            if pc.get("decides") and pc.get("losses"):
                reasons.append(f"{c}: {', '.join(pc['losses'])} worse than the bar beyond the noise (each cell's "
                               f"test at {100 * lv['loss_cell']:.3g} % at this look)")
    elif verdict == "WIN":
        reasons.append("gain above the bar in every deciding cell and its lower bound above 0")
    elif verdict == "NO_WIN" and v5:
        hi = pct_of_log(float(core["futility_upper"][0]))
        lo_f = pct_of_log(float(core["futility_lower"][0]))
        reasons.append(f"a gain of the bar is ruled out: the gain's upper bound {hi:+.2f} % is below +{win_pct} % "
                       f"(futility level {100 * float(core['levels']['futility'][0]):.3g} % at this look)"
                       + ("" if core["final_look"] else
                          f", and its lower bound {lo_f:+.2f} % above -{win_pct} % (an interim look stops only "
                          "when the whole interval lies within the bars)"))
    elif verdict == "NO_WIN":
        reasons.append("speed gain not shown, and the bracket resolves the bar (half-width <= bar)")
    elif v5 and layout is None:
        g5 = f"+-{power_gain_pct:g} % at {100 * power:.0f} % power"
        if plan is None:
            reasons.append(f"pilot: {n_starts} of {pilot} starts; the first look comes after the pilot")
        elif more:
            reasons.append(f"undecided at look {len(plan['looks'])} (after {n_starts} starts); sized from the "
                           f"start-to-start noise so far, the bracket runs to {plan['planned_starts']} starts, the "
                           f"next look after {next_starts}")
        elif plan["starts_needed"] is None or plan["starts_needed"] > max_starts:
            sd_now = plan["looks"][-1]["start_sd_used_pct"]
            at = (f"at the registered fallback noise ({sd_now:.2f} %, used while fewer than min_df {min_df} "
                  "degrees of freedom are measured: the real noise may be larger)" if bool(pn["fallback"][0])
                  else f"at this start-to-start noise ({sd_now:.2f} %)")
            reasons.append(f"too noisy to decide within max_starts {max_starts}: {at} "
                           + (f"no bracket of up to {SIZE_LIMIT} starts would decide {g5}"
                              if plan["starts_needed"] is None else
                              f"about {plan['starts_needed']} starts would decide {g5}")
                           + ("; the bracket stops at the pilot instead of running starts that could not"
                              if len(plan["looks"]) == 1 else ""))
        else:
            reasons.append(f"the planned {plan['planned_starts']} starts ran without a decision: gain {gain:+.2f} %, "
                           f"neither its lower bound above 0 with the gain above the bar, nor its upper bound below "
                           f"the bar, nor a loss beyond the noise")
    else:
        how = ("no bracket of up to 41 starts would resolve it at this noise" if need is None
               else f"about {need} starts would resolve it" if layout is None
               else f"about {(need - 1) // 2} candidate starts would resolve it")
        reasons.append(f"too noisy to decide at the {win_pct} % bar after {own} starts: half-width {half:.2f} % "
                       f"> {log_bar(win_pct):.2f} % (the bar on the log scale); {how}" + ("; the bracket grows by a candidate and a control start" if more
                                                  else f" (max_starts {max_starts} reached)"))
    reasons.append(summary)
    if not core["consistent"][0] and verdict != "LOSS":
        low = [c for c in decide if per_cell[c]["primary"]["point_gain_pct"] <= win_pct]
        reasons.append(f"cells not above the bar: {low}")
    for m, r in rep_res.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    out.update(verdict=verdict, more_starts=more, reasons=reasons, cells=per_cell, reported=rep_res, noise=noise,
               needed={"starts_needed": need, "half_width_pct": half}, pooled_gain_pct=gain, half_width_pct=half,
               lower_bound_pct=lower, log_gain=lg, loss_tests=core["n_loss_tests"], looks=looks,
               **({} if not (v5 and layout is None) else {"plan": plan, "next_starts": next_starts if more else None}),
               **({} if not v5 else {"upper_bound_pct": pct_of_log(float(core["futility_upper"][0]))}),
               alpha_per_look={"win": lv["win"], "loss_pooled": lv["loss_pooled"], "loss_cell": lv["loss_cell"]})
    return out


def win2_v3(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], **kw: Any) -> dict:
    """win2-v3: the sequential alternating bracket, alpha / looks at every look, an equal share per loss test."""
    return _win2_sequential("win2-v3", WIN2_V3, cells, **kw)


def win2_v4(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], *, spending: str = "obf",
            loss_pooled_share: float | None = 0.5, **kw: Any) -> dict:
    """win2-v4: win2-v3's bracket with alpha spent O'Brien-Fleming-type over the looks and half of alpha_loss
    on the pooled loss test (``WIN2_V4``)."""
    return _win2_sequential("win2-v4", WIN2_V4, cells, spending=spending, loss_pooled_share=loss_pooled_share,
                            **kw)


# ----------------------------------------------------------------- win2-v5
#
# Registered values. WIN and LOSS as win2-v4 (O'Brien-Fleming-type spending, 5 % each, the pooled loss test
# half of alpha_loss). NO_WIN is a bound: the upper bound of the gain below +win_pct, at its own futility
# alpha spent over the looks; at an interim look the whole interval must lie within (-bar, +bar). The
# bracket is sized from the noise: a pilot of pilot_starts starts, then the starts at which the last look
# would NO_WIN an A/A and WIN a +power_gain_pct / LOSS a -power_gain_pct change with probability `power`
# (an internal pilot: the variance only, never the gain, sizes it; re-estimated at every look), with at most
# max_looks looks. WIN is sized as decided: every deciding cell above the bar, each cell's gain noisier than
# the pooled one (``win2_v5_size``'s cell_var). `power` is 0.85 for a known variance; with the variance
# estimated a bracket realises 83-96 % A/A NO_WIN, 83-93 % +3 % WIN and 90-100 % -3 % LOSS at start-to-start
# 1.4-2.25 % when it may grow to the size the noise needs (bench/speed_v5.py, docs/speed.md). A pilot of 7
# starts (5 degrees of freedom) sizes far better than one of 5 (3).
WIN2_V5 = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "alpha_futility": 0.10, "power": 0.85,
           "power_gain_pct": 3.0, "pilot_starts": 7, "max_looks": 5, "start_noise_pct": 3.0, "min_df": 2,
           "evidence_f_alpha": 0.05, "loss_pooled_share": 0.5}
# Sizing searches brackets up to this many starts; a noise that needs more is reported as "more than this".
SIZE_LIMIT = 999
# The pilot stops the bracket only when the lower end of the variance's one-sided interval at this level
# (chi-square, the pilot's degrees of freedom) still needs more than max_starts.
PILOT_STOP_LEVEL = 0.2


def chi2_isf(p: float, df: np.ndarray) -> np.ndarray:
    """Upper p-quantile of chi-square at each df."""
    from scipy.stats import chi2

    return np.asarray(chi2.isf(p, np.maximum(np.asarray(df), 1)))


def pilot_of(pilot_starts: int, max_starts: int) -> int:
    """The pilot a bracket of at most ``max_starts`` starts runs: pilot_starts, at least 3, at most max_starts, odd."""
    p = max(3, min(int(pilot_starts), int(max_starts)))
    return p if p % 2 else p - 1


def plan_looks(pilot: int, planned: int, max_looks: int) -> tuple[int, ...]:
    """The starts after which a bracket planned to ``planned`` starts looks: the pilot, the last, and evenly
    between them (odd counts), at most ``max_looks``."""
    if planned <= pilot:
        return (pilot,)
    k = max(2, int(max_looks))
    half = (planned - pilot) // 2
    return tuple(sorted({pilot + 2 * round(half * j / (k - 1)) for j in range(k)}))


def plan_fractions(looks: Sequence[int]) -> tuple[float, ...]:
    """Each look's share of the last look's information (1 / arm_factor of its starts)."""
    info = [1.0 / arm_factor(k) for k in looks]
    return tuple(i / info[-1] for i in info)


def cell_corr(cell_var: np.ndarray, pooled_var: np.ndarray) -> np.ndarray:
    """The correlation of the deciding cells' start values, one per bracket, from each cell's variance and the
    variance of their mean (the pooled start value): the cells share every start's offset, so they move
    together. Equal correlation between every two cells is assumed (exact for two); it is kept within [0, 1)."""
    cv = np.asarray(cell_var, dtype=float)
    c = cv.shape[-1]
    if c < 2:
        return np.zeros(cv.shape[:-1])
    s = np.sqrt(np.maximum(cv, 0.0))
    off = s.sum(axis=-1) ** 2 - (s ** 2).sum(axis=-1)                     # sum over j != k of s_j s_k
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (c * c * np.asarray(pooled_var, dtype=float) - cv.sum(axis=-1)) / off
    return np.clip(np.nan_to_num(r, nan=0.0), 0.0, 0.999)


# Gauss-Hermite nodes for the start offset the deciding cells share (``cell_spread``).
_HERMITE_NODES = 48


def cell_spread(cell_var: np.ndarray, r: np.ndarray, power: float) -> np.ndarray:
    """The ``power`` quantile of max_j sd_j (sqrt(r) Z0 + sqrt(1 - r) Z_j), per bracket: how far below its mean
    the weakest deciding cell's start value may fall (sd_j = sqrt(cell_var[..., j]), Z standard normal). A
    cell gain's deviation is this times sqrt(arm_factor(n)); every cell clears a threshold with probability
    ``power`` when the mean gain exceeds it by that much. One cell: z_power sd."""
    from scipy.special import ndtr

    sd = np.sqrt(np.maximum(np.asarray(cell_var, dtype=float), 1e-12))     # (B, C)
    r = np.asarray(r, dtype=float)[..., None, None]                          # (B, 1, 1)
    z, w = np.polynomial.hermite_e.hermegauss(_HERMITE_NODES)
    w = w / w.sum()
    zs = z[None, :, None]

    def cdf(x):                                                              # P(max < x), x (B,)
        a = (x[:, None, None] / sd[:, None, :] - np.sqrt(r) * zs) / np.sqrt(1.0 - r)
        return (np.prod(ndtr(a), axis=-1) * w).sum(axis=-1)

    lo = np.zeros(sd.shape[0])
    hi = 10.0 * sd.max(axis=-1)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        below = cdf(mid) < power
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return hi


def _size_ok(n: int, var: np.ndarray, ev_df: np.ndarray, *, levels: Mapping[str, float], win_pct: float,
             power: float, power_gain_pct: float, spread: np.ndarray | None = None) -> np.ndarray:
    """Whether the last look of a bracket of ``n`` starts has ``power`` for each of the three outcomes the
    design promises, at start-value variance ``var`` (normal gain, Student-t quantiles at the df it will have).

    ``spread`` (``cell_spread``): WIN needs every deciding cell above the bar as well as the pooled lower bound
    above 0, so every cell must clear max(bar, the pooled bound's reach) with ``power`` jointly; without it
    only the pooled gain is sized for (one deciding cell)."""
    from scipy.stats import norm, t

    fac = arm_factor(n)
    se = np.sqrt(fac * np.asarray(var, dtype=float))
    df = np.maximum(n - 2 + np.asarray(ev_df), 1)
    zp = float(norm.ppf(power))
    up, down = log_bar(win_pct), -log_bar(-win_pct)
    g_up, g_down = log_bar(power_gain_pct), -log_bar(-power_gain_pct)
    q_fut, q_win, q_loss = (t.ppf(1.0 - levels[k], df) for k in ("futility", "win", "loss_pooled"))
    aa = (q_fut * np.sqrt(futility_var_factor(df)) + zp) * se <= up  # an A/A: the upper bound below +bar
    reach = zp * se if spread is None else math.sqrt(fac) * np.asarray(spread)
    win = g_up - np.maximum(up, q_win * se) >= reach                   # +g: above the bar, lower bound above 0
    loss = g_down - np.maximum(down, q_loss * se) >= zp * se           # -g: below -bar, upper bound below 0
    return aa & win & loss


def _final_levels(looks: tuple[int, ...], *, alpha_win: float, alpha_loss: float, alpha_futility: float,
                  loss_pooled_share: float) -> dict[str, float]:
    fr = plan_fractions(looks)
    return {"win": obf_levels(float(alpha_win), fr, DESIGN_GRID)[-1],
            "loss_pooled": obf_levels(float(alpha_loss * loss_pooled_share), fr, DESIGN_GRID)[-1],
            "futility": obf_levels(float(alpha_futility), fr, DESIGN_GRID)[-1]}


def win2_v5_size(start_var: float | np.ndarray, ev_df: int | np.ndarray = 0, *, pilot: int, max_looks: int,
                 win_pct: float, alpha_win: float, alpha_loss: float, alpha_futility: float,
                 loss_pooled_share: float, power: float, power_gain_pct: float,
                 limit: int = SIZE_LIMIT, cell_var: np.ndarray | None = None) -> np.ndarray:
    """The starts a win2-v5 bracket needs at this start-value variance (%^2 of the control, on the log scale):
    the smallest odd n >= pilot whose last look has ``power`` to NO_WIN an A/A, WIN +power_gain_pct and LOSS
    -power_gain_pct; 0 where no bracket of up to ``limit`` starts would. Vectorised over ``start_var``.

    ``cell_var``: each deciding cell's start-value variance (start_var's shape plus one axis of cells). WIN
    needs every deciding cell above the bar, and a cell's gain is noisier than the pooled one, so the WIN
    condition is then the joint event: every cell clears the bar (and the pooled bound) with ``power``, the
    cells correlated as their variances and the pooled one say (``cell_corr``, ``cell_spread``). Without it
    the pooled gain alone is sized for, which is exact for one deciding cell.

    First with each test at its whole alpha (a fixed design), then checked at the levels the planned looks'
    O'Brien-Fleming-type spending leaves the last look, growing by two starts until they hold.
    """
    var = np.atleast_1d(np.asarray(start_var, dtype=float))
    evdf = np.broadcast_to(np.asarray(ev_df), var.shape)
    out = np.zeros(var.shape, dtype=int)
    if power_gain_pct <= win_pct:
        return out
    spread = None
    if cell_var is not None and var.size:
        cv = np.asarray(cell_var, dtype=float).reshape(var.shape + (-1,))
        spread = cell_spread(cv.reshape(-1, cv.shape[-1]), cell_corr(cv, var).reshape(-1), power).reshape(var.shape)
    fixed = {"win": alpha_win, "loss_pooled": alpha_loss * loss_pooled_share, "futility": alpha_futility}
    kw = dict(win_pct=win_pct, power=power, power_gain_pct=power_gain_pct)
    open_ = np.ones(var.shape, dtype=bool)
    for n in range(pilot, limit + 1, 2):
        if not open_.any():
            break
        hit = open_ & _size_ok(n, var, evdf, levels=fixed, spread=spread, **kw)
        out[hit] = n
        open_ &= ~hit
    for n0 in sorted(set(out[out > 0].tolist())):
        idx = np.flatnonzero(out == n0)
        n = n0
        while idx.size and n <= limit:
            lv = _final_levels(plan_looks(pilot, n, max_looks), alpha_win=alpha_win, alpha_loss=alpha_loss,
                               alpha_futility=alpha_futility, loss_pooled_share=loss_pooled_share)
            ok = _size_ok(n, var[idx], evdf[idx], levels=lv, spread=None if spread is None else spread[idx], **kw)
            out[idx[ok]] = n
            idx = idx[~ok]
            n += 2
        out[idx] = 0
    return out


def _sub_evidence(evidence: Mapping[str, Mapping[str, Any]] | None, idx: np.ndarray) -> dict | None:
    """Simulated per-bracket evidence (arrays over brackets) restricted to the brackets ``idx``."""
    if not evidence:
        return None

    def take(e):
        return None if e is None else (np.asarray(e[0])[idx] if np.ndim(e[0]) else e[0], e[1])

    return {m: {"pooled": take(e.get("pooled")), "cells": [take(c) for c in e.get("cells") or []]}
            for m, e in evidence.items()}


def size_rung(need: np.ndarray) -> np.ndarray:
    """A bracket's size rounded up to a rung of a coarse ladder (every odd count to 21, then steps of 4 to 41,
    then of 8): a size re-estimated from a noisy variance moves by more than a rung's width anyway, and
    brackets of one rung share their looks' levels (the simulation evaluates them together)."""
    need = np.asarray(need)
    out = need.copy()
    big = need > 21
    out[big] = np.where(need[big] <= 41, 21 + 4 * np.ceil((need[big] - 21) / 4),
                        41 + 8 * np.ceil((need[big] - 41) / 8)).astype(int)
    return out


def _next_look(n: int, planned: int, done: int, max_looks: int) -> int:
    """The starts of the next look: the rest of the plan spread over the looks left, but at least half as many
    starts again as so far (a size estimated low early must not spend the looks on small brackets)."""
    left = max_looks - done
    if left <= 1 or planned - n <= 2:
        return planned
    spread = n + max(2, 2 * math.ceil((planned - n) / left / 2))
    grown = n + 2 * math.ceil(n / 4)
    return min(planned, max(spread, grown))


@dataclass(frozen=True)
class V5Run:
    """win2-v5 run over brackets: each one's verdict (INCONCLUSIVE while open), the starts it ran to its last
    look, whether it is still open (it may grow), its looks (starts, planned size, starts needed, start-to-
    start sd used) and the design of its last look (for ``_win2_v3_core``)."""
    verdict: np.ndarray
    used: np.ndarray
    open: np.ndarray
    looks: list[list[dict[str, Any]]]
    designs: list[tuple[tuple[float, ...], tuple[float, ...]] | None]
    next_starts: np.ndarray


def v5_run(metrics: Mapping[str, np.ndarray], *, upto: int, max_starts: int, pilot_starts: int, max_looks: int,
           power: float, power_gain_pct: float, alpha_futility: float,
           evidence: Mapping[str, Mapping[str, Any]] | None = None, **kw: Any) -> V5Run:
    """win2-v5 over brackets (arrays (brackets, cells, repeats, starts) per metric) with ``upto`` starts run.

    The pilot look comes after the pilot's starts. At every look the start-to-start variance so far (never
    the gain) sizes the bracket (``win2_v5_size``, with each deciding cell's variance: WIN needs every cell above
    the bar); at the pilot a size beyond max_starts stops it there (more
    starts could not decide), later the size is capped at max_starts. The look spends the O'Brien-Fleming
    share of each alpha that its information fraction of that size allows (``design_level``): what earlier
    looks spent stays spent. The next look spreads the rest of the size over the looks left; the size's own
    look, or the max_looks-th, is the last. Brackets that share their looks so far are evaluated together.
    """
    n_b = next(iter(metrics.values())).shape[0]
    pilot = pilot_of(pilot_starts, max_starts)
    kwc: dict[str, Any] = {**kw, "alpha_futility": alpha_futility, "moving_only": True}
    size_kw = dict(win_pct=kw["win_pct"], alpha_win=kw["alpha_win"], alpha_loss=kw["alpha_loss"],
                   alpha_futility=alpha_futility, loss_pooled_share=kw.get("loss_pooled_share") or 0.5,
                   power=power, power_gain_pct=power_gain_pct)
    ev = (evidence or {}).get(kw["primary"], {}).get("pooled")
    verdict = np.full(n_b, "INCONCLUSIVE", dtype=object)
    used = np.zeros(n_b, dtype=int)
    open_ = np.ones(n_b, dtype=bool)
    nxt = np.full(n_b, pilot, dtype=int)
    looks: list[list[dict[str, Any]]] = [[] for _ in range(n_b)]
    designs: list[tuple[tuple[float, ...], tuple[float, ...]] | None] = [None] * n_b
    queue: list[tuple[np.ndarray, tuple[tuple[int, float, int], ...], int]] = [(np.arange(n_b), (), pilot)]
    while queue:
        idx, path, n = queue.pop()
        nxt[idx] = n
        if n > upto:
            continue
        sub = {m: v[idx][..., :n] for m, v in metrics.items()}
        sev = _sub_evidence(evidence, idx)
        now = _win2_v3_core(sub, looks=1, design=((1.0,), (1.0,)), evidence=sev, **kwc)
        nz, cell_var = now["noise"], now["cell_noise"][kw["primary"]]["used_var"]
        ev_df = np.where(nz["pooled_evidence"], 0 if ev is None else int(ev[1]), 0)
        need = size_rung(win2_v5_size(nz["used_var"], ev_df, pilot=pilot, max_looks=max_looks, cell_var=cell_var,
                                      **size_kw))
        beyond = (need == 0) | (need > max_starts)
        stop = np.zeros(need.shape, dtype=bool)
        if not path:
            # At the pilot the variance has few degrees of freedom: the bracket stops there only when even
            # the low end of its interval (PILOT_STOP_LEVEL) would need more than max_starts.
            shrink = nz["df"] / chi2_isf(PILOT_STOP_LEVEL, nz["df"])
            low_need = win2_v5_size(nz["used_var"] * shrink, ev_df, pilot=pilot, max_looks=max_looks,
                                    cell_var=cell_var * shrink[:, None], **size_kw)
            stop = (low_need == 0) | (low_need > max_starts)
        planned = np.where(stop, n, np.where(beyond, max_starts, np.maximum(need, n)))
        if path:
            # a size never shrinks: a variance that reads low at a later look must not make that look the
            # last and spend the rest of alpha on it (simulated: the bound's +bar rate then exceeds its alpha)
            planned = np.maximum(planned, path[-1][2])
        if len(path) + 1 >= max_looks:
            planned[:] = n
        for p in sorted(set(planned.tolist())):
            j = np.flatnonzero(planned == p)
            gi = idx[j]
            path2 = path + ((n, arm_factor(p) / arm_factor(n), int(p)),)
            design = (tuple(1.0 / arm_factor(k) for k, _, _ in path2), tuple(t for _, t, _ in path2))
            core = _win2_v3_core({m: v[j] for m, v in sub.items()}, looks=len(path2), design=design,
                                 evidence=_sub_evidence(sev, j), **kwc)
            v = core["verdict"]
            for a, b in enumerate(gi):
                looks[b].append({"starts": n, "planned_starts": int(p), "starts_needed": int(need[j[a]]) or None,
                                 "start_sd_used_pct": math.sqrt(float(nz["used_var"][j[a]])),
                                 "verdict": str(v[a])})
                designs[b] = design
            used[gi] = n
            done = v != "INCONCLUSIVE"
            verdict[gi[done]] = v[done]
            if p == n:
                open_[gi] = False
                continue
            open_[gi[done]] = False
            rest = gi[~done]
            if rest.size:
                queue.append((rest, path2, _next_look(n, int(p), len(path2), max_looks)))
    return V5Run(verdict.astype(str), used, open_, looks, designs, nxt)




def win2_v5(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], *, alpha_futility: float = 0.10,
            spending: str = "obf", loss_pooled_share: float | None = 0.5, **kw: Any) -> dict:
    """win2-v5: win2-v4's WIN and LOSS; NO_WIN a bound at its own futility alpha; the bracket sized at a pilot
    from the noise (``WIN2_V5``)."""
    return _win2_sequential("win2-v5", WIN2_V5, cells, alpha_futility=alpha_futility, spending=spending,
                            loss_pooled_share=loss_pooled_share, **kw)
