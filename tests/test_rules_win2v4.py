"""win2-v4 known answers: win2-v3's bracket with alpha spent over the looks O'Brien-Fleming-type and half of
alpha_loss on the pooled loss test; the spending boundaries against published values; cases built to decide
each verdict and cases built not to; its simulated error rates beside win2-v3's at the noise measured on an
H200."""

from __future__ import annotations

import pytest
from scipy.stats import norm

from pairaudit import gates
from pairaudit.gates.speed import information_fractions, look_level, obf_levels

PRIMARY = "pooled_rate_tps"
# an earlier window's evidence: 0.8 % start to start, 12 degrees of freedom (an A/A of 13 control starts)
EV = {m: {"pooled": {"var": 0.64, "df": 12, "windows": 3}, "cells": {"c1": {"var": 0.64, "df": 12}}}
      for m in (PRIMARY, "decode_tps")}


def cells(values: list[float], reps: int = 3) -> dict:
    series = [[v for v in values] for _ in range(reps)]
    return {"c1": {PRIMARY: series, "decode_tps": series}}


def v4(values, **kw):
    return gates.win2_v4(cells(values), primary=PRIMARY, guards=["decode_tps"], **kw)


def test_boundaries_match_the_published_lan_demets_obrien_fleming_values():
    # one-sided 2.5 %, four equally spaced looks: 4.333, 2.963, 2.359, 2.014 (Lan and DeMets' spending function)
    z = [float(norm.isf(p)) for p in obf_levels(0.025, (0.25, 0.5, 0.75, 1.0))]
    assert z == pytest.approx([4.333, 2.963, 2.359, 2.014], abs=0.002)
    # a single look spends all of alpha; later looks of a longer sequence spend more than earlier ones
    assert obf_levels(0.05, (1.0,)) == pytest.approx((0.05,))
    levels = obf_levels(0.05, information_fractions(4))
    assert list(levels) == sorted(levels) and levels[-1] < 0.05 and sum(levels) > 0.05 / 4 * 4 * 0.9
    # bonferroni is win2-v3's: the same level at every look
    assert look_level(0.05, 4, 0, "bonferroni") == look_level(0.05, 4, 3, "bonferroni") == 0.0125
    with pytest.raises(ValueError, match="spending 'pocock'"):
        look_level(0.05, 4, 0, "pocock")


def test_information_grows_with_the_alternating_bracket():
    # 3, 5, 7, 9 starts: 1 / (1/n_cand + 1/n_ctrl) relative to the last
    assert information_fractions(4) == pytest.approx((0.3, 0.54, 0.7714, 1.0), abs=1e-3)


def test_an_aa_bracket_at_the_last_look_decides_no_win_where_win2_v3_cannot():
    # nine starts at the start-to-start noise an H200 showed (about 1.4 %, and as much in the host's
    # evidence): within the bar at O'Brien-Fleming's last level, not at alpha / 4
    ev = {m: {"pooled": {"var": 1.96, "df": 12, "windows": 3}, "cells": {"c1": {"var": 1.96, "df": 12}}}
          for m in (PRIMARY, "decode_tps")}
    vals = [100.0, 101.8, 98.4, 100.2, 101.9, 98.5, 100.1, 101.7, 99.3]
    res = v4(vals, max_starts=9, evidence=ev)
    assert res["verdict"] == "NO_WIN", res["reasons"]
    assert res["noise"]["start_sd_used_pct"] > 1.3
    assert res["alpha_per_look"]["win"] == pytest.approx(obf_levels(0.05, information_fractions(4))[-1])
    old = gates.win2_v3(cells(vals), primary=PRIMARY, guards=["decode_tps"], max_starts=9, evidence=ev)
    assert old["verdict"] == "INCONCLUSIVE" and old["half_width_pct"] > res["half_width_pct"]
    assert res["rule"] == "win2-v4" and res["deviations"] == {}


def test_the_first_look_is_stricter_than_win2_v3s():
    # the same 3-start A/A window: O'Brien-Fleming spends little at the first of four looks
    vals = [100.0, 100.3, 99.8]
    a, b = v4(vals, max_starts=9, evidence=EV), gates.win2_v3(cells(vals), primary=PRIMARY, guards=["decode_tps"],
                                                              max_starts=9, evidence=EV)
    assert a["half_width_pct"] > b["half_width_pct"]
    assert a["verdict"] == "INCONCLUSIVE" and a["more_starts"] is True


def test_a_planted_three_percent_slowdown_is_a_loss_by_the_pooled_test():
    # candidates 3 % slower in five starts; the pooled test carries half of alpha_loss
    res = v4([100.0, 97.1, 100.4, 96.8, 99.7], max_starts=9, evidence=EV)
    assert res["verdict"] == "LOSS", res["reasons"]
    assert res["alpha_per_look"]["loss_pooled"] > res["alpha_per_look"]["loss_cell"]
    assert any("pooled over the deciding cells" in r for r in res["reasons"])
    # built not to: the same slowdown hidden by 3 % start-to-start noise in the window stays undecided
    noisy = v4([100.0, 97.1, 104.0, 100.0, 96.0], max_starts=9, evidence=EV)
    assert noisy["verdict"] == "INCONCLUSIVE"


def test_a_planted_three_percent_speedup_is_a_win_and_one_below_the_bar_is_not():
    assert v4([100.0, 103.1, 100.3, 102.9, 99.8], max_starts=9, evidence=EV)["verdict"] == "WIN"
    # +1.5 %: the lower bound may clear 0 but the gain is below the 2 % bar
    res = v4([100.0, 101.5, 100.1, 101.6, 99.9, 101.4, 100.0], max_starts=9, evidence=EV)
    assert res["verdict"] in ("NO_WIN", "INCONCLUSIVE") and res["verdict"] != "WIN"


def test_a_changed_spending_is_a_deviation():
    res = v4([100.0, 100.2, 99.9, 100.1, 100.1], max_starts=5, evidence=EV, spending="bonferroni")
    assert res["deviations"] == {"spending": {"registered": "obf", "used": "bonferroni"}}


@pytest.mark.parametrize("rep_sd, start_sd", [(2.7, 1.0), (2.0, 0.8)])
def test_simulated_rates_keep_alpha_and_decide_more_aa_brackets_than_win2_v3(rep_sd, start_sd):
    common = dict(rep_sd=rep_sd, start_sd=start_sd, cells=2, repeats=3, max_starts=9, guards=["decode_tps"],
                  evidence_df=12, prompt_sd=5.0, n=1500)
    new = gates.win2_v3_rates(**common, spending="obf", loss_pooled_share=0.5)
    old = gates.win2_v3_rates(**common)
    assert new["false_win"] <= 0.05 and new["false_loss"] <= 0.05
    assert new["null_no_win"] > old["null_no_win"] + 0.2
    assert new["power_loss"] >= old["power_loss"]
