"""win2-v2 known answers (built to pass and built to fail every clause), its error
rates on seeded simulated windows, and the noise simulation of bench/speed_noise.py."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pairaudit import gates

ROOT = Path(__file__).resolve().parents[1]
QUIET_GUARD = [(50.0, 50.0, 50.1), (50.1, 50.1, 50.0), (50.0, 50.05, 50.1)]


def cell(gain_pct=0.0, *, base=100.0, wobble=(0.0, 0.5, -0.5), s3_shift=0.0, guard=None, apr=None):
    """Three repeats (s1, s2, s3) of one cell: the candidate ``gain_pct`` % above a steady control."""
    k = 1 + gain_pct / 100
    rate = [(base + w, base * k + w, base + w + s3_shift) for w in wobble]
    out = {"rate": rate, "decode_tps": guard or QUIET_GUARD}
    if apr is not None:
        out["accepted_per_round"] = apr
    return out


def v2(cells, **kw):
    kw.setdefault("guards", ["decode_tps"])
    kw.setdefault("with_rates", False)
    return gates.win2_v2(cells, primary="rate", **kw)


# ------------------------------------------------------------ verdict clauses

def test_clear_win_names_rule_noise_and_rates():
    r = v2({"a": cell(10), "b": cell(11)}, with_rates=True)
    assert r["rule"] == "win2-v2" and r["verdict"] == "WIN", r["reasons"]
    assert r["pooled_gain_pct"] == pytest.approx(10.5, abs=0.01)
    # the start-level part is the registered 3 % floor: s1 and s3 agree, which one difference cannot vouch for
    assert r["noise"]["start_sd_pct"] == pytest.approx(0.0)
    assert r["noise"]["start_sd_used_pct"] == 3.0
    z = 1.6448536269514722
    rep = r["noise"]["rep_sd_pct"]
    assert r["half_width_pct"] == pytest.approx(z * math.sqrt(1.5 * (9.0 + rep ** 2 / 6)), rel=1e-9)
    assert r["lower_bound_pct"] > 0
    for k in ("measured", "assumed"):
        assert set(r["rates"][k]) >= {"false_win", "false_loss", "power"}
    assert r["rates"]["assumed"]["false_win"] <= 0.05
    assert any("false WIN" in x and "simulated windows" in x for x in r["reasons"])
    assert r["deviations"] == {}


def test_a_real_but_small_gain_is_inconclusive_at_the_registered_noise():
    r = v2({"a": cell(4), "b": cell(4)})
    assert r["verdict"] == "INCONCLUSIVE"
    assert r["half_width_pct"] > 2.0
    # the start-to-start floor alone exceeds the bar: repeats cannot help, brackets can
    assert r["needed"]["repeats_needed"] is None
    z = 1.6448536269514722
    want = math.ceil((9.0 + r["noise"]["rep_sd_pct"] ** 2 / 6) / ((2.0 / z) ** 2 / 1.5))
    assert r["needed"]["brackets_needed"] == want
    assert any("too noisy to decide at the 2.0 % bar" in x and f"{want} brackets" in x for x in r["reasons"])


def test_a_quieter_assumed_host_is_a_deviation_and_decides_the_small_gain():
    r = v2({"a": cell(4), "b": cell(4)}, start_noise_pct=0.3)
    assert r["verdict"] == "WIN"
    assert r["deviations"] == {"start_noise_pct": {"registered": 3.0, "used": 0.3}}
    assert any("start_noise_pct" in x for x in r["reasons"])
    flat = v2({"a": cell(0), "b": cell(0.5)}, start_noise_pct=0.3)
    assert flat["verdict"] == "NO_WIN" and flat["half_width_pct"] <= 2.0


def test_repeats_needed_when_only_the_repeat_noise_is_too_high():
    noisy = (0.0, 6.0, -6.0)
    r = v2({"a": cell(0, wobble=noisy), "b": cell(0, wobble=noisy)}, start_noise_pct=0.5)
    assert r["verdict"] == "INCONCLUSIVE"
    need = r["needed"]["repeats_needed"]
    z = 1.6448536269514722
    budget = (2.0 / z) ** 2 / 1.5 - 0.25
    assert need == math.ceil(r["noise"]["rep_sd_pct"] ** 2 / (2 * budget))
    assert need > 3 and any(f"{need} repeats per start" in x for x in r["reasons"])


def test_every_deciding_cell_must_clear_the_bar():
    r = v2({"a": cell(20), "b": cell(1)})
    assert r["pooled_gain_pct"] > 8 and r["verdict"] != "WIN"
    assert any("cells not above the bar: ['b']" in x for x in r["reasons"])
    # a cell that does not decide cannot hold back the WIN
    r = v2({"a": cell(12), "b": cell(1)}, decide=["a"])
    assert r["verdict"] == "WIN" and r["cells"]["b"]["decides"] is False


def test_a_visible_start_offset_widens_the_interval():
    # s3 runs 9 % above s1 in both cells: the window itself shows start-level noise above the floor
    r = v2({"a": cell(9, s3_shift=9.0), "b": cell(9, s3_shift=9.0)})
    assert r["noise"]["start_sd_pct"] > 3.0 and r["noise"]["start_sd_used_pct"] == r["noise"]["start_sd_pct"]
    assert r["verdict"] == "INCONCLUSIVE"
    assert v2({"a": cell(9), "b": cell(9)})["verdict"] == "WIN"


def test_primary_loss_beyond_the_noise_and_not_within_it():
    r = v2({"a": cell(-15), "b": cell(0)})
    assert r["verdict"] == "LOSS" and r["cells"]["a"]["losses"] == ["rate"]
    assert any("a: rate worse than the bar" in x for x in r["reasons"])
    assert r["loss_tests"] == 4  # 2 cells x (primary + 1 guard), each at 5 % / 4
    assert v2({"a": cell(-5), "b": cell(0)})["verdict"] == "INCONCLUSIVE"


def test_a_guard_blocks_only_beyond_the_noise_and_never_wins():
    bad = [(50.0, 42.0, 50.0)] * 3                     # -16 %
    r = v2({"a": cell(12, guard=bad), "b": cell(12)})
    assert r["verdict"] == "LOSS" and r["cells"]["a"]["guards"]["decode_tps"]["guard_verdict"] == "LOSS"
    mild = [(50.0, 48.0, 50.0)] * 3                    # -4 %: within 3 % start-to-start noise
    assert v2({"a": cell(12, guard=mild), "b": cell(12)})["verdict"] == "WIN"
    great = [(50.0, 70.0, 50.0)] * 3
    assert v2({"a": cell(0, guard=great), "b": cell(0, guard=great)})["verdict"] == "INCONCLUSIVE"


def test_lower_is_better_metric_as_primary():
    ms = {"ms": [(10.0, 8.8, 10.0), (10.05, 8.85, 10.0), (10.0, 8.8, 10.05)], "decode_tps": QUIET_GUARD}
    r = gates.win2_v2({"a": ms}, primary="ms", guards=["decode_tps"], lower_is_better=["ms"], with_rates=False)
    assert r["verdict"] == "WIN" and r["pooled_gain_pct"] == pytest.approx(12.0, abs=0.5)
    worse = {"ms": [(10.0, 12.0, 10.0)] * 3, "decode_tps": QUIET_GUARD}
    assert gates.win2_v2({"a": worse}, primary="ms", guards=["decode_tps"], lower_is_better=["ms"],
                         with_rates=False)["verdict"] == "LOSS"


def test_zero_control_guard_is_no_loss_and_a_lost_draft_rate_is():
    none = [(0.0, 0.0, 0.0)] * 3
    some = [(0.0, 0.4, 0.0)] * 3
    for apr in (none, some):
        r = v2({"a": cell(12, apr=apr), "b": cell(12, apr=apr)}, guards=["decode_tps", "accepted_per_round"])
        assert r["verdict"] == "WIN", r["reasons"]
    lost = [(0.5, 0.0, 0.5)] * 3
    r = v2({"a": cell(12, apr=lost), "b": cell(12, apr=lost)}, guards=["decode_tps", "accepted_per_round"])
    assert r["verdict"] == "LOSS"


def test_reported_metrics_never_decide():
    c = {**cell(12), "ttft": [(1.0, 3.0, 1.0)] * 3}
    r = v2({"a": c}, reported=["ttft"], lower_is_better=["ttft"])
    assert r["verdict"] == "WIN" and r["reported"]["ttft"]["verdict"] == "LOSS"


@pytest.mark.parametrize("bad, match", [
    ({"a": {"rate": [(1.0, 2.0)] * 3, "decode_tps": QUIET_GUARD}}, "3 finite numbers"),
    ({"a": {"rate": [(1.0, float("nan"), 1.0)] * 3, "decode_tps": QUIET_GUARD}}, "3 finite numbers"),
    ({"a": {"decode_tps": QUIET_GUARD}}, "absent"),
    ({"a": {"rate": [(1.0, 1.0, 1.0)] * 2, "decode_tps": QUIET_GUARD}}, "different repeat counts"),
])
def test_malformed_series_are_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        v2(bad)


def test_one_repeat_is_inconclusive():
    r = v2({"a": {"rate": [(100.0, 120.0, 100.0)], "decode_tps": [(1.0, 1.0, 1.0)]}})
    assert r["verdict"] == "INCONCLUSIVE"


# ------------------------------------------------------------ error rates, seeded

def _gate(rep_sd, start_sd, gain=0.0, n=2000, seed=1, **kw):
    rng = np.random.default_rng(seed)
    w = gates.simulate_windows(rng, n, cells=2, repeats=3, rep_sd=rep_sd, start_sd=start_sd, gain_pct=gain,
                               metrics=("primary", "apr", "dtps"), zero=("apr",))
    args = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "start_noise_pct": 3.0, **kw}
    return gates.speed._win2_v2_core(w, primary="primary", guards=["apr", "dtps"], lower_is_better=(), **args)["verdict"]


@pytest.mark.parametrize("rep_sd, start_sd", [(1, 0), (3, 0), (5, 0), (1, 1), (1, 2), (1, 3)])
def test_identical_arms_false_win_and_false_loss_at_most_5_percent(rep_sd, start_sd):
    v = _gate(rep_sd, start_sd)
    assert (v == "WIN").mean() <= 0.05 and (v == "LOSS").mean() <= 0.05


def test_ten_percent_gain_at_3_percent_noise_wins_at_least_80_percent():
    assert (_gate(3, 0, gain=10.0) == "WIN").mean() >= 0.80


def test_built_to_fail_without_the_start_noise_floor_offsets_fake_wins():
    # The floor is what bounds the false WIN under per-start offsets: without it
    # the one s1-s3 difference is trusted and 3 % offsets win far too often.
    v = _gate(1, 3, start_noise_pct=0.0)
    assert (v == "WIN").mean() > 0.10


def test_vectorized_core_equals_the_registered_rule_window_by_window():
    rng = np.random.default_rng(5)
    for gain in (0.0, 6.0, -8.0):
        w = gates.simulate_windows(rng, 25, cells=2, repeats=3, rep_sd=2.0, start_sd=2.0, gain_pct=gain,
                                   metrics=("rate", "decode_tps"))
        core = gates.speed._win2_v2_core(w, primary="rate", guards=["decode_tps"], lower_is_better=(),
                                   win_pct=2.0, alpha_win=0.05, alpha_loss=0.05, start_noise_pct=3.0)["verdict"]
        for i in range(25):
            cells = {f"c{j}": {m: w[m][i, j].tolist() for m in w} for j in range(2)}
            assert v2(cells)["verdict"] == core[i]


def test_rates_are_seeded():
    a = gates.win2_v2_rates(rep_sd=2.0, start_sd=1.0, cells=2, repeats=3, n=500)
    assert a == gates.win2_v2_rates(rep_sd=2.0, start_sd=1.0, cells=2, repeats=3, n=500)


def test_simulation_prints_both_rules_side_by_side():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "speed_noise.py"), "--windows", "300",
                          "--check", "10"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if "%" in line and "win2-v" in line]
    by = {}
    for r in rows:
        rule = next(x for x in r if x.startswith("win2-v"))
        label = " ".join(r[:r.index(rule)])
        by.setdefault(label, set()).add(rule)
    assert len(by) == 8 and all(v == {"win2-v1", "win2-v2"} for v in by.values()), out.stdout
