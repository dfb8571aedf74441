"""pairaudit.serving.client: pure helpers, plus error paths against the fake server."""

import hashlib
import math
import socket
import subprocess
import sys

import pytest

from pairaudit.core.artifacts import sha256_json
from pairaudit.serving.client import (
    Endpoint,
    ServerError,
    error_message,
    metrics,
    metrics_delta,
    tail_lines,
    wait_healthy,
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- pure helpers -------------------------------------------------------------

def test_sha256_json_is_canonical():
    a = {"b": 1, "a": [1, 2, {"y": "é", "x": None}]}
    b = {"a": [1, 2, {"x": None, "y": "é"}], "b": 1}
    assert sha256_json(a) == sha256_json(b)
    expected = hashlib.sha256('{"a":[1,2,{"x":null,"y":"é"}],"b":1}'.encode()).hexdigest()
    assert sha256_json(a) == expected
    assert sha256_json({"a": 1}) != sha256_json({"a": 1.5})


def test_error_message_shapes():
    assert error_message({"error": {"message": "too long", "type": "BadRequestError"}}) == "too long"
    assert error_message({"object": "error", "message": "old style"}) == "old style"
    assert error_message({"error": "plain"}) == "plain"
    assert error_message("Internal Server Error") == "Internal Server Error"
    assert error_message(None) == ""


PROM = """\
# HELP vllm:spec_decode_num_drafts_total Number of drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="x",engine="0"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="x"} 3.0
vllm:generation_tokens_total{model_name="a \\"quoted\\" name, with } brace"} 7 1700000000000
vllm:num_requests_running 2
weird_nan NaN
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="x"} 5.0
this line is garbage
"""


def test_metrics_sums_label_sets_and_keeps_labelled_values():
    m = metrics(PROM)
    assert m["vllm:spec_decode_num_drafts_total"] == 15.0
    assert m['vllm:spec_decode_num_drafts_total{engine="0",model_name="x"}'] == 12.0
    # label order in the text does not change the key
    assert m['vllm:spec_decode_num_drafts_total{engine="1",model_name="x"}'] == 3.0
    assert m["vllm:generation_tokens_total"] == 7.0  # timestamp ignored, quoted brace parsed
    assert m["vllm:num_requests_running"] == 2.0
    assert math.isnan(m["weird_nan"])
    assert m['vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="x"}'] == 5.0
    assert "this" not in m


def test_metrics_delta_counts_new_series_from_zero():
    before = {"a": 1.0, "gone": 5.0}
    after = {"a": 4.0, "new{x=\"1\"}": 2.0}
    assert metrics_delta(before, after) == {"a": 3.0, "new{x=\"1\"}": 2.0}


def test_tail_lines_respects_offset(tmp_path):
    p = tmp_path / "log"
    p.write_text("old1\nold2\n")
    off = p.stat().st_size
    with open(p, "a") as f:
        f.write("".join(f"new{i}\n" for i in range(50)))
    t = tail_lines(p, 30, offset=off)
    assert t.splitlines()[0] == "new20" and t.splitlines()[-1] == "new49"
    assert tail_lines(tmp_path / "missing") == ""


# --- HTTP error paths (fake server) -------------------------------------------

def test_http_400_keeps_server_body(fake):
    ep = fake()
    res = ep.post_json("/v1/completions", {"model": "fake-model", "prompt": "x", "max_tokens": 1, "logprobs": 21})
    assert res["status"] == 400
    assert res["body"]["error"]["message"].startswith("Requested sample logprobs of 21")
    assert res["error"] == "http 400: " + res["body"]["error"]["message"]
    assert res["elapsed_s"] >= 0 and res["started_at"]


def test_http_404_and_500_keep_bodies(fake):
    ep = fake()
    res = ep.post_json("/v1/completions", {"model": "nope", "prompt": "x"})
    assert res["status"] == 404 and "does not exist" in res["error"]
    ep5 = fake("http500")
    res = ep5.get_json("/v1/models")
    assert res["status"] == 500 and res["body"]["error"]["message"] == "internal boom"
    assert res["error"] == "http 500: internal boom"


def test_non_json_body_is_kept_as_text(fake):
    ep = fake()
    res = ep.get_json("/metrics")
    assert res["error"] is None and isinstance(res["body"], str)
    assert "vllm:generation_tokens_total" in res["body"]


def test_connection_refused_is_a_transport_error():
    ep = Endpoint(f"http://127.0.0.1:{closed_port()}", timeout_s=5)
    res = ep.post_json("/v1/completions", {"prompt": "x"})
    assert res["status"] is None and res["body"] is None
    assert res["error"].startswith("transport: connection:")


def test_hang_is_a_transport_timeout(fake):
    ep = fake("hang")
    res = ep.post_json("/tokenize", {"prompt": "x"}, timeout_s=0.3)
    assert res["status"] is None
    assert res["error"].startswith("transport: timeout:")


def test_stream_http_error_keeps_body(fake):
    ep = fake()
    out = ep.stream_completion("/v1/completions", {"model": "fake-model", "prompt": "x", "max_tokens": 2,
                                                   "logprobs": 21})
    assert out["status"] == 400 and out["body"]["error"]["message"].startswith("Requested sample logprobs")
    assert out["error"].startswith("http 400:") and out["chunks"] == 0 and out["ttft_s"] is None


def test_stream_midstream_error_event_is_recorded(fake):
    ep = fake("midstream_error")
    out = ep.stream_completion("/v1/chat/completions", {"model": "fake-model", "max_tokens": 6,
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert out["status"] == 200
    assert out["error"] == "stream: engine died mid-stream"
    assert out["chunks"] == 2 and len(out["itl_s"]) == 1 and out["usage"] is None and out["tpot_s"] is None


def test_stream_transport_error():
    ep = Endpoint(f"http://127.0.0.1:{closed_port()}", timeout_s=5)
    out = ep.stream_completion("/v1/completions", {"prompt": "x"})
    assert out["status"] is None and out["error"].startswith("transport: connection:")


def test_stream_does_not_mutate_callers_body(fake):
    ep = fake()
    body = {"model": "fake-model", "prompt": "x", "max_tokens": 3}
    ep.stream_completion("/v1/completions", body)
    assert body == {"model": "fake-model", "prompt": "x", "max_tokens": 3}


# --- wait_healthy ---------------------------------------------------------------

def test_wait_healthy_fails_fast_when_process_exits(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import sys; print('loading...'); print('boom: CUDA out of memory', "
                                 "file=sys.stderr); sys.exit(7)"], stdout=f, stderr=subprocess.STDOUT)
    ep = Endpoint(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ServerError) as ei:
        wait_healthy(ep, 120, proc=proc, log_path=log)
    msg = str(ei.value)
    assert "exited with code 7" in msg and "boom: CUDA out of memory" in msg


def test_wait_healthy_times_out_on_503(fake):
    ep = fake("never_healthy")
    with pytest.raises(ServerError) as ei:
        wait_healthy(ep, 0.6)
    assert "not healthy after 0.6 s" in str(ei.value) and "503" in str(ei.value)


def test_wait_healthy_times_out_on_dead_url():
    ep = Endpoint(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ServerError, match="transport: connection"):
        wait_healthy(ep, 0.5)


def test_wait_healthy_waits_through_loading(fake):
    ep = fake(loading_s=0.5)
    res = wait_healthy(ep, 30)
    assert res["healthy"] and res["polls"] >= 2


# --- salts and silent clamping (vLLM 0.32) --------------------------------------

def test_safe_salt_keeps_within_vllm_limits():
    from pairaudit.serving.client import SALT_RE, safe_salt

    assert safe_salt("audit-control-tail-16", "ab12") == "audit-control-tail-16-ab12"
    for readable in ("a/b@c\\d\x00e", "x" * 500, "", "ünïcode audit"):
        salt = safe_salt(readable, "f" * 24)
        assert SALT_RE.match(salt) and len(salt) <= 128 and salt.endswith("f" * 24)
    assert safe_salt("", "") == "salt"


def test_clamping_known_answers():
    from pairaudit.serving.client import clamping

    # vLLM 0.32: 2045 prompt tokens + max_tokens 4 at 2048 -> 200, 3 tokens, "length"
    c = clamping({"max_tokens": 4}, "length", {"prompt_tokens": 2045, "completion_tokens": 3}, 2048)
    assert c["clamped"] and c["over_context"] is True and c["asked"] == 4
    assert "prompt 2045 + max_tokens 4 > max_model_len 2048" in c["reason"]
    # chat's max_completion_tokens is the budget when given
    c = clamping({"max_tokens": 9, "max_completion_tokens": 4}, "length", {"completion_tokens": 3})
    assert c["clamped"] and c["asked"] == 4 and c["over_context"] is None
    # a clamp although the request fit is the server's own doing: said so
    c = clamping({"max_tokens": 16}, "length", {"prompt_tokens": 100, "completion_tokens": 10}, 2048)
    assert c["clamped"] and c["over_context"] is False and "fits max_model_len" in c["reason"]
    # not clamps: all tokens used, a natural stop, no usage
    assert not clamping({"max_tokens": 4}, "length", {"prompt_tokens": 10, "completion_tokens": 4}, 2048)["clamped"]
    assert not clamping({"max_tokens": 4}, "stop", {"prompt_tokens": 2045, "completion_tokens": 2}, 2048)["clamped"]
    assert not clamping({"max_tokens": 4}, "length", None, 2048)["clamped"]


def test_chat_message_reads_both_reasoning_fields():
    from pairaudit.serving.client import chat_message

    assert chat_message({"message": {"content": None, "reasoning": "r"}}) == {"content": None, "reasoning": "r"}
    assert chat_message({"message": {"content": "a", "reasoning_content": "r"}}) == {"content": "a", "reasoning": "r"}
    assert chat_message({"text": "x"}) == {"content": None, "reasoning": None}
