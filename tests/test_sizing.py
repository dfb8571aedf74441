"""pairaudit.quality.sizing: exact power of quality-v1, checked by brute force, and the items it needs."""

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import pytest

from pairaudit import gates
from pairaudit.core import defaults, stats
from pairaudit.core.settings import QualitySettings
from pairaudit.plans import change
from pairaudit.quality import sizing

REPO = Path(__file__).resolve().parents[1]


p_value = functools.lru_cache(maxsize=None)(stats.mcnemar_exact_p)


def brute_power(n, loss, discordance, *, alpha=0.05, max_net_loss=0):
    """Sum the multinomial probability of every (b, c) outcome that quality-v1 FAILs, one by one."""
    pb, pc = (discordance + loss) / 2, (discordance - loss) / 2
    total = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            if b - c > max_net_loss and p_value(b, c) < alpha:
                r = n - b - c
                ways = math.factorial(n) // (math.factorial(b) * math.factorial(c) * math.factorial(r))
                total += ways * pb ** b * pc ** c * (1 - pb - pc) ** r
    return total


def table(b, c, n):
    """A paired table with b control-only and c candidate-only items out of n, all else clean."""
    control_only, candidate_only = list(range(b)), list(range(b, b + c))
    return {"n": n, "control_only": control_only, "candidate_only": candidate_only, "bodies_identical": True,
            "unnatural_finish_indices": {"control": [], "candidate": []},
            "unanswered_indices": {"control": [], "candidate": []}}


def test_the_fail_region_is_quality_v1s():
    """The region the brute force sums over is where quality-v1 itself says FAIL."""
    n = 10
    for b in range(n + 1):
        for c in range(n - b + 1):
            for m in (0, 2):
                fails = b - c > m and stats.mcnemar_exact_p(b, c) < 0.05
                assert (gates.quality_v1(table(b, c, n), max_net_loss=m)["verdict"] == "FAIL") is fails, (b, c, m)


@pytest.mark.parametrize("n,loss_pct,discordance,m", [
    (5, 40, 0.6, 0), (6, 50, 0.5, 0), (10, 20, 0.4, 0), (17, 30, 0.3, 0), (24, 10, 0.2, 0),
    (20, 30, 0.5, 2), (25, 100, 1.0, 0), (9, 5, 1.0, 1),
])
def test_power_equals_brute_force(n, loss_pct, discordance, m):
    got = sizing.fail_power(n, loss_pct, discordance, max_net_loss=m)
    want = brute_power(n, loss_pct / 100, discordance, max_net_loss=m)
    assert got == pytest.approx(want, abs=1e-12)


def test_power_equals_stats_for_large_n():
    # beyond brute force: the vectorized sum against stats.mcnemar_loss_power (scipy's pmf, every k)
    for n in (500, 3000):
        got = sizing.fail_power(n, 4, 0.25)
        assert got == pytest.approx(stats.mcnemar_loss_power(n, (0.25 + 0.04) / 2, (0.25 - 0.04) / 2), abs=1e-9)


def test_five_or_fewer_items_can_never_fail():
    # even b = n, c = 0 has p = 2 * 0.5^n >= 0.0625 for n <= 5
    assert all(sizing.fail_power(n, 100, 1.0) == 0.0 for n in range(1, 6))
    assert sizing.fail_power(6, 100, 1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("loss_pct,discordance,power", [(50, 0.5, 0.8), (30, 0.4, 0.8), (40, 0.6, 0.9), (25, 0.25, 0.5)])
def test_items_is_the_smallest_count_reaching_the_power_by_brute_force(loss_pct, discordance, power):
    plan = sizing.items_needed(loss_pct, discordance, power=power)
    first = plan.first_items
    assert brute_power(first, loss_pct / 100, discordance) >= power
    assert all(brute_power(n, loss_pct / 100, discordance) < power for n in range(1, first))
    # items: from it on, nothing up to the scan limit dips below the target; the count before it does
    assert all(sizing.fail_power(n, loss_pct, discordance) >= power for n in range(plan.items, plan.scan_limit + 1))
    if plan.items > first:
        assert sizing.fail_power(plan.items - 1, loss_pct, discordance) < power
    assert plan.items_power == pytest.approx(brute_power(plan.items, loss_pct / 100, discordance), abs=1e-12)


def test_known_answers():
    # computed once with this module and checked against stats.mcnemar_loss_power at the boundary
    for loss, d, items in ((5, 0.2, 658), (5, 0.1, 337), (10, 0.3, 249), (50, 0.5, 15)):
        plan = sizing.items_needed(loss, d)
        assert plan.items == items
        pb, pc = (d + loss / 100) / 2, (d - loss / 100) / 2
        assert stats.mcnemar_loss_power(items, pb, pc) >= 0.8 > stats.mcnemar_loss_power(plan.first_items - 1, pb, pc)


def test_items_fall_as_the_loss_grows():
    got = [sizing.items_needed(loss, 0.4).items for loss in (8, 10, 15, 20, 30, 40)]
    assert got == sorted(got, reverse=True) and len(set(got)) == len(got)


def test_items_grow_with_discordance():
    got = [sizing.items_needed(10, d).items for d in (0.1, 0.15, 0.2, 0.3, 0.5, 0.8)]
    assert got == sorted(got) and len(set(got)) == len(got)


def test_items_grow_with_power_and_fall_with_alpha_and_grow_with_tolerance():
    by_power = [sizing.items_needed(10, 0.3, power=p).items for p in (0.5, 0.7, 0.8, 0.9, 0.95)]
    assert by_power == sorted(by_power) and len(set(by_power)) == len(by_power)
    by_alpha = [sizing.items_needed(10, 0.3, alpha=a).items for a in (0.01, 0.05, 0.1, 0.2)]
    assert by_alpha == sorted(by_alpha, reverse=True) and len(set(by_alpha)) == len(by_alpha)
    # a tolerated net loss only matters where it is not already implied by p < alpha
    by_m = [sizing.items_needed(30, 0.4, max_net_loss=m).items for m in (0, 10, 20)]
    assert by_m == sorted(by_m) and by_m[0] < by_m[-1]


def test_consistent_with_the_paired_tables_detectable_loss():
    """A table of the planned size, with that discordance, reports a detectable loss no larger than the plan's."""
    loss, d = 10, 0.3
    n = sizing.items_needed(loss, d).items
    mde = stats.minimum_detectable_loss(n, math.floor(d * n))
    assert mde["net_loss"] <= math.ceil(loss / 100 * n)


def test_none_when_the_cap_is_too_small():
    plan = sizing.items_needed(5, 0.2, max_items=300)
    assert plan.items is None and plan.first_items is None and plan.scan_limit == 300


@pytest.mark.parametrize("kw,msg", [
    ({"loss_pct": 0, "discordance": 0.2}, r"loss_pct must be in \(0, 100\]"),
    ({"loss_pct": 10, "discordance": 0.05}, "discordance 0.05 is below the loss 0.1"),
    ({"loss_pct": 10, "discordance": 1.5}, r"discordance must be a fraction in \(0, 1\]"),
    ({"loss_pct": 10, "discordance": 0.2, "power": 1.0}, "need 0 < alpha < 1 and 0 < power < 1"),
    ({"loss_pct": 10, "discordance": 0.2, "max_net_loss": -1}, "max_net_loss must be a non-negative integer"),
    ({"loss_pct": float("nan"), "discordance": 0.2}, "loss_pct must be a finite number"),
])
def test_bad_input_names_the_parameter(kw, msg):
    with pytest.raises(sizing.SizingError, match=msg):
        sizing.items_needed(**kw)


# ------------------------------------------------------------------ the load-time note

def _config(loss=None, count=32):
    import yaml

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    change.derive_arms(cfg)  # the change form becomes the two arms, as at load
    if loss is not None:
        cfg["rules"]["quality"]["detect_loss_pct"] = loss
    for d in cfg["datasets"]:
        d["select"] = {"count": count, "seed": 1}
    return cfg


def test_load_check_notes_a_dataset_too_small_for_the_declared_loss():
    from pairaudit.configcheck import check_config

    floor = sizing.items_needed(10, 0.1).items        # every discordant item a loss
    res = check_config(_config(10), base_dir=REPO)
    assert res.problems == []
    notes = [n for n in res.notes if "detect_loss_pct" in n]
    assert len(notes) == 2
    assert notes[0].startswith("datasets[0] (arith): 32 selected items cannot see a net loss of 10 points")
    assert f"needs at least {floor} items even if every discordant item were a loss (discordance 0.1)" in notes[0]
    # enough items: no note; the key absent: no note
    assert not [n for n in check_config(_config(10, count=floor), base_dir=REPO).notes if "detect_loss_pct" in n]
    assert not [n for n in check_config(_config(None), base_dir=REPO).notes if "detect_loss_pct" in n]


def test_load_check_uses_the_audits_calibration_when_it_has_one(tmp_path):
    from pairaudit.core.artifacts import sha256_file, write_json
    from pairaudit.promotion import calibration

    summary = tmp_path / "results" / "default-calibration" / "promotion" / "calibration.json"
    write_json(summary, {"schema": "pairaudit.calibration/v1", "quality": {"arith": {"n": 100, "discordant": 30}}})
    calibration.append(tmp_path / "results" / "calibrations.jsonl", calibration.CalibrationEntry(
        time="2026-12-01T00:00:00+00:00", audit="default-calibration", of_audit="default", control_spec_sha256="c",
        host={}, host_sha256="h", decision="PROMOTE", headline="", flagged=[], summary_path=str(summary),
        summary_sha256=sha256_file(summary), decision_path="d", decision_sha256="e"))
    floor = sizing.items_needed(10, 0.1).items
    measured = sizing.items_needed(10, 0.3).items
    cfg = _config(10, count=floor)                    # enough for the floor, not for the measured discordance
    quality = QualitySettings.from_json(defaults.filled(cfg["rules"], "rules")["quality"])
    selected = [sizing.SelectedCount(where=f"datasets[{i}]", name=d["name"], n=d["select"]["count"])
                for i, d in enumerate(cfg["datasets"])]
    notes = sizing.detect_loss_notes(quality, selected, audit=cfg["audit"], calibration_log="results/calibrations.jsonl",
                                     base_dir=tmp_path)
    assert len(notes) == 1 and notes[0].startswith(f"datasets[0] (arith): {floor} selected items cannot see")
    assert f"at the discordance its A/A calibration default-calibration measured (0.3): that needs {measured} items" \
        in notes[0]


# ------------------------------------------------------------ quality-v2: ruling out the margin

def test_pass_limits_are_the_rules_own_pass_region():
    """For every k, the bisected limit separates quality-v2's PASS from the rest (checked b by b)."""
    from pairaudit.core import stats as st

    for n, margin, level in ((40, 0.25, 0.975), (200, 0.05, 0.95), (120, 0.1, 0.9833)):
        ks = np.arange(0, n + 1)
        lim = st.pass_limits(ks, n, margin, level)
        for k in ks[::9]:
            for b in range(k + 1):
                # the rule's PASS (a few tables), else the Tango bound itself against the margin
                if b % 5 == 0 and k < 30:
                    want = gates.quality_v2(table(b, k - b, n), margin_pct=100 * margin,
                                            level=level)["verdict"] == "PASS"
                else:
                    want = st.loss_upper_bound(b, k - b, n, level) < margin
                assert (b <= lim[k]) == want, (n, k, b)


def test_noninferiority_power_is_the_brute_force_sum():
    from scipy import stats as sst

    from pairaudit.core import stats as st

    n, margin, d, level = 50, 0.2, 0.3, 0.975
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            if st.noninferiority_pass(b, c, n, margin, level):
                total += sst.multinomial.pmf([b, c, n - b - c], n, [d / 2, d / 2, 1 - d])
    assert st.noninferiority_power(n, margin, d, level=level) == pytest.approx(total, rel=1e-9)


def test_noninferiority_items_reach_the_power_and_fewer_do_not():
    from pairaudit.core import stats as st

    for margin, d in ((0.05, 0.1), (0.25, 0.25), (0.03, 0.0)):
        plan = st.noninferiority_items(margin, d, level=0.975)
        n = plan["items"]
        assert plan["power"] >= 0.8
        assert all(st.noninferiority_power(m, margin, d, level=0.975) >= 0.8 for m in range(n, n + 20))
        assert st.noninferiority_power(n - 1, margin, d, level=0.975) < 0.8
    assert st.noninferiority_items(0.05, 0.1, level=0.975, loss=0.05)["items"] is None   # loss at the margin


def test_the_margin_note_names_the_dataset_and_the_items_it_would_need():
    from pairaudit.configcheck import check_config

    cfg = _config(None, count=32)
    cfg["rules"]["quality"]["margin_pct"] = 3.0
    res = check_config(cfg, base_dir=REPO)
    from pairaudit.quality import sizing

    notes = [n for n in res.notes if "rules.quality.margin_pct" in n]
    expected = sizing.expected_discordance(REPO, audit=cfg["audit"])
    want = sizing.margin_items(3.0, expected.rate("arith"), 0.95, len(cfg["datasets"]))["items"]
    assert notes and all("too few for quality-v2" in n for n in notes)
    assert any("(arith): 32 selected items" in n and f"about {want} items" in n for n in notes)
    cfg["rules"]["quality"]["margin_pct"] = 40.0     # a margin 32 items resolve: no note
    assert not [n for n in check_config(cfg, base_dir=REPO).notes if "rules.quality.margin_pct" in n]
    cfg["rules"]["quality"]["rule"] = "quality-v1"     # quality-v1 has no margin to note
    assert not [n for n in check_config(cfg, base_dir=REPO).notes if "rules.quality.margin_pct" in n]


def test_the_margin_note_follows_the_registered_rule_not_its_name(monkeypatch):
    sel = [sizing.SelectedCount(where="datasets[0]", name="arith", n=4)]
    q = QualitySettings.from_json(defaults.filled({}, "rules", "quality"))
    notes = sizing.margin_notes(q, sel, datasets=1, audit=None, base_dir=REPO)
    assert notes and f"too few for {gates.default_rule('quality').name}" in notes[0]
    # a registered rule without a margin to rule out gets no note; an unregistered one is an error, not silence
    assert sizing.margin_notes(dataclasses.replace(q, rule="quality-v1"), sel, datasets=1, audit=None,
                               base_dir=REPO) == []
    with pytest.raises(ValueError, match="unknown quality rule 'quality-v0'"):
        sizing.margin_notes(dataclasses.replace(q, rule="quality-v0"), sel, datasets=1, audit=None, base_dir=REPO)

