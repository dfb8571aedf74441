"""The reference server's API process: aiohttp on one asyncio loop, apart from the engine's process.

Why a process of its own: in one process the HTTP threads and the engine's
step loop share one GIL, so every JSON body, every detokenization and every
streamed write is time the step loop waits for, at random moments; on a GPU,
where a decode step is under a millisecond, that loop set both the pace and
the jitter of the inter-token gaps.  As in vLLM V1, this process does all the
per-request Python (parsing, validation, tokenization and chat templates,
detokenization, SSE framing) and the engine process only steps the model.

The engine process spawns this one (``multiprocessing``, spawn) and the two
talk over one socket pair (:mod:`.protocol`): a request goes over as token ids
and sampling parameters; each engine step comes back as one message with
every request's news.  Each process dies with the other: this one exits when
the socket pair reaches end-of-file (and asks the kernel for SIGTERM when its
parent dies), the engine exits when this one's end closes, so no orphan keeps
the port.

Metrics stay in the engine process, where the step and request timings are
taken: ``GET /metrics`` asks the engine for a snapshot of its counters and
histograms and renders it here.  Rebuilding them here from the step messages
would time the messages' arrival, not the engine, and would need a copy of
every engine-side counter (steps, graph replays, speculative drafts).

Streaming: one SSE event per HTTP chunk (chunked transfer-encoding), one
event per engine step that gave the request tokens; the text is detokenized
incrementally (:class:`.tokenizer.IncrementalText`), holding back what could
still become a stop string or half a UTF-8 character, and the last event's
text is cut from one full decode, exactly as a non-streamed response's.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import json
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.tcp_helpers import tcp_nodelay

from .api import API_KEY_ENV, Api, ApiError, authorized, check_types
from .metrics import Metrics
from .protocol import (ABORT, ADD, CONFIG, LISTEN_ERROR, LISTENING, METRICS, STEP, Emitted, SamplingParams,
                       Update)
from .tokenizer import ChatTokenizer, IncrementalText

log = logging.getLogger("refserver")
CONNECTION_ERRORS = (ConnectionResetError, BrokenPipeError)


@dataclass
class Stream:
    """One request as the API process sees it: what the engine sent so far."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    emitted: list[Emitted] = field(default_factory=list)
    prompt_logprobs: list[dict | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    updates: "asyncio.Queue[Update]" = field(default_factory=asyncio.Queue)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def apply(self, u: Update) -> None:
        self.output.extend(u.tokens)
        self.emitted.extend(u.emitted)
        if u.prompt_logprobs is not None:
            self.prompt_logprobs = u.prompt_logprobs
        self.finish_reason, self.stop_reason, self.error = u.finish_reason, u.stop_reason, u.error


class Frontend:
    def __init__(self, api: Api, conn, *, version: str, metrics_name: str):
        self.api, self.conn, self.version = api, conn, version
        # read once: the key of this start (serving.launch sets it in the server's environment only)
        self.api_key = os.environ.get(API_KEY_ENV) or None
        self.streams: dict[str, Stream] = {}
        self.tickets = itertools.count()
        self.waiting_metrics: dict[int, asyncio.Future] = {}
        self.metrics = Metrics(metrics_name)
        self.engine_alive = True
        self.stop = asyncio.Event()

    # --- the engine's side ----------------------------------------------------
    def on_readable(self) -> None:
        """Every message the engine has sent; one queue item per step per request (one SSE event each)."""
        try:
            while self.conn.poll(0):
                self.dispatch(self.conn.recv())
        except (EOFError, OSError):
            self.engine_gone("the engine process exited")

    def dispatch(self, msg: tuple) -> None:
        if msg[0] == STEP:
            for u in msg[1]:
                st = self.streams.get(u.request_id)
                if st is not None:
                    if u.finish_reason is not None or u.error is not None:
                        del self.streams[u.request_id]
                    st.updates.put_nowait(u)
        elif msg[0] == METRICS:
            fut = self.waiting_metrics.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])

    def engine_gone(self, why: str) -> None:
        if not self.engine_alive:
            return
        self.engine_alive = False
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.conn.fileno())
        log.error("%s: failing %d requests and stopping the API process", why, len(self.streams))
        for st in self.streams.values():
            st.updates.put_nowait(Update(st.request_id, [], [], None, None, f"engine error: {why}", None))
        self.streams.clear()
        for fut in self.waiting_metrics.values():
            if not fut.done():
                fut.set_exception(ApiError(f"engine error: {why}", status=503))
        loop.call_later(0.2, self.stop.set)  # the failed requests' answers go out first

    def send(self, msg: tuple) -> None:
        if not self.engine_alive:
            raise ApiError("engine error: the engine process is not running", status=503)
        try:
            self.conn.send(msg)
        except OSError:
            self.engine_gone("the engine process closed its connection")
            raise ApiError("engine error: the engine process is not running", status=503) from None

    def submit(self, prompt: list[int], params: SamplingParams, prefix: str) -> Stream:
        st = Stream(f"{prefix}-{uuid.uuid4().hex}", prompt, params)
        self.send((ADD, st.request_id, prompt, params, time.monotonic()))
        self.streams[st.request_id] = st
        return st

    def abort(self, st: Stream) -> None:
        if self.streams.pop(st.request_id, None) is not None and self.engine_alive:
            try:
                self.conn.send((ABORT, st.request_id))
            except OSError:
                pass

    async def wait(self, st: Stream) -> None:
        while not st.done:
            st.apply(await st.updates.get())
        if st.error:
            raise ApiError(st.error, status=500)

    # --- routes ---------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.errors], client_max_size=64 * 2**20)
        gets: dict[str, Any] = {"/health": self.health, "/ping": self.health, "/v1/models": self.models,
                                "/metrics": self.metrics_route, "/version": self.version_route}
        posts: dict[str, Any] = {"/v1/completions": self.completions, "/v1/chat/completions": self.chat,
                                 "/tokenize": self.tokenize, "/detokenize": self.detokenize}
        for path, fn in gets.items():
            app.router.add_get(path, fn, allow_head=False)
        for path, fn in posts.items():
            app.router.add_post(path, fn)
        app.router.add_route("*", "/{tail:.*}", self.no_route)
        return app

    @web.middleware
    async def errors(self, request: web.Request, handler) -> web.StreamResponse:
        if request.transport is not None:
            # as uvicorn sets for vLLM: with Nagle on, a small body waits for the client's delayed ACK
            tcp_nodelay(request.transport, True)
        if not authorized(request.path, request.headers.get("Authorization"), self.api_key):
            return json_response(401, {"error": "Unauthorized"})
        try:
            return await handler(request)
        except ApiError as exc:
            return json_response(exc.status, exc.body())
        except web.HTTPException as exc:  # a known path, another method
            err = ApiError(f"no route {request.method} {request.path}", status=404) if exc.status in (404, 405) \
                else ApiError(exc.reason, status=exc.status)
            return json_response(err.status, err.body())
        except (asyncio.CancelledError, *CONNECTION_ERRORS):
            raise
        except Exception as exc:  # keep the server up; report like vLLM's 500
            err = ApiError(f"internal error: {type(exc).__name__}: {exc}", status=500)
            return json_response(500, err.body())

    async def no_route(self, request: web.Request) -> web.Response:
        raise ApiError(f"no route {request.method} {request.path}", status=404)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.engine_alive else 503)

    async def models(self, request: web.Request) -> web.Response:
        api = self.api
        card = {"id": api.name, "object": "model", "created": api.created, "owned_by": "vllm",
                "root": api.root, "parent": None, "max_model_len": api.max_model_len, "permission": []}
        return json_response(200, {"object": "list", "data": [card]})

    async def version_route(self, request: web.Request) -> web.Response:
        return json_response(200, {"version": self.version, "pairaudit": self.api.info})

    async def metrics_route(self, request: web.Request) -> web.Response:
        ticket = next(self.tickets)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiting_metrics[ticket] = fut
        try:
            self.send((METRICS, ticket))
            state = await asyncio.wait_for(fut, 120)
        finally:
            self.waiting_metrics.pop(ticket, None)
        self.metrics.load(state)
        return web.Response(body=self.metrics.render().encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    async def tokenize(self, request: web.Request) -> web.Response:
        api = self.api
        body = await read_body(request)
        check_types(body, {"prompt": ((str,), "a string"), "add_special_tokens": ((bool,), "a boolean"),
                           "return_token_strs": ((bool,), "a boolean")})
        api.check_model(body)
        if "messages" in body:
            ids = api.chat_prompt(body)
        elif isinstance(body.get("prompt"), str):
            ids = api.tok(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)).input_ids
        else:
            raise ApiError("tokenize: expected `prompt` (a string) or `messages`", param="prompt")
        strs = api.tok.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
        return json_response(200, {"count": len(ids), "max_model_len": api.max_model_len, "tokens": ids,
                                   "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        self.api.check_model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ApiError("tokens: expected a list of integers", param="tokens")
        return json_response(200, {"prompt": self.api.tok.decode(ids)})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        api = self.api
        body = await read_body(request)
        check_types(body, {"logprobs": ((int,), "an integer"), "prompt": ((str, list), "a string or token ids")})
        api.check_model(body)
        prompt = api.completion_prompt(body)
        params = api.sampling(body, len(prompt), chat=False)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        st = self.submit(prompt, params, "cmpl")
        if body.get("stream"):
            return await self.stream(request, st, body, chat=False, as_ids=as_ids)
        try:
            await self.wait(st)
        finally:
            if not st.done:  # the client went away (the handler was cancelled)
                self.abort(st)
        choice = {"index": 0, "text": api.final_text(st),
                  "logprobs": api.completion_logprobs(st, as_ids) if params.logprobs is not None else None,
                  "finish_reason": st.finish_reason, "stop_reason": st.stop_reason,
                  "prompt_logprobs": api.prompt_logprobs(st)}
        return json_response(200, {"id": st.request_id, "object": "text_completion", "created": int(time.time()),
                                   "model": api.name, "choices": [choice], "usage": api.usage(st)})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        api = self.api
        body = await read_body(request)
        check_types(body, {"logprobs": ((bool,), "a boolean"), "messages": ((list,), "a list")})
        api.check_model(body)
        prompt = api.chat_prompt(body)
        params = api.sampling(body, len(prompt), chat=True)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        st = self.submit(prompt, params, "chatcmpl")
        if body.get("stream"):
            return await self.stream(request, st, body, chat=True, as_ids=as_ids)
        try:
            await self.wait(st)
        finally:
            if not st.done:
                self.abort(st)
        choice = {"index": 0,
                  # vLLM 0.32 names a reasoning parser's output `reasoning`
                  # (older releases: reasoning_content); there is no parser here.
                  "message": {"role": "assistant", "content": api.final_text(st), "reasoning": None},
                  "logprobs": api.chat_logprobs(st, as_ids) if params.logprobs is not None else None,
                  "finish_reason": st.finish_reason, "stop_reason": st.stop_reason}
        return json_response(200, {"id": st.request_id, "object": "chat.completion", "created": int(time.time()),
                                   "model": api.name, "choices": [choice], "usage": api.usage(st),
                                   "prompt_logprobs": api.prompt_logprobs(st)})

    async def stream(self, request: web.Request, st: Stream, body: dict, *, chat: bool,
                     as_ids: bool) -> web.StreamResponse:
        api = self.api
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        # Chunked, as vLLM's uvicorn sends it: each event is its own HTTP
        # chunk, so a client sees it the moment it is written. Without a
        # framing a client reading a fixed-size buffer (requests reads 512
        # bytes) receives several events at once, which skews TTFT and ITL.
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        resp.force_close()
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        hold = max((len(s) for s in st.params.stop), default=1) - 1
        text_so_far = IncrementalText(api.tok)
        sent_text, sent_tokens, done = "", 0, False

        async def chunk(choices, usage=None):
            data: dict[str, Any] = {"id": st.request_id, "object": obj, "created": created, "model": api.name,
                                    "choices": choices}
            if usage is not None:
                data["usage"] = usage
            await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")

        try:
            await resp.prepare(request)
            if chat:
                await chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            while not done:
                st.apply(await st.updates.get())
                done = st.done
                if st.error:
                    raise ApiError(st.error, status=500)
                upto = len(st.output)
                if done:
                    text = api.final_text(st)  # one full decode, cut at the stop string
                else:
                    text = text_so_far.extend(st.output)
                    # hold back what may still become a stop string or half a UTF-8 character
                    text = text[: max(len(sent_text), len(text) - hold)].rstrip("\ufffd")
                if upto == sent_tokens and not done:
                    continue
                delta = text[len(sent_text):]
                lp = None
                if st.params.logprobs is not None:
                    lp = (api.chat_logprobs(st, as_ids, sent_tokens, upto) if chat
                          else api.completion_logprobs(st, as_ids, sent_tokens, upto))
                sent_tokens, sent_text = upto, text
                finish = st.finish_reason if done else None
                if chat:
                    choice = {"index": 0, "delta": {"content": delta}, "logprobs": lp, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": delta, "logprobs": lp, "finish_reason": finish}
                if done:
                    choice["stop_reason"] = st.stop_reason
                await chunk([choice])
            if include_usage:
                await chunk([], api.usage(st))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()  # the zero-length chunk that ends the body
        except CONNECTION_ERRORS:
            pass
        except ApiError as exc:
            try:
                await resp.write(b"data: " + json.dumps(exc.body()).encode() + b"\n\n")
                await resp.write_eof()
            except CONNECTION_ERRORS:
                pass
        finally:
            if not st.done:  # the client went away: the engine stops decoding it
                self.abort(st)
        return resp


def json_response(status: int, obj) -> web.Response:
    return web.Response(status=status, body=json.dumps(obj).encode(), content_type="application/json")


async def read_body(request: web.Request) -> dict:
    raw = await request.read()
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the engine process dies (the socket's end-of-file is the other watch)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(conn, start: dict) -> None:
    """The API process (a ``multiprocessing`` spawn target): wait for the engine's facts, listen, serve."""
    _die_with_parent()
    if os.getppid() != start["parent_pid"]:  # the parent died before the watch was set
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the engine, which stops this process
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", stream=sys.stderr)
    try:
        tokenizer = ChatTokenizer(start["model_root"])
        msg = conn.recv()
    except (EOFError, OSError):
        return  # the engine did not start
    if msg[0] != CONFIG:
        raise RuntimeError(f"API process: expected the engine's {CONFIG} message, got {msg[0]}")
    facts = msg[1]
    api = Api(tokenizer, served_name=start["served_name"], model_root=start["model_root"], info=facts["info"],
              max_model_len=facts["max_model_len"], vocab=facts["vocab"], eos=facts["eos"])
    asyncio.run(_serve(Frontend(api, conn, version=start["version"], metrics_name=start["served_name"]), start))


async def _serve(front: Frontend, start: dict) -> None:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, front.stop.set)
    # a stop waits at most half a second for handlers in flight (the engine is stopping too)
    runner = web.AppRunner(front.app(), handler_cancellation=True, access_log_format='%a "%r" %s %b',
                           shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, start["host"], start["port"], reuse_address=True)
        await site.start()
    except OSError as exc:
        front.conn.send((LISTEN_ERROR, str(exc)))
        await runner.cleanup()
        return
    port = runner.addresses[0][1]
    front.conn.send((LISTENING, port))
    loop.add_reader(front.conn.fileno(), front.on_readable)
    front.on_readable()  # anything that came with the facts
    try:
        await front.stop.wait()
    finally:
        if front.engine_alive:
            loop.remove_reader(front.conn.fileno())
        await runner.cleanup()
