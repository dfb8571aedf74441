"""The reference server's two processes (engine, HTTP): each dies with the other, so no orphan keeps the port."""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import pytest
from refserver_fixture import RefServer

pytestmark = pytest.mark.server


def _api_pid(server: RefServer) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"HTTP in process (\d+)", server.log_path.read_text())
        if found:
            return int(found.group(1))
        time.sleep(0.2)
    raise AssertionError("the server did not log its API process")


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie child of ours is gone for this purpose
            if open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z"):
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("victim", ["engine", "api"])
def test_either_process_dying_takes_the_other_and_the_port_with_it(tmp_path, victim):
    server = RefServer(max_model_len=256, log_dir=tmp_path)
    try:
        api = _api_pid(server)
        assert api != server.proc.pid
        assert server.completion(prompt="Hi", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2
        if victim == "engine":
            os.kill(server.proc.pid, signal.SIGKILL)  # no chance to clean up: the API process must notice
            assert _gone(api, 20), "the API process outlived the engine"
        else:
            os.kill(api, signal.SIGKILL)
            server.proc.wait(20)  # the engine exits on its own
            assert server.proc.returncode != 0
            assert "API process" in server.log_path.read_text()
        assert _port_closed(server.port)
    finally:
        server.stop()
