"""A tiny stand-in server for ERROR-PATH unit tests only.

It speaks just enough of the vLLM-style API for the client, launcher and
preflight to reach the failure under test; it is not a model and its
"generations" mean nothing. Anything about real behaviour is tested against
the reference server (tests marked ``server``).

Run as a script (launcher tests) or build in-process with ``make_server``.
Faults are chosen with ``--fault NAME`` (repeatable):

  die              print an error to stderr and exit 3 before listening
  never_healthy    /health answers 503 forever
  wrong_model      /v1/models lists another model id
  wrong_len        /v1/models reports max_model_len // 2
  no_len           /v1/models cards carry no max_model_len
  http500          every endpoint (health included) answers 500 with a JSON body
  hang             POST requests sleep 60 s before answering
  ignore_term      the process ignores SIGTERM (launcher must SIGKILL)
  tokenize_mismatch  /detokenize returns a different string
  logprobs_few     completions return 19 top_logprobs entries per position
  logprobs_str_keys  top_logprobs keyed by decoded string, not token_id:N
  no_prompt_logprobs prompt_logprobs missing from the reply
  unseeded         seeded sampling ignores the seed
  accept_overlong  no context-length check (overlong prompts answered 200)
  vague_overlong   context refusal is a 400 that does not mention the context length
  logprobs21_ok    logprobs=21 answered 200
  spec_still       speculative counters never move
  spec_moves       counters move even without --spec
  midstream_error  streams two chunks then an error event
  concurrent_stream_dies  a stream that arrives while another is in flight gets a 500, then the process exits
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OFFSET = 100  # token id = UTF-8 byte + OFFSET, so ids are never tiny ints


def _tok(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode("utf-8")]


def _detok(ids: list[int]) -> str:
    return bytes((i - OFFSET) % 256 for i in ids).decode("utf-8", errors="replace")


class State:
    def __init__(self, model: str, max_model_len: int, faults: set[str], switches: dict | None,
                 spec: bool, loading_s: float):
        self.model = model
        self.max_model_len = max_model_len
        self.faults = faults
        self.switches = switches
        self.spec = spec
        self.ready_at = time.monotonic() + loading_s
        self.lock = threading.Lock()
        self.counters = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "gen": 0.0, "prompt": 0.0,
                         "requests": 0.0, "decode_s": 0.0}
        self.in_flight = 0


def _err(code: int, message: str, typ: str = "BadRequestError", param=None) -> tuple[int, dict]:
    return code, {"error": {"message": message, "type": typ, "param": param, "code": code}}


def _generate(st: State, prompt_ids: list[int], body: dict) -> list[int]:
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    temp = float(body.get("temperature", 1.0))
    seed = body.get("seed")
    if temp == 0:
        rng = random.Random(sum(prompt_ids))
    elif seed is not None and "unseeded" not in st.faults:
        rng = random.Random(int(seed) * 7919 + sum(prompt_ids))
    else:
        rng = random.Random()
    return [ord(rng.choice("abcdefgh ")) + OFFSET for _ in range(n)]


def _count(st: State, n_prompt: int, n_out: int) -> None:
    with st.lock:
        st.counters["prompt"] += n_prompt
        st.counters["gen"] += n_out
        st.counters["requests"] += 1
        st.counters["decode_s"] += 0.001 * n_out
        if ("spec_moves" in st.faults or st.spec) and "spec_still" not in st.faults:
            st.counters["drafts"] += max(1, n_out // 3)
            st.counters["draft_tokens"] += 3 * max(1, n_out // 3)
            st.counters["accepted"] += n_out // 2


def _logprobs_block(st: State, out_ids: list[int], k: int) -> dict:
    tops = []
    for i in out_ids:
        ids = [i] + [OFFSET + 40 + j for j in range(k - 1)]
        if "logprobs_few" in st.faults:
            ids = ids[:19]
        if "logprobs_str_keys" in st.faults:
            tops.append({f"s{j}": -0.1 * (n + 1) for n, j in enumerate(ids)})
        else:
            tops.append({f"token_id:{j}": -0.1 * (n + 1) for n, j in enumerate(ids)})
    tokens = [f"token_id:{i}" for i in out_ids]
    return {"tokens": tokens, "token_logprobs": [-0.1] * len(out_ids), "top_logprobs": tops,
            "text_offset": list(range(len(out_ids)))}


def handle_post(st: State, path: str, body: dict) -> tuple[int, dict]:
    if body.get("model") not in (None, st.model):
        return _err(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
    if path == "/tokenize":
        # a chat prompt is "rendered" as its contents joined, as the chat route reads it
        text = "".join(m.get("content", "") for m in body["messages"]) if "messages" in body else body.get("prompt", "")
        ids = _tok(text)
        return 200, {"count": len(ids), "max_model_len": st.max_model_len, "tokens": ids,
                     "token_strs": None}
    if path == "/detokenize":
        text = _detok(body.get("tokens", []))
        if "tokenize_mismatch" in st.faults:
            text = text.upper()
        return 200, {"prompt": text}
    if path not in ("/v1/completions", "/v1/chat/completions"):
        return _err(404, f"no route {path}", "NotFoundError")
    chat = path.endswith("chat/completions")
    if chat:
        prompt_ids = _tok("".join(m.get("content", "") for m in body.get("messages", [])))
    else:
        p = body.get("prompt", "")
        prompt_ids = list(p) if isinstance(p, list) else _tok(p)
    lp = body.get("logprobs")
    if not chat and isinstance(lp, int) and not isinstance(lp, bool) and lp > 20 \
            and "logprobs21_ok" not in st.faults:
        return _err(400, f"Requested sample logprobs of {lp}, which is greater than max allowed: 20",
                    param="logprobs")
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    if len(prompt_ids) + max_tokens > st.max_model_len and "accept_overlong" not in st.faults:
        if "vague_overlong" in st.faults:
            return _err(400, "request rejected")
        return _err(400, f"This model's maximum context length is {st.max_model_len} tokens. However, "
                         f"you requested {len(prompt_ids) + max_tokens} tokens.", param="prompt")
    out_ids = _generate(st, prompt_ids, body)
    _count(st, len(prompt_ids), len(out_ids))
    text = _detok(out_ids)
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out_ids),
             "total_tokens": len(prompt_ids) + len(out_ids)}
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        return 200, {"id": "chatcmpl-x", "object": "chat.completion", "model": st.model,
                     "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    if isinstance(lp, int) and not isinstance(lp, bool):
        choice["logprobs"] = _logprobs_block(st, out_ids, max(lp, 1))
    if body.get("prompt_logprobs") and "no_prompt_logprobs" not in st.faults:
        choice["prompt_logprobs"] = [None] + [{str(i): {"logprob": -1.0, "rank": 1, "decoded_token": "x"}}
                                              for i in prompt_ids[1:]]
    return 200, {"id": "cmpl-x", "object": "text_completion", "model": st.model,
                 "choices": [choice], "usage": usage}


def metrics_text(st: State) -> str:
    c = st.counters
    lab = f'{{model_name="{st.model}"}}'
    return "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total drafts",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{lab} {c['drafts']}",
        f"vllm:spec_decode_num_draft_tokens_total{lab} {c['draft_tokens']}",
        f"vllm:spec_decode_num_accepted_tokens_total{lab} {c['accepted']}",
        f"vllm:generation_tokens_total{lab} {c['gen']}",
        f"vllm:prompt_tokens_total{lab} {c['prompt']}",
        f"vllm:request_success_total{lab} {c['requests']}",
        f"vllm:request_decode_time_seconds_sum{lab} {c['decode_s']}",
        "",
    ])


def make_handler(st: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # keep test output quiet; the log is stderr
            sys.stderr.write("fake: " + (fmt % args) + "\n")

        def _send(self, code: int, payload, ctype="application/json"):
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if "http500" in st.faults:
                return self._send(*_err(500, "internal boom", "InternalServerError"))
            if self.path == "/health":
                ok = "never_healthy" not in st.faults and time.monotonic() >= st.ready_at
                return self._send(200 if ok else 503, "" if ok else "loading", "text/plain")
            if self.path == "/v1/models":
                card = {"id": st.model, "object": "model", "owned_by": "fake",
                        "max_model_len": st.max_model_len}
                if "wrong_model" in st.faults:
                    card["id"] = "some-other-model"
                if "wrong_len" in st.faults:
                    card["max_model_len"] = st.max_model_len // 2
                if "no_len" in st.faults:
                    del card["max_model_len"]
                return self._send(200, {"object": "list", "data": [card]})
            if self.path == "/version":
                v = {"version": "0.0.0-fake"}
                if st.switches is not None:
                    v["pairaudit"] = {"switches": st.switches, "model_sha256": "0" * 64}
                return self._send(200, v)
            if self.path == "/metrics":
                return self._send(200, metrics_text(st), "text/plain; version=0.0.4")
            return self._send(*_err(404, f"no route {self.path}", "NotFoundError"))

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n)
            if "hang" in st.faults:
                time.sleep(60)
            if "http500" in st.faults:
                return self._send(*_err(500, "internal boom", "InternalServerError"))
            try:
                body = json.loads(raw)
            except ValueError:
                return self._send(*_err(400, "body is not JSON"))
            if body.get("stream"):
                return self._stream(body)
            if "chat500_dies" in st.faults and self.path == "/v1/chat/completions" and body.get("seed") is not None:
                # the engine crashes on a seeded sampled chat request: a 500, then the process is gone
                self._send(*_err(500, "EngineCore encountered an issue: index out of bounds", "InternalServerError"))
                self.wfile.flush()
                os._exit(1)
            return self._send(*handle_post(st, self.path, body))

        def _stream(self, body):
            with st.lock:
                st.in_flight += 1
                crowded = st.in_flight > 1
            try:
                if crowded and "concurrent_stream_dies" in st.faults:
                    # the engine crashes when two streams share a step: a 500, then the process is gone
                    self._send(*_err(500, "EngineCore died: batch of 2 streams", "InternalServerError"))
                    self.wfile.flush()
                    os._exit(1)
                return self._stream_one(body)
            finally:
                with st.lock:
                    st.in_flight -= 1

        def _stream_one(self, body):
            code, payload = handle_post(st, self.path, dict(body, stream=False))
            if code != 200:
                return self._send(code, payload)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            choice = payload["choices"][0]
            text = choice.get("text") if "text" in choice else choice["message"]["content"]
            chat = "message" in choice

            def emit(obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            for i, ch in enumerate(text):
                if "concurrent_stream_dies" in st.faults:
                    time.sleep(0.02)  # stay in flight long enough for a concurrent stream to arrive
                if "midstream_error" in st.faults and i == 2:
                    emit({"error": {"message": "engine died mid-stream", "type": "InternalServerError",
                                    "code": 500}})
                    self.close_connection = True
                    return
                last = i == len(text) - 1
                c = {"index": 0, "finish_reason": "length" if last else None}
                if chat:
                    c["delta"] = {"content": ch}
                else:
                    c["text"] = ch
                emit({"choices": [c], "usage": None})
            emit({"choices": [], "usage": payload["usage"]})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def make_server(host="127.0.0.1", port=0, *, model="fake-model", max_model_len=256, faults=(),
                switches=None, spec=False, loading_s=0.0) -> ThreadingHTTPServer:
    st = State(model, max_model_len, set(faults), switches, spec, loading_s)
    srv = ThreadingHTTPServer((host, port), make_handler(st))
    srv.daemon_threads = True
    srv.state = st  # type: ignore[attr-defined]
    return srv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--switches-from-env", action="store_true",
                    help="report PAIRAUDIT_REF_* env vars in /version like the reference server")
    ap.add_argument("--switches", default=None, help="JSON dict reported as /version pairaudit.switches")
    ap.add_argument("--spec", action="store_true")
    ap.add_argument("--loading-s", type=float, default=0.0)
    ap.add_argument("--spawn-child-pidfile", default=None,
                    help="start a sleeping grandchild in our process group and write its pid here")
    ap.add_argument("--record-env", default=None,
                    help="append {pid, CUDA_VISIBLE_DEVICES (null: unset), CUDA_DEVICE_ORDER} to this file at start")
    a = ap.parse_args(argv)
    if a.record_env:
        with open(a.record_env, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER")}) + "\n")
    print(f"fake server starting pid={os.getpid()} faults={a.fault}", file=sys.stderr, flush=True)
    if "die" in a.fault:
        print("fatal: could not load weights for fake-model (planted failure)", file=sys.stderr, flush=True)
        return 3
    if "ignore_term" in a.fault:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    switches = json.loads(a.switches) if a.switches else None
    if a.switches_from_env:
        switches = {k: v for k, v in os.environ.items() if k.startswith("PAIRAUDIT_REF_")}
    if a.spawn_child_pidfile:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(a.spawn_child_pidfile, "w") as f:
            f.write(str(child.pid))
    srv = make_server(a.host, a.port, model=a.model, max_model_len=a.max_model_len, faults=a.fault,
                      switches=switches, spec=a.spec, loading_s=a.loading_s)
    print(f"fake server listening on {a.host}:{srv.server_address[1]}", file=sys.stderr, flush=True)
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
