"""The sequential rules over the alternating bracket: win2-v3 and win2-v4 (and their shared core).

Stated in full in docs/rules.md."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pairaudit.gates.common import registered_params
from pairaudit.gates.speed.design import (_check_cells, _nums, _q, _v3_gain, _v3_start_values, _v3_window_var,
                                          arm_factor, bracket_arms, look_level, log_bar, looks_for, pct_of_log)
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


def _levels(alpha: float, looks: int, look: int, spending: str, df: np.ndarray) -> np.ndarray:
    """The level a test spends at this look, per window: its spending's, capped at alpha / looks on few df."""
    df = np.asarray(df)
    level = look_level(alpha, looks, look, spending)
    if spending == "bonferroni":
        return np.full(df.shape, level)
    return np.where(df >= GS_MIN_DF, level, min(level, alpha / looks))


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
                  loss_pooled_share: float | None = None, layout: SweepLayout | None = None) -> dict:
    """win2-v3 / win2-v4 at one look over many windows: arrays (windows, cells, repeats, starts) per metric.

    ``evidence``: metric -> {"pooled": (var, df), "cells": [(var, df) or None per cell]} from the host's
    earlier windows of this control (variances in %^2 of the control; a var may be an array, one per
    window), or None. ``spending`` and ``loss_pooled_share``: how alpha is spent over the looks and over
    the loss tests (win2-v3: bonferroni and an equal share; win2-v4: obf and a share for the pooled test).
    ``layout``: one candidate of a shared-control bracket (``sweep_layout``): its gain, variance factor,
    look and start-to-start variance come from its own windows and the bracket's other control starts.
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
    level_win = _levels(alpha_win, looks, look, spending, pn["df"])
    q_win = _quantiles(1.0 - level_win, pn["df"])
    half = q_win * se
    # the bar on the log scale: a win is a ratio above 1 + bar, a loss one below 1 - bar
    up, down = log_bar(win_pct), -log_bar(-win_pct) if win_pct < 100 else math.inf
    cell_gain = {m: gain_of(v) for m, v in vals.items()}                  # (W, C)
    consistent = (cell_gain[primary] > up).all(axis=-1)
    win = (pooled_gain - half > 0) & (pooled_gain > up) & consistent
    # one loss test per cell and metric, plus the primary pooled over the cells (it borrows every cell's
    # repeats and the host's evidence, so it sees a uniform slowdown no single cell can show alone)
    n_tests = n_cells * len(vals) + 1
    if loss_pooled_share is None:
        a_pool = a_cell = alpha_loss / n_tests
    else:
        a_pool, a_cell = alpha_loss * loss_pooled_share, alpha_loss * (1.0 - loss_pooled_share) / (n_tests - 1)
    level_pool = _levels(a_pool, looks, look, spending, pn["df"])
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
        level_cell = _levels(a_cell, looks, look, spending, cn["df"])
        cell_levels.append(level_cell.min(axis=-1))
        q_loss = _quantiles(1.0 - level_cell, cn["df"])
        g = cell_gain[m]
        loss_by[m] = (g < -down) & (g + q_loss * np.sqrt(fac * cn["used_var"]) < 0)
        cell_noise[m] = cn
    loss = pooled_loss.copy()
    for m in loss_by:
        loss |= loss_by[m].any(axis=-1)
    decided = half <= up
    verdict = np.where(loss, "LOSS", np.where(win, "WIN", np.where(decided, "NO_WIN", "INCONCLUSIVE")))
    return {"verdict": verdict, "values": vals, "pooled_values": pm, "pooled_gain": pooled_gain, "se": se,
            "half_width": half, "q_win": q_win, "noise": pn, "window_var": wv, "window_df": wdf,
            "cell_gain": cell_gain, "cell_noise": cell_noise, "consistent": consistent, "loss_by": loss_by,
            "pooled_loss": pooled_loss, "n_loss_tests": n_tests, "factor": fac, "n_starts": n_starts,
            "levels": {"win": level_win, "loss_pooled": level_pool, "loss_cell": np.min(cell_levels, axis=0)}}


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
) -> dict:
    """The alternating bracket (C, T, C, T, C ...) decided sequentially, paired by prompt (win2-v3, win2-v4).

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
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    used = {"win_pct": win_pct, "alpha_win": alpha_win, "alpha_loss": alpha_loss, "start_noise_pct": start_noise_pct,
            "min_df": min_df, "evidence_f_alpha": evidence_f_alpha, "spending": spending,
            "loss_pooled_share": loss_pooled_share}
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
    elif verdict == "NO_WIN":
        reasons.append("speed gain not shown, and the bracket resolves the bar (half-width <= bar)")
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
