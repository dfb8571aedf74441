"""The speed rules' simulations: synthetic brackets under a noise model, and the error rates a decision
reports and the benchmarks print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pairaudit.gates.speed.design import looks_for
from pairaudit.gates.speed.onebracket import WIN2_V2_RATE_SEED, WIN2_V2_RATE_WINDOWS
from pairaudit.gates.speed.sequential import WIN2_V5, _sub_evidence, _win2_v3_core, v5_run
from pairaudit.gates.speed.sweep import sweep_layout, sweep_next, sweep_windows

def simulate_sequences(rng: np.random.Generator, n: int, *, cells: int, repeats: int, rep_sd: float,
                       start_sd: float, max_starts: int, gain_pct: float = 0.0, prompt_sd: float = 0.0,
                       metrics: Sequence[str] = ("primary",), zero: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """n synthetic alternating brackets of ``max_starts`` starts, (n, cells, repeats, max_starts) per metric.

    As simulate_windows, plus ``prompt_sd``: a per (cell, repeat) speed shared by every start (the same
    prompts at the same repeat index decode at their own speed). Candidate starts are ``gain_pct`` % faster.
    """
    off = rng.normal(0.0, start_sd, (n, 1, 1, max_starts))
    prompt = rng.normal(0.0, prompt_sd, (n, cells, repeats, 1))
    scale = np.array([1.0 + (gain_pct / 100.0 if k % 2 else 0.0) for k in range(max_starts)])
    out = {}
    for m in metrics:
        if m in zero:
            out[m] = np.zeros((n, cells, repeats, max_starts))
            continue
        e = rng.normal(0.0, rep_sd, (n, cells, repeats, max_starts))
        out[m] = 100.0 * (1.0 + (off + e + prompt) / 100.0) * scale
    return out


def evidence_from_controls(x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], int]:
    """Earlier windows' control starts (windows, cells, repeats, starts) -> the evidence the gate is given.

    The arithmetic of :mod:`pairaudit.speed.evidence` on simulated windows:
    per window, each start's mean over repeats in % of the window's mean,
    pooled over the cells; the within-window variance, starts - 1 degrees of
    freedom. Returns (pooled variance per window, per-cell variances, df).
    """
    lv = np.log(x).mean(axis=-2)                                          # (W, C, S), as the gate's start values
    rel = 100.0 * (lv - lv.mean(axis=-1, keepdims=True))
    df = x.shape[-1] - 1
    pooled = rel.mean(axis=1).var(axis=-1, ddof=1)
    cells = [rel[:, j].var(axis=-1, ddof=1) for j in range(x.shape[1])]
    return pooled, cells, df


def simulated_evidence(rng: np.random.Generator, n: int, evidence_df: int, *, metrics: Sequence[str],
                       **noise: Any) -> dict | None:
    """Each of n brackets its own earlier window of the same host: evidence_df + 1 control starts under the
    same noise, as the gate's evidence (None for evidence_df 0)."""
    if evidence_df <= 0:
        return None
    ctrl = simulate_sequences(rng, n, max_starts=evidence_df + 1, metrics=metrics, **noise)
    ev = {}
    for m in metrics:
        pv, cv, df = evidence_from_controls(ctrl[m])
        ev[m] = {"pooled": (pv, df), "cells": [(c, df) for c in cv]}
    return ev


def sequential_verdicts(metrics: Mapping[str, np.ndarray], *, max_starts: int, **kw) -> tuple[np.ndarray, np.ndarray]:
    """The sequential win2-v3 over simulated full brackets: each window's verdict and the starts it used."""
    n = next(iter(metrics.values())).shape[0]
    verdict = np.full(n, "INCONCLUSIVE", dtype=object)
    used = np.full(n, max_starts)
    open_ = np.ones(n, dtype=bool)
    looks = looks_for(max_starts)
    for k in range(3, max_starts + 1, 2):
        core = _win2_v3_core({m: v[..., :k] for m, v in metrics.items()}, looks=looks, **kw)
        v = core["verdict"]
        now = open_ & (v != "INCONCLUSIVE")
        verdict[now] = v[now]
        used[now] = k
        open_ &= ~now
    return verdict.astype(str), used


@dataclass(frozen=True)
class SweepSimulation:
    """Simulated shared-control brackets: per candidate its verdict and candidate starts, per bracket its starts."""
    verdicts: dict[str, np.ndarray]
    windows: dict[str, np.ndarray]
    starts: np.ndarray


def sweep_verdicts(metrics: Mapping[str, np.ndarray], candidates: Sequence[str], *, max_starts: int,
                   evidence: Mapping[str, Mapping[str, Any]] | None = None, **kw: Any) -> SweepSimulation:
    """The shared-control bracket over simulated timelines: each candidate's verdict, and the starts each ran.

    metrics: metric -> (brackets, cells, repeats, starts) with every odd start a candidate start (which
    candidate is the schedule's: ``sweep_next``); at least ``sweep_length`` starts. Each bracket runs
    round by round; after each round every candidate that got a window looks (``_win2_v3_core`` with its
    ``sweep_layout``), a decided one gets no more starts. Brackets with the same schedule so far are
    evaluated together. ``evidence``: as ``_win2_v3_core``'s, a var may be an array over the brackets.
    """
    n = next(iter(metrics.values())).shape[0]
    budget = looks_for(max_starts)
    cands = list(candidates)
    verdict = {c: np.full(n, "INCONCLUSIVE", dtype=object) for c in cands}
    arms: list[tuple[str, ...]] = [()] * n
    undecided: list[set[str]] = [set(cands) for _ in range(n)]
    used = np.zeros(n, dtype=int)
    while True:
        nxt = [sweep_next(arms[w], cands, undecided[w], budget) for w in range(n)]
        groups: dict[tuple[str, ...], list[int]] = {}
        for w in range(n):
            if nxt[w]:
                arms[w] = arms[w] + tuple(nxt[w])
                groups.setdefault(arms[w], []).append(w)
        if not groups:
            break
        for a, ws in groups.items():
            idx = np.asarray(ws)
            looked = [c for c in cands if c in set(a[-len(nxt[ws[0]]):])]
            sub = {m: v[idx][..., :len(a)] for m, v in metrics.items()}
            for c in looked:
                v = _win2_v3_core(sub, looks=budget, layout=sweep_layout(a, c), evidence=_sub_evidence(evidence, idx),
                                  **kw)["verdict"]
                for j, w in enumerate(ws):
                    verdict[c][w] = v[j]
                    if v[j] != "INCONCLUSIVE":
                        undecided[w].discard(c)
            used[idx] = len(a)
    windows = {c: np.asarray([sweep_windows(arms[w], c) for w in range(n)]) for c in cands}
    return SweepSimulation({c: v.astype(str) for c, v in verdict.items()}, windows, used)


def win2_v3_rates(*, rep_sd: float, start_sd: float, cells: int, repeats: int, max_starts: int,
                  guards: Sequence[str] = (), zero_guards: Sequence[str] = (), win_pct: float = 2.0,
                  alpha_win: float = 0.05, alpha_loss: float = 0.05, start_noise_pct: float = 3.0, min_df: int = 2,
                  evidence_f_alpha: float = 0.05, evidence_df: int = 0, power_gain_pct: float = 3.0,
                  prompt_sd: float = 0.0, n: int = WIN2_V2_RATE_WINDOWS, seed: int = WIN2_V2_RATE_SEED,
                  spending: str = "bonferroni", loss_pooled_share: float | None = None) -> dict:
    """Seeded simulated error rates of the sequential win2-v3 at one noise level.

    ``evidence_df``: the host evidence the gate is given, one simulated earlier window of
    ``evidence_df + 1`` control starts per bracket under the same noise (0: none). false_win / false_loss on
    identical arms; power / power_loss: WIN for a +power_gain_pct change, LOSS for a -power_gain_pct one.
    """
    names = ["primary", *guards]
    kw: dict[str, Any] = dict(primary="primary", guards=list(guards), lower_is_better=(), win_pct=win_pct,
                              alpha_win=alpha_win, alpha_loss=alpha_loss, start_noise_pct=start_noise_pct,
                              min_df=min_df, evidence_f_alpha=evidence_f_alpha, spending=spending,
                              loss_pooled_share=loss_pooled_share)
    rng = np.random.default_rng(seed)

    def run(gain: float) -> tuple[np.ndarray, np.ndarray]:
        sims = simulate_sequences(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                  max_starts=max_starts, gain_pct=gain, prompt_sd=prompt_sd, metrics=names,
                                  zero=zero_guards)
        ev = simulated_evidence(rng, n, evidence_df, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                prompt_sd=prompt_sd, metrics=names)
        return sequential_verdicts(sims, max_starts=max_starts, evidence=ev, **kw)

    null, used0 = run(0.0)
    up, used_up = run(power_gain_pct)
    down, used_down = run(-power_gain_pct)
    return {"rep_sd_pct": rep_sd, "start_sd_pct": start_sd, "prompt_sd_pct": prompt_sd, "cells": cells,
            "repeats": repeats, "max_starts": max_starts, "evidence_df": evidence_df, "windows": n, "seed": seed,
            "false_win": float((null == "WIN").mean()), "false_loss": float((null == "LOSS").mean()),
            "null_no_win": float((null == "NO_WIN").mean()),
            "null_inconclusive": float((null == "INCONCLUSIVE").mean()), "null_mean_starts": float(used0.mean()),
            "power_gain_pct": power_gain_pct, "power": float((up == "WIN").mean()),
            "power_loss": float((down == "LOSS").mean()), "alt_mean_starts": float(used_up.mean())}


def sequential_verdicts_v5(metrics: Mapping[str, np.ndarray], *, max_starts: int,
                           **kw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """win2-v5 over simulated full brackets, exactly as the rule runs one (``v5_run``). Returns each bracket's
    verdict, the starts it ran, and the starts its pilot asked for (0: more than any bracket of up to
    SIZE_LIMIT)."""
    run = v5_run(metrics, upto=max_starts, max_starts=max_starts, **kw)
    need = np.asarray([lk[0]["starts_needed"] or 0 for lk in run.looks])
    return run.verdict, run.used, need


def win2_v5_rates(*, rep_sd: float, start_sd: float, cells: int, repeats: int, max_starts: int,
                  guards: Sequence[str] = (), zero_guards: Sequence[str] = (), evidence_df: int = 0,
                  prompt_sd: float = 0.0, n: int = WIN2_V2_RATE_WINDOWS, seed: int = WIN2_V2_RATE_SEED,
                  gains: Sequence[float] | None = None, **params: Any) -> dict:
    """Seeded simulated outcomes of win2-v5 at one noise level: ``start_sd`` is the start component (a
    start's own offset, shared by all its repeats and cells), ``rep_sd`` the per-repeat noise on top of it.

    ``params``: the rule's registered parameters (``WIN2_V5``, a config may override them). Simulates identical
    arms and true gains of +-power_gain_pct and +win_pct (``gains`` adds others); reports per gain the share
    of each verdict and the mean starts, plus the headline rates: false WIN / LOSS and NO_WIN on identical
    arms, WIN at +power_gain_pct, LOSS at -power_gain_pct, NO_WIN at +win_pct (a gain of the bar called no win).
    """
    p = {**WIN2_V5, **params}
    names = ["primary", *guards]
    kw: dict[str, Any] = dict(primary="primary", guards=list(guards), lower_is_better=(), win_pct=p["win_pct"],
                              alpha_win=p["alpha_win"], alpha_loss=p["alpha_loss"],
                              start_noise_pct=p["start_noise_pct"], min_df=p["min_df"],
                              evidence_f_alpha=p["evidence_f_alpha"], spending="obf",
                              loss_pooled_share=p["loss_pooled_share"])
    g, bar = float(p["power_gain_pct"]), float(p["win_pct"])
    todo = [0.0, g, -g, bar, *(gains or ())]
    rng = np.random.default_rng(seed)
    by: dict[str, dict[str, float]] = {}
    for gain in dict.fromkeys(todo):
        sims = simulate_sequences(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                  max_starts=max_starts, gain_pct=gain, prompt_sd=prompt_sd, metrics=names,
                                  zero=zero_guards)
        ev = simulated_evidence(rng, n, evidence_df, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                prompt_sd=prompt_sd, metrics=names)
        v, used, need = sequential_verdicts_v5(sims, max_starts=max_starts, pilot_starts=p["pilot_starts"],
                                               max_looks=p["max_looks"], power=p["power"],
                                               power_gain_pct=g, alpha_futility=p["alpha_futility"],
                                               evidence=ev, **kw)
        by[f"{gain:+g}"] = {**{k: float((v == k).mean()) for k in ("WIN", "LOSS", "NO_WIN", "INCONCLUSIVE")},
                            "mean_starts": float(used.mean()), "max_starts_run": int(used.max()),
                            "sized_beyond_max": float(((need == 0) | (need > max_starts)).mean())}
    zero, up, down, at_bar = by["+0"], by[f"{g:+g}"], by[f"{-g:+g}"], by[f"{bar:+g}"]
    return {"rule": "win2-v5", "rep_sd_pct": rep_sd, "start_sd_pct": start_sd, "prompt_sd_pct": prompt_sd,
            "cells": cells, "repeats": repeats, "max_starts": max_starts, "evidence_df": evidence_df, "windows": n,
            "seed": seed, "false_win": zero["WIN"], "false_loss": zero["LOSS"], "null_no_win": zero["NO_WIN"],
            "null_inconclusive": zero["INCONCLUSIVE"], "null_mean_starts": zero["mean_starts"],
            "power_gain_pct": g, "power": up["WIN"], "power_loss": down["LOSS"], "bar_no_win": at_bar["NO_WIN"],
            "alt_mean_starts": up["mean_starts"], "by_gain": by}
