"""Known-answer tests for pairaudit.gates.rules: each rule on cases built to pass and
cases built to fail, with the failing clause named."""

import itertools

import numpy as np
import pytest
import torch

from pairaudit.core.stats import minimum_detectable_loss, paired_table
from pairaudit.gates.boundary import boundary_missing_cases, boundary_v1
from pairaudit.gates.determinism import determinism_v1
from pairaudit.gates.grid_tie import PROBE_CLAUSES, fp32_gap_tolerance, grid_tie_audit, grid_tie_probe, grid_tie_v1
from pairaudit.gates.promotion import promotion_v1
from pairaudit.gates.quality import quality_v1, quality_v2
from pairaudit.gates.speed import win2_v1

# ------------------------------------------------------------------ quality-v1

def make_table(control_only, candidate_only, both=10, neither=3, *, body_bad=(),
               unnatural=None, unanswered=None):
    """Build a real paired table through stats.paired_table."""
    unnatural = unnatural or {}
    unanswered = unanswered or {}
    n = both + neither + control_only + candidate_only
    cs, ks, cr, kr = [], [], [], []
    for i in range(n):
        if i < both:
            a, b = True, True
        elif i < both + neither:
            a, b = False, False
        elif i < both + neither + control_only:
            a, b = True, False
        else:
            a, b = False, True
        for arm, lst, correct in (("control", cs, a), ("candidate", ks, b)):
            lst.append({"index": i, "correct": correct,
                        "answered": i not in unanswered.get(arm, ()),
                        "finish_reason": "length" if i in unnatural.get(arm, ()) else "stop",
                        "text": "x"})
        cr.append({"index": i, "body_sha256": f"b{i}", "response": {}, "error": None})
        kr.append({"index": i, "body_sha256": f"b{i}" + ("!" if i in body_bad else ""),
                   "response": {}, "error": None})
    return paired_table(cs, ks, cr, kr)


def test_quality_pass_net_zero():
    r = quality_v1(make_table(control_only=2, candidate_only=2))
    assert r["rule"] == "quality-v1" and r["verdict"] == "PASS"
    assert r["net"] == 0 and r["deviations"] == {}


def test_quality_pass_when_candidate_better():
    r = quality_v1(make_table(control_only=0, candidate_only=4))
    assert r["verdict"] == "PASS" and r["net"] == 4


def test_quality_hold_worse_but_unresolved():
    # b=5, c=0: p = 2 * 0.5^5 = 0.0625 >= 0.05 -> unresolved difference
    t = make_table(control_only=5, candidate_only=0)
    r = quality_v1(t)
    assert r["verdict"] == "HOLD"
    assert r["mcnemar_p"] == pytest.approx(0.0625)
    assert "unresolved" in r["reasons"][0]
    assert str(t["control_only"]) in r["reasons"][0]  # names the indices


def test_quality_fail_worse_and_significant():
    # b=12, c=0: p = 2 * 0.5^12 ~ 4.9e-4
    r = quality_v1(make_table(control_only=12, candidate_only=0))
    assert r["verdict"] == "FAIL" and r["net"] == -12
    assert r["mcnemar_p"] < 0.05


def test_quality_fail_just_below_alpha():
    # b=6, c=0: p = 0.03125 < 0.05
    assert quality_v1(make_table(control_only=6, candidate_only=0))["verdict"] == "FAIL"


def test_quality_max_net_loss_is_recorded_as_deviation():
    t = make_table(control_only=1, candidate_only=0)
    assert quality_v1(t)["verdict"] == "HOLD"
    r = quality_v1(t, max_net_loss=1)
    assert r["verdict"] == "PASS"
    assert r["deviations"] == {"max_net_loss": {"registered": 0, "used": 1}}
    assert any("differs from the registered" in x for x in r["reasons"])


def test_quality_invalid_on_body_mismatch_even_if_better():
    t = make_table(control_only=0, candidate_only=3, body_bad=(4,))
    r = quality_v1(t)
    assert r["verdict"] == "INVALID"
    assert any("[4]" in x and "bodies differ" in x for x in r["reasons"])


def test_quality_invalid_on_unnatural_finish_either_arm():
    r = quality_v1(make_table(1, 1, unnatural={"control": (2,)}))
    assert r["verdict"] == "INVALID"
    assert any("control did not finish naturally at indices [2]" in x for x in r["reasons"])
    r = quality_v1(make_table(1, 1, unnatural={"candidate": (0, 5)}))
    assert r["verdict"] == "INVALID"
    assert any("[0, 5]" in x for x in r["reasons"])


def test_invalid_says_which_arm_ran_on_where_the_other_stopped():
    # every control answer ended by itself; the candidate's were cut at 0 and 5: it runs on
    r = quality_v2(make_table(1, 1, unnatural={"candidate": (0, 5)}))
    assert r["verdict"] == "INVALID"
    alone = [x for x in r["reasons"] if x.startswith("candidate alone")]
    assert alone and "[0, 5]" in alone[0] and "max_tokens is enough for the task as the control does it" in alone[0]
    # both arms cut at 2: the budget may be too small; the candidate alone at 5, but the control ran out too
    r = quality_v2(make_table(1, 1, unnatural={"control": (2,), "candidate": (2, 5)}))
    assert any(x == "both arms ran out at indices [2]: max_tokens may be too small for these items"
               for x in r["reasons"])
    alone = [x for x in r["reasons"] if x.startswith("candidate alone")]
    assert alone and "[5]" in alone[0] and "max_tokens is enough" not in alone[0]
    assert not any(x.startswith("control alone") for x in r["reasons"])


def test_quality_invalid_on_unanswered():
    r = quality_v1(make_table(0, 0, unanswered={"candidate": (1,)}))
    assert r["verdict"] == "INVALID"
    assert any("candidate unanswered at indices [1]" in x for x in r["reasons"])


# ----------------------------------------------------------------- grid-tie-v1
#
# Evidence is produced the way a BF16-head server produces it: float32 logits,
# rounded to bfloat16, then torch's float32 log_softmax over a 1000-token
# vocabulary, top-20 by torch.topk. The background vocabulary lives in [0, 8)
# so the planted logits are the top-20.

VOCAB = 1000


def served_top(planted: dict[int, float], *, bf16=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(VOCAB, generator=g, dtype=torch.float32) * 8
    for t, v in planted.items():
        x[t] = v
    if bf16:
        x = x.to(torch.bfloat16).to(torch.float32)
    lp = torch.log_softmax(x, dim=-1)
    assert lp.dtype == torch.float32
    v, i = torch.topk(lp, 20)
    return [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]


def probe(top, cand, ctrl, *, index=0, plen=(12, 12), control_top=None):
    return {"index": index, "candidate_token_id": cand, "control_token_id": ctrl,
            "candidate_top": top, "control_top": control_top if control_top is not None else top,
            "control_prefix_len": plen[0], "candidate_prefix_len": plen[1]}


def filler(n, lo, hi, seed=1, start=100):
    """n random float32 logits in [lo, hi) for token ids start.. (rounded later)."""
    g = torch.Generator().manual_seed(seed)
    vals = (torch.rand(n, generator=g) * (hi - lo) + lo).tolist()
    return {start + k: v for k, v in enumerate(vals)}


def one_binade(cand_logit=31.0, ctrl_logit=30.875, seed=1):
    # [16, 32): BF16 spacing 2^(4-7) = 0.125
    planted = filler(18, 16.0, 30.0, seed=seed)
    planted.update({7: cand_logit, 9: ctrl_logit})
    return planted


def test_grid_pass_control_one_step_below():
    r = grid_tie_probe(probe(served_top(one_binade()), cand=7, ctrl=9))
    assert r["verdict"] == "PASS", r["reasons"]
    assert all(r["clauses"][c] is True for c in PROBE_CLAUSES)
    assert r["step"] == 0.125 and r["step_exponent"] == -3
    assert r["gap"] == pytest.approx(0.125, abs=1e-6)
    # the evidence the registration asks for is all there
    assert len(r["residuals"]) == 20 * 19 // 2
    assert r["max_residual"] <= r["max_tolerance"]
    assert r["candidate_prefix_len"] == r["control_prefix_len"] == 12
    assert r["n_candidate_top"] == 20 and r["all_values_fp32_exact"] is True
    out = grid_tie_v1([probe(served_top(one_binade()), cand=7, ctrl=9)])
    assert out["verdict"] == "PASS" and out["failed_clauses"] == []
    assert out["rule"] == "grid-tie-v1" and out["registered_as"] == "pp4-r12-logit-grid-tie"


def test_grid_pass_on_exact_tie():
    r = grid_tie_probe(probe(served_top(one_binade(31.0, 31.0)), cand=7, ctrl=9))
    assert r["verdict"] == "PASS", r["reasons"]
    assert r["gap"] == 0.0 and r["candidate_to_top_gap"] == 0.0


def test_grid_seed000_half_and_one_gaps_are_accepted():
    # [64, 128): BF16 spacing 0.5. The seed reports 0.5 gaps served as
    # 0.5000000596046448 and 1.0 gaps as 1.0 after FP32 log_softmax.
    planted = {t: 100.0 - 0.5 * t for t in range(20)}
    top = served_top(planted)
    gaps = {abs(a[1] - b[1]) for a, b in itertools.combinations(top, 2)}
    assert 0.5000000596046448 in gaps and 1.0 in gaps  # the FP noise really is present
    r = grid_tie_probe(probe(top, cand=0, ctrl=1))
    assert r["verdict"] == "PASS", r["reasons"]
    assert r["step"] == 0.5
    r = grid_tie_probe(probe(top, cand=0, ctrl=2))  # two 0.5 steps = 1.0 gap
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["gap_within_one_step"]


def test_tolerance_scale_accepts_fp32_noise_rejects_real_offsets():
    a, b = -0.9327067732810974, -1.4327068328857422  # a served 0.5000000596 gap
    tol = fp32_gap_tolerance(a, b)
    assert abs((a - b) - 0.5) <= tol
    assert 1e-3 > 1000 * tol  # an off-grid offset of 1e-3 is far outside


def test_grid_stop_candidate_not_top():
    r = grid_tie_probe(probe(served_top(one_binade(30.875, 31.0)), cand=7, ctrl=9))
    assert r["verdict"] == "STOP"
    assert r["failed_clauses"] == ["candidate_token_is_top"]
    assert r["candidate_to_top_gap"] == pytest.approx(0.125, abs=1e-6)


def test_grid_stop_control_token_absent():
    planted = one_binade()
    top = served_top(planted)
    assert 555 not in planted and 555 not in [t for t, _ in top]
    r = grid_tie_probe(probe(top, cand=7, ctrl=555))
    assert r["verdict"] == "STOP"
    assert r["failed_clauses"] == ["both_tokens_present"]
    assert "gap_within_one_step" in r["unevaluated_clauses"]


def test_grid_stop_off_grid_fp32_logits():
    # Same construction, but the head is FP32: logits never meet the BF16 grid.
    planted = filler(18, 16.0, 30.0, seed=5)
    planted.update({7: 31.0371, 9: 30.9113})
    r = grid_tie_probe(probe(served_top(planted, bf16=False), cand=7, ctrl=9))
    assert r["verdict"] == "STOP"
    assert {"grid_step_power_of_two", "all_gaps_on_grid"} & set(r["failed_clauses"]) or \
        "all_gaps_on_grid" in r["unevaluated_clauses"]


def test_grid_stop_single_off_grid_value_half_step_plus_1e3():
    # Grid values 31, 30.875, 30.75 and below 30.25 on the 0.125 grid; one
    # unrounded logit 0.501 below the top, no grid value within 0.125 of it.
    planted = filler(16, 16.0, 30.25, seed=2)
    planted.update({7: 31.0, 9: 30.875, 11: 30.75, 13: 31.0 - 0.501})
    x = torch.tensor(list(planted.values()))
    rounded = x.to(torch.bfloat16).to(torch.float32).tolist()
    planted = dict(zip(planted, rounded))
    planted[13] = 31.0 - 0.501  # this one stays FP32
    g = torch.Generator().manual_seed(0)
    bg = torch.rand(VOCAB, generator=g) * 8
    for t, v in planted.items():
        bg[t] = v
    lp = torch.log_softmax(bg, dim=-1)
    v, i = torch.topk(lp, 20)
    top = [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]
    r = grid_tie_probe(probe(top, cand=7, ctrl=9))
    assert r["clauses"]["grid_step_power_of_two"] is True and r["step"] == 0.125
    assert r["failed_clauses"] == ["all_gaps_on_grid"]
    assert r["worst_pair"]["token_a"] == 13 or r["worst_pair"]["token_b"] == 13
    assert abs(r["worst_pair"]["residual"]) == pytest.approx(1e-3, rel=1e-2)


def test_grid_stop_step_not_power_of_two():
    # All values on a 0.3 grid (an FP32 head with a 0.3 quantizer, say).
    planted = {t: 30.0 - 0.3 * t for t in range(20)}
    r = grid_tie_probe(probe(served_top(planted, bf16=False), cand=0, ctrl=1))
    assert r["verdict"] == "STOP"
    assert "grid_step_power_of_two" in r["failed_clauses"]
    assert r["step"] is None and r["min_positive_gap"] == pytest.approx(0.3, abs=1e-5)
    assert "all_gaps_on_grid" in r["unevaluated_clauses"]


def test_grid_stop_step_above_one():
    # [256, 512): BF16 spacing 2 -- a power of two, but k = 1 > 0.
    planted = {t: 400.0 - 2.0 * t for t in range(20)}
    r = grid_tie_probe(probe(served_top(planted), cand=0, ctrl=1))
    assert r["verdict"] == "STOP"
    assert r["failed_clauses"] == ["grid_step_power_of_two"]
    assert r["step"] == 2.0 and r["step_exponent"] == 1


def test_grid_stop_all_equal_top20_infers_no_grid():
    planted = {t: 24.0 for t in range(20)}
    r = grid_tie_probe(probe(served_top(planted), cand=0, ctrl=1))
    assert r["verdict"] == "STOP"
    assert "grid_step_power_of_two" in r["failed_clauses"]
    assert r["step"] is None and r["min_positive_gap"] is None
    assert r["clauses"]["candidate_token_is_top"] is True  # a tie for the top is fine


def test_grid_stop_gap_two_steps():
    # 0.125 adjacency exists elsewhere, control token sits 2 steps down.
    planted = one_binade(31.0, 30.75)
    planted[8] = 30.0
    planted[10] = 29.875
    r = grid_tie_probe(probe(served_top(planted), cand=7, ctrl=9))
    assert r["step"] == 0.125
    assert r["verdict"] == "STOP"
    assert r["failed_clauses"] == ["gap_within_one_step"]
    assert r["gap_in_steps"] == pytest.approx(2.0, abs=1e-4)


def test_grid_stop_unequal_prefix_lengths():
    r = grid_tie_probe(probe(served_top(one_binade()), cand=7, ctrl=9, plen=(40, 41)))
    assert r["verdict"] == "STOP"
    assert r["failed_clauses"] == ["equal_prefix_lengths"]


def test_grid_count_clause():
    three = [probe(served_top(one_binade(seed=s)), cand=7, ctrl=9, index=s) for s in range(3)]
    assert grid_tie_v1(three)["verdict"] == "PASS"
    four = three + [probe(served_top(one_binade(seed=9)), cand=7, ctrl=9, index=9)]
    out = grid_tie_v1(four)
    assert all(p["verdict"] == "PASS" for p in out["probes"])
    assert out["verdict"] == "STOP"
    assert out["failed_clauses"] == ["at_most_3_divergent"]
    assert out["clauses"]["at_most_3_divergent"] is False
    # a looser count is allowed only visibly
    loose = grid_tie_v1(four, max_divergent=4)
    assert loose["verdict"] == "PASS"
    assert loose["deviations"] == {"max_divergent": {"registered": 3, "used": 4}}


def test_grid_zero_divergent_prompts_pass_only_on_compared_items():
    # Zero divergences PASS only when items were compared; before the counts
    # existed, grid_tie_v1([]) passed like compared-and-passed evidence.
    out = grid_tie_v1([], selected=4, compared=4)
    assert out["verdict"] == "PASS" and out["n_divergent"] == 0
    assert out["selected"] == 4 and out["compared"] == 4 and out["nothing_compared"] is False
    assert "4 selected, 4 compared" in out["reasons"][-1]


@pytest.mark.parametrize("bad", [-9999.0, float("nan"), float("-inf"), float("inf"), 0.25, "x", None])
def test_grid_stop_nonfinite_clamped_or_malformed_value(bad):
    top = served_top(one_binade())
    top[5] = [top[5][0], bad]
    r = grid_tie_probe(probe(top, cand=7, ctrl=9, control_top=served_top(one_binade())))
    assert r["verdict"] == "STOP"
    assert r["failed_clauses"] == ["finite_values"]
    out = grid_tie_v1([probe(top, cand=7, ctrl=9)])
    assert out["verdict"] == "STOP" and out["failed_clauses"] == ["finite_values"]
    assert "gap_within_one_step" in out["unevaluated_clauses"]


def test_grid_stop_malformed_records():
    good = served_top(one_binade())
    cases = [
        probe(good, cand=7, ctrl=7),                          # not a divergence
        probe(good + good[:1], cand=7, ctrl=9),               # 21 entries + duplicate id
        probe(good, cand="7", ctrl=9),                        # id not an int
        probe([], cand=7, ctrl=9),                            # empty top
        {**probe(good, cand=7, ctrl=9), "control_prefix_len": None},
        probe(good, cand=7, ctrl=9, control_top=[[1, -9999.0]]),  # clamped control data
    ]
    for c in cases:
        r = grid_tie_probe(c)
        assert r["verdict"] == "STOP" and r["failed_clauses"] == ["finite_values"], c


def f32(x):
    return float(np.float32(x))


def test_grid_one_ulp_difference_is_a_tie_not_a_step():
    # Two values one FP32 ulp apart must not become a 2^-22 "step" (that would
    # make every gap on grid, a fine-GCD rescue). Hand-built served values,
    # padded to a full top-20 on the 0.125 grid (a shorter list is sparse).
    top = [[1, -2.0], [2, -2.0 - 2.0 ** -22], [3, -2.125], [4, -2.25], [5, -2.625]]
    top += [[6 + k, -3.0 - 0.125 * k] for k in range(15)]
    r = grid_tie_probe(probe(top, cand=1, ctrl=3))
    assert r["step"] == 0.125
    assert r["verdict"] == "PASS", r["reasons"]
    # same set with one value moved off grid by 1e-3 (smallest gap still
    # 0.125): STOP
    top[4] = [5, f32(-2.626)]
    r = grid_tie_probe(probe(top, cand=1, ctrl=3))
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["all_gaps_on_grid"]


def test_grid_sparse_set_is_never_rescued_by_a_finer_divisor():
    # Gaps 0.25 and 0.375: a GCD would be 0.125, but 0.125 is not observed,
    # so the observable step is 0.25 and 0.375 is off it. (Padded to 20 on
    # the 0.25 grid, every value shifted by a served-looking log-partition.)
    vals = [-1.0, -1.25, -1.625] + [-2.0 - 0.25 * k for k in range(17)]
    top = [[1 + k, f32(v - 1 / 3)] for k, v in enumerate(vals)]
    r = grid_tie_probe(probe(top, cand=1, ctrl=2))
    assert r["step"] == 0.25
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["all_gaps_on_grid"]


def test_grid_mixed_binade_behaviour():
    # Values straddling 32: [32, 64) has spacing 0.25, [16, 32) has 0.125.
    # (a) both binades populated with an adjacent 0.125 pair: the fine step is
    #     observed and the coarse values are multiples of it -> PASS.
    #     The control token ties the top (token 50).
    planted = {t: 40.0 - 0.25 * t for t in range(9)}            # 40 .. 38
    planted[50] = 40.0
    planted.update({100 + t: 31.0 - 0.125 * t for t in range(10)})  # 31 .. 29.875
    r = grid_tie_probe(probe(served_top(planted), cand=0, ctrl=50))
    assert r["step"] == 0.125
    assert r["verdict"] == "PASS", r["reasons"]
    # (b) a lone finer-binade value at an odd multiple of 0.125 while the
    #     observed step is 0.25: off the observed grid -> STOP.
    planted = {t: 40.0 - 0.25 * t for t in range(19)}
    planted[100] = 31.875
    r = grid_tie_probe(probe(served_top(planted), cand=0, ctrl=1))
    assert r["step"] == 0.25
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["all_gaps_on_grid"]


def test_grid_mixed_binade_coarse_step_counts_double():
    # (c) explicit: top in the coarse binade, control one coarse step below,
    # fine step observed in the lower binade -> gap is 2 observed steps.
    planted = {0: 40.0, 1: 39.75}
    planted.update({100 + t: 31.0 - 0.125 * t for t in range(18)})
    r = grid_tie_probe(probe(served_top(planted), cand=0, ctrl=1))
    assert r["step"] == 0.125
    assert r["failed_clauses"] == ["gap_within_one_step"]


def test_grid_overall_lists_every_failing_clause_and_index():
    ok = probe(served_top(one_binade()), cand=7, ctrl=9, index=3)
    bad1 = probe(served_top(one_binade(30.875, 31.0)), cand=7, ctrl=9, index=11)
    bad2 = probe(served_top(one_binade()), cand=7, ctrl=9, index=12, plen=(5, 6))
    out = grid_tie_v1([ok, bad1, bad2])
    assert out["verdict"] == "STOP"
    assert set(out["failed_clauses"]) == {"candidate_token_is_top", "equal_prefix_lengths"}
    assert [p["verdict"] for p in out["probes"]] == ["PASS", "STOP", "STOP"]
    assert any(x.startswith("index 11:") and "candidate_token_is_top" in x for x in out["reasons"])
    assert any(x.startswith("index 12:") and "equal_prefix_lengths" in x for x in out["reasons"])


def test_grid_duplicate_probe_index_is_an_error():
    p = probe(served_top(one_binade()), cand=7, ctrl=9, index=1)
    with pytest.raises(ValueError):
        grid_tie_v1([p, dict(p)])


# -------------------------------------------------------------- determinism-v1

def test_determinism():
    r = determinism_v1({"control": ["a"] * 3, "candidate": ["b"] * 3})
    assert r["verdict"] == "PASS" and r["nondeterministic_arms"] == []
    r = determinism_v1({"control": ["a"] * 3, "candidate": ["b", "c", "b"]})
    assert r["verdict"] == "STOP" and r["nondeterministic_arms"] == ["candidate"]
    assert r["arms"]["candidate"]["distinct_hashes"] == ["b", "c"]
    assert r["arms"]["control"]["deterministic"] is True
    assert determinism_v1({"control": ["a"], "candidate": ["b", "b"]})["verdict"] == "STOP"
    assert determinism_v1({})["verdict"] == "STOP"


# ---------------------------------------------------------------- boundary-v1

def case(arm, name, correct=True, finish="stop"):
    return {"arm": arm, "case": name, "correct": correct, "finish_reason": finish,
            "expected": "173\n284", "text": "173\n284" if correct else "173\n2849"}


def test_boundary_pass():
    r = boundary_v1([case(a, n) for a in ("control", "candidate") for n in ("32k", "tail-16")])
    assert r["verdict"] == "PASS" and r["candidate_failures"] == []
    assert r["identical_text_cases"] == ["32k", "tail-16"]


def test_boundary_candidate_failure_fails():
    r = boundary_v1([case("control", "tail-16"), case("candidate", "tail-16", correct=False)])
    assert r["verdict"] == "FAIL"
    assert [f["case"] for f in r["candidate_failures"]] == ["tail-16"]


def test_boundary_needs_natural_eos():
    r = boundary_v1([case("candidate", "tail-16", finish="length")])
    assert r["verdict"] == "FAIL"


def test_boundary_control_failure_never_excuses_candidate():
    # both fail the same case (the capacity tail): still FAIL
    r = boundary_v1([case("control", "tail-16", correct=False),
                     case("candidate", "tail-16", correct=False)])
    assert r["verdict"] == "FAIL"
    assert len(r["control_failures"]) == 1
    # control alone failing: candidate passes, control failure reported beside
    r = boundary_v1([case("control", "tail-16", correct=False), case("candidate", "tail-16")])
    assert r["verdict"] == "PASS"
    assert [f["case"] for f in r["control_failures"]] == ["tail-16"]
    assert any("control tail-16" in x for x in r["reasons"])


def test_boundary_no_candidate_cases_is_inconclusive():
    assert boundary_v1([case("control", "x")])["verdict"] == "INCONCLUSIVE"


def refused(arm, name):
    body = "HTTP 400: This model's maximum context length is 512 tokens"
    return {**case(arm, name, correct=False, finish=None), "text": "", "config_error": body}


def test_boundary_config_error_is_inconclusive_not_fail():
    # a length the server refuses is the configuration's fault, never the model's
    r = boundary_v1([case("control", "tail-16"), case("candidate", "tail-16"),
                     refused("control", "retrieval-1.05"), refused("candidate", "retrieval-1.05")])
    assert r["verdict"] == "INCONCLUSIVE"
    assert r["candidate_failures"] == [] and r["control_failures"] == []
    assert [e["case"] for e in r["config_errors"]] == ["retrieval-1.05", "retrieval-1.05"]
    assert r["reasons"][0].startswith("configuration error: control retrieval-1.05")
    assert "maximum context length is 512" in r["reasons"][0]
    # a control-only refusal also leaves the comparison incomplete
    assert boundary_v1([case("candidate", "tail-16"), refused("control", "x")])["verdict"] == "INCONCLUSIVE"
    # without the refused case the same set passes: the refusal alone made it INCONCLUSIVE
    assert boundary_v1([case("control", "tail-16"), case("candidate", "tail-16")])["verdict"] == "PASS"


def test_boundary_real_candidate_failure_still_fails_beside_a_config_error():
    r = boundary_v1([case("candidate", "tail-16", correct=False), refused("candidate", "retrieval-1.05")])
    assert r["verdict"] == "FAIL"
    assert [f["case"] for f in r["candidate_failures"]] == ["tail-16"]


# ------------------------------------------------------------------- win2-v1

def series(primary, guard=None, reported=None):
    s = {"rate": primary}
    if guard is not None:
        s["decode_tps"] = guard
    if reported is not None:
        s["ttft_s"] = reported
    return s


STEADY_GUARD = [(50.0, 50.0, 50.2), (50.1, 50.1, 50.0), (50.0, 50.05, 50.1)]


def test_win2_win():
    s = series([(100, 110, 100), (101, 112, 99), (99, 109, 101)], STEADY_GUARD)
    r = win2_v1(s, primary="rate", guards=["decode_tps"], reported=[])
    assert r["rule"] == "win2-v1" and r["verdict"] == "WIN", r["reasons"]
    assert r["primary"]["point_gain_pct"] == pytest.approx(100 * (331 / 3 - 100) / 100)
    assert r["primary"]["t_interval"]["lo"] > 0
    # spread beside the bar: repeat 2 has |101-99| / 100 = 2 %
    assert r["primary"]["max_control_spread_pct"] == pytest.approx(2.0)
    assert any("2.0 %" in x and "spread" in x for x in r["reasons"])


def test_win2_no_win_interval_includes_zero():
    s = series([(100, 130, 100), (100, 80, 100), (100, 112, 100)])
    r = win2_v1(s, primary="rate")
    assert r["primary"]["point_gain_pct"] > 2.0  # gain above the bar...
    assert r["primary"]["t_interval"]["lo"] < 0 < r["primary"]["t_interval"]["hi"]  # ...but not shown
    assert r["verdict"] == "NO_WIN"


def test_win2_no_win_significant_but_below_bar():
    s = series([(100, 101, 100), (100, 101.1, 100), (100, 100.9, 100)])
    r = win2_v1(s, primary="rate")
    assert r["primary"]["t_interval"]["lo"] > 0
    assert r["verdict"] == "NO_WIN"


def test_win2_guard_loss_overrides_primary_win():
    guard = [(50.0, 48.0, 50.2), (50.1, 48.5, 50.0), (50.0, 50.05, 50.1)]  # worse in 2 of 3
    s = series([(100, 110, 100), (101, 112, 99), (99, 109, 101)], guard)
    r = win2_v1(s, primary="rate", guards=["decode_tps"])
    assert r["verdict"] == "LOSS"
    assert r["guards"]["decode_tps"]["repeats_worse_than_spread"] == 2
    assert any("guard decode_tps" in x for x in r["reasons"])


def test_win2_guard_worse_once_is_not_loss():
    guard = [(50.0, 48.0, 50.2), (50.1, 50.1, 50.0), (50.0, 50.05, 50.1)]
    s = series([(100, 110, 100), (101, 112, 99), (99, 109, 101)], guard)
    r = win2_v1(s, primary="rate", guards=["decode_tps"])
    assert r["verdict"] == "WIN"
    assert r["guards"]["decode_tps"]["guard_verdict"] == "OK"


def test_win2_guard_cannot_cause_win():
    guard = [(50.0, 60.0, 50.0)] * 3  # hugely better guard, flat primary
    s = series([(100, 100, 100), (100, 100.5, 100), (100, 99.5, 100)], guard)
    assert win2_v1(s, primary="rate", guards=["decode_tps"])["verdict"] == "NO_WIN"


def test_win2_reported_never_decides():
    reported = [(1.0, 2.0, 1.0), (1.0, 2.1, 1.0), (1.0, 1.9, 1.0)]  # ttft doubled
    s = series([(100, 110, 100), (101, 112, 99), (99, 109, 101)], reported=reported)
    r = win2_v1(s, primary="rate", reported=["ttft_s"], lower_is_better={"ttft_s"})
    assert r["verdict"] == "WIN"
    assert r["reported"]["ttft_s"]["verdict"] == "LOSS"


def test_win2_lower_is_better_primary():
    s = {"ms_per_round": [(10.0, 9.0, 10.0), (10.1, 9.1, 9.9), (9.9, 8.9, 10.1)]}
    r = win2_v1(s, primary="ms_per_round", lower_is_better={"ms_per_round"})
    assert r["verdict"] == "WIN"
    assert r["primary"]["point_gain_pct"] == pytest.approx(10.0)
    r = win2_v1(s, primary="ms_per_round")  # read as higher-is-better it is a 10 % loss
    assert r["verdict"] == "LOSS"


def test_win2_inconclusive_on_clock_caps_or_throttle():
    s = series([(100, 110, 100), (101, 112, 99), (99, 109, 101)])
    assert win2_v1(s, primary="rate", clock_caps=[2300, 2300, 2300])["verdict"] == "WIN"
    r = win2_v1(s, primary="rate", clock_caps=[2300, 2150, 2300])
    assert r["verdict"] == "INCONCLUSIVE"
    assert any("clock caps" in x for x in r["reasons"])
    assert win2_v1(s, primary="rate", clock_caps=[2150] * 3,
                   expected_clock_cap=2300)["verdict"] == "INCONCLUSIVE"
    assert win2_v1(s, primary="rate", throttled=True)["verdict"] == "INCONCLUSIVE"


def test_win2_bar_change_is_visible_and_input_checked():
    s = series([(100, 101, 100), (100, 101.1, 100), (100, 100.9, 100)])
    r = win2_v1(s, primary="rate", win_pct=0.5)
    assert r["verdict"] == "WIN"
    assert r["deviations"] == {"win_pct": {"registered": 2.0, "used": 0.5}}
    with pytest.raises(ValueError):
        win2_v1({"rate": [(1, 2)]}, primary="rate")
    with pytest.raises(ValueError):
        win2_v1({"rate": [(1, 2, 3)]}, primary="rate", guards=["missing"])
    assert win2_v1({"rate": [(1, 2, 1)]}, primary="rate")["verdict"] == "INCONCLUSIVE"


def test_win2_guard_loss_keeps_the_two_of_three_fraction_for_other_repeat_counts():
    win = [(100, 110, 100), (101, 112, 99), (99, 109, 101), (100, 110, 100), (100, 111, 100)]
    bad, ok = (50.0, 40.0, 50.0), (50.0, 50.0, 50.0)
    # R=5: ceil(2 * 5 / 3) = 4 repeats needed; 3 worse is not a LOSS, 4 is
    r = win2_v1({"rate": win, "decode_tps": [bad, bad, bad, ok, ok]}, primary="rate", guards=["decode_tps"])
    assert r["guard_loss_needed"] == 4 and r["verdict"] == "WIN"
    r = win2_v1({"rate": win, "decode_tps": [bad, bad, bad, bad, ok]}, primary="rate", guards=["decode_tps"])
    assert r["verdict"] == "LOSS"
    # R=2: both repeats must be worse
    r = win2_v1({"rate": win[:2], "decode_tps": [bad, ok]}, primary="rate", guards=["decode_tps"])
    assert r["guard_loss_needed"] == 2 and r["verdict"] != "LOSS"
    r = win2_v1({"rate": win[:2], "decode_tps": [bad, bad]}, primary="rate", guards=["decode_tps"])
    assert r["verdict"] == "LOSS"


def test_win2_clock_caps_as_fact_dicts_compare_by_content():
    s = series([(100, 110, 100), (101, 112, 99), (99, 109, 101)])
    a = {"governor": "performance", "gpu0.clocks.max.sm": "2300"}
    b = {"gpu0.clocks.max.sm": "2300", "governor": "performance"}  # same facts, other order
    assert win2_v1(s, primary="rate", clock_caps=[a, b, a])["verdict"] == "WIN"
    c = {**a, "gpu0.clocks.max.sm": "2150"}
    r = win2_v1(s, primary="rate", clock_caps=[a, c, a])
    assert r["verdict"] == "INCONCLUSIVE"
    assert win2_v1(s, primary="rate", clock_caps=[a, a, a], expected_clock_cap=b)["verdict"] == "WIN"
    assert win2_v1(s, primary="rate", clock_caps=[a, a, a], expected_clock_cap=c)["verdict"] == "INCONCLUSIVE"


# -------------------------------------------------------------- promotion-v1

def g(v):
    return {"rule": "x", "verdict": v, "reasons": [f"because {v}"]}


def test_promotion_all_pass():
    r = promotion_v1({"quality_gsm8k": g("PASS"), "grid": g("PASS"), "boundary": g("PASS"),
                      "speed": g("WIN")})
    assert r["verdict"] == "PROMOTE" and r["not_evaluated"] == []
    assert len(r["reasons"]) == 4


@pytest.mark.parametrize("bad", ["FAIL", "LOSS"])
def test_promotion_fail_rejects_even_with_missing_and_hold(bad):
    r = promotion_v1({"a": g("PASS"), "b": None, "c": g("HOLD"), "d": g(bad), "e": g("INVALID")})
    assert r["verdict"] == "REJECT"
    assert r["rejecting"] == ["d"] and r["not_evaluated"] == ["b"]
    assert len(r["reasons"]) == 5


@pytest.mark.parametrize("v", ["HOLD", "STOP", "NO_WIN"])
def test_promotion_hold(v):
    r = promotion_v1({"a": g("PASS"), "b": g(v)})
    assert r["verdict"] == "HOLD" and r["holding"] == ["b"]
    # a HOLD finding stands even if another gate is missing
    assert promotion_v1({"a": None, "b": g(v)})["verdict"] == "HOLD"


@pytest.mark.parametrize("gates", [
    {"a": g("PASS"), "b": None},
    {"a": g("PASS"), "b": g("INVALID")},
    {"a": g("WIN"), "b": g("INCONCLUSIVE")},
    {"a": g("PASS"), "b": {"rule": "x"}},            # no verdict at all
    {"a": g("PASS"), "b": g("MAYBE")},               # unknown verdict
    {},
])
def test_promotion_incomplete_is_inconclusive_never_promote(gates):
    r = promotion_v1(gates)
    assert r["verdict"] == "INCONCLUSIVE"


def test_promotion_names_missing_gates():
    r = promotion_v1({"quality": g("PASS"), "speed": None, "boundary": None})
    assert r["not_evaluated"] == ["speed", "boundary"]
    assert "speed: not evaluated" in r["reasons"]


@pytest.mark.parametrize("v", ["WIN", "NO_WIN", "INCONCLUSIVE"])
def test_promotion_informational_speed_never_gates_unless_loss(v):
    info = {**g(v), "informational": True}
    r = promotion_v1({"quality": g("PASS"), "speed": info})
    assert r["verdict"] == "PROMOTE" and r["informational"] == ["speed"]
    assert r["gates"]["speed"]["outcome"] == "INFORMATIONAL"
    # a HOLD elsewhere still holds; informational does not lift anything
    assert promotion_v1({"quality": g("HOLD"), "speed": info})["verdict"] == "HOLD"
    # only informational gates: nothing decided
    assert promotion_v1({"speed": info})["verdict"] == "INCONCLUSIVE"


def test_promotion_informational_loss_still_rejects():
    r = promotion_v1({"quality": g("PASS"), "speed": {**g("LOSS"), "informational": True}})
    assert r["verdict"] == "REJECT" and r["rejecting"] == ["speed"]
    # "informational" must be literally true: a truthy string is not an opt-out
    r = promotion_v1({"quality": g("PASS"), "speed": {**g("INCONCLUSIVE"), "informational": "yes"}})
    assert r["verdict"] == "INCONCLUSIVE"


def test_grid_step_inside_fp32_noise_is_not_a_grid():
    # Near-zero values have tiny FP32 tolerances, so a 2^-20 gap there is
    # "positive"; but the -20.x values carry ~5e-6 of FP32 error, so with a
    # 2^-20 step every gap (even the 0.3 one) would look on grid. The step
    # must stand clear of the noise, else it is a fine-GCD rescue in disguise.
    top = [[1, -2.0 ** -10], [2, -2.0 ** -10 - 2.0 ** -20], [3, -20.0], [4, -20.3]]
    r = grid_tie_probe(probe(top, cand=1, ctrl=2))
    assert r["min_positive_gap"] == 2.0 ** -20 and r["step_resolvable"] is False
    assert r["verdict"] == "STOP"
    assert "grid_step_power_of_two" in r["failed_clauses"]


# ------------------------------------------- grid-tie-v1: evidence, counts, audit
#
# Known answers for the clauses that make grid-tie-v1 the registered rule:
# unrounded FP32 evidence, full top lists, "nothing compared" as its own
# outcome, and the divergent-prompt cap over the whole audit.

def test_grid_real_bf16_top20_rounded_to_4_decimals_stops_on_unrounded_fp32():
    # The 0.5-step top-20 of test_grid_seed000..., rounded as a decimal
    # diagnostic would store it: the 0.5 gaps survive and every other clause
    # passes, so only the new clause can stop it.
    top = served_top({t: 100.0 - 0.5 * t for t in range(20)})
    assert grid_tie_probe(probe(top, cand=0, ctrl=1))["verdict"] == "PASS"
    rounded = [[t, round(v, 4)] for t, v in top]
    r = grid_tie_probe(probe(rounded, cand=0, ctrl=1))
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["unrounded_fp32"], r["reasons"]
    assert r["all_values_fp32_exact"] is False
    assert any("rounded artifacts cannot pass" in x for x in r["reasons"])
    # rounded, then stored as float32 again: FP32-exact, but still 4-decimal values
    recast = [[t, f32(v)] for t, v in rounded]
    r = grid_tie_probe(probe(recast, cand=0, ctrl=1))
    assert r["all_values_fp32_exact"] is True
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["unrounded_fp32"]
    assert r["rounded_lists"] == ["candidate_top", "control_top"]


def test_grid_fp32_exact_values_all_at_4_decimals_stop():
    # A 0.125 grid at -1, -1.125, ...: FP32-exact and on-grid, but a whole list
    # of short decimals is what rounding leaves, never what log_softmax serves.
    top = [[k, -1.0 - 0.125 * k] for k in range(20)]
    r = grid_tie_probe(probe(top, cand=0, ctrl=1))
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["unrounded_fp32"]
    # the same grid under a served-looking log-partition passes
    served = [[k, f32(-1 / 3 - 0.125 * k)] for k in range(20)]
    assert grid_tie_probe(probe(served, cand=0, ctrl=1))["verdict"] == "PASS"


def test_grid_one_non_fp32_value_stops_naming_its_token():
    top = served_top(one_binade())
    tid, v = top[7]
    top[7] = [tid, v + 1e-9]  # float64 noise: no FP32 server serves this
    r = grid_tie_probe(probe(top, cand=7, ctrl=9, control_top=served_top(one_binade())))
    assert r["verdict"] == "STOP" and "unrounded_fp32" in r["failed_clauses"]
    assert any(f"tokens [{tid}]" in x and "not FP32-exact" in x for x in r["reasons"])
    # control evidence counts too
    r = grid_tie_probe(probe(served_top(one_binade()), cand=7, ctrl=9, control_top=top))
    assert r["failed_clauses"] == ["unrounded_fp32"] and r["control_values_fp32_exact"] is False


def test_grid_short_top_list_stops_as_sparse():
    # A 2-entry list one grid step apart passed before: the all-pairs clause
    # had one gap to check.
    top = [[7, f32(-1 / 3)], [9, f32(-1 / 3 - 0.125)]]
    r = grid_tie_probe(probe(top, cand=7, ctrl=9))
    assert r["verdict"] == "STOP" and r["failed_clauses"] == ["full_top_list"]
    assert r["required_top_len"] == 20
    assert any("sparse" in x and "2 entries" in x for x in r["reasons"])
    # a vocabulary of 2 has nothing more to give: the list is full
    r = grid_tie_probe({**probe(top, cand=7, ctrl=9), "vocab_size": 2})
    assert r["verdict"] == "PASS", r["reasons"]
    # a full candidate list with a short control list is still sparse evidence
    full = served_top(one_binade())
    r = grid_tie_probe(probe(full, cand=7, ctrl=9, control_top=full[:19]))
    assert r["failed_clauses"] == ["full_top_list"]
    assert any("control_top has 19 entries" in x for x in r["reasons"])


def test_grid_nothing_compared_is_its_own_outcome():
    out = grid_tie_v1([], selected=0, compared=0)
    assert out["verdict"] == "INCONCLUSIVE" and out["nothing_compared"] is True
    assert "nothing compared: 0 selected, 0 compared" in out["reasons"][-1]
    out = grid_tie_v1([])  # counts unknown, no probe: nothing shown compared
    assert out["verdict"] == "INCONCLUSIVE" and "? selected, ? compared" in out["reasons"][-1]
    # probes alone show a comparison happened
    p = probe(served_top(one_binade()), cand=7, ctrl=9)
    assert grid_tie_v1([p])["verdict"] == "PASS"
    # an item that could not be compared is a probe without evidence: STOP, not INCONCLUSIVE
    unresolved = {"index": 4, "control_token_id": None, "candidate_token_id": None, "candidate_top": None,
                  "control_top": None, "control_prefix_len": None, "candidate_prefix_len": None}
    assert grid_tie_v1([unresolved], selected=1, compared=0)["verdict"] == "STOP"
    with pytest.raises(ValueError, match="compared 3 > selected 2"):
        grid_tie_v1([], selected=2, compared=3)
    with pytest.raises(ValueError, match="only 0 items selected"):
        grid_tie_v1([p], selected=0, compared=0)


def flips(n, start=0):
    return [probe(served_top(one_binade(seed=start + k)), cand=7, ctrl=9, index=start + k) for k in range(n)]


def dataset_record(n_flips, *, selected=None, compared=None, start=0, **kw):
    selected = n_flips + 2 if selected is None else selected
    compared = selected if compared is None else compared
    return grid_tie_v1(flips(n_flips, start), selected=selected, compared=compared, **kw)


def test_grid_audit_caps_divergent_prompts_over_all_datasets():
    # Three datasets, three passing flips each: every dataset PASSes its own
    # cap, but the audit has nine divergent prompts and STOPs.
    per = {ds: dataset_record(3, start=10 * k) for k, ds in enumerate(("a", "b", "c"))}
    assert all(r["verdict"] == "PASS" for r in per.values())
    out = grid_tie_audit(per)
    assert out["rule"] == "grid-tie-v1" and out["scope"] == "audit"
    assert out["verdict"] == "STOP" and out["failed_clauses"] == ["at_most_3_divergent"]
    assert out["n_divergent"] == 9 and out["clauses"]["at_most_3_divergent"] is False
    assert any("9 divergent prompts over the audit (a 3, b 3, c 3) > 3" in x for x in out["reasons"])
    assert promotion_v1({"grid_tie": out})["verdict"] == "HOLD"
    # one flip in each of three datasets is three over the audit: PASS
    per = {ds: dataset_record(1, start=10 * k) for k, ds in enumerate(("a", "b", "c"))}
    out = grid_tie_audit(per)
    assert out["verdict"] == "PASS", out["reasons"]
    assert (out["selected"], out["compared"], out["n_divergent"]) == (9, 9, 3)
    assert out["datasets"]["b"] == {"selected": 3, "compared": 3, "n_divergent": 1, "recorded_verdict": "PASS",
                                    "probe_verdicts": {"10": "PASS"}}


def test_grid_audit_two_and_two_is_four():
    out = grid_tie_audit({"a": dataset_record(2), "b": dataset_record(2, start=20)})
    assert out["verdict"] == "STOP" and out["failed_clauses"] == ["at_most_3_divergent"]
    loose = grid_tie_audit({"a": dataset_record(2, max_divergent=4), "b": dataset_record(2, start=20,
                                                                                         max_divergent=4)})
    assert loose["verdict"] == "PASS"
    assert loose["deviations"] == {"max_divergent": {"registered": 3, "used": 4}}
    with pytest.raises(ValueError, match="different max_divergent"):
        grid_tie_audit({"a": dataset_record(1, max_divergent=4), "b": dataset_record(1, start=20)})


def test_grid_audit_empty_selection_cannot_pass():
    per = {"a": grid_tie_v1([], selected=0, compared=0), "b": grid_tie_v1([], selected=0, compared=0)}
    out = grid_tie_audit(per)
    assert out["verdict"] == "INCONCLUSIVE" and out["nothing_compared"] is True
    assert "nothing compared: 0 items selected, 0 compared over 2 dataset(s)" in out["reasons"][-1]
    assert "greedy selection is empty" in out["reasons"][-1]
    # one dataset with an empty selection beside one that compared items: PASS
    per["b"] = grid_tie_v1([], selected=3, compared=3)
    out = grid_tie_audit(per)
    assert out["verdict"] == "PASS" and (out["selected"], out["compared"]) == (3, 3)


def test_grid_audit_counts_from_the_artifact_and_missing_datasets():
    legacy = {"a": grid_tie_v1([]), "b": grid_tie_v1([])}  # records without counts
    out = grid_tie_audit(legacy)
    assert out["verdict"] == "INCONCLUSIVE" and out["counts_unrecorded_datasets"] == ["a", "b"]
    out = grid_tie_audit(legacy, counts={"a": {"selected": 2, "compared": 2}, "b": {"selected": 1, "compared": 1}})
    assert out["verdict"] == "PASS" and out["compared"] == 3 and out["counts_unrecorded_datasets"] == []
    # a dataset whose divergence never ran is named, and the audit cannot pass
    out = grid_tie_audit({"a": dataset_record(1), "b": None})
    assert out["verdict"] == "INCONCLUSIVE" and out["not_evaluated_datasets"] == ["b"]
    assert any("not evaluated for datasets ['b']" in x for x in out["reasons"])
    # a STOP found elsewhere still stands
    bad = grid_tie_v1([probe(served_top(one_binade(30.875, 31.0)), cand=7, ctrl=9)], selected=3, compared=3)
    out = grid_tie_audit({"a": bad, "b": None})
    assert out["verdict"] == "STOP" and out["failed_clauses"] == ["candidate_token_is_top"]
    assert any(x.startswith("a index 0: STOP") for x in out["reasons"])


def test_grid_audit_reevaluates_records_made_under_an_older_rule():
    # A record stored as PASS on rounded, short evidence (what the rule used to
    # accept) cannot carry its PASS into the decision.
    top = [[t, round(v, 4)] for t, v in served_top({t: 100.0 - 0.5 * t for t in range(20)})][:2]
    old = grid_tie_v1([probe(top, cand=0, ctrl=1)], selected=3, compared=3)
    old["verdict"] = "PASS"
    old["probes"][0]["verdict"] = "PASS"
    out = grid_tie_audit({"a": old})
    assert out["verdict"] == "STOP"
    assert set(out["failed_clauses"]) == {"full_top_list", "unrounded_fp32"}
    assert out["datasets"]["a"]["recorded_verdict"] == "PASS"
    with pytest.raises(ValueError, match="grid-tie-v1"):
        grid_tie_audit({"a": {"rule": "quality-v1", "verdict": "PASS"}})


# ------------------------------------------------- quality-v1: detectable loss

def test_quality_states_its_minimum_detectable_loss_without_changing_the_verdict():
    t = make_table(control_only=2, candidate_only=2)  # n = 17, 4 discordant
    r = quality_v1(t)
    assert r["verdict"] == "PASS"
    m = r["mde"]
    assert m == minimum_detectable_loss(17, 4)
    assert m["net_loss"] is not None and m["power"] >= 0.8 and m["target_power"] == 0.8
    assert r["reasons"][-1].startswith("detectable: at alpha 0.05 and power 80 %")
    assert f"a net loss of {m['net_loss']} items" in r["reasons"][-1]
    # too few items for any loss to be found: said in words
    tiny = quality_v1(make_table(control_only=0, candidate_only=0, both=3, neither=1))
    assert tiny["verdict"] == "PASS" and tiny["mde"]["net_loss"] is None
    assert "this table cannot show a loss" in tiny["reasons"][-1]


def test_quality_mde_follows_the_rule_parameters():
    t = make_table(control_only=3, candidate_only=1, both=60, neither=10)
    base = quality_v1(t)["mde"]["net_loss"]
    assert quality_v1(t, max_net_loss=2)["mde"]["net_loss"] >= base  # a looser bar hides as much or more
    assert quality_v1(t, max_net_loss=10)["mde"]["net_loss"] > base
    assert quality_v1(t, alpha=0.01)["mde"]["net_loss"] > base


# ---------------------------------------------- promotion-v1: identical arms

def test_promotion_identical_arms_are_no_change_under_audit():
    gates = {"quality": g("PASS"), "grid": g("PASS"), "speed": g("WIN")}
    r = promotion_v1(gates, identical_arms=True)
    assert r["verdict"] == "INCONCLUSIVE" and r["no_change"] is True and r["gate_verdict"] == "PROMOTE"
    assert r["reasons"][0].startswith("no change under audit")
    # not even a REJECT: there is no change to reject
    r = promotion_v1({"quality": g("FAIL")}, identical_arms=True)
    assert r["verdict"] == "INCONCLUSIVE" and r["gate_verdict"] == "REJECT"
    # only a literal True opts in; the default decides by the gates
    assert promotion_v1(gates, identical_arms="yes")["verdict"] == "PROMOTE"
    assert promotion_v1(gates)["no_change"] is False


# ------------------------------------------------- boundary: the capacity tail

def test_boundary_required_cases_and_schema_refuses_a_config_without_the_tail():
    res = boundary_v1([{"arm": "candidate", "case": c, "correct": True, "finish_reason": "stop",
                        "expected": "1", "text": "1"} for c in ("retrieval-0.5", "tail-32")])
    assert res["verdict"] == "PASS" and boundary_missing_cases(res) == ["tail-16"]
    res["candidate_cases"].append("tail-16")
    assert boundary_missing_cases(res) == []

    import copy
    from pathlib import Path

    import yaml
    from snakemake.utils import validate
    from snakemake_interface_common.exceptions import WorkflowError

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "tests" / "data" / "tiny_config.yaml").read_text())
    schema = str(root / "config" / "schema.yaml")
    validate(copy.deepcopy(cfg), schema)
    for offsets in ([], [32], [8, 32]):
        bad = copy.deepcopy(cfg)
        bad["boundary"]["tail_offsets"] = offsets
        with pytest.raises(WorkflowError, match="tail_offsets"):
            validate(bad, schema)
    ok = copy.deepcopy(cfg)
    ok["boundary"]["tail_offsets"] = [32, 16, 64]
    validate(ok, schema)
    # the default (no tail_offsets given) is filled with [16, 32]
    dflt = copy.deepcopy(cfg)
    del dflt["boundary"]["tail_offsets"]
    validate(dflt, schema)
    assert dflt["boundary"]["tail_offsets"] == [16, 32]


# ------------------------------------------------------------------ quality-v2

def test_tango_bound_known_answers():
    from pairaudit.core.stats import loss_upper_bound

    # Fagerland, Lydersen & Laake (2014), the paired example (n = 21, b = 1, c = 7): Tango's 95 % score
    # interval of p12 - p21 is (-0.517, -0.026); its ends are the one-sided 97.5 % bounds
    assert loss_upper_bound(1, 7, 21, 0.975) == pytest.approx(-0.0260, abs=5e-4)
    assert -loss_upper_bound(7, 1, 21, 0.975) == pytest.approx(-0.5172, abs=5e-4)
    # no discordant item: the bound solves n d / (1 - d) = z^2, d = z^2 / (n + z^2)
    z = 1.6448536269514722
    assert loss_upper_bound(0, 0, 60, 0.95) == pytest.approx(z * z / (60 + z * z), rel=1e-6)


def test_tango_restricted_mle_is_the_numerical_maximum():
    """The closed-form nuisance estimate is the likelihood's maximum under loss = delta (checked numerically)."""
    import math

    from scipy import optimize

    from pairaudit.core import stats

    for b, c, n, d in ((3, 4, 60, 0.05), (6, 4, 32, 0.2), (0, 5, 40, 0.1), (10, 0, 50, 0.3)):
        m = n - b - c

        def nll(q):
            return -(b * math.log(q + d) + c * math.log(q) + m * math.log(1 - 2 * q - d))

        best = optimize.minimize_scalar(nll, bounds=(1e-12, (1 - d) / 2 - 1e-12), method="bounded",
                                        options={"xatol": 1e-12}).x
        z = (b - c - n * d) / math.sqrt(n * (2 * best + d * (1 - d)))
        assert float(stats.tango_score(b, c, n, d)) == pytest.approx(z, rel=1e-5)


def test_quality_v2_sixty_items_net_plus_one_and_two_is_inconclusive_with_the_items_needed():
    """The GPU audit's tables: 60 items, net +1 and +2 -- quality-v1 passed both; v2 cannot rule out its margin."""
    from pairaudit.core.stats import noninferiority_items

    for co, ko in ((3, 4), (2, 4)):
        t = make_table(control_only=co, candidate_only=ko, both=30, neither=60 - 30 - co - ko)
        assert quality_v1(t)["verdict"] == "PASS"
        r = quality_v2(t, datasets=2)
        assert r["rule"] == "quality-v2" and r["verdict"] == "INCONCLUSIVE"
        assert r["loss_bound"]["level"] == pytest.approx(0.975) and r["loss_bound"]["upper_pct"] > 3.0
        want = noninferiority_items(0.03, (co + ko) / 60, level=0.975)["items"]
        assert r["needed"]["items"] == want and want > 60
        assert r["reasons"][0].startswith(f"cannot rule out a loss of {r['loss_bound']['upper_pct']:.1f} points "
                                          f"with 60 items; about {want} items would")


def test_quality_v2_a_large_audit_with_a_small_loss_passes():
    t = make_table(control_only=40, candidate_only=30, both=600, neither=330)   # 1000 items, loss 1 point
    r = quality_v2(t, datasets=2)
    assert r["verdict"] == "PASS" and r["loss_bound"]["ruled_out"] is True
    assert 1.0 < r["loss_bound"]["upper_pct"] < 3.0
    assert r["reasons"][0].startswith(f"loss >= {r['loss_bound']['upper_pct']:.1f} points ruled out at 97.5 %")
    # the same loss on 100 items rules nothing out
    small = quality_v2(make_table(control_only=4, candidate_only=3, both=60, neither=33), datasets=2)
    assert small["verdict"] == "INCONCLUSIVE"


def test_quality_v2_a_significant_loss_fails_and_a_significant_loss_within_the_margin_passes():
    r = quality_v2(make_table(control_only=12, candidate_only=0, both=30, neither=18))
    assert r["verdict"] == "FAIL" and r["mcnemar_p"] < 0.05 and "candidate worse" in r["reasons"][0]
    # 20,000 items, loss 1 point, significant, bound below 3: the margin accepts it (said so)
    big = quality_v2(make_table(control_only=400, candidate_only=200, both=15000, neither=4400))
    assert big["mcnemar_p"] < 1e-6 and big["verdict"] == "PASS"
    assert any("significant" in x for x in big["reasons"])


def test_quality_v2_invalid_and_parameters():
    assert quality_v2(make_table(1, 1, unnatural={"candidate": (0,)}))["verdict"] == "INVALID"
    t = make_table(control_only=2, candidate_only=2, both=200, neither=96)
    r = quality_v2(t)
    assert r["deviations"] == {} and r["multiplicity"] == {"method": "bonferroni", "datasets": 1,
                                                           "family_level": 0.95, "per_dataset_level": 0.95}
    wide = quality_v2(t, margin_pct=10.0)
    assert wide["deviations"] == {"margin_pct": {"registered": 3.0, "used": 10.0}}
    # Bonferroni: more datasets, each bound higher
    b1, b3 = quality_v2(t, datasets=1)["loss_bound"], quality_v2(t, datasets=3)["loss_bound"]
    assert b3["level"] == pytest.approx(1 - 0.05 / 3) and b3["upper_pct"] > b1["upper_pct"]
    with pytest.raises(ValueError):
        quality_v2(t, datasets=0)


def test_quality_v2_pass_is_exactly_the_bound_below_the_margin():
    from pairaudit.core.stats import loss_upper_bound

    for n, b, c in ((200, 5, 5), (300, 3, 1), (150, 0, 0), (400, 12, 6), (1000, 30, 25)):
        t = make_table(control_only=b, candidate_only=c, both=n - b - c, neither=0)
        r = quality_v2(t)
        assert (r["verdict"] == "PASS") == (loss_upper_bound(b, c, n, 0.95) < 0.03), (n, b, c)


def test_the_default_audits_margin_is_the_smallest_its_32_items_resolve_and_its_measured_tables():
    """config/config.yaml's margin (docs/default-audit.md): 32 items reach power 0.8 at discordance 0.25 for
    27 points, not 26; on the measured default tables both datasets rule 27 out, algebra by 0.6 points."""
    from pathlib import Path

    import yaml

    from pairaudit.core.stats import noninferiority_items

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    q = cfg["rules"]["quality"]
    assert q["rule"] == "quality-v2" and q["margin_pct"] == 27.0
    assert noninferiority_items(0.27, 0.25, level=0.975)["items"] <= 32 < noninferiority_items(0.26, 0.25,
                                                                                               level=0.975)["items"]
    arith = quality_v2(make_table(control_only=2, candidate_only=6, both=8, neither=16), margin_pct=27.0, datasets=2)
    algebra = quality_v2(make_table(control_only=6, candidate_only=4, both=6, neither=16), margin_pct=27.0,
                         datasets=2)
    assert arith["verdict"] == algebra["verdict"] == "PASS"
    assert round(arith["loss_bound"]["upper_pct"], 1) == 5.6 and round(algebra["loss_bound"]["upper_pct"], 1) == 26.4
    assert arith["reasons"][0].startswith("loss >= 5.6 points ruled out at 97.5 %")
    assert arith["deviations"] == {"margin_pct": {"registered": 3.0, "used": 27.0}}
    # at the registered margin the same tables rule nothing out
    assert quality_v2(make_table(control_only=6, candidate_only=4, both=6, neither=16), datasets=2)["verdict"] == \
        "INCONCLUSIVE"
