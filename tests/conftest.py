"""Shared fixtures."""

import threading

import fake_server
import pytest

from pairaudit.serving.client import Endpoint


@pytest.fixture
def fake():
    """Factory: an in-process fake server with the given faults (error paths only); yields an Endpoint."""
    servers = []

    def make(*faults, **kw):
        srv = fake_server.make_server(faults=faults, **kw)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return Endpoint(f"http://127.0.0.1:{srv.server_address[1]}", model="fake-model", timeout_s=10)

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()

# Real vLLM servers (marker ``vllm``), started once per session for every module that asks.
from vllm_fixture import vllm_pair  # noqa: E402,F401


def pytest_collection_modifyitems(config, items):
    # The cluster test installs Slurm and stops its daemons afterwards. With
    # Slurm installed and no controller, the Slurm executor plugin's import
    # waits up to 10 s on `scontrol show config` in every later snakemake
    # start, so the cluster test runs last.
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
