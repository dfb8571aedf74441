"""How tests/conftest.py groups and queues the suite for two workers (docs/tests.md, "Two workers").

Fake items stand in for collected tests: the groups and their order are what the workers' scheduler
reads, so a marker moved to another group, or the cluster queued last again, shows here.
"""

from __future__ import annotations

import os
from pathlib import Path

import conftest


class Item:
    def __init__(self, file: str, *markers: str):
        self.path = Path("/repo/tests") / file
        self.nodeid = f"tests/{file}::t{id(self)}"
        self._markers = set(markers)

    def get_closest_marker(self, name: str):
        return name if name in self._markers else None


def queued(items: list[Item]) -> list[str]:
    """The groups in the order the collection hook leaves them (as without workers)."""
    worker = os.environ.pop("PYTEST_XDIST_WORKER", None)
    try:
        conftest.pytest_collection_modifyitems(None, items)
    finally:
        if worker is not None:
            os.environ["PYTEST_XDIST_WORKER"] = worker
    order: list[str] = []
    for item in items:
        group = conftest.group_of(item)
        if not order or order[-1] != group:
            order.append(group)
    return order


def test_each_marker_has_its_group():
    assert conftest.group_of(Item("test_slurm.py", "workflow", "cluster")) == "cluster"
    assert conftest.group_of(Item("test_vllm_install.py", "vllm", "serial")) == "serial"
    assert conftest.group_of(Item("test_vllm_audit.py", "vllm")) == "vllm"
    assert conftest.group_of(Item("test_sweep_workflow.py", "workflow", "timed")) == "timed"
    assert conftest.group_of(Item("test_speed_sweep.py", "server", "timed")) == "timed"
    assert conftest.group_of(Item("test_report_html.py")) == "tiny-audit"
    assert conftest.group_of(Item("test_stats.py")) == "test_stats.py"


def test_the_cluster_first_the_timed_tests_after_the_server_files_the_reinstall_last():
    items = [Item("test_stats.py"), Item("test_stats.py"),
             Item("test_vllm_install.py", "vllm", "serial"),
             Item("test_sweep_workflow.py", "workflow", "timed"),
             Item("test_refserver.py", "server"),
             Item("test_vllm_audit.py", "vllm"), Item("test_vllm_conformance.py", "vllm"),
             Item("test_speed_sweep.py"), Item("test_speed_sweep.py", "server", "timed"),
             Item("test_workflow.py", "workflow"),
             Item("test_slurm.py", "workflow", "cluster"), Item("test_slurm.py", "workflow", "cluster")]
    assert queued(items) == ["cluster", "vllm", "tiny-audit", "test_refserver.py", "timed", "test_stats.py",
                             "test_speed_sweep.py", "serial"]
    # a group's tests stay together, in their collected order
    assert [i.path.name for i in items[:2]] == ["test_slurm.py", "test_slurm.py"]
