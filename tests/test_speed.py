"""The speed stage: win2-v1 and win2-v2 known answers through the stage's decision path,
clock facts before/after every start (unverifiable, changed within a start),
a control-vs-control noise simulation, metric pooling on known numbers, the
control archive, clock facts, config errors, and the OFF/ON/OFF bracket end
to end on real reference servers (n-gram speculation ON vs OFF)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import stat

import numpy as np
import pytest

from pairaudit import gates
from pairaudit.core import artifacts, contracts
from pairaudit.core.settings import SpeedCell, SpeedSettings
from pairaudit.plans import stage as plan_stage
from pairaudit.serving import armspec, launch
from pairaudit.speed import archive as speedarchive
from pairaudit.speed import bracket as speed
from pairaudit.speed import clock as speedclock
from pairaudit.speed import decision as speeddecision
from pairaudit.speed import gpu as speedgpu
from pairaudit.speed import metrics as speedmetrics
from pairaudit.speed import stage as speed_stage

CELLS = [{"name": "short-c1", "prompt": "short", "decide": True},
         {"name": "rnd-c4", "prompt": "random", "concurrency": 4, "decide": False}]
# win2-v1 known answers: the rule stays selectable and decides as it always did.
CFG = speed.resolve_config({"cells": CELLS, "repeats": 3, "rule": "win2-v1"})
CFG_V2 = speed.resolve_config({"cells": CELLS, "repeats": 3, "rule": "win2-v2"})
STARTS = ("s1", "s2", "s3")
QUIET = {"governor": "performance", "scaling_max_freq_khz": 3000000, "cpu_mhz": 2990.0, "loadavg": [0.1, 0.1, 0.1],
         "gpu": None}


def gpu(mask: int = 0x0, app: int = 2300, power: float = 300.0, sm: int = 1980, **counters) -> dict:
    """A one-GPU reading (speedgpu.GpuQuery) with these caps, active reasons and counters (us, default 0).

    The readings of a real driver are parsed in tests/test_speedgpu.py; here only the check over them runs.
    """
    return {"exe": "nvidia-smi", "driver_version": "580.159.04", "cuda_visible_devices": None, "selected": None,
            "reason_fields": "clocks_event_reasons", "not_reported": {}, "notes": [], "error": None,
            "gpus": [{"index": 0, "uuid": "GPU-test", "temperature_c": 40,
                      "clocks": {"clocks.current.sm": sm, "clocks.max.sm": 2300, "clocks.applications.graphics": app},
                      "power": {"power.limit": power, "enforced.power.limit": power, "power.draw": 250.0},
                      "active_mask": f"0x{mask:016X}",
                      "active_reasons": [n for b, n in speedgpu.EVENT_BITS.items() if mask & b],
                      "counters_us": {c: counters.get(c, 0) for c in speedgpu.COUNTERS}, "locked_clocks": None}]}


def pooled(rate, apr=0.0, dtps=None, msr=None, ttft=0.1):
    return {"pooled_rate_tps": rate, "accepted_per_round": apr, "decode_tps": rate if dtps is None else dtps,
            "ms_per_round": 1000.0 / rate if msr is None else msr, "ttft_s": ttft}


def results_from(per_start_cell):
    """{start: {cell: [per repeat pooled]}} -> the stage's results shape."""
    return {st: {cell: {"pooled": reps} for cell, reps in cells.items()} for st, cells in per_start_cell.items()}


def bracket(control, candidate, *, after=None, other=None, **kw):
    """Three repeats of the decision cell short-c1; rnd-c4 (reported only) flat unless ``other``."""
    after = control if after is None else after
    flat = [pooled(100.0)] * 3
    return results_from({
        "s1": {"short-c1": [pooled(x, **kw.get("c", {})) for x in control], "rnd-c4": flat},
        "s2": {"short-c1": [pooled(x, **kw.get("k", {})) for x in candidate], "rnd-c4": other or flat},
        "s3": {"short-c1": [pooled(x, **kw.get("c", {})) for x in after], "rnd-c4": flat},
    })


def quiet_clock(n=3, **override):
    facts = [{**QUIET, **override} if i == 1 else dict(QUIET) for i in range(n)]
    return speedclock.clock_check(facts, after=facts)


# ------------------------------------------------------- win2-v1 known answers

def test_clear_win():
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    win2, series, gate = speeddecision.decide(res, CFG, quiet_clock())
    assert gate["rule"] == "win2-v1" and gate["verdict"] == "WIN", gate["reasons"]
    assert series["short-c1"]["pooled_rate_tps"][0] == [100.0, 110.0, 100.0]
    p = win2["short-c1"]["primary"]
    assert p["point_gain_pct"] == pytest.approx(100 * (330.5 / 3 - 100) / 100)
    assert p["t_interval"]["lo"] > 0
    # the reported-only cell cannot turn the gate: it is flat (NO_WIN) and the gate still WINs
    assert gate["cells"]["rnd-c4"] == "NO_WIN"


def test_the_per_cell_gate_is_named_by_the_rule_that_decided_its_cells():
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    # the record and the mapping its to_json wrote decide alike
    win2, _, gate = speeddecision.decide(res, SpeedSettings.from_json(CFG), quiet_clock())
    assert gate == speeddecision.decide(res, CFG, quiet_clock())[2]
    again = speeddecision.combine(win2, ["short-c1"], informational=False)
    assert again["rule"] == gates.REGISTERED[CFG["rule"]].name and again["verdict"] == gate["verdict"]
    # a result of no registered rule, or of a pooled one, is not combined: an error, not a default
    with pytest.raises(ValueError, match="unknown speed rule 'win2-v0'"):
        speeddecision.combine({c: {**w, "rule": "win2-v0"} for c, w in win2.items()}, ["short-c1"],
                              informational=False)
    with pytest.raises(ValueError, match="win2-v2 decides over every deciding cell at once"):
        speeddecision.combine({c: {**w, "rule": "win2-v2"} for c, w in win2.items()}, ["short-c1"],
                              informational=False)
    with pytest.raises(ValueError, match="unknown speed rule 'win2-v0'"):
        speeddecision.decide(res, {**CFG, "rule": "win2-v0"}, quiet_clock())


def test_one_percent_gain_does_not_win_even_when_certain():
    res = bracket([100.0, 100.0, 100.0], [101.0, 101.02, 100.98])
    win2, _, gate = speeddecision.decide(res, CFG, quiet_clock())
    p = win2["short-c1"]["primary"]
    assert p["t_interval"]["lo"] > 0  # the gain is real...
    assert p["point_gain_pct"] == pytest.approx(1.0, abs=0.01)  # ...but below the 2 % bar
    assert gate["verdict"] == "NO_WIN"


def test_guard_loss_blocks_a_primary_win():
    # the rate wins, but accepted/round falls below the control spread in 2 of 3 repeats
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0],
                  c={"apr": 1.50}, k={"apr": 1.40})
    res["s2"]["short-c1"]["pooled"][2]["accepted_per_round"] = 1.55
    win2, _, gate = speeddecision.decide(res, CFG, quiet_clock())
    assert win2["short-c1"]["primary"]["verdict"] == "WIN"
    assert win2["short-c1"]["guards"]["accepted_per_round"]["repeats_worse_than_spread"] == 2
    assert gate["verdict"] == "LOSS"
    assert any("guard accepted_per_round" in r for r in win2["short-c1"]["reasons"])


def test_guard_loss_in_a_reported_only_cell_does_not_decide():
    bad = [pooled(100.0, dtps=80.0)] * 3
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0], other=bad)
    _, _, gate = speeddecision.decide(res, CFG, quiet_clock())
    assert gate["cells"]["rnd-c4"] == "LOSS" and gate["verdict"] == "WIN"


def test_clock_mismatch_is_inconclusive():
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    clock = quiet_clock(governor="powersave")
    assert clock["verdict"] == "DIFFERENT" and clock["mismatch"] == ["governor"]
    win2, _, gate = speeddecision.decide(res, CFG, clock)
    assert gate["verdict"] == "INCONCLUSIVE"
    assert any("governor" in r for r in win2["short-c1"]["reasons"])
    # load and current MHz differ all the time: recorded, never decisive
    clock = quiet_clock(loadavg=[3.0, 2.0, 1.0], cpu_mhz=1800.0)
    assert clock["verdict"] == "OK"
    assert speeddecision.decide(res, CFG, clock)[2]["verdict"] == "WIN"


def test_clock_off_expected_cap_or_gpu_slowdown_is_inconclusive():
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    clock = speedclock.clock_check([QUIET] * 3, {"governor": "schedutil"})
    assert clock["off_expected"] == ["governor"]
    assert speeddecision.decide(res, CFG, clock)[2]["verdict"] == "INCONCLUSIVE"
    g = [{**QUIET, "gpu": gpu()}] * 3
    ok = speedclock.clock_check(g, after=g)
    assert ok["verdict"] == "OK"
    assert speeddecision.decide(res, CFG, ok)[2]["verdict"] == "WIN"
    # s2's GPU spent 0.5 s in SW thermal slowdown (its counter grew; the reason was active after it)
    hot = {**QUIET, "gpu": gpu(0x20, sw_thermal_slowdown=500000)}
    clock = speedclock.clock_check(g, after=[g[0], hot, g[2]])
    assert [(s["start"], s["reason"], s["us"]) for s in clock["slowdowns"]] == [("s2", "sw_thermal_slowdown", 500000)]
    win2, _, gate = speeddecision.decide(res, CFG, clock)
    assert gate["verdict"] == "INCONCLUSIVE" and win2["short-c1"]["throttled"] is True
    capped = {**QUIET, "gpu": gpu(app=2150)}
    clock = speedclock.clock_check([g[0], capped, g[2]])
    assert clock["mismatch"] == ["gpu0.clocks.applications.graphics"]


def test_a_gpu_at_its_power_limit_is_not_a_slowdown():
    """0x4 (SW power cap) is what every loaded GPU at its power limit shows: recorded, never refused.

    The check before this one took any reason but idle and application clocks as throttling, so a
    working GPU made the gate INCONCLUSIVE.
    """
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    before = [{**QUIET, "gpu": gpu(0x1)}] * 3
    after = [{**QUIET, "gpu": gpu(0x4, sm=1500, sw_power_cap=20_000_000 + i)} for i in range(3)]
    clock = speedclock.clock_check(before, after=after)
    assert clock["verdict"] == "OK" and clock["slowdowns"] == []
    assert [p["sw_power_cap_us"] for p in clock["power_cap"]] == [20_000_000, 20_000_001, 20_000_002]
    for cfg in (CFG, CFG_V2):
        assert speeddecision.decide(res, cfg, clock)[2]["verdict"] == "WIN"


def test_primary_loss_rejects_and_missing_values_are_inconclusive():
    res = bracket([100.0, 101.0, 99.0], [90.0, 91.0, 89.5])
    assert speeddecision.decide(res, CFG, quiet_clock())[2]["verdict"] == "LOSS"
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    res["s2"]["short-c1"]["pooled"][1]["pooled_rate_tps"] = None  # 0 decode seconds
    win2, _, gate = speeddecision.decide(res, CFG, quiet_clock())
    assert gate["verdict"] == "INCONCLUSIVE" and win2["short-c1"]["verdict"] == "INCONCLUSIVE"


def test_informational_gate_only_rejects_on_loss():
    cfg = {**CFG, "informational": True}
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    _, _, gate = speeddecision.decide(res, cfg, quiet_clock(governor="powersave"))
    assert gate["verdict"] == "INCONCLUSIVE" and gate["informational"] is True
    prom = gates.promotion_v1({"quality": {"rule": "quality-v1", "verdict": "PASS"}, "speed": gate})
    assert prom["verdict"] == "PROMOTE" and prom["informational"] == ["speed"]
    not_info = {**gate, "informational": False}
    assert gates.promotion_v1({"quality": {"rule": "quality-v1", "verdict": "PASS"},
                               "speed": not_info})["verdict"] == "INCONCLUSIVE"
    loss = speeddecision.decide(bracket([100.0, 101.0, 99.0], [90.0, 91.0, 89.5]), cfg, quiet_clock())[2]
    assert gates.promotion_v1({"quality": {"rule": "quality-v1", "verdict": "PASS"},
                               "speed": loss})["verdict"] == "REJECT"


# ------------------------------------------------------- win2-v2 through the stage, clock facts

NO_CLOCK = {**QUIET, "governor": None, "scaling_max_freq_khz": None}   # a VM: no cpufreq, no GPU


def test_default_rule_is_win2_v5_and_win2_v2_decides_over_the_deciding_cells_as_a_deviation():
    assert speed.resolve_config({"cells": CELLS})["rule"] == "win2-v5"
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    win2, _, gate = speeddecision.decide(res, CFG_V2, quiet_clock())
    assert CFG_V2["rule"] == "win2-v2"
    assert gate["rule"] == "win2-v2" and gate["verdict"] == "WIN", gate["reasons"]
    assert gate["decision_cells"] == ["short-c1"] and win2["rnd-c4"]["decides"] is False
    assert gate["noise"]["start_sd_used_pct"] == 3.0 and gate["rates"]["assumed"]["false_win"] <= 0.05
    assert [d["what"] for d in gate["stage_deviations"]] == ["rule"] and gate["clock_check"] == "OK"
    # win2-v2 judges the same numbers by its own rule: a +3 % bracket is too noisy to decide here
    small = bracket([100.0, 101.0, 99.0], [103.0, 104.03, 101.97])
    assert speeddecision.decide(small, CFG_V2, quiet_clock())[2]["verdict"] == "INCONCLUSIVE"
    assert speeddecision.decide(small, CFG, quiet_clock())[2]["verdict"] == "WIN"  # win2-v1 calls it a WIN


def test_win2_v1_selected_is_a_deviation():
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    _, _, gate = speeddecision.decide(res, CFG, quiet_clock())
    assert gate["rule"] == "win2-v1"
    assert [d["what"] for d in gate["stage_deviations"]] == ["rule"]
    assert gate["stage_deviations"][0]["gate"] == "speed"


@pytest.mark.parametrize("cfg", [CFG, CFG_V2], ids=["win2-v1", "win2-v2"])
def test_no_clock_facts_is_inconclusive_unless_accepted_as_a_deviation(cfg):
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    clock = speedclock.clock_check([NO_CLOCK] * 3, after=[NO_CLOCK] * 3)
    assert clock["verdict"] == "UNVERIFIABLE" and [u["start"] for u in clock["unverifiable"]] == ["s1", "s2", "s3"]
    _, _, gate = speeddecision.decide(res, cfg, clock)
    assert gate["verdict"] == "INCONCLUSIVE"
    assert any(r.startswith("clock unverifiable") for r in gate["reasons"] + sum(
        (w.get("reasons", []) for w in speeddecision.decide(res, cfg, clock)[0].values()), []))
    ok = {**cfg, "accept_unverifiable_clock": True}
    _, _, gate = speeddecision.decide(res, ok, clock)
    assert gate["verdict"] == "WIN"
    dev = [d for d in gate["stage_deviations"] if d["what"] == "accept_unverifiable_clock"]
    assert len(dev) == 1 and dev[0]["gate"] == "speed" and "clock unverifiable" in dev[0]["detail"]
    # one start without facts is enough
    some = speedclock.clock_check([QUIET, NO_CLOCK, QUIET], after=[QUIET] * 3)
    assert [u["start"] for u in some["unverifiable"]] == ["s2"]
    assert speeddecision.decide(res, cfg, some)[2]["verdict"] == "INCONCLUSIVE"


def test_a_failing_nvidia_smi_is_unverifiable_and_gpu_facts_alone_verify():
    assert speedclock.clock_gaps({**NO_CLOCK, "gpu": gpu()}) == []
    failed = {**gpu(), "gpus": [], "error": "nvidia-smi exit 9: boom"}
    assert speedclock.clock_gaps({**QUIET, "gpu": failed}) == ["gpu: nvidia-smi exit 9: boom"]
    assert speedclock.clock_gaps(NO_CLOCK) and speedclock.clock_gaps(QUIET) == []


@pytest.mark.parametrize("cfg", [CFG, CFG_V2], ids=["win2-v1", "win2-v2"])
def test_clocks_that_change_inside_a_start_are_inconclusive(cfg):
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    before = [QUIET] * 3
    # the candidate's start ends on another governor / max frequency
    for change in ({"governor": "powersave"}, {"scaling_max_freq_khz": 2000000}):
        after = [QUIET, {**QUIET, **change}, QUIET]
        clock = speedclock.clock_check(before, after=after)
        assert clock["verdict"] == "DIFFERENT" and clock["mismatch"] == []
        assert clock["within_start"][0]["start"] == "s2"
        _, _, gate = speeddecision.decide(res, cfg, clock)
        assert gate["verdict"] == "INCONCLUSIVE"
    # a GPU slowdown inside s3 only (HW thermal: its counter grew over the start)
    g = [{**QUIET, "gpu": gpu()}] * 3
    clock = speedclock.clock_check(g, after=[g[0], g[1], {**QUIET, "gpu": gpu(0x40, hw_thermal_slowdown=70000)}])
    assert clock["within_start"] == [] and clock["verdict"] == "DIFFERENT"
    assert [(s["start"], s["reason"], s["us"], s["source"]) for s in clock["slowdowns"]] == [
        ("s3", "hw_thermal_slowdown", 70000, "counter")]
    assert speeddecision.decide(res, cfg, clock)[2]["verdict"] == "INCONCLUSIVE"
    # the GPU's application clock moved during s1
    clock = speedclock.clock_check(g, after=[{**QUIET, "gpu": gpu(app=2100)}, g[1], g[2]])
    assert clock["within_start"][0]["changed"] == ["gpu0.clocks.applications.graphics"]
    assert speeddecision.decide(res, cfg, clock)[2]["verdict"] == "INCONCLUSIVE"
    # current MHz and load move all the time: not a change of the clock caps
    clock = speedclock.clock_check(g, after=[{**QUIET, "gpu": gpu(sm=2250), "cpu_mhz": 1700.0,
                                              "loadavg": [4.0, 3.0, 2.0]}] * 3)
    assert clock["verdict"] == "OK" and speeddecision.decide(res, cfg, clock)[2]["verdict"] == "WIN"


def test_win2_v2_missing_values_in_a_deciding_cell_are_inconclusive_not_in_a_reported_one():
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    res["s2"]["rnd-c4"]["pooled"] = [dict(p) for p in res["s2"]["rnd-c4"]["pooled"]]
    res["s2"]["rnd-c4"]["pooled"][0]["pooled_rate_tps"] = None
    win2, _, gate = speeddecision.decide(res, CFG_V2, quiet_clock())
    assert gate["verdict"] == "WIN" and win2["rnd-c4"]["verdict"] == "INCONCLUSIVE"
    res["s2"]["short-c1"]["pooled"][1]["pooled_rate_tps"] = None
    _, _, gate = speeddecision.decide(res, CFG_V2, quiet_clock())
    assert gate["verdict"] == "INCONCLUSIVE" and any("short-c1" in r for r in gate["reasons"])


def test_win2_v2_informational_gate_only_rejects_on_loss():
    cfg = {**CFG_V2, "informational": True}
    loss = speeddecision.decide(bracket([100.0, 101.0, 99.0], [80.0, 81.0, 79.5]), cfg, quiet_clock())[2]
    assert loss["verdict"] == "LOSS" and loss["informational"] is True
    assert gates.promotion_v1({"quality": {"rule": "quality-v1", "verdict": "PASS"},
                               "speed": loss})["verdict"] == "REJECT"


# ------------------------------------------------------- noise simulation

def _simulate(n, rng, *, rep_sd, start_sd=0.0, drift=0.0, guards=True):
    """Fraction of WIN and LOSS over n synthetic brackets whose candidate is drawn like the controls.

    Noise (in % of the mean): ``rep_sd`` per repeat and start, ``start_sd`` per
    start (shared by all repeats of that start), and a linear drift of
    ``drift`` per start over the window (s1, s2, s3), either direction.
    """
    wins = losses = 0
    for _ in range(n):
        off = rng.normal(0, start_sd, 3) + drift * np.array([0.0, 1.0, 2.0]) * rng.choice([-1, 1])
        s = {"pooled_rate_tps": [list(100 * (1 + (off + rng.normal(0, rep_sd, 3)) / 100)) for _ in range(3)],
             "decode_tps": [list(50 * (1 + rng.normal(0, rep_sd, 3) / 100)) for _ in range(3)]}
        v = gates.win2_v1(s, primary="pooled_rate_tps", guards=["decode_tps"] if guards else [])["verdict"]
        wins += v == "WIN"
        losses += v == "LOSS"
    return wins / n, losses / n


def test_control_vs_control_noise_rarely_wins():
    rng = np.random.default_rng(20261130)
    # repeat-level noise from 1 % to 20 %, with and without a linear drift the bracket cancels
    for rep_sd, drift in ((1.0, 0.0), (3.0, 0.0), (3.0, 3.0), (8.0, 0.0), (20.0, 0.0)):
        false_win, _ = _simulate(2000, rng, rep_sd=rep_sd, drift=drift, guards=False)
        assert false_win <= 0.05, (rep_sd, drift, false_win)
    # guards can only block: with them the false-WIN rate cannot rise
    false_win, false_loss = _simulate(2000, rng, rep_sd=3.0)
    assert false_win <= 0.05
    assert false_loss > 0.05  # the price: a noisy guard blocks (module docstring of gates.win2_v1: ~13 %)
    # and the bar is not so high that a real 10 % gain at 3 % noise goes unseen
    wins = 0
    for _ in range(500):
        s = {"r": [list(100 * (1 + rng.normal(0, 3.0, 3) / 100) * np.array([1, 1.10, 1])) for _ in range(3)]}
        wins += gates.win2_v1(s, primary="r")["verdict"] == "WIN"
    assert wins / 500 > 0.5


def test_start_level_noise_is_the_known_limit_of_pairing_by_repeat():
    # A per-start offset is shared by all repeats of the start, so the paired
    # differences carry it as a constant the t interval cannot see. With small
    # start offsets the 2 % bar absorbs it; with 2-3 % offsets the false-WIN
    # rate leaves 5 % (docs/speed.md). The in-window s1/s3 spread printed
    # beside the bar is what exposes such a window.
    rng = np.random.default_rng(7)
    small, _ = _simulate(2000, rng, rep_sd=2.0, start_sd=1.0, guards=False)
    assert small <= 0.05
    large, _ = _simulate(2000, rng, rep_sd=1.0, start_sd=3.0, guards=False)
    assert large > 0.10


# ------------------------------------------------------- metrics on known numbers

def _stream(ttft, e2el, n, itl=None, error=None):
    return {"ttft_s": ttft, "e2el_s": e2el, "output_tokens": n, "tpot_s": (e2el - ttft) / (n - 1),
            "itl_s": itl or [], "error": error}


def test_pool_repeat_sums_counters_before_ratios():
    waves = [
        {"delta": {"vllm:request_success_total": 1, "vllm:generation_tokens_total": 65,
                   "vllm:spec_decode_num_accepted_tokens_total": 24, "vllm:spec_decode_num_drafts_total": 30,
                   "vllm:spec_decode_num_draft_tokens_total": 120, "vllm:request_decode_time_seconds_sum": 2.0},
         "streams": [_stream(0.5, 2.5, 65)]},
        {"delta": {"vllm:request_success_total": 2, "vllm:generation_tokens_total": 130,
                   "vllm:spec_decode_num_accepted_tokens_total": 0, "vllm:spec_decode_num_drafts_total": 0,
                   "vllm:spec_decode_num_draft_tokens_total": 0, "vllm:request_decode_time_seconds_sum": 6.0},
         "streams": [_stream(1.0, 5.0, 65), _stream(1.0, 3.0, 65)]},
    ]
    p = speedmetrics.pool_repeat(waves)
    # rounds = 195 generated - 24 accepted - 3 first tokens (one per request, from prefill)
    assert p["rounds"] == 168
    assert p["pooled_rate_tps"] == pytest.approx((168 + 24) / 8.0)
    assert p["accepted_per_round"] == pytest.approx(24 / 168)
    assert p["ms_per_round"] == pytest.approx(1000 * 8.0 / 168)
    assert p["decode_tps"] == pytest.approx(3 * 64 / (2.0 + 4.0 + 2.0))
    assert p["ttft_s"] == pytest.approx(2.5 / 3)
    # pooled, not averaged per wave: the per-wave rates are 32 and 21.33 (mean 26.67)
    assert p["pooled_rate_tps"] == pytest.approx(24.0) != pytest.approx(np.mean([32.0, 128 / 6.0]))
    # a non-speculative repeat: rounds = decode steps, nothing accepted
    q = speedmetrics.pool_repeat(waves[1:])
    assert q["rounds"] == 128 and q["accepted_per_round"] == 0.0


def test_pool_repeat_zero_decode_time_gives_no_rate():
    p = speedmetrics.pool_repeat([{"delta": {}, "streams": []}])
    assert p["pooled_rate_tps"] is None and p["ms_per_round"] is None and p["decode_tps"] is None


def test_bench_serve_table_matches_vllm_definitions():
    streams = [_stream(0.1, 1.1, 11, itl=[0.1] * 10), _stream(0.3, 2.3, 11, itl=[0.2] * 10),
               _stream(0.2, 0.2, 0, error="http 500: boom")]
    t = speedmetrics.bench_serve_table(streams, duration_s=4.0)
    assert t["completed"] == 2 and t["failed"] == 1
    assert t["total_output_tokens"] == 22 and t["output_throughput"] == pytest.approx(5.5)
    assert t["request_throughput"] == pytest.approx(0.5)
    assert t["ttft_ms"]["mean"] == pytest.approx(200.0) and t["ttft_ms"]["median"] == pytest.approx(200.0)
    assert t["tpot_ms"]["mean"] == pytest.approx(150.0)
    assert t["itl_ms"]["n"] == 20 and t["itl_ms"]["p99"] == pytest.approx(200.0)
    assert t["e2el_ms"]["p90"] == pytest.approx(np.percentile([1100.0, 2300.0], 90))


# ------------------------------------------------------- archive

def test_archive_appends_never_rewrites_and_spread_filters(tmp_path):
    path = tmp_path / "results" / "control-archive.jsonl"
    line = {"audit": "a", "start": "s1", "cell": "short-c1", "config_hash": "h1",
            "metrics": {"pooled_rate_tps": 100.0}, "clock": {}, "host": "x"}
    assert speedarchive.append_archive(path, [line]) == 1
    first = path.read_bytes()
    speedarchive.append_archive(path, [{**line, "start": "s3", "metrics": {"pooled_rate_tps": 104.0}},
                                {**line, "config_hash": "h2", "metrics": {"pooled_rate_tps": 50.0}},
                                {**line, "cell": "long-c1", "metrics": {"pooled_rate_tps": 10.0}}])
    assert path.read_bytes().startswith(first)  # earlier lines untouched
    with open(path, "a") as f:
        f.write("not json\n")
    recs = speedarchive.read_archive(path)
    assert len(recs) == 4 and all(r["schema"] == contracts.CONTROL_ARCHIVE_SCHEMA for r in recs)
    sp = speedarchive.archive_spread(recs, "short-c1", "h1", "pooled_rate_tps")
    assert sp["n"] == 2 and sp["range_pct"] == pytest.approx(100 * 4 / 102)
    assert speedarchive.archive_spread(recs, "short-c1", "h2", "pooled_rate_tps")["range_pct"] is None
    assert speedarchive.archive_spread([], "short-c1", "h1", "pooled_rate_tps")["n"] == 0


def test_config_hash_follows_cell_and_control_not_candidate():
    spec = armspec.resolve_spec("control", {"mode": "attach", "url": "http://127.0.0.1:1", "model": "m"})
    other = armspec.resolve_spec("control", {"mode": "attach", "url": "http://127.0.0.1:1", "model": "m2"})
    rec = SpeedSettings.from_json(CFG)
    cell = rec.cells[0]
    h = speedarchive.config_hash(cell, rec, spec)
    assert h == speedarchive.config_hash(SpeedCell.from_json(cell.to_json()), SpeedSettings.from_json(rec.to_json()),
                                         spec)
    assert h != speedarchive.config_hash(dataclasses.replace(cell, input_len=33), rec, spec)
    assert h != speedarchive.config_hash(cell, dataclasses.replace(rec, output_len=64), spec)
    assert h != speedarchive.config_hash(cell, rec, other)
    # the document hashed is the one the archive has always been keyed by: earlier windows stay comparable
    assert h == artifacts.sha256_json({
        "cell": CFG["cells"][0], "output_len": CFG["output_len"], "waves": CFG["waves"], "repeats": CFG["repeats"],
        "repeat_s": CFG["repeat_s"], "sampling": {"temperature": 1.0, "top_p": 1.0, "ignore_eos": True},
        "control": spec.identity()})


# ------------------------------------------------------- clock facts, config

def test_clock_facts_here_and_a_failing_nvidia_smi(tmp_path):
    f = speedclock.clock_facts()
    assert f["cpu_count"] == os.cpu_count() and len(f["loadavg"]) == 3
    assert set(speedclock.cap_facts(f)) >= {"governor", "scaling_max_freq_khz"}
    # nvidia-smi's own output is parsed on known answers in tests/test_speedgpu.py
    broken = tmp_path / "broken-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    err = speedclock.clock_facts(exe=str(broken))["gpu"]["error"]
    assert "exit 9" in err and "NVIDIA-SMI has failed" in err and "driver unknown" in err


@pytest.mark.parametrize("bad, where", [
    ({"repeats": 1}, "speed.repeats"),
    ({"primary": "tokens"}, "speed.primary"),
    ({"guards": ["pooled_rate_tps"]}, "more than one role"),
    ({"cells": [{"name": "a", "prompt": "poem"}]}, "speed.cells[0].prompt"),
    ({"cells": [{"name": "a", "prompt": "short", "decide": False}]}, "no cell has decide"),
    ({"cells": [{"name": "a", "prompt": "short"}, {"name": "a", "prompt": "long"}]}, "speed.cells[1].name"),
    ({"wins": 2}, "unknown key"),
    ({"informational": "yes"}, "speed.informational"),
    ({"rule": "win2-v9"}, "speed.rule"),
    ({"start_noise_pct": -1}, "speed.start_noise_pct"),
    ({"accept_unverifiable_clock": "yes"}, "speed.accept_unverifiable_clock"),
])
def test_config_errors_name_the_key(bad, where):
    with pytest.raises(speed.SpeedConfigError, match=where.replace("[", r"\[").replace("]", r"\]")):
        speed.resolve_config(bad)


def test_schema_defaults_equal_module_defaults():
    import yaml
    schema = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "config", "schema.yaml")))
    props = schema["properties"]["speed"]["properties"]
    for k, v in speed.DEFAULTS.items():
        assert props[k].get("default") == v, k


# ------------------------------------------------------- end to end, real servers

# one compute thread, as every test server (tests/refserver_fixture.py)
REF_CMD = ["{python}", "-m", "pairaudit.refserver", "--model", "{model}", "--host", "{host}", "--port", "{port}",
           "--max-model-len", "{max_model_len}", "--threads", "1"]


def _arm(ngram):
    return {"mode": "launch", "command": REF_CMD, "model": "SmolLM2-135M-Instruct", "max_model_len": 512,
            "env": {"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "PAIRAUDIT_REF_SPEC_NGRAM": str(ngram)},
            "speculative": bool(ngram), "health_timeout_s": 300}


def bracket_inputs(tmp_path, arms: dict) -> tuple[dict, dict, dict]:
    """Spec files, launch receipts and passed preflights of both arms: what the bracket reads before a server starts."""
    lp, pp, sp = {}, {}, {}
    for arm, cfg in arms.items():
        sp[arm] = str(tmp_path / f"specs/{arm}.json")
        plan_stage.arm_spec_stage(arm=arm, arm_cfg=cfg, out_path=sp[arm])
        lp[arm] = str(tmp_path / f"launch-{arm}.json")
        artifacts.write_json(lp[arm], launch.receipt(armspec.read_spec(sp[arm], arm=arm)))
        pp[arm] = str(tmp_path / f"preflight-{arm}.json")
        artifacts.write_json(pp[arm], {"schema": "pairaudit.preflight/v1", "verdict": "PASS"})
    return lp, pp, sp


@pytest.mark.server
def test_ngram_on_vs_off_bracket_end_to_end(tmp_path):
    arms = {"control": _arm(0), "candidate": _arm(4)}
    lp, pp, sp = bracket_inputs(tmp_path, arms)
    archive = tmp_path / "results" / "control-archive.jsonl"
    n = 16
    cfg = {"cells": [{"name": "rep-c1", "prompt": "repetitive", "input_len": 40, "concurrency": 1},
                     {"name": "rnd-c2", "prompt": "random", "input_len": 16, "concurrency": 2, "decide": False}],
           "repeats": 2, "waves": 1, "output_len": n, "archive": str(archive),
           "accept_unverifiable_clock": True,
           # the default rule with a start-noise fallback no 3-start window can beat: the bracket must grow to
           # five starts (at five the window's own 3 degrees of freedom replace the fallback)
           "max_starts": 5, "start_noise_pct": 50.0, "repeat_s": None}
    out, streams = tmp_path / "speed" / "decision.json", tmp_path / "speed" / "streams.jsonl"
    logs = {s: str(tmp_path / f"server-{s}.log") for s in STARTS}
    every = ("s1", "s2", "s3", "s4", "s5")
    doc = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed.resolve(cfg), audit="e2e",
                            out_path=str(out), streams_path=str(streams), archive_path=str(archive),
                            server_logs=logs)
    saved = artifacts.check_schema(artifacts.read_json(out), contracts.SPEED_DECISION_SCHEMA, out)
    assert saved["gate"] == doc["gate"] and saved["gate"]["rule"] == "win2-v5"
    # five fresh servers, alternating, in bracket order, on one host; the first look asked for more
    assert [(s["start"], s["arm"]) for s in saved["starts"]] == [
        ("s1", "control"), ("s2", "candidate"), ("s3", "control"), ("s4", "candidate"), ("s5", "control")]
    assert [s["role"] for s in saved["starts"][:3]] == ["control_before", "candidate", "control_after"]
    assert [lk["starts"] for lk in saved["looks"]] == [3, 5] and saved["looks"][0]["more_starts"] is True
    assert saved["gate"]["starts"] == 5 and saved["gate"]["noise"]["window_df"] == 3
    assert len({s["host"] for s in saved["starts"]}) == 1
    pids = [s["server"]["pid"] for s in saved["starts"]]
    assert len(set(pids)) == 5 and all(s["server"]["identity_check"]["ok"] for s in saved["starts"])
    assert all(os.path.getsize(p) > 0 for p in logs.values())
    assert all(os.path.getsize(tmp_path / f"server-{st}.log") > 0 for st in ("s4", "s5"))
    # speculation shows in the counters of the ON start only, and only there
    for cell in ("rep-c1", "rnd-c2"):
        for st in every:
            for rep in saved["pooled"][cell][st]:
                assert rep["requests"] == (1 if cell == "rep-c1" else 2)
                assert rep["generation_tokens"] == n * rep["requests"]
                if st in ("s2", "s4"):
                    assert rep["drafts"] > 0
                else:
                    assert rep["drafts"] == rep["accepted"] == 0 and rep["rounds"] == (n - 1) * rep["requests"]
    assert all(r["accepted"] > 0 for r in saved["pooled"]["rep-c1"]["s2"])  # the pattern is drafted and accepted
    g = saved["win2"]["rep-c1"]["guards"]["accepted_per_round"]
    assert g["point_gain_pct"] == 100.0  # drafts accepted against none: better, never a loss
    assert g["guard_verdict"] == "OK"
    # the verdict follows the stored series (timing noise here decides it; the rule must not drift)
    again = gates.win2_v5(saved["series"], primary="pooled_rate_tps", guards=["accepted_per_round", "decode_tps"],
                          reported=["ms_per_round", "ttft_s"], lower_is_better=["ms_per_round", "ttft_s"],
                          decide=["rep-c1"], max_starts=5, evidence=saved["evidence"], start_noise_pct=50.0)
    assert again["verdict"] == saved["gate"]["verdict"]
    assert saved["win2"]["rnd-c2"]["decides"] is False
    # clock facts were read before and after every start; a VM without cpufreq has none,
    # which this config accepts, and that acceptance is listed as a deviation
    assert all(s["clock_after"]["time"] >= s["clock"]["time"] for s in saved["starts"])
    cv = saved["clock_check"]["verdict"]
    assert cv in ("OK", "UNVERIFIABLE")
    accepted = [d for d in saved["deviations"] if d["what"] == "accept_unverifiable_clock"]
    assert bool(accepted) == (cv == "UNVERIFIABLE")
    assert saved["gate"]["stage_deviations"] == saved["deviations"]
    # bench-serve table per cell and start; raw timings beside
    bs = saved["bench_serve"]["rnd-c2"]["s2"]
    assert bs["completed"] == 4 and bs["failed"] == 0 and bs["total_output_tokens"] == 4 * n
    header, recs = artifacts.read_jsonl(streams)
    assert header["schema"] == contracts.SPEED_STREAMS_SCHEMA
    # a warm-up wave of every cell, then repeats x (c1 + c2 streams), per start
    assert len(recs) == 5 * ((1 + 2) + 2 * (1 + 2))
    # every request, warm-ups too, says when it was sent: the busy time of the server is read from them
    for st in every:
        mine = [r for r in recs if r["start"] == st]
        assert [r["warmup_of"] for r in mine[:3]] == ["rep-c1", "rnd-c2", "rnd-c2"]
        warm = max(dt.datetime.fromisoformat(r["started_at"]) for r in mine[:3])
        assert all(r["cell"] != "warmup" for r in mine[3:])
        assert all(dt.datetime.fromisoformat(r["started_at"]) >= max(warm, dt.datetime.fromisoformat(
            r["wave_started_at"])) for r in mine[3:])
        # each measured wave carries the host's CPU share over it (this Linux host has /proc/stat)
        assert all(r["wave_host_cpu"] is None for r in mine[:3])
        shares = [r["wave_host_cpu"] for r in mine[3:]]
        assert all(0.0 <= sh["busy_pct"] <= 100.0 and 0.0 <= sh["steal_pct"] <= 100.0 for sh in shares)
    salts = [r["cache_salt"] for r in recs]
    assert len(set(salts)) == len(salts)  # a fresh salt per stream
    seeds = {st: [r["seed"] for r in recs if r["start"] == st] for st in every}
    assert all(seeds[st] == seeds["s1"] for st in every)  # matched across starts
    # every control start reached the archive, once per cell, under this window
    lines = speedarchive.read_archive(archive)
    assert sorted((r["start"], r["cell"]) for r in lines) == [(s, c) for s in ("s1", "s3", "s5")
                                                              for c in ("rep-c1", "rnd-c2")]
    assert {r["window"] for r in lines} == {saved["window"]}
    assert saved["spread"]["rep-c1"]["archive_n"] == 0 and saved["spread"]["rep-c1"]["archive_with_window_n"] == 3
    assert saved["archive"]["appended"] == 6


def test_the_report_accepts_either_registered_speed_rule():
    from pairaudit.promotion import decision, render
    res = bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0])
    for cfg in (CFG, CFG_V2):
        gate = speeddecision.decide(res, cfg, quiet_clock())[2]
        decision._check_rule("speed", "speed", gate)
    assert decision._key_numbers(gate)["point_gain_pct"] > 2 and decision._key_numbers(gate)["rates"]
    with pytest.raises(ValueError, match="win2-v4 or win2-v3 or win2-v2 or win2-v1"):
        decision._check_rule("speed", "speed", {**gate, "rule": "win2-v0"})
    md = "\n".join(render.speed_markdown({"schema": contracts.SPEED_DECISION_SCHEMA, "gate": gate}))
    assert md.startswith("## Speed (win2-v2)")


def test_a_win2_v2_speed_decision_reaches_the_promotion(tmp_path):
    import test_report as tr

    from pairaudit.promotion import stage as report
    pair = tr.passing_pair()
    ins = tr._write_inputs(tmp_path / "in", pair, tr.launches(), tr.preflights())
    lg = tr.passing_later(pair)
    div = []
    for ds in pair:
        p = tmp_path / "in" / "divergence" / f"{ds}.json"
        artifacts.write_json(p, {"schema": "pairaudit.divergence/v1", "dataset": ds, "divergences": [],
                                 "grid_tie": lg["divergence"][ds], "determinism": lg["determinism"][ds]})
        div.append(str(p))
    bp, sp = tmp_path / "in" / "boundary_gate.json", tmp_path / "in" / "speed_decision.json"
    artifacts.write_json(bp, {"schema": "pairaudit.boundary_gate/v1", "gate": lg["boundary"]})
    win2, series, gate = speeddecision.decide(bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0]), CFG_V2, quiet_clock())
    artifacts.write_json(sp, {"schema": contracts.SPEED_DECISION_SCHEMA, "gate": gate, "win2": win2, "series": series,
                              "bar": {"win_pct": 2.0, "primary": "pooled_rate_tps",
                                      "lower_is_better": sorted(speedmetrics.LOWER_IS_BETTER)},
                              "deviations": gate["stage_deviations"]})
    out = tmp_path / "out"
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], out / "d.json", out / "r.md",
                           out / "m.json", out / "p.png", later={"divergence": div, "boundary": str(bp), "speed": str(sp)})
    d = artifacts.read_json(out / "d.json")
    assert d["decision"] == "PROMOTE", d["reasons"]
    assert d["gates"]["speed"]["rule"] == "win2-v2" and d["gates"]["speed"]["rates"]["assumed"]["false_win"] <= 0.05
    assert "## Speed (win2-v2)" in (out / "r.md").read_text()


def test_host_cpu_share_known_answers(tmp_path):
    from pairaudit.speed.clock import host_cpu_share, host_cpu_times
    # user nice system idle iowait irq softirq steal, as /proc/stat's aggregate line gives them
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    before = host_cpu_times(str(stat))
    assert before == (100, 0, 50, 800, 10, 0, 0, 40)
    # 200 jiffies pass: 60 busy (40 user + 20 system), 100 idle, 10 iowait, 30 stolen by the hypervisor
    after = (140, 0, 70, 900, 20, 0, 0, 70)
    assert host_cpu_share(before, after) == {"busy_pct": 30.0, "steal_pct": 15.0, "iowait_pct": 5.0}
    # a quiet guest: nothing stolen
    assert host_cpu_share(before, (140, 0, 70, 930, 20, 0, 0, 40))["steal_pct"] == 0.0
    # unknown or no time passed: no share rather than a made-up one
    assert host_cpu_share(None, after) is None and host_cpu_share(before, before) is None
    assert host_cpu_times(str(tmp_path / "absent")) is None
    # an older kernel's line without steal reads as zero steal
    stat.write_text("cpu  1 2 3 4 5 6 7\n")
    assert host_cpu_times(str(stat)) == (1, 2, 3, 4, 5, 6, 7, 0)
