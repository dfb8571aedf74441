"""Real vLLM servers for the ``vllm`` tests: the project's vLLM venv, the embedded model.

The interpreter is ``$PAIRAUDIT_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python``
(``./install.sh --vllm``). Where neither exists the tests skip, saying so,
except under CI (``CI=true``), where a missing vLLM is a failure: CI installs
it, so a skip there would hide a missing install step.

Servers start with ``--enforce-eager`` (no torch.compile: healthy in 30-100 s
on a shared 2-core machine instead of minutes), a small ``max_model_len`` and
a 1 GiB KV cache, and are stopped (their whole process group) at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from pairaudit import configcheck
from pairaudit.serving import armspec, modelstore

REPO = Path(__file__).resolve().parents[1]
MODEL = modelstore.EMBEDDED_NAME
MML = 1024
HEALTH_TIMEOUT_S = 900  # vLLM's start on 2 shared cores under load: 30 s to several minutes
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                    "prompt_lookup_min": 2})

# The candidate's reduced precision: bfloat16 where the CPU computes it natively, float16
# elsewhere (vLLM's CPU build emulates bfloat16 without AVX512-BF16/AMX, a few tokens/s).
HALF = "bfloat16" if (configcheck.cpu_flags() or set()) & set(configcheck.BF16_FLAGS) else "float16"

pytestmark = pytest.mark.vllm


def vllm_python_or_skip() -> str:
    exe = armspec.vllm_python()
    if os.access(exe, os.X_OK):
        return str(exe)
    msg = (f"real vLLM not installed: {exe} is missing (run ./install.sh --vllm, or set "
           f"{armspec.VLLM_PYTHON_ENV})")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg + "; CI installs it, so this is a missing install step")
    pytest.skip(msg)


def model_dir() -> str:
    path, _ = modelstore.resolve_model(MODEL)  # converts once where the cache is missing
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_args(*, dtype: str = "float32", max_model_len: int = MML, extra=()) -> list[str]:
    """The server's arguments after ``-m vllm.entrypoints.openai.api_server`` (without host/port)."""
    return ["--model", model_dir(), "--served-model-name", MODEL, "--max-model-len", str(max_model_len),
            "--dtype", dtype, "--enforce-eager", "--max-num-seqs", "4", "--seed", "0", *extra]


# OMP_NUM_THREADS as the example configs state it (see docs/vllm.md, Threads)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto", "OMP_NUM_THREADS": "1"}


class VllmServer:
    """One real vLLM OpenAI server on a free loopback port; ``wait()`` until healthy."""

    def __init__(self, log_dir: Path, *, name: str, dtype: str = "float32", max_model_len: int = MML, extra=()):
        self.python = vllm_python_or_skip()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.max_model_len = max_model_len
        self.name = name
        self.log_path = Path(log_dir) / f"vllm-{name}-{self.port}.log"
        self.argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", *vllm_args(
            dtype=dtype, max_model_len=max_model_len, extra=extra), "--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, env={**os.environ, **VLLM_ENV}, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                     start_new_session=True)

    def wait(self) -> "VllmServer":
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM {self.name} exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM {self.name} not healthy after {HEALTH_TIMEOUT_S} s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        # engine core and workers share the group and may outlive the leader
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(30)
        self._log.close()


def start_all(log_dir: Path, specs: dict) -> dict:
    """Start several servers at once (their loads overlap) and wait for all; stop all on any failure."""
    servers = {}
    try:
        for name, kw in specs.items():
            servers[name] = VllmServer(log_dir, name=name, **kw)
        for s in servers.values():
            s.wait()
    except BaseException:
        for s in servers.values():
            s.stop()
        raise
    return servers


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory):
    """A float32 control and a reduced-precision candidate (``HALF``), started once for the whole session."""
    vllm_python_or_skip()
    servers = start_all(tmp_path_factory.mktemp("vllm-logs"), {"fp32": {"dtype": "float32"},
                                                               "half": {"dtype": HALF}})
    yield servers
    for s in servers.values():
        s.stop()
