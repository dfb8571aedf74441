"""Record a server's HTTP answers, and serve them again where that server cannot run.

Some servers the audit meets exist only on hardware no CI machine has (vLLM
on a GPU).  ``RecordingProxy`` stands in front of such a server while it runs
and keeps every exchange (method, path, request body, status, content type,
response body); the recording is committed as a JSON file.  ``ReplayServer``
is a real HTTP server that answers the same requests with the recorded
bytes, so the project's own client code (``Endpoint``, the preflight, the
conformance checks) runs against them unchanged in CI.

Requests are matched on method, path and body, but for one part that is
new on every run by design and matches any value of its kind: a fresh
``cache_salt`` (32 hex digits, ``preflight.fresh_salt``), which keeps the
prefix cache from answering a probe with an earlier probe's state.  A
request sent several times is answered in the recorded order, the last
answer repeated once they run out.  A request that was never recorded gets
a 501 naming it, so a test that drifted from its recording fails saying so.

Streams are relayed whole (the proxy reads the upstream answer to its end
before answering), so a recording keeps the events, not their timing.
"""

from __future__ import annotations

import json
import re
import threading
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

SCHEMA = "pairaudit.recording/1"
_FRESH_SALT = re.compile(r"^[0-9a-f]{32}$")


def request_key(method: str, path: str, body: bytes) -> str:
    """The recording's key of one request: method, path and canonical body, fresh salts blanked."""
    text = body.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return f"{method} {path} {text}"
    if isinstance(doc, dict) and isinstance(doc.get("cache_salt"), str) and _FRESH_SALT.match(doc["cache_salt"]):
        doc = {**doc, "cache_salt": "<fresh>"}
    return f"{method} {path} {json.dumps(doc, sort_keys=True, ensure_ascii=False)}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Base:
    """A local HTTP server on 127.0.0.1, started by ``with``; ``url`` is its base URL.

    Its handler hands every request to the owner's ``answer(handler, method, path, body)``.
    """

    def __enter__(self):
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # the exchanges are the record; no access log on stderr
        pass

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self.server.owner.answer(self, "GET", self.path, b"")  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        self.server.owner.answer(self, "POST", self.path, self._body())  # type: ignore[attr-defined]


class RecordingProxy(_Base):
    """Relays every request to ``upstream`` and keeps the exchange."""

    def __init__(self, upstream: str, timeout_s: float = 300):
        self.upstream = upstream.rstrip("/")
        self.timeout_s = timeout_s
        self.exchanges: list[dict] = []
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._session.trust_env = False  # a known local server, never an environment's proxy

    def answer(self, h: _Handler, method: str, path: str, body: bytes) -> None:
        headers = {"Content-Type": h.headers.get("Content-Type", "application/json")} if body else {}
        # A server behind an API key answers the proxy only with the client's key; the key is relayed, never
        # kept: a recording holds exchanges, not credentials.
        if h.headers.get("Authorization"):
            headers["Authorization"] = h.headers["Authorization"]
        try:
            r = self._session.request(method, self.upstream + path, data=body or None, headers=headers,
                                      timeout=self.timeout_s)
            status, ctype, payload = r.status_code, r.headers.get("Content-Type", "application/octet-stream"), r.content
        except requests.RequestException as exc:
            status, ctype = 502, "application/json"
            payload = json.dumps({"error": {"message": f"recording proxy: upstream failed: {exc}"}}).encode()
        with self._lock:
            self.exchanges.append({"method": method, "path": path, "request": body.decode("utf-8", "replace"),
                                   "status": status, "content_type": ctype,
                                   "response": payload.decode("utf-8", "replace")})
        h._send(status, ctype, payload)

    def save(self, path: Path, about: dict[str, Any], outcomes: dict[str, dict] | None = None) -> None:
        """Write the recording: ``about`` says what server it came from (version, flags, device);
        ``outcomes`` are the conformance checks' outcomes as measured live, which a replay must give again."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            doc = {"schema": SCHEMA, "about": about, "outcomes": outcomes, "exchanges": list(self.exchanges)}
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def load(path: Path) -> dict:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a recording (schema {doc.get('schema')!r}, expected {SCHEMA!r})")
    return doc


class ReplayServer(_Base):
    """Answers each request with what was recorded for it."""

    def __init__(self, recording: dict):
        self._answers: dict[str, deque] = defaultdict(deque)
        self._last: dict[str, dict] = {}
        for ex in recording["exchanges"]:
            self._answers[request_key(ex["method"], ex["path"], ex["request"].encode())].append(ex)
        self._lock = threading.Lock()
        self.unrecorded: list[str] = []

    def answer(self, h: _Handler, method: str, path: str, body: bytes) -> None:
        key = request_key(method, path, body)
        with self._lock:
            queue = self._answers.get(key)
            ex = queue.popleft() if queue else self._last.get(key)
            if ex is not None:
                self._last[key] = ex
            else:
                self.unrecorded.append(key)
        if ex is None:
            payload = json.dumps({"error": {"message": f"not in the recording: {key[:300]}", "code": 501}})
            h._send(501, "application/json", payload.encode())
            return
        h._send(ex["status"], ex["content_type"], ex["response"].encode("utf-8"))
