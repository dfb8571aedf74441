"""win2-v5 known answers: brackets built for each verdict and built not to; NO_WIN as a bound (a gain of the bar
is never called no win on a tight interval that does not exclude it, where win2-v4's precision test did), its
variance taken at the upper end of a one-sided interval; WIN only with every deciding cell above the bar; the
bracket sized from the noise (a pilot, then the size re-estimated at every look, for the joint event that every
deciding cell clears the bar; a size beyond max_starts stopped at the pilot with the starts it would need); the
start component of the noise recovered without counting the repeat noise twice; and the simulated rates the
decision reports checked against an independent Monte Carlo that runs the registered rule one bracket at a
time, as the speed stage does."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pairaudit import gates
from pairaudit.core import defaults
from pairaudit.gates.speed import (WIN2_V5, arm_factor, cell_corr, cell_spread, log_bar, pct_of_log, pilot_of,
                                   repeat_noise_sd, win2_v5_size)
from pairaudit.speed.decision import start_component_sd

PRIMARY = "pooled_rate_tps"
GUARD = "decode_tps"


def cells(per_start: list[float], reps: int = 3, jitter: float = 0.0, seed: int = 0) -> dict:
    """One deciding cell: every repeat the same start values (x jitter, the per-repeat noise in %)."""
    rng = np.random.default_rng(seed)
    series = [[v * (1.0 + jitter / 100.0 * rng.standard_normal()) for v in per_start] for _ in range(reps)]
    return {"c1": {PRIMARY: series, GUARD: series}}


def alternating(n: int, gain_pct: float, sd_pct: float, seed: int = 1) -> list[float]:
    """n starts C, T, C, ...: each start's own offset (sd_pct) and the candidate ``gain_pct`` % faster."""
    rng = np.random.default_rng(seed)
    return [100.0 * (1.0 + sd_pct / 100.0 * rng.standard_normal()) * (1.0 + gain_pct / 100.0 if k % 2 else 1.0)
            for k in range(n)]


def v5(values, **kw):
    return gates.win2_v5(cells(values, jitter=kw.pop("jitter", 0.0)), primary=PRIMARY, guards=[GUARD], **kw)


def test_registered_as_the_default_with_win2_v4_a_deviation():
    assert gates.rules_of("speed")[0] == "win2-v5"
    r = gates.REGISTERED["win2-v5"]
    assert r.params == WIN2_V5 and r.sequential and r.pooled
    assert WIN2_V5["alpha_win"] == WIN2_V5["alpha_loss"] == 0.05 and WIN2_V5["alpha_futility"] == 0.10
    assert gates.REGISTERED["win2-v4"].why_not and "precision" in gates.REGISTERED["win2-v4"].why_not


def test_a_clear_speedup_wins_and_a_clear_slowdown_loses_at_the_pilot():
    win = v5(alternating(7, 10.0, 0.3), max_starts=31)
    assert win["verdict"] == "WIN" and win["more_starts"] is False, win["reasons"]
    assert win["plan"]["pilot_starts"] == 7 and [lk["starts"] for lk in win["plan"]["looks"]] == [7]
    loss = v5(alternating(7, -10.0, 0.3), max_starts=31)
    assert loss["verdict"] == "LOSS" and loss["more_starts"] is False, loss["reasons"]
    assert "worse than the bar beyond the noise" in loss["reasons"][0]


def test_identical_arms_at_low_noise_end_no_win_with_the_whole_interval_within_the_bars():
    res = v5(alternating(7, 0.0, 0.2), max_starts=31)
    assert res["verdict"] == "NO_WIN", res["reasons"]
    # so quiet that the pilot already is the size the bracket needs: its look is the last, the upper bound
    # alone decides, at the whole futility alpha
    assert res["plan"]["planned_starts"] == 7 and res["upper_bound_pct"] < 2.0
    assert "a gain of the bar is ruled out" in res["reasons"][0]
    assert res["alpha_per_look"]["win"] == pytest.approx(0.05)
    # noisier, the pilot is an interim look: NO_WIN needs the whole interval within the bars
    mid = v5(alternating(7, 0.0, 0.2), max_starts=31, jitter=0.0, evidence=None)
    assert mid["verdict"] == "NO_WIN"


def test_no_win_is_a_bound_where_win2_v4_was_a_precision_test():
    # a gain just under the bar, measured to +-0.8 %: win2-v4 calls it NO_WIN (half-width within the bar)
    # although its interval holds the bar; win2-v5 does not
    vals = [100.0, 101.9, 100.6, 101.5, 99.4, 102.3, 100.3, 101.9, 99.7]
    old = gates.win2_v4(cells(vals), primary=PRIMARY, guards=[GUARD], max_starts=9)
    assert old["verdict"] == "NO_WIN", old["reasons"]
    assert old["pooled_gain_pct"] + old["half_width_pct"] > 2.0      # the bar is inside its interval
    new = v5(vals, max_starts=9, pilot_starts=9)
    assert new["verdict"] == "INCONCLUSIVE" and new["upper_bound_pct"] >= 2.0, new["reasons"]


def test_a_gain_of_three_percent_is_never_no_win_on_a_tight_interval():
    for seed in range(8):
        res = v5(alternating(7, 3.0, 0.4, seed=seed), max_starts=31)
        assert res["verdict"] != "NO_WIN", (seed, res["reasons"])
        assert res["verdict"] in ("WIN", "INCONCLUSIVE")


# -1.6 %: inside the bars in point, at 1.2 % start to start: sized to 13 starts from this pilot
SLOWDOWN = [100.0, 98.5, 101.6, 99.7, 98.4, 97.7, 100.8]


def test_a_slowdown_is_not_stopped_as_no_win_at_an_interim_look():
    # at an interim look the interval reaches below -bar: the bracket goes on (a LOSS may still show)
    interim = v5(SLOWDOWN, max_starts=31)
    assert interim["verdict"] == "INCONCLUSIVE" and interim["more_starts"] is True, interim["reasons"]
    assert interim["plan"]["planned_starts"] == 13 and interim["next_starts"] == 11
    assert interim["reasons"][0].startswith("undecided at look 1 (after 7 starts)")
    # max_starts = the pilot: its look is the last, and the upper bound alone decides
    last = v5(SLOWDOWN, max_starts=7)
    assert last["verdict"] == "NO_WIN" and last["upper_bound_pct"] < 2.0, last["reasons"]


def test_before_the_pilot_nothing_is_decided_and_the_next_look_is_the_pilot():
    res = v5(alternating(3, -20.0, 0.2), max_starts=31)
    assert res["verdict"] == "INCONCLUSIVE" and res["more_starts"] is True and res["next_starts"] == 7
    assert res["reasons"][0].startswith("pilot: 3 of 7 starts")


def test_a_start_count_that_is_not_a_look_is_refused():
    with pytest.raises(ValueError, match=r"9 starts is not a look of this bracket \(its looks: \[7\], the next "
                                         r"after 11 starts\)"):
        v5(SLOWDOWN + [99.0, 100.2], max_starts=31)


def test_too_noisy_for_max_starts_stops_at_the_pilot_and_says_how_many_starts_would_decide():
    res = v5(alternating(7, 0.0, 6.0, seed=2), max_starts=31)
    assert res["verdict"] == "INCONCLUSIVE" and res["more_starts"] is False, res["reasons"]
    assert res["plan"]["planned_starts"] == 7
    assert "too noisy to decide within max_starts 31" in res["reasons"][0]
    need = res["plan"]["starts_needed"]
    assert need is None or need > 31
    # the same noise with room to grow: the bracket is sized and goes on
    roomy = v5(alternating(7, 0.0, 1.5, seed=2), max_starts=61)
    assert roomy["more_starts"] is True and 7 < roomy["plan"]["planned_starts"] <= 61


def test_the_size_grows_with_the_noise_and_meets_its_power_condition():
    kw: dict[str, Any] = dict(pilot=7, max_looks=5, win_pct=2.0, alpha_win=0.05, alpha_loss=0.05, alpha_futility=0.10,
              loss_pooled_share=0.5, power=0.85, power_gain_pct=3.0)
    sizes = [int(win2_v5_size(sd ** 2, **kw)[0]) for sd in (1.0, 1.5, 2.0, 3.0)]
    assert sizes == sorted(sizes) and all(s % 2 == 1 and s >= 7 for s in sizes)
    # at the size, an A/A's upper bound (normal, futility quantile at its level) stays below the bar with
    # at least the registered power; two starts fewer it does not
    from scipy.stats import norm
    sd2 = 2.0 ** 2
    n = int(win2_v5_size(sd2, **kw)[0])
    se = math.sqrt(gates.speed.arm_factor(n) * sd2)
    assert norm.cdf((log_bar(2.0) - 1.2816 * se) / se) > 0.85 - 0.02
    # a gain no bigger than the bar can never be sized for
    assert int(win2_v5_size(1.0, **{**kw, "power_gain_pct": 2.0})[0]) == 0
    assert pilot_of(7, 3) == 3 and pilot_of(7, 31) == 7 and pilot_of(8, 31) == 7


def two_cells(first: list[float], second: list[float]) -> dict:
    """Two deciding cells, every repeat the same start values."""
    return {"c1": {PRIMARY: [first] * 3, GUARD: [first] * 3}, "c2": {PRIMARY: [second] * 3, GUARD: [second] * 3}}


def test_a_win_needs_every_deciding_cell_above_the_bar():
    # both cells 5 % faster: WIN at the pilot; one 8 % and one 1 % faster, pooled 4.5 % with a lower bound far
    # above 0: not a WIN (and no NO_WIN either: the pooled gain is above the bar)
    both = gates.win2_v5(two_cells(alternating(7, 5.0, 0.2, seed=3), alternating(7, 5.0, 0.2, seed=4)),
                         primary=PRIMARY, guards=[GUARD], max_starts=31)
    assert both["verdict"] == "WIN", both["reasons"]
    split = gates.win2_v5(two_cells(alternating(7, 8.0, 0.2, seed=3), alternating(7, 1.0, 0.2, seed=4)),
                          primary=PRIMARY, guards=[GUARD], max_starts=31)
    assert split["pooled_gain_pct"] > 4.0 and split["lower_bound_pct"] > 2.0
    assert split["verdict"] == "INCONCLUSIVE", split["reasons"]
    assert "cells not above the bar: ['c2']" in split["reasons"]


SIZE_KW: dict[str, Any] = dict(pilot=7, max_looks=5, win_pct=2.0, alpha_win=0.05, alpha_loss=0.05, alpha_futility=0.10,
               loss_pooled_share=0.5, power=0.85, power_gain_pct=3.0)


def test_the_size_is_for_every_deciding_cell_above_the_bar_jointly():
    """Two cells sharing each start's offset (start component 1.4 %, per repeat 2.5 %, 3 repeats): each cell's
    start value has variance 1.4^2 + 2.5^2 / 3, their mean 1.4^2 + 2.5^2 / 6. Sized for the pooled gain alone
    the bracket gives both cells above the bar well under the power; sized with the cells it gives the power,
    two starts fewer it does not (the probability from scipy's bivariate normal, not the rule's quadrature)."""
    from scipy.stats import multivariate_normal

    pooled, cell = 1.4 ** 2 + 2.5 ** 2 / 6, 1.4 ** 2 + 2.5 ** 2 / 3
    cov = np.array([[cell, 2 * pooled - cell], [2 * pooled - cell, cell]])   # Var of the mean is `pooled`
    margin = log_bar(3.0) - log_bar(2.0)

    def both_above(n: int) -> float:
        return float(multivariate_normal(mean=[0.0, 0.0], cov=arm_factor(n) * cov).cdf([margin, margin]))

    alone = int(win2_v5_size(pooled, **SIZE_KW)[0])
    joint = int(win2_v5_size(pooled, cell_var=np.array([cell, cell]), **SIZE_KW)[0])
    assert joint > alone and both_above(alone) < 0.82
    assert both_above(joint) >= 0.85 > both_above(joint - 2)
    # one deciding cell is the pooled gain: the same size either way
    assert int(win2_v5_size(pooled, cell_var=np.array([pooled]), **SIZE_KW)[0]) == alone
    # the cells' correlation from their variances and their mean's, and the weakest cell's reach:
    # z_power for one cell, the quantile of the larger of two independent normals for uncorrelated cells
    assert float(cell_corr(cov.diagonal()[None, :], np.array([pooled]))[0]) == pytest.approx(cov[0, 1] / cell)
    from scipy.stats import norm
    assert float(cell_spread(np.array([[1.0]]), np.array([0.0]), 0.85)[0]) == pytest.approx(norm.ppf(0.85), abs=1e-6)
    assert float(cell_spread(np.array([[1.0, 1.0]]), np.array([0.0]), 0.85)[0]) == pytest.approx(
        norm.ppf(math.sqrt(0.85)), abs=1e-6)


# 7 starts of identical arms, +0.5 % in point at 0.8 % start to start: the last look at the pilot (max_starts 7)
NEAR_BAR = [100.7, 99.6, 98.9, 100.5, 100.8, 100.4, 98.0]


def test_no_win_takes_the_variance_at_the_upper_end_of_its_interval():
    """The NO_WIN bound by hand: the gain plus the t quantile (5 df, the whole 10 % at the last look) times the
    standard error from the variance raised to the upper end of its one-sided 70 % interval (5 / chi2_0.3(5)).
    At the variance itself the bound would be below the bar (NO_WIN); raised, it is not."""
    from scipy.stats import chi2, t

    lv = 100.0 * np.log(NEAR_BAR)
    c, tr = lv[0::2], lv[1::2]
    gain = tr.mean() - c.mean()
    var = (((c - c.mean()) ** 2).sum() + ((tr - tr.mean()) ** 2).sum()) / 5
    se, q = math.sqrt(arm_factor(7) * var), float(t.ppf(0.9, 5))
    raised = gain + q * se * math.sqrt(5 / float(chi2.ppf(0.3, 5)))
    assert gain + q * se < log_bar(2.0) < raised
    res = v5(NEAR_BAR, max_starts=7)
    assert res["verdict"] == "INCONCLUSIVE" and res["more_starts"] is False, res["reasons"]
    assert res["upper_bound_pct"] == pytest.approx(pct_of_log(raised), rel=1e-9)
    # the same bracket a little tighter around its mean is ruled below the bar
    m = float(np.mean(NEAR_BAR))
    tight = v5([m + 0.5 * (v - m) for v in NEAR_BAR], max_starts=7)
    assert tight["verdict"] == "NO_WIN" and tight["upper_bound_pct"] < 2.0, tight["reasons"]


def test_the_start_component_is_the_start_value_sd_without_the_repeat_noise():
    # simulated: start offsets of 1.9 %, per-repeat noise 2.5 %, 2 cells x 3 repeats, many starts
    rng = np.random.default_rng(11)
    sims = gates.simulate_sequences(rng, 1, cells=2, repeats=3, rep_sd=2.5, start_sd=1.9, max_starts=401)
    x = sims["primary"][0]                                    # (cells, repeats, starts)
    start_values = np.log(x).mean(axis=(0, 1)) * 100.0
    value_sd = float(np.std(start_values[0::2], ddof=1))       # control starts only: no gain in them
    rep = repeat_noise_sd(x)
    assert rep == pytest.approx(2.5, rel=0.1)
    assert value_sd > 2.0                                      # the value's sd holds the repeat noise too
    assert start_component_sd(value_sd, rep, 2, 3) == pytest.approx(1.9, rel=0.12)


def _rule_run(values: np.ndarray, max_starts: int) -> tuple[str, int]:
    """One simulated bracket through the registered rule as the speed stage runs it: 3 starts first, then
    as many as the rule's next look asks for, until it stops."""
    n = 3
    while True:
        series = {"c1": {PRIMARY: values[0, :, :n].tolist(), GUARD: values[0, :, :n].tolist()},
                  "c2": {PRIMARY: values[1, :, :n].tolist(), GUARD: values[1, :, :n].tolist()}}
        res = gates.REGISTERED["win2-v5"].apply(series, {}, primary=PRIMARY, guards=[GUARD], max_starts=max_starts)
        if not res["more_starts"]:
            return res["verdict"], n
        n = res["next_starts"]


@pytest.mark.parametrize("gain", [0.0, -3.0, 3.0, 2.0])
def test_rates_agree_with_an_independent_monte_carlo_of_the_rule(gain):
    """The vectorised simulation behind the decision's rates (``win2_v5_rates``) against brackets drawn here
    with their own generator and decided one by one by the registered rule at the schema's max_starts: the
    shares of each verdict agree within the Monte Carlo error of both; false WIN / LOSS stay near their alphas,
    and a gain of the bar is called NO_WIN near the futility alpha."""
    n, start_sd, rep_sd = 160, 1.4, 2.5
    max_starts = int(defaults.section("speed")["max_starts"])
    rng = np.random.default_rng(20261206 + int(10 * abs(gain)) + (7 if gain > 0 else 0))
    got: dict[str, int] = {}
    for _ in range(n):
        off = rng.normal(0.0, start_sd, (1, 1, max_starts))
        e = rng.normal(0.0, rep_sd, (2, 3, max_starts))
        scale = np.array([1.0 + (gain / 100.0 if k % 2 else 0.0) for k in range(max_starts)])
        values = 100.0 * (1.0 + (off + e) / 100.0) * scale
        verdict, _ = _rule_run(values, max_starts)
        got[verdict] = got.get(verdict, 0) + 1
    sim = gates.win2_v5_rates(rep_sd=rep_sd, start_sd=start_sd, cells=2, repeats=3, max_starts=max_starts,
                              guards=[GUARD], n=600, seed=3)["by_gain"][f"{gain:+g}"]
    for verdict in ("WIN", "LOSS", "NO_WIN", "INCONCLUSIVE"):
        p_rule, p_sim = got.get(verdict, 0) / n, sim[verdict]
        se = math.sqrt(max(p_sim * (1 - p_sim), 0.01) * (1 / n + 1 / 600))
        assert abs(p_rule - p_sim) <= 4 * se, (verdict, p_rule, p_sim, got)
    bound = {0.0: ("WIN", 0.05), 2.0: ("NO_WIN", 0.10)}
    if gain in bound:
        what, alpha = bound[gain]
        assert got.get(what, 0) / n <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / n)
    if gain == 0.0:
        assert got.get("LOSS", 0) / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n)
