"""Differential conformance: the same API contract checks against real vLLM 0.32 and the reference server.

Each check (``pairaudit.serving.conformance``) sends the same requests to both
servers and reduces the answers to an *outcome* (status codes, shapes, the
decisive words of an error); the two outcomes must be equal, and equal to
vLLM 0.32's known answer, so a check that returned nothing useful on both
sides still fails.
The reference server follows vLLM 0.32 where releases differ (the context
limit and silent max_tokens clamping, the 128-character cache_salt, chat's
``message.reasoning``); these checks are how that claim is kept true.
"""

from __future__ import annotations

import pytest
from vllm_fixture import MML, MODEL

from pairaudit.serving import conformance

pytestmark = [pytest.mark.vllm, pytest.mark.server]


@pytest.fixture(scope="module")
def servers(vllm_pair, shared_server):
    return {"reference": conformance.Target(shared_server(None, MML).url, MODEL, MML),
            "vllm": conformance.Target(vllm_pair["fp32"].url, MODEL, MML)}


@pytest.mark.parametrize("name", list(conformance.CHECKS))
def test_same_outcome_on_real_vllm_and_the_reference_server(servers, name):
    outcomes = {server: conformance.run(target, [name])[name] for server, target in servers.items()}
    shown = conformance.dumps(outcomes)
    assert outcomes["vllm"] == outcomes["reference"], shown
    assert outcomes["vllm"] == conformance.known(MODEL, MML)[name], shown
