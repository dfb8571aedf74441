"""pairaudit.serving.preflight: one test per failing probe (fake server), plus the real
reference server run (marker ``server``) that shows the probes pass where they
should.
"""

import importlib.util
import socket

import pytest

from pairaudit.serving.client import Endpoint
from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.preflight import PreflightError, probe_names, require_pass, run_preflight


def arm(speculative=False, max_model_len=256):
    # the spec of an attached arm: the probes read its served name, context and speculation
    return resolve_spec("candidate", {"mode": "attach", "url": "http://fake-server", "model": "fake-model",
                                      "max_model_len": max_model_len, "speculative": speculative})


def assert_failed_at(result, name):
    assert result["schema"] == "pairaudit.preflight/v1"
    assert result["verdict"] == "FAIL" and result["failed_probe"] == name
    names = [p["name"] for p in result["probes"]]
    order = probe_names(result["speculative"])
    # fail fast: every probe before the failing one ran and passed, nothing after ran
    assert names == order[: order.index(name) + 1]
    assert all(p["pass"] for p in result["probes"][:-1]) and not result["probes"][-1]["pass"]
    with pytest.raises(PreflightError) as ei:
        require_pass(result)
    assert f"failed at probe {name!r}" in str(ei.value) and ei.value.result is result
    return result["probes"][-1]


@pytest.mark.parametrize("faults, spec_kw, probe, words", [
    (("never_healthy",), {}, "health", "503"),
    (("http500",), {}, "health", "internal boom"),
    (("wrong_model",), {}, "models", "does not list 'fake-model'"),
    (("wrong_len",), {}, "models", "max_model_len is 128, spec says 256"),
    (("no_len",), {}, "models", "no usable max_model_len"),
    (("tokenize_mismatch",), {}, "tokenize_roundtrip", "round trip changed the text"),
    (("logprobs_few",), {}, "completion_logprobs20", "19 top entries, need >= 20"),
    (("logprobs_str_keys",), {}, "completion_logprobs20", "keys not in token_id:N form"),
    (("no_prompt_logprobs",), {}, "prompt_logprobs", "prompt_logprobs missing"),
    (("unseeded",), {}, "seeded_repeat", "same seed, different outputs"),
    (("accept_overlong",), {}, "max_model_len", "257 prompt tokens > max_model_len 256 was accepted"),
    (("vague_overlong",), {}, "max_model_len", "400 does not mention the context length: 'request rejected'"),
    (("logprobs21_ok",), {}, "known_bad_400", "logprobs=21 must be refused with 400, got HTTP 200"),
    (("spec_still",), {"speculative": True}, "spec_counters_move", "counters did not move"),
    (("spec_moves",), {"speculative": False}, "spec_counters_still", "non-speculative arm but spec counters moved"),
])
def test_each_probe_fails_on_its_fault(fake, faults, spec_kw, probe, words):
    ep = fake(*faults)
    result = run_preflight(ep, arm(**spec_kw))
    failed = assert_failed_at(result, probe)
    assert words in failed["reason"]


def test_error_bodies_are_kept(fake):
    result = run_preflight(fake("vague_overlong"), arm())
    failed = assert_failed_at(result, "max_model_len")
    assert failed["status"] == 400
    assert failed["body"] == {"error": {"message": "request rejected", "type": "BadRequestError",
                                        "param": None, "code": 400}}
    # the huge token-id prompt is summarised in the record, its hash kept
    call = failed["calls"][0]
    assert call["request"]["prompt"].startswith("<257 x token id ")
    assert len(call["request_sha256"]) == 64
    with pytest.raises(PreflightError, match="request rejected"):
        require_pass(result)


def test_known_bad_probe_keeps_the_400_body_on_the_way(fake):
    # With every probe up to spec passing on the fake, the known_bad record must
    # carry the server's 400 text verbatim (keep every HTTP error body).
    result = run_preflight(fake("spec_moves"), arm())
    kb = next(p for p in result["probes"] if p["name"] == "known_bad_400")
    assert kb["pass"] and kb["status"] == 400
    assert kb["body"]["error"]["message"] == "Requested sample logprobs of 21, which is greater than max allowed: 20"


def test_dead_server_fails_health_with_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_preflight(Endpoint(f"http://127.0.0.1:{port}", timeout_s=5), arm())
    failed = assert_failed_at(result, "health")
    assert failed["status"] is None and failed["error"].startswith("transport: connection")


def test_hanging_server_fails_with_timeout(fake):
    ep = fake("hang")
    ep.timeout_s = 0.3
    failed = assert_failed_at(run_preflight(ep, arm()), "tokenize_roundtrip")
    assert "no answer (transport: timeout" in failed["reason"]


def test_malformed_reply_fails_the_probe_not_the_run(fake, monkeypatch):
    ep = fake()
    real = ep.get_json

    def odd(path, **kw):
        res = real(path, **kw)
        if path == "/v1/models":
            res["body"] = {"object": "list", "data": [{"id": "fake-model", "max_model_len": "256"}]}
        return res

    monkeypatch.setattr(ep, "get_json", odd)
    failed = assert_failed_at(run_preflight(ep, arm()), "models")
    assert "no usable max_model_len ('256')" in failed["reason"]


# --- the real reference server (the lead runs these) ----------------------------

def _refserver_or_skip():
    pytest.importorskip("pairaudit.refserver")
    if importlib.util.find_spec("pairaudit.refserver.__main__") is None:
        pytest.skip("pairaudit.refserver has no __main__ yet")


# one compute thread, as every test server (tests/refserver_fixture.py)
REF_CMD = ["{python}", "-m", "pairaudit.refserver", "--model", "{model}", "--host", "{host}", "--port", "{port}",
           "--max-model-len", "{max_model_len}", "--threads", "1"]


@pytest.mark.server
@pytest.mark.parametrize("speculative, env", [
    (False, {"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "PAIRAUDIT_REF_SPEC_NGRAM": "0"}),
    (True, {"PAIRAUDIT_REF_SPEC_NGRAM": "1"}),
])
def test_preflight_passes_on_the_reference_server(tmp_path, speculative, env):
    _refserver_or_skip()
    from pairaudit.serving.launch import Server

    spec = resolve_spec("control", {"mode": "launch", "command": REF_CMD, "env": env, "health_timeout_s": 300,
                                    "model": "SmolLM2-135M-Instruct", "max_model_len": 8192,
                                    "speculative": speculative})
    with Server(spec, log_path=tmp_path / "ref.log") as srv:
        pid = srv.pid
        result = run_preflight(srv.endpoint, spec)
        assert result["verdict"] == "PASS", require_pass(result)
        # a launched reference server gets a fresh API key: the probe that a request without it is refused runs
        assert [p["name"] for p in result["probes"]] == probe_names(speculative, keyed=True)
        assert result["max_model_len"] == 8192
        # streaming timings on a real stream (vllm bench serve definitions)
        out = srv.endpoint.stream_completion("/v1/chat/completions", {
            "model": spec.served_model_name, "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
        assert out["error"] is None and out["status"] == 200, out
        assert out["output_tokens"] == 8 and out["text"]
        assert out["ttft_s"] <= out["e2el_s"] and len(out["itl_s"]) == out["chunks"] - 1
        assert out["tpot_s"] is not None and out["finish_reason"] == "length"
    assert not _alive(pid)  # the real server does not outlive its context either


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
