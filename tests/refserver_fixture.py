"""Start the real reference server (real model) on a free loopback port for tests.

Test servers run with one compute thread: the suite runs on two workers on a
2-core machine, and a 2-thread server whose second thread is descheduled waits
at every OpenMP barrier (docs/reference-server-performance.md, Threads: 10x
slower decoding when the machine is oversubscribed). The thread count does not
change the numbers: greedy tokens and logprobs are bitwise the same with 1 and
2 threads (checked on the fp32 model: decode, a 700-token prefill, a seeded
sampled chat).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[1]
SWITCH_DEFAULTS = {
    "PAIRAUDIT_REF_LM_HEAD_BF16": "0",
    "PAIRAUDIT_REF_SPEC_NGRAM": "0",
    "PAIRAUDIT_REF_FAULT_TAIL": "0",
    "PAIRAUDIT_REF_FAULT_NOISE": "0",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# See the module docstring; tests/data/tiny_config.yaml and the tests that launch the server themselves
# pass the same flag.
THREADS = ["--threads", "1"]


class RefServer:
    def __init__(self, env: dict | None = None, max_model_len: int = 1024, extra_args=(), log_dir: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.max_model_len = max_model_len
        full_env = {**os.environ, **SWITCH_DEFAULTS, **(env or {})}
        log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        self.log_path = log_dir / f"refserver-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pairaudit.refserver", "--port", str(self.port), "--host", "127.0.0.1",
             "--max-model-len", str(max_model_len), *THREADS, *extra_args],
            env=full_env, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"refserver exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("refserver did not become healthy in 300 s")

    def post(self, path: str, body: dict, **kw) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=300, **kw)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=30)

    def completion(self, **body) -> dict:
        r = self.post("/v1/completions", {"model": "SmolLM2-135M-Instruct", **body})
        assert r.status_code == 200, r.text
        return r.json()

    def metric(self, name: str) -> float:
        total = 0.0
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """Factory ``(env=None, max_model_len=512) -> RefServer``: one server per configuration and worker.

    The server tests ask for a handful of configurations (fp32, the BF16 head, n-gram speculation,
    the planted faults; 512 or 1024 tokens) in many modules; each starts once per worker session
    and serves every test that asks. A server keeps nothing between requests but its counters,
    which the tests read as differences; a test that stops its server starts its own instead.
    """
    started: dict[tuple, RefServer] = {}
    log_dir = tmp_path_factory.mktemp("refservers")

    def get(env: dict | None = None, max_model_len: int = 512) -> RefServer:
        key = (tuple(sorted({**SWITCH_DEFAULTS, **(env or {})}.items())), max_model_len)
        server = started.get(key)
        if server is None or server.proc.poll() is not None:
            if server is not None:
                server.stop()  # died under an earlier test: its log closed, a fresh start
            server = started[key] = RefServer(env, max_model_len=max_model_len, log_dir=log_dir)
        return server

    yield get
    for server in started.values():
        server.stop()


def module_server(env: dict | None = None, max_model_len: int = 512):
    """A fixture serving the real model with ``env`` switches (the worker's shared server)."""

    @pytest.fixture(scope="module")
    def fixture(shared_server):
        return shared_server(env, max_model_len)

    return fixture
