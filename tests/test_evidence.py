"""The host's evidence on its start-to-start noise: only windows of the same host, control (config hash: the
cell, request shape, repeats and the control server), wave plan and age bound count; newest first, a window
whose noise differs from the newer ones' (Bartlett) is left out; every window left out is listed with why."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from pairaudit.speed.evidence import bartlett_p, host_evidence

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
M = "pooled_rate_tps"


def window(name: str, values: list[float], *, hours_ago: float, plan: str | None = "P", host: str = "h",
           chash: str = "H") -> list[dict]:
    t = (NOW - dt.timedelta(hours=hours_ago)).isoformat()
    return [{"window": name, "cell": "c1", "start": f"s{2 * k + 1}", "host": host, "config_hash": chash,
             "plan_hash": plan, "time": t, "metrics": {M: v}} for k, v in enumerate(values)]


def evidence(records, **kw):
    args = dict(host="h", hashes={"c1": "H"}, deciding=["c1"], metrics=[M], exclude_window="now", plan="P",
                max_age_h=24.0, now=NOW)
    return host_evidence(records, **{**args, **kw})


def quiet(seed: int, sd: float = 1.0, n: int = 5) -> list[float]:
    rng = np.random.default_rng(seed)
    return [100.0 * math.exp(sd / 100.0 * z) for z in rng.standard_normal(n)]


def test_same_host_control_plan_and_age_count_and_the_rest_is_listed_with_why():
    recs = (window("a", quiet(1), hours_ago=1) + window("b", quiet(2), hours_ago=30)
            + window("c", quiet(3), hours_ago=2, plan="Q") + window("d", quiet(4), hours_ago=3, plan=None)
            + window("e", quiet(5), hours_ago=1, host="other") + window("f", quiet(6), hours_ago=1, chash="X")
            + window("now", quiet(7), hours_ago=0))
    ev = evidence(recs)[M]
    assert ev["windows_used"] == ["a"] and ev["pooled"]["df"] == 4 and ev["pooled"]["windows"] == 1
    why = {w["window"]: w["why"] for w in ev["left_out"]}
    assert why["b"].startswith("older than evidence_max_age_h 24 h (30.0 h)")
    assert why["c"] == "another wave plan than this window's"
    assert why["d"] == "archived without its wave plan"
    # another host's or another control's windows are not this control's evidence at all, and not listed
    assert set(why) == {"b", "c", "d"}
    # without an age bound or a plan to match, the old and the other-plan windows count
    loose = evidence(recs, max_age_h=None, plan=None)[M]
    assert sorted(loose["windows_used"]) == ["a", "b", "c", "d"]


def test_a_window_noisier_than_the_newer_ones_is_left_out_newest_first():
    recs = (window("new1", quiet(11, 0.8, 9), hours_ago=1) + window("new2", quiet(12, 0.8, 9), hours_ago=2)
            + window("old-loud", quiet(13, 6.0, 9), hours_ago=3) + window("old-quiet", quiet(14, 0.8, 9), hours_ago=4))
    ev = evidence(recs)[M]
    assert ev["windows_used"] == ["new1", "new2", "old-quiet"]
    (gone,) = ev["left_out"]
    assert gone["window"] == "old-loud" and "Bartlett p" in gone["why"]
    assert ev["pooled"]["df"] == 24 and math.sqrt(ev["pooled"]["var"]) < 2.0


def test_bartlett_rejects_unequal_variances_and_not_equal_ones():
    assert bartlett_p([(4.0 * 8, 8), (4.1 * 8, 8)]) > 0.9
    assert bartlett_p([(1.0 * 20, 20), (25.0 * 20, 20)]) < 1e-6
    assert bartlett_p([(1.0, 1)]) == 1.0
    # against scipy's own test on raw samples
    from scipy.stats import bartlett
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 12), rng.normal(0, 2, 9)
    ss = [(float(((x - x.mean()) ** 2).sum()), len(x) - 1) for x in (a, b)]
    assert bartlett_p(ss) == pytest.approx(bartlett(a, b).pvalue, rel=1e-9)


def test_no_window_of_this_control_is_no_evidence():
    assert evidence(window("x", quiet(1), hours_ago=1, host="other")) is None
