"""Recorded servers: a recording proxy in front of a live server, replayed through a real HTTP server.

The round trip is checked on the reference server: the conformance checks
through the proxy, then again against the replay alone, must give the same
outcomes (and vLLM 0.32's known ones).  The recordings committed under
``tests/data/recordings/`` come from servers no CI machine runs (vLLM on a
GPU); ``test_recorded_vllm_gpu`` reads what the audit relies on from them.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from pairaudit.answers.sampled import is_final
from pairaudit.serving import conformance, recording
from pairaudit.serving.client import Endpoint, clamping, error_message, safe_salt
from pairaudit.serving.modelstore import EMBEDDED_NAME as MODEL
from pairaudit.serving.preflight import CONTEXT_REFUSAL_RE

MML = 512


@pytest.mark.server
def test_conformance_round_trip_through_a_recording(shared_server, tmp_path):
    live = shared_server(None, MML)
    with recording.RecordingProxy(live.url) as proxy:
        through_proxy = conformance.run(conformance.Target(proxy.url, MODEL, MML))
        proxy.save(tmp_path / "rec.json", {"server": "reference"}, through_proxy)
    assert through_proxy == conformance.known(MODEL, MML), conformance.dumps(through_proxy)
    rec = recording.load(tmp_path / "rec.json")
    # every check's requests are in it, the preflight's fresh salts among them
    assert len(rec["exchanges"]) > len(conformance.CHECKS)
    assert any('"cache_salt": "<fresh>"' in recording.request_key(e["method"], e["path"], e["request"].encode())
               for e in rec["exchanges"])
    with recording.ReplayServer(rec) as replay:
        replayed = conformance.run(conformance.Target(replay.url, MODEL, MML))
        assert replay.unrecorded == []
    assert replayed == through_proxy == rec["outcomes"], conformance.dumps(replayed)


def test_replay_answers_in_order_then_repeats_and_refuses_the_unrecorded():
    rec = {"schema": recording.SCHEMA, "about": {}, "exchanges": [
        {"method": "POST", "path": "/v1/completions", "request": json.dumps({"prompt": "a", "n": 1}),
         "status": 200, "content_type": "application/json", "response": '{"i": 1}'},
        {"method": "POST", "path": "/v1/completions", "request": json.dumps({"n": 1, "prompt": "a"}),
         "status": 400, "content_type": "application/json", "response": '{"i": 2}'},
        {"method": "GET", "path": "/metrics", "request": "", "status": 200, "content_type": "text/plain",
         "response": "vllm:x 1\n"},
    ]}
    with recording.ReplayServer(rec) as replay:
        ep = Endpoint(replay.url)
        got = [ep.post_json("/v1/completions", {"prompt": "a", "n": 1}) for _ in range(3)]
        assert [(g["status"], g["body"]) for g in got] == [(200, {"i": 1}), (400, {"i": 2}), (400, {"i": 2})]
        assert ep.get_json("/metrics")["body"] == "vllm:x 1\n"
        other = requests.post(replay.url + "/v1/completions", json={"prompt": "b"}, timeout=30)
        assert other.status_code == 501 and "not in the recording" in other.json()["error"]["message"]
        assert len(replay.unrecorded) == 1


def test_fresh_salts_match_any_fresh_salt_but_chosen_salts_must_be_equal():
    key = recording.request_key
    a = key("POST", "/p", json.dumps({"cache_salt": "0123456789abcdef0123456789abcdef"}).encode())
    b = key("POST", "/p", json.dumps({"cache_salt": "fedcba9876543210fedcba9876543210"}).encode())
    c = key("POST", "/p", json.dumps({"cache_salt": "s" * 32}).encode())
    assert a == b and a != c


def test_a_file_that_is_not_a_recording_is_refused(tmp_path):
    (tmp_path / "x.json").write_text('{"schema": "other"}')
    with pytest.raises(ValueError, match="not a recording"):
        recording.load(tmp_path / "x.json")


RECORDINGS = sorted((Path(__file__).parent / "data" / "recordings").glob("*.json"))


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_a_committed_recording_replays_to_the_outcomes_measured_live(path):
    rec = recording.load(path)
    about = rec["about"]
    with recording.ReplayServer(rec) as replay:
        got = conformance.run(conformance.Target(replay.url, about["model"], about["max_model_len"]))
        assert replay.unrecorded == []
    assert got == rec["outcomes"], conformance.dumps(got)


# --- what vLLM 0.26 on a GPU does that vLLM 0.32's CPU build never did ------------------------

VLLM_GPU = Path(__file__).parent / "data" / "recordings" / "vllm-0.26.0-h200.json"


@pytest.fixture(scope="module")
def vllm_gpu():
    rec = recording.load(VLLM_GPU)
    with recording.ReplayServer(rec) as replay:
        yield rec, Endpoint(replay.url, model=rec["about"]["model"])


def test_the_gpu_recording_is_what_it_says(vllm_gpu):
    rec, _ = vllm_gpu
    about = rec["about"]
    assert (about["version"], about["device"], about["dtype"]) == ("0.26.0", "NVIDIA H200", "bfloat16")
    # recorded live against the same checks: the differences below are the server's, not the replay's
    diff = conformance.differences(rec["outcomes"], conformance.known(about["model"], about["max_model_len"]))
    assert sorted(diff) == ["cache_salt", "prompt_fills_context", "prompt_over_context", "silent_clamp"]


def test_vllm_026_refuses_a_request_past_the_context_that_0_32_would_cut_short(vllm_gpu):
    rec, ep = vllm_gpu
    mml = rec["about"]["max_model_len"]
    body = {"model": ep.model, "prompt": conformance.ids(mml - 2), "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}
    res = ep.post_json("/v1/completions", body)
    # 0.32 answers 200 with 2 tokens and finish "length" (a clamp); 0.26 refuses the whole request
    assert res["status"] == 400 and res["body"]["error"]["param"] == "input_tokens"
    message = error_message(res["body"])
    assert message.startswith(f"This model's maximum context length is {mml} tokens. However, you requested 4 "
                              f"output tokens and your prompt contains {mml - 2} input tokens")
    # ... which the preflight's context probe reads as a context refusal, the same as 0.32's form
    assert CONTEXT_REFUSAL_RE.search(message)
    # a refused request is a final answer with no text: the sampled phase keeps it, scoring calls it no answer
    assert is_final(res)
    # and is never mistaken for a clamp, which needs a served answer
    assert clamping(body, None, None, mml)["clamped"] is False


def test_vllm_026_accepts_salts_0_32_refuses_and_the_audits_salts_satisfy_both(vllm_gpu):
    rec, _ = vllm_gpu
    got = rec["outcomes"]["cache_salt"]
    assert [got[k][0] for k in ("129", "slash", "at", "backslash")] == [200, 200, 200, 200]
    assert got["empty"] == [400, "cache_salt"]
    # so a salt only 0.26 takes would make an audit that passes there fail on 0.32: every salt the audit
    # makes is one both releases accept
    salt = safe_salt("audit/with@odd\\chars-" + "x" * 300, "0123abcd" * 3)
    assert 0 < len(salt) <= 128 and not set(salt) & set("@/\\\0") and salt.endswith("0123abcd" * 3)


def test_the_proxy_relays_the_api_key_and_keeps_it_out_of_the_recording(tmp_path):
    key = "Bearer sk-test-0123456789"

    class Guarded(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            ok = self.headers.get("Authorization") == key
            payload = b'{"ok": true}' if ok else b'{"error": "unauthorized"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with recording.RecordingProxy(f"http://127.0.0.1:{upstream.server_address[1]}") as proxy:
            with_key = requests.get(proxy.url + "/v1/models", headers={"Authorization": key}, timeout=30)
            without = requests.get(proxy.url + "/v1/models", timeout=30)
            proxy.save(tmp_path / "rec.json", {"server": "guarded"})
    finally:
        upstream.shutdown()
    assert (with_key.status_code, without.status_code) == (200, 401)
    saved = (tmp_path / "rec.json").read_text()
    assert "sk-test" not in saved and [e["status"] for e in recording.load(tmp_path / "rec.json")["exchanges"]] == [200, 401]
