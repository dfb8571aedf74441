"""HTTP client for vLLM-style OpenAI-compatible servers.

Nothing here raises on an HTTP error status: audits need the server's own
words (a 400 whose body was dropped can cost a whole admission window),
so every call returns a plain record and the caller decides.

Records (all JSON-able dicts)
-----------------------------
HttpResult (``Endpoint.get_json`` / ``Endpoint.post_json``)::

    {"method": "GET"|"POST", "path": str,
     "status": int | None,          # None = no HTTP answer at all
     "body": <parsed JSON> | str | None,   # server body kept verbatim on errors
     "error": None                  # 2xx
            | "http <code>: <server message>"
            | "transport: <kind>: <detail>",   # refused, reset, timeout, ...
     "elapsed_s": float, "started_at": ISO-8601 UTC str}

StreamResult (``Endpoint.stream_completion``), timing definitions as in
``vllm bench serve``::

    {"path": str, "status": int | None, "text": str, "finish_reason": str | None,
     "usage": dict | None, "chunks": int,      # SSE events that carried choices
     "events": int,                             # all data events incl. usage-only
     "ttft_s": float | None,   # start -> first event with non-empty choices
     "itl_s": [float],         # gaps between consecutive choice events
     "e2el_s": float | None,   # start -> last choice event
     "tpot_s": float | None,   # (e2el - ttft) / (completion_tokens - 1)
     "output_tokens": int | None,   # usage.completion_tokens
     "body": <error body> | None, "error": None | "http ..." | "transport: ..." | "stream: ...",
     "started_at": str}

Metrics (``metrics``): ``{name: sum over label sets, name{k="v",...}: value}``;
label keys are sorted inside the braces so two scrapes always key alike.

HealthResult (``wait_healthy``)::

    {"healthy": True, "waited_s": float, "polls": int, "last_status": int}
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, TypeGuard

import requests
from prometheus_client.parser import text_string_to_metric_families

from pairaudit.core.artifacts import canonical_json, utc_now

# Keep the health poll's own request short so the overall deadline holds even
# when the server accepts a connection but never answers.
_HEALTH_REQUEST_TIMEOUT_S = 2.0


class ServerError(RuntimeError):
    """A server died, never became healthy, or is not the server we asked for."""


def error_message(body: Any, limit: int = 2000) -> str:
    """The human part of an error body, in vLLM's old or new shape, else the text."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message") is not None:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message") is not None:  # older vLLM: {"object": "error", "message": ...}
            return str(body["message"])
        if body.get("detail") is not None:  # FastAPI validation errors
            return canonical_json(body["detail"])[:limit]
        return canonical_json(body)[:limit]
    if body is None:
        return ""
    return str(body)[:limit]


def _parse_body(resp: requests.Response) -> Any:
    text = resp.text
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _transport_error(exc: BaseException) -> str:
    if isinstance(exc, requests.Timeout):
        kind = "timeout"
    elif isinstance(exc, requests.ConnectionError):
        kind = "connection"
    else:
        kind = type(exc).__name__
    return f"transport: {kind}: {exc}"


POOL_CONNECTIONS = 128


class Endpoint:
    """One server base URL plus the model name requests should carry."""

    def __init__(self, base_url: str, *, model: str | None = None, timeout_s: float = 600,
                 api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.session = requests.Session()
        # Never pick up proxies from the environment: audits talk to a known
        # host, and a corporate proxy answering instead would be a silent lie.
        self.session.trust_env = False
        # One kept-alive connection per concurrent request: requests' default
        # pool holds 10, so at concurrency 16 (a GPU audit) every extra
        # connection was opened and thrown away again, with a warning per
        # request (seen on an H200).  POOL_CONNECTIONS covers the phases'
        # concurrency settings with room to spare.
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_CONNECTIONS)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        # The key lives in the session's headers only: no request record, error, repr or log line carries
        # it (a request record keeps method, path, body, status; never a header).
        self.keyed = bool(api_key)
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def __repr__(self) -> str:
        return f"Endpoint({self.base_url!r}, model={self.model!r})"

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def _request(self, method: str, path: str, body: Any = None,
                 timeout_s: float | None = None, without_key: bool = False) -> dict:
        started_at = utc_now("milliseconds")
        t0 = time.perf_counter()
        rec: dict = {"method": method, "path": path, "status": None, "body": None,
                     "error": None, "elapsed_s": None, "started_at": started_at}
        try:
            # a request-level None drops the session's header: the same request, without the key
            drop: Any = {"Authorization": None} if without_key else None
            resp = self.session.request(method, self.url(path), json=body, headers=drop,
                                        timeout=timeout_s if timeout_s is not None else self.timeout_s)
            rec["status"] = resp.status_code
            rec["body"] = _parse_body(resp)
            if not 200 <= resp.status_code < 300:
                rec["error"] = f"http {resp.status_code}: {error_message(rec['body'])}"
        except requests.RequestException as exc:
            rec["error"] = _transport_error(exc)
        rec["elapsed_s"] = time.perf_counter() - t0
        return rec

    def get_json(self, path: str, *, timeout_s: float | None = None, without_key: bool = False) -> dict:
        """GET; the body is parsed JSON when it parses, else the raw text (e.g. /metrics). ``without_key``:
        sent with no Authorization header (the preflight's check that the server refuses it)."""
        return self._request("GET", path, timeout_s=timeout_s, without_key=without_key)

    def post_json(self, path: str, body: dict, *, timeout_s: float | None = None) -> dict:
        return self._request("POST", path, body=body, timeout_s=timeout_s)

    def scrape_metrics(self, *, timeout_s: float | None = None) -> tuple[dict, dict[str, float] | None]:
        """(HttpResult, parsed metrics or None when the scrape failed)."""
        res = self.get_json("/metrics", timeout_s=timeout_s)
        if res["error"] is None and isinstance(res["body"], str):
            return res, metrics(res["body"])
        return res, None

    def stream_completion(self, path: str, body: dict, *, timeout_s: float | None = None) -> dict:
        """POST ``body`` as a stream and time it the way ``vllm bench serve`` does.

        Only choice index 0 is followed (n=1 requests). The caller's dict is not
        modified; ``stream`` and ``stream_options.include_usage`` are forced on
        because TPOT needs the server's completion token count.
        """
        req = dict(body)
        req["stream"] = True
        req["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        out: dict = {"path": path, "status": None, "text": "", "finish_reason": None,
                     "usage": None, "chunks": 0, "events": 0, "ttft_s": None, "itl_s": [],
                     "e2el_s": None, "tpot_s": None, "output_tokens": None, "body": None,
                     "error": None, "started_at": utc_now("milliseconds")}
        parts: list[str] = []
        t0 = time.perf_counter()
        last_t: float | None = None
        try:
            with self.session.post(self.url(path), json=req, stream=True,
                                   timeout=timeout_s if timeout_s is not None else self.timeout_s) as resp:
                out["status"] = resp.status_code
                if resp.status_code != 200:
                    out["body"] = _parse_body(resp)
                    out["error"] = f"http {resp.status_code}: {error_message(out['body'])}"
                    return out
                for raw in resp.iter_lines(decode_unicode=False):
                    now = time.perf_counter()
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line or line.startswith(":") or not line.startswith("data:"):
                        continue  # blank separators, SSE comments, event:/id: fields
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        out["error"] = f"stream: unparseable event: {data[:200]}"
                        break
                    out["events"] += 1
                    if isinstance(event, dict) and event.get("error") is not None:
                        # vLLM reports mid-stream failures as an error event with a 200 status.
                        out["body"] = event
                        out["error"] = f"stream: {error_message(event)}"
                        break
                    choices = event.get("choices") if isinstance(event, dict) else None
                    if choices:
                        if last_t is None:
                            out["ttft_s"] = now - t0
                        else:
                            out["itl_s"].append(now - last_t)
                        last_t = now
                        out["chunks"] += 1
                        ch = choices[0]
                        piece = ch.get("text")
                        if piece is None and isinstance(ch.get("delta"), dict):
                            piece = ch["delta"].get("content")
                        if piece:
                            parts.append(piece)
                        if ch.get("finish_reason") is not None:
                            out["finish_reason"] = ch["finish_reason"]
                    if isinstance(event, dict) and event.get("usage"):
                        out["usage"] = event["usage"]
        except requests.RequestException as exc:
            out["error"] = _transport_error(exc)
        out["text"] = "".join(parts)
        if last_t is not None:
            out["e2el_s"] = last_t - t0
        if out["usage"]:
            out["output_tokens"] = out["usage"].get("completion_tokens")
        n = out["output_tokens"]
        if isinstance(n, int) and n > 1 and out["ttft_s"] is not None and out["e2el_s"] is not None:
            out["tpot_s"] = (out["e2el_s"] - out["ttft_s"]) / (n - 1)
        if out["error"] is None and out["status"] == 200 and out["finish_reason"] is None:
            out["error"] = "stream: ended without a finish_reason"
        return out


# --- answers: reasoning and silent max_tokens clamping -------------------------

# vLLM 0.32 refuses a cache_salt over 128 characters or holding '@', '/', '\\'
# or NUL; salts we make stay inside the narrower [A-Za-z0-9_.-] so that no
# release's check and no log or path they end up in can trip over them.
MAX_SALT_CHARS = 128
SALT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_SALT_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def safe_salt(readable: str, unique: str = "") -> str:
    """A cache salt of at most 128 ``[A-Za-z0-9_.-]`` characters.

    ``unique`` (e.g. random hex) is kept whole; ``readable`` (audit, arm,
    case: for reading logs) has other characters replaced by ``_`` and is
    cut from the left to fit, so its most specific end survives.
    """
    unique = _SALT_BAD.sub("_", unique)[:MAX_SALT_CHARS]
    room = MAX_SALT_CHARS - len(unique) - (1 if unique and readable else 0)
    text = _SALT_BAD.sub("_", readable)[-room:] if room > 0 else ""
    salt = f"{text}-{unique}" if text and unique else (text or unique)
    return salt or "salt"


def requested_max_tokens(body: dict | None) -> int | None:
    """The output budget a request asked for (chat's ``max_completion_tokens`` wins, as in vLLM)."""
    if not isinstance(body, dict):
        return None
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def chat_message(choice: dict | None) -> dict:
    """``{"content", "reasoning"}`` of a chat choice.

    vLLM puts a reasoning parser's output in ``message.reasoning`` (0.32) or
    ``reasoning_content`` (older releases), and ``content`` may then be null.
    """
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        return {"content": None, "reasoning": None}
    reasoning = msg.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = msg.get("reasoning_content")
    content = msg.get("content")
    return {"content": content if isinstance(content, str) else None,
            "reasoning": reasoning if isinstance(reasoning, str) else None}


def clamping(body: dict | None, finish_reason: str | None, usage: dict | None,
             max_model_len: int | None = None) -> dict:
    """Did the server silently lower ``max_tokens``?  Pure.

    Older vLLM releases refuse prompt + max_tokens > max_model_len with a 400;
    vLLM 0.32 instead lowers max_tokens to what fits and answers 200 with
    finish_reason "length".  Such an answer is neither natural nor what was
    asked: it is *clamped* when it stopped for length with fewer tokens than
    asked.  ``over_context`` says whether the request itself did not fit
    (prompt + asked > max_model_len, when both are known): a clamp that did
    fit is the server's own fault, not the configuration's.

    Returns ``{"clamped": bool, "asked": int | None, "completion_tokens",
    "prompt_tokens", "max_model_len", "over_context": bool | None, "reason": str | None}``.
    """
    asked = requested_max_tokens(body)
    usage = usage if isinstance(usage, dict) else {}
    got, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")

    def is_int(v: Any) -> TypeGuard[int]:
        return isinstance(v, int) and not isinstance(v, bool)

    over = None
    if is_int(prompt) and is_int(asked) and is_int(max_model_len):
        over = prompt + asked > max_model_len
    clamped = finish_reason == "length" and is_int(got) and is_int(asked) and got < asked
    reason = None
    if clamped:
        reason = f"max_tokens clamped: asked {asked}, got {got} tokens with finish_reason 'length'"
        if over:
            reason += (f" (prompt {prompt} + max_tokens {asked} > max_model_len {max_model_len}: the server "
                       "lowered max_tokens to what fits instead of refusing)")
        elif over is False:
            reason += f" although prompt {prompt} + max_tokens {asked} fits max_model_len {max_model_len}"
    return {"clamped": clamped, "asked": asked, "completion_tokens": got, "prompt_tokens": prompt,
            "max_model_len": max_model_len, "over_context": over, "reason": reason}


# --- Prometheus text ---------------------------------------------------------

def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _samples(text: str):
    """Every sample of the exposition text; a line the parser refuses is skipped, not fatal."""
    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except ValueError:
        pass
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                out += [s for fam in text_string_to_metric_families(line + "\n") for s in fam.samples]
            except ValueError:
                continue
    return out


def metrics(text: str) -> dict[str, float]:
    """Parse Prometheus exposition text (prometheus_client's parser).

    Returns both the per-name total (summed over label sets, which is what a
    counter like ``vllm:spec_decode_num_drafts_total`` means when several
    models or engines report) and every labelled sample under
    ``name{k="v",...}`` with label keys sorted and values escaped as in the
    exposition format. Malformed lines are skipped rather than fatal: a
    scrape is evidence, and one odd line must not hide the counters we need.
    """
    out: dict[str, float] = {}
    for sample in _samples(text):
        name, value = sample.name, float(sample.value)
        out[name] = out.get(name, 0.0) + value
        if sample.labels:
            key = name + "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(sample.labels.items())) + "}"
            out[key] = out.get(key, 0.0) + value
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for every key present after the request.

    A key missing before counts as 0 (vLLM creates labelled series lazily, on
    first use); a key present only before is dropped (nothing to compare).
    """
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


# --- health ------------------------------------------------------------------

def tail_lines(path, n: int = 30, *, offset: int = 0) -> str:
    """The last ``n`` lines of a log file from byte ``offset`` on ('' if absent)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            # Read at most ~256 KiB: a chatty server can write megabytes.
            start = max(offset, size - 256 * 1024)
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])


def _with_tail(msg: str, log_path, log_offset: int) -> str:
    if log_path is None:
        return msg
    tail = tail_lines(log_path, 30, offset=log_offset)
    return f"{msg}\n--- last lines of {log_path} ---\n{tail if tail else '(log empty)'}"


def wait_healthy(endpoint: Endpoint, timeout_s: float, proc=None, log_path=None, *,
                 log_offset: int = 0, poll_s: float = 0.25) -> dict:
    """Poll GET /health until 200; raise ``ServerError`` on exit or deadline.

    ``proc`` (a ``subprocess.Popen``) is checked between polls so a server that
    crashed at import time fails in well under a second instead of after the
    whole timeout. The error message carries the log tail because that is
    where the server says why.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    polls = 0
    last = None
    while True:
        if proc is not None and proc.poll() is not None:
            raise ServerError(_with_tail(
                f"server process exited with code {proc.returncode} before becoming healthy "
                f"({endpoint.base_url})", log_path, log_offset))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            what = f"last /health: {last['error'] or last['status']}" if last else "no poll completed"
            raise ServerError(_with_tail(
                f"server at {endpoint.base_url} not healthy after {timeout_s:g} s ({what})",
                log_path, log_offset))
        last = endpoint.get_json("/health", timeout_s=max(0.05, min(_HEALTH_REQUEST_TIMEOUT_S, remaining)))
        polls += 1
        if last["status"] == 200:
            return {"healthy": True, "waited_s": time.monotonic() - t0, "polls": polls,
                    "last_status": 200}
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
