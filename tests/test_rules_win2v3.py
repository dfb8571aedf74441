"""win2-v3 known answers: the alternating bracket decided sequentially, paired by prompt, with the
start-to-start noise from the window and the host's evidence (the control archive), the registered floor
only as the fallback; its simulated error rates; the host evidence read from archive lines; the wave plan
that sizes a repeat by time."""

from __future__ import annotations

import numpy as np
import pytest

from pairaudit import gates
from pairaudit.speed import bracket as speed
from pairaudit.speed import decision as speeddecision
from pairaudit.speed.evidence import host_evidence
from pairaudit.speed.metrics import start_roles

PRIMARY = "pooled_rate_tps"


def cells_from(starts: list[list[float]], *, prompt=(0.0, 0.0, 0.0), guard=None) -> dict:
    """One deciding cell: per start its three repeats, times a per-repeat prompt factor shared by every start."""
    reps = len(starts[0])
    series = [[v * (1 + prompt[r] / 100) for v in (s[r] for s in starts)] for r in range(reps)]
    g = series if guard is None else [[s[r] for s in guard] for r in range(reps)]
    return {"c1": {PRIMARY: series, "decode_tps": g}}


def flat(values: list[float], reps: int = 3) -> list[list[float]]:
    return [[v] * reps for v in values]


def v3(cells, **kw):
    return gates.win2_v3(cells, primary=PRIMARY, guards=["decode_tps"], **kw)


QUIET = {PRIMARY: {"pooled": {"var": 0.04, "df": 8, "windows": 4}, "cells": {"c1": {"var": 0.04, "df": 8}}},
         "decode_tps": {"pooled": {"var": 0.04, "df": 8, "windows": 4}, "cells": {"c1": {"var": 0.04, "df": 8}}}}


def test_one_bracket_without_evidence_uses_the_floor_and_asks_for_more_starts():
    # 0.2 % between the controls: one degree of freedom is below min_df, so 3 % is assumed
    res = v3(cells_from(flat([100.0, 100.1, 100.2])), max_starts=5)
    assert res["verdict"] == "INCONCLUSIVE"
    assert res["more_starts"] is True
    assert res["noise"]["start_sd_used_pct"] == pytest.approx(3.0)
    assert res["noise"]["source"].startswith("fallback")
    assert "the bracket grows" in " ".join(res["reasons"])
    # at the last allowed start the same window is final
    assert v3(cells_from(flat([100.0, 100.1, 100.2])), max_starts=3)["more_starts"] is False


def test_five_quiet_starts_decide_no_win_from_their_own_noise():
    res = v3(cells_from(flat([100.0, 100.2, 99.9, 100.1, 100.1])), max_starts=5)
    assert res["verdict"] == "NO_WIN"
    assert res["noise"]["df_used"] == 3 and res["noise"]["source"] == "this window alone"
    assert res["half_width_pct"] < 2.0


def test_quiet_host_evidence_lets_one_bracket_decide_no_win():
    res = v3(cells_from(flat([100.0, 100.1, 100.2])), max_starts=5, evidence=QUIET)
    assert res["verdict"] == "NO_WIN"
    assert res["noise"]["df_used"] == 9
    assert "earlier windows" in res["noise"]["source"]


def test_a_window_noisier_than_its_evidence_does_not_borrow_it():
    # controls 100 and 106: far beyond the evidence's 0.2 % sd, so the window stands alone (1 df -> floor)
    res = v3(cells_from(flat([100.0, 103.0, 106.0])), max_starts=5, evidence=QUIET)
    assert res["verdict"] == "INCONCLUSIVE"
    assert "not pooled" in res["noise"]["source"] or res["noise"]["source"].startswith("fallback")


def test_planted_three_percent_slowdown_is_a_loss_and_speedup_a_win():
    slow = v3(cells_from(flat([100.0, 97.0, 100.1])), max_starts=5, evidence=QUIET)
    assert slow["verdict"] == "LOSS"
    fast = v3(cells_from(flat([100.0, 103.0, 100.1])), max_starts=5, evidence=QUIET)
    assert fast["verdict"] == "WIN"
    assert fast["lower_bound_pct"] > 0


def test_a_one_percent_gain_never_wins():
    res = v3(cells_from(flat([100.0, 101.0, 100.0, 101.0, 100.0])), max_starts=5, evidence=QUIET)
    assert res["verdict"] == "NO_WIN"


def test_prompt_dependent_speed_cancels_in_the_pairing():
    # repeat 2 decodes at half the speed in every start: the same prompts, not noise
    res = v3(cells_from(flat([100.0, 100.1, 100.2]), prompt=(0.0, -50.0, 0.0)), max_starts=5, evidence=QUIET)
    assert res["verdict"] == "NO_WIN"
    assert res["noise"]["rep_sd_pct"] < 0.5


def test_linear_drift_cancels_in_the_neighbour_pairing():
    # the host speeds up by 1 % a start; the candidate is the same server
    res = v3(cells_from(flat([100.0 * 1.01 ** k for k in range(5)])), max_starts=5, evidence=QUIET)
    assert abs(res["pooled_gain_pct"]) < 1e-6
    assert res["verdict"] != "WIN"


def test_a_guard_loss_blocks_a_primary_win():
    good = flat([100.0, 110.0, 100.0])
    bad_guard = flat([100.0, 90.0, 100.0])
    res = v3(cells_from(good, guard=bad_guard), max_starts=5, evidence=QUIET)
    assert res["verdict"] == "LOSS"
    assert res["cells"]["c1"]["losses"] == ["decode_tps"]


def test_refuses_an_even_or_too_long_bracket():
    with pytest.raises(ValueError, match="odd number of starts"):
        v3(cells_from(flat([100.0, 100.0, 100.0, 100.0])), max_starts=5)
    with pytest.raises(ValueError, match="exceed max_starts"):
        v3(cells_from(flat([100.0] * 5)), max_starts=3)


def test_arm_factor_matches_the_variance_of_the_arm_difference():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (200000, 5))
    d = x[:, 1::2].mean(axis=1) - x[:, 0::2].mean(axis=1)
    assert d.var() == pytest.approx(gates.speed.arm_factor(5), rel=0.02)
    assert gates.speed.arm_factor(3) == pytest.approx(1.5)


@pytest.mark.parametrize("rep, start, ev, max_starts", [(3.0, 3.0, 0, 5), (1.0, 1.0, 4, 5), (2.0, 1.0, 0, 7),
                                                        (0.5, 0.3, 2, 5)])
def test_sequential_error_rates_stay_within_the_registered_alpha(rep, start, ev, max_starts):
    r = gates.win2_v3_rates(rep_sd=rep, start_sd=start, cells=2, repeats=3, max_starts=max_starts,
                            guards=["g"], evidence_df=ev, prompt_sd=5.0, n=3000, seed=1)
    assert r["false_win"] <= 0.05 and r["false_loss"] <= 0.05


def test_a_quiet_gpu_like_host_decides_identical_arms_and_planted_three_percent():
    r = gates.win2_v3_rates(rep_sd=0.5, start_sd=0.3, cells=2, repeats=3, max_starts=5, evidence_df=2,
                            prompt_sd=5.0, n=3000, seed=2)
    assert r["null_no_win"] >= 0.95 and r["power"] >= 0.9 and r["power_loss"] >= 0.9


def _line(window, start, cell, value, *, host="h", chash="x"):
    return {"window": window, "start": start, "cell": cell, "config_hash": chash, "host": host,
            "metrics": {PRIMARY: value}}


def test_host_evidence_pools_windows_of_the_same_control_and_host_only():
    recs = [_line("w1", "s1", "c1", 100.0), _line("w1", "s3", "c1", 102.0),
            _line("w2", "s1", "c1", 100.0), _line("w2", "s3", "c1", 100.0), _line("w2", "s5", "c1", 101.0),
            _line("w3", "s1", "c1", 50.0), _line("w3", "s3", "c1", 150.0, host="other"),
            _line("w4", "s1", "c1", 50.0, chash="y"), _line("w4", "s3", "c1", 150.0, chash="y"),
            _line("now", "s1", "c1", 10.0), _line("now", "s3", "c1", 500.0),
            {**_line(None, "s1", "c1", 1.0)}, {**_line(None, "s3", "c1", 900.0)}]
    ev = host_evidence(recs, host="h", hashes={"c1": "x"}, deciding=["c1"], metrics=[PRIMARY], exclude_window="now")
    assert ev is not None
    pooled = ev[PRIMARY]["pooled"]
    assert pooled["df"] == 3 and pooled["windows"] == 2
    rel1 = 100 * np.log([100.0, 102.0])
    rel2 = 100 * np.log([100.0, 100.0, 101.0])
    ss = ((rel1 - rel1.mean()) ** 2).sum() + ((rel2 - rel2.mean()) ** 2).sum()
    assert pooled["var"] == pytest.approx(ss / 3)
    assert ev[PRIMARY]["cells"]["c1"]["df"] == 3
    assert host_evidence(recs, host="nobody", hashes={"c1": "x"}, deciding=["c1"], metrics=[PRIMARY],
                         exclude_window=None) is None


def test_wave_plan_sizes_a_repeat_by_time_and_keeps_the_configured_floor():
    cfg = speed.resolve({"cells": [{"name": "a", "prompt": "short"}, {"name": "b", "prompt": "long"}],
                         "waves": 2, "repeat_s": 3.0})
    assert speed.wave_plan(cfg, {"a": 0.5, "b": 4.0}) == {"a": 6, "b": 2}
    none = speed.resolve({"cells": [{"name": "a", "prompt": "short"}], "waves": 2, "repeat_s": None})
    assert speed.wave_plan(none, {"a": 0.01}) == {"a": 2}


@pytest.mark.parametrize("bad, where", [({"max_starts": 4}, "speed.max_starts"), ({"max_starts": 1}, "speed.max_starts"),
                                        ({"repeat_s": 0}, "speed.repeat_s"), ({"repeat_s": "3"}, "speed.repeat_s")])
def test_config_errors_name_the_key(bad, where):
    with pytest.raises(speed.SpeedConfigError, match=where):
        speed.resolve_config({"cells": [{"name": "a", "prompt": "short"}], **bad})


def test_older_rules_keep_their_three_starts():
    cfg = speed.resolve_config({"cells": [{"name": "a", "prompt": "short"}], "rule": "win2-v2", "max_starts": 7})
    assert cfg["max_starts"] == 3


@pytest.mark.parametrize("rule", ["win2-v4", "win2-v3"])
def test_start_roles_alternate_and_the_stage_decision_reads_every_start(rule):
    assert [a for _, _, a in start_roles(5)] == ["control", "candidate", "control", "candidate", "control"]
    cfg = speed.resolve_config({"cells": [{"name": "c1", "prompt": "short"}], "accept_unverifiable_clock": True,
                                "rule": rule, "max_starts": 5})
    vals = [100.0, 100.1, 99.9, 100.2, 100.0]
    res = {f"s{k + 1}": {"c1": {"pooled": [{PRIMARY: v, "accepted_per_round": 0.0, "decode_tps": v,
                                              "ms_per_round": 1000 / v, "ttft_s": 0.1}] * 3}} for k, v in enumerate(vals)}
    from pairaudit.speed import clock as speedclock
    facts = [{"governor": None, "gpu": None}] * 5
    clock = speedclock.clock_check(facts, after=facts, starts=[f"s{k + 1}" for k in range(5)])
    win2, series, gate = speeddecision.decide(res, cfg, clock, starts=[f"s{k + 1}" for k in range(5)])
    assert gate["rule"] == rule and gate["starts"] == 5
    assert len(series["c1"][PRIMARY][0]) == 5
    assert gate["verdict"] == "NO_WIN"
    assert gate["rates"]["false_win"] <= 0.05
