"""Known-answer tests for pairaudit.core.stats."""

import math

import pytest
from scipy import stats as st

from pairaudit.core.stats import (
    MDE_POWER,
    mcnemar_exact_p,
    mcnemar_loss_power,
    minimum_detectable_loss,
    paired_bootstrap_ci,
    paired_t_interval,
    paired_table,
)

# ------------------------------------------------------------------ McNemar

@pytest.mark.parametrize(
    "b,c,expected",
    [
        (0, 0, 1.0),                 # no discordant pairs
        (0, 5, 2 * 0.5**5),          # 0.0625
        (5, 0, 2 * 0.5**5),          # symmetric
        (1, 1, 1.0),                 # 2*P(X<=1; 2) = 1.5, capped
        (2, 8, 2 * (1 + 10 + 45) / 1024),  # 0.109375
        (0, 6, 2 * 0.5**6),          # 0.03125, below 0.05
        (12, 0, 2 * 0.5**12),
    ],
)
def test_mcnemar_hand_values(b, c, expected):
    assert mcnemar_exact_p(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_matches_scipy_binomtest():
    for b in range(0, 15):
        for c in range(0, 15):
            if b + c == 0:
                continue
            ref = st.binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue
            assert mcnemar_exact_p(b, c) == pytest.approx(ref, rel=1e-9, abs=1e-15), (b, c)


@pytest.mark.parametrize("b,c", [(-1, 2), (1.5, 2), (True, 2)])
def test_mcnemar_rejects_bad_counts(b, c):
    with pytest.raises(ValueError):
        mcnemar_exact_p(b, c)


# -------------------------------------------------------------- paired_table

_DEFAULT = object()


def score(i, correct, finish="stop", text=_DEFAULT, answered=True):
    return {"index": i, "correct": correct, "answered": answered, "finish_reason": finish,
            "text": f"t{i}" if text is _DEFAULT else text}


def rec(i, body="h", error=None):
    return {"index": i, "body_sha256": f"{body}{i}", "response": {}, "error": error}


def test_paired_table_counts_and_indices():
    # control correct on 0,1,2,4 ; candidate correct on 0,3,4 ; neither on 5
    ctrl = [score(0, True), score(1, True), score(2, True), score(3, False), score(4, True),
            score(5, False)]
    cand = [score(0, True), score(1, False, text="other"), score(2, False), score(3, True),
            score(4, True, text="x"), score(5, False)]
    # records given in a different order: pairing must be by index
    t = paired_table(ctrl, cand, [rec(i) for i in range(6)], [rec(i) for i in reversed(range(6))])
    assert t["n"] == 6
    assert t["indices"] == [0, 1, 2, 3, 4, 5]
    assert t["control_correct"] == 4 and t["candidate_correct"] == 3
    assert t["both_correct"] == 2 and t["neither_correct"] == 1
    assert t["control_only"] == [1, 2] and t["candidate_only"] == [3]
    assert t["net"] == -1
    assert t["mcnemar_p"] == pytest.approx(1.0)  # b=2,c=1: 2*P(X<=1;3)=1.0
    assert t["exact_text_matches"] == 4 and t["exact_text_match_indices"] == [0, 2, 3, 5]
    assert t["bodies_identical"] is True and t["body_mismatch_indices"] == []
    assert t["natural_finish"] == {"control": 6, "candidate": 6}
    assert t["unnatural_finish_indices"] == {"control": [], "candidate": []}
    assert t["unanswered_indices"] == {"control": [], "candidate": []}


def test_paired_table_flags_bodies_finishes_unanswered():
    ctrl = [score(0, True), score(1, True, finish="length"), score(2, False)]
    cand = [score(0, True), score(1, True), score(2, False, finish=None, answered=False, text=None)]
    c_rec = [rec(0), rec(1), rec(2)]
    k_rec = [rec(0), rec(1, body="different"), rec(2, error={"status": 500})]
    t = paired_table(ctrl, cand, c_rec, k_rec)
    assert t["bodies_identical"] is False
    assert t["body_mismatch_indices"] == [1]
    assert t["natural_finish"] == {"control": 2, "candidate": 2}
    assert t["unnatural_finish_indices"] == {"control": [1], "candidate": [2]}
    assert t["unanswered_indices"] == {"control": [], "candidate": [2]}
    assert t["error_indices"] == {"control": [], "candidate": [2]}
    # text None on one side is never an exact match
    assert 2 not in t["exact_text_match_indices"]


def test_paired_table_missing_body_hash_is_mismatch():
    r = rec(0)
    del r["body_sha256"]
    t = paired_table([score(0, True)], [score(0, True)], [r], [rec(0)])
    assert t["bodies_identical"] is False and t["body_mismatch_indices"] == [0]


def test_paired_table_index_sets_must_match_and_errors_name_them():
    ctrl = [score(0, True), score(1, True), score(2, True)]
    cand = [score(0, True), score(1, True), score(7, True)]
    recs = [rec(0), rec(1), rec(2)]
    with pytest.raises(ValueError) as e:
        paired_table(ctrl, cand, recs, recs)
    msg = str(e.value)
    assert "candidate_scores lacks indices [2]" in msg
    assert "[7]" in msg


def test_paired_table_rejects_duplicate_index():
    with pytest.raises(ValueError, match="duplicate index 0"):
        paired_table([score(0, True), score(0, False)], [score(0, True)], [rec(0)], [rec(0)])


# ------------------------------------------------------------------ bootstrap

def test_bootstrap_identical_arms_is_degenerate_at_zero():
    # Pairing: when both arms agree item by item the difference is 0 on every
    # resample; an unpaired bootstrap would give a wide interval here.
    a = [True, False] * 20
    ci = paired_bootstrap_ci(a, a, n_boot=500, seed=1)
    assert ci["diff"] == 0 and ci["lo"] == 0 and ci["hi"] == 0


def test_bootstrap_all_flips_to_candidate():
    ci = paired_bootstrap_ci([False] * 10, [True] * 10, n_boot=200)
    assert ci["diff"] == 1 and ci["lo"] == 1 and ci["hi"] == 1


def test_bootstrap_mixed_case_is_reproducible_and_brackets_point():
    ctrl = [True] * 30 + [False] * 10 + [True] * 5 + [False] * 5
    cand = [True] * 30 + [False] * 10 + [False] * 5 + [True] * 5
    ctrl, cand = ctrl + [True] * 10, cand + [False] * 10  # control ahead by 10/60
    a = paired_bootstrap_ci(ctrl, cand, seed=3)
    b = paired_bootstrap_ci(ctrl, cand, seed=3)
    assert a == b
    assert a["diff"] == pytest.approx(-10 / 60)
    assert a["lo"] < a["diff"] < a["hi"]
    assert a["hi"] < 0  # 15 discordant for control vs 5 for candidate: clearly negative
    wide = paired_bootstrap_ci(ctrl, cand, seed=3, level=0.99)
    assert wide["lo"] <= a["lo"] and wide["hi"] >= a["hi"]


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_bootstrap_ci([True], [True, False])
    with pytest.raises(ValueError):
        paired_bootstrap_ci([], [])


# ------------------------------------------------------------------ paired t

def test_paired_t_textbook_value():
    # mean 2, sd 1, n 3: half width = t_{0.975,2} / sqrt(3), t = 4.302652729911275
    m, lo, hi = paired_t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert m == pytest.approx(2.0)
    assert lo == pytest.approx(2.0 - half, rel=1e-9)
    assert hi == pytest.approx(2.0 + half, rel=1e-9)


def test_paired_t_zero_spread_and_level():
    assert paired_t_interval([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    _, lo90, hi90 = paired_t_interval([1.0, 2.0, 4.0], level=0.90)
    _, lo95, hi95 = paired_t_interval([1.0, 2.0, 4.0], level=0.95)
    assert lo95 < lo90 < hi90 < hi95


def test_paired_t_needs_two():
    with pytest.raises(ValueError):
        paired_t_interval([1.0])


# ------------------------------------------------- minimum detectable loss

def _quality_fail_table(n, b, c):
    """The smallest table quality_v1 reads, with b control-only and c candidate-only items."""
    return {"n": n, "control_only": list(range(b)), "candidate_only": list(range(b, b + c)),
            "bodies_identical": True}


def _enumerated_fail_probability(n, pb, pc, *, alpha=0.05, max_net_loss=0):
    """P(quality-v1 FAILs) by summing the trinomial over every (b, c) -- with quality_v1's own verdict."""
    from pairaudit.gates.quality import quality_v1
    fails = {}
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            if (b, c) not in fails:
                fails[b, c] = quality_v1(_quality_fail_table(n, b, c), alpha=alpha,
                                         max_net_loss=max_net_loss)["verdict"] == "FAIL"
            if fails[b, c]:
                total += st.multinomial.pmf([b, c, n - b - c], n, [pb, pc, 1 - pb - pc])
    return total


@pytest.mark.parametrize("n,pb,pc,alpha,m", [(14, 0.4, 0.05, 0.05, 0), (16, 0.25, 0.1, 0.05, 1),
                                             (12, 0.6, 0.0, 0.1, 0), (10, 0.3, 0.3, 0.05, 0)])
def test_mcnemar_loss_power_is_the_exact_fail_probability_of_quality_v1(n, pb, pc, alpha, m):
    got = mcnemar_loss_power(n, pb, pc, alpha=alpha, max_net_loss=m)
    assert got == pytest.approx(_enumerated_fail_probability(n, pb, pc, alpha=alpha, max_net_loss=m), abs=1e-12)


def test_minimum_detectable_loss_is_the_first_loss_reaching_the_power():
    n, discordant = 40, 6
    m = minimum_detectable_loss(n, discordant)
    d = m["net_loss"]

    def power(loss):
        pd = max(discordant / n, loss / n)
        return mcnemar_loss_power(n, (pd + loss / n) / 2, (pd - loss / n) / 2)

    assert m["power"] == pytest.approx(power(d)) and power(d) >= 0.8 > power(d - 1)
    assert m["rate"] == d / n and m["discordance"] == discordant / n and m["target_power"] == MDE_POWER == 0.8


def test_minimum_detectable_loss_without_observed_discordance():
    # No discordant pair seen: a loss of d items is d control-only items, so
    # FAIL needs b >= 6 at alpha 0.05 (2 * 0.5**6 < 0.05 <= 2 * 0.5**5) and the
    # power is P(Binomial(n, d/n) >= 6): an independent closed form.
    for n in (50, 200):
        want = next(d for d in range(1, n + 1) if st.binom.sf(5, n, d / n) >= 0.8)
        assert minimum_detectable_loss(n, 0)["net_loss"] == want
    assert minimum_detectable_loss(200, 0)["net_loss"] == 8


def test_minimum_detectable_loss_grows_with_discordance_and_is_none_when_nothing_can_fail():
    assert minimum_detectable_loss(200, 0)["net_loss"] < minimum_detectable_loss(200, 40)["net_loss"] \
        < minimum_detectable_loss(200, 120)["net_loss"]
    # five items: even five control-only items have p = 0.0625 >= 0.05
    m = minimum_detectable_loss(5, 0)
    assert m["net_loss"] is None and m["power"] is None
    assert minimum_detectable_loss(0, 0)["net_loss"] is None
    with pytest.raises(ValueError):
        minimum_detectable_loss(10, 11)
    with pytest.raises(ValueError):
        minimum_detectable_loss(10, 2, power=1.0)
