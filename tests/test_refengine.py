"""Pure parts of the reference engine: switches, n-gram drafting, sampling filters."""

from __future__ import annotations

import pytest
import torch

from pairaudit.refserver.engine import Engine, Request, SamplingParams, Switches, propose_ngram


def test_switches_parse_and_report():
    s = Switches.from_env({"PAIRAUDIT_REF_LM_HEAD_BF16": "1", "PAIRAUDIT_REF_SPEC_NGRAM": "4",
                           "PAIRAUDIT_REF_FAULT_NOISE": "0.5"})
    assert s.lm_head_bf16 and s.spec_ngram == 4 and s.fault_noise == 0.5 and s.fault_tail == 0
    assert s.as_env()["PAIRAUDIT_REF_SPEC_NGRAM"] == "4"
    assert Switches.from_env({}) == Switches()
    with pytest.raises(ValueError, match="PAIRAUDIT_REF_SPEC_NGRAM"):
        Switches.from_env({"PAIRAUDIT_REF_SPEC_NGRAM": "four"})
    with pytest.raises(ValueError, match="must be >= 0"):
        Switches.from_env({"PAIRAUDIT_REF_FAULT_TAIL": "-1"})


def test_ngram_proposes_the_continuation_of_the_latest_match():
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # suffix [1, 2, 3] last occurred at 6..8, followed by 7, 8
    assert propose_ngram(tokens, 2) == [7, 8]
    assert propose_ngram(tokens, 5) == [7, 8, 1, 2, 3]
    assert propose_ngram([5, 6, 7, 8], 3) == []  # no repeated suffix, no draft
    assert propose_ngram([4, 4], 3) == []  # a one-token match is too weak (n_min = 2)


def _engine_stub():
    eng = Engine.__new__(Engine)
    eng.eos = 0
    return eng


def test_sampling_filters_top_k_top_p_min_p():
    eng = _engine_stub()
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    req = Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=1.0, top_k=2))
    assert torch.count_nonzero(eng._probs(req, row)) == 2
    req.params = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.7)
    probs = eng._probs(req, row)
    assert probs[2] == 0 and probs[3] == 0 and probs[:2].sum() == pytest.approx(1.0)
    req.params = SamplingParams(max_tokens=1, temperature=1.0, min_p=0.5)
    probs = eng._probs(req, row)
    assert probs[1] > 0 and probs[2] == 0  # 0.15 < 0.5 * 0.5


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    eng = _engine_stub()
    req = Request(prompt=[1], params=SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(3,)))
    row = torch.zeros(5)
    masked = eng._processed(req, row)
    assert masked[0] == float("-inf") and masked[3] == float("-inf") and masked[1] == 0
    req.output = [1, 2]
    assert torch.equal(eng._processed(req, row), row)


def test_speculative_acceptance_keeps_the_target_distribution():
    # a deterministic draft d is accepted with probability p(d); on rejection the
    # token comes from p without d: overall P(token) must equal p
    eng = _engine_stub()
    p = torch.tensor([0.2, 0.5, 0.3])
    row = torch.log(p)
    counts = torch.zeros(3)
    for seed in range(4000):
        req = Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=1.0))
        req.generator = torch.Generator().manual_seed(seed)
        counts[eng._choose(req, row, draft=1)] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, p, atol=0.03)
