"""Shared fixtures, and how the suite shares two workers (pytest-xdist; docs/tests.md).

``pyproject.toml`` runs the suite on two workers (``-n 2``). Every test gets a
group here, and one worker runs a group's tests one after the other, so its
module and session fixtures start once:

- ``cluster`` (every ``cluster`` test): the real one-node Slurm, queued
  first, beside the other worker's tests. It installs Debian packages,
  writes /etc/slurm and starts daemons that no other test uses; what it may
  not do is leave Slurm installed without its controller while another
  worker still starts snakemake (the Slurm executor plugin, which every
  snakemake start imports, then waits 10 s on ``scontrol``). So the
  cluster stays up for its worker's whole session and is stopped only once
  no other worker runs tests that start snakemake (the snakemake lock below);
- ``serial`` (marker ``serial``): the vLLM install test reruns install.sh,
  which reinstalls the project into the venv every other test imports from.
  It runs after everything else, alone (the machine lock below);
- ``vllm``: every real-vLLM test, around the session's vLLM pair;
- ``timed``: a verdict they assert is decided from speed measured on a real
  server, and a vLLM server working beside it (its engine loop holds a
  core) slowed one start of a bracket far more than the next. They never run
  beside a vLLM test (the vLLM lock below), but need not wait in the vLLM
  worker's queue: whichever worker reaches them runs them once no worker
  runs the vLLM group any more;
- ``tiny-audit``: test_workflow.py, test_report_html.py and test_verify.py, around one run of
  the tiny audit (``tiny_audit``);
- otherwise the test's file, so a module fixture never starts twice.

Groups are queued longest first (the cluster, whose time is mostly Slurm's
submission and polling, then vLLM, then workflow, then server files, then the
timed group, so that the vLLM group is most likely over when a worker reaches
it, then the rest, larger groups first), so the two workers finish close
together; the serial group last. The groups reach the scheduler through a file the workers
write at collection (``GroupScheduling``): xdist's own ``--dist loadgroup``
carries them in the test ids, which pytest 9.2 no longer lets a plugin change,
so it silently schedules test by test there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import fake_server
import pytest

from pairaudit.serving import apikey, slots
from pairaudit.serving.client import Endpoint

SERIAL = "serial"
CLUSTER = "cluster"
VLLM = "vllm"
TIMED = "timed"
SHARED_DIR_ENV = "PAIRAUDIT_TESTS_SHARED_DIR"
# Files whose tests share the tiny audit (one run of tests/data/tiny_config.yaml per worker).
TINY_AUDIT_FILES = {"test_workflow.py", "test_report_html.py", "test_verify.py"}


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


# Real vLLM servers (marker ``vllm``), started once per worker session for every module that asks;
# the worker's reference servers, one per configuration (refserver_fixture.shared_server).
from refserver_fixture import shared_server  # noqa: E402,F401
from vllm_fixture import vllm_pair  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_audit(tmp_path_factory):
    """(project, config): the tiny audit of tests/data/tiny_config.yaml, run once per worker session.

    test_workflow.py checks its artifacts and dry-runs changed configs against it; test_report_html.py
    decides it once more and renders its report. Neither edits a config or reruns a stage of it.
    """
    import yaml
    from test_workflow import TINY, make_project, refserver_pids, snake

    config = yaml.safe_load(TINY.read_text())
    project = make_project(tmp_path_factory.mktemp("wf") / "project", config)
    proc = snake(project, "promotion")
    assert refserver_pids(project) == [], "a server outlived the workflow"
    # what the user's terminal showed (test_workflow reads it): Snakemake logs to stderr, onsuccess prints to stdout
    (project / ".terminal-stderr.txt").write_text(proc.stderr)
    (project / ".terminal-stdout.txt").write_text(proc.stdout)
    return project, config


# ---------------------------------------------------------------- two workers

def is_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def pytest_configure(config):
    # The controller (or a run without workers) makes one scratch directory for the whole run:
    # the workers inherit its path, and find the machine lock and their own server slots there.
    if not is_worker():
        shared = tempfile.mkdtemp(prefix="pairaudit-tests-")
        os.environ[SHARED_DIR_ENV] = shared
        config.add_cleanup(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared = Path(os.environ[SHARED_DIR_ENV])
    # Machine-wide server slots (serving/slots.py) per worker: each worker runs its tests one at a
    # time, so its workflows get one slot as on a machine of their own, and neither the other
    # worker's audits nor one running beside the suite can hold up its servers. Tests of the slots
    # themselves set their own directory.
    os.environ[slots.SLOTS_DIR_ENV] = str(shared / f"slots-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
    # The servers the suite launches take their key from a file of the run's own, not the user's.
    os.environ[apikey.KEY_FILE_ENV] = str(shared / "server-api-key")


def group_of(item) -> str:
    if item.get_closest_marker(SERIAL):
        return SERIAL
    if item.get_closest_marker(CLUSTER):
        return CLUSTER
    if item.get_closest_marker(VLLM):
        return VLLM
    if item.get_closest_marker(TIMED):
        return TIMED
    if item.path.name in TINY_AUDIT_FILES:
        return "tiny-audit"
    return item.path.name


def weight(item) -> int:
    """Lower runs earlier: the long groups first, so that the workers end close together."""
    for rank, marker in enumerate(("vllm", "workflow", "server")):
        if item.get_closest_marker(marker):
            return rank
    return 3


def _groups_file() -> Path:
    return Path(os.environ[SHARED_DIR_ENV]) / "groups.json"


def pytest_collection_modifyitems(config, items):
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    # Whole groups in order, each keeping its tests' order: the cluster first (its worker waits
    # on Slurm's submission and polling, beside the other worker's vLLM start), the serial group
    # last, the rest by their heaviest test, then the larger group first (the unit-test files
    # differ mostly in their number of tests; the sandbox's hostile suite is the longest of
    # them). Without workers this is the run order too: the cluster's session fixture keeps it
    # up to the end of the session, so no later snakemake start meets Slurm without its
    # controller (it would wait 10 s on `scontrol`).
    # The timed group after the workflow and server groups (a worker that reaches it while the vLLM
    # group still runs waits, taking nothing else), before the short unit-test files that even out the end.
    order = sorted(groups, key=lambda g: (g == SERIAL, g != CLUSTER,
                                          2.5 if g == TIMED else min(weight(i) for i in groups[g]), -len(groups[g])))
    items[:] = [item for g in order for item in groups[g]]
    if is_worker():  # every worker collects the same tests: the last one's identical file stays
        tmp = _groups_file().with_suffix(f".{os.environ['PYTEST_XDIST_WORKER']}.tmp")
        tmp.write_text(json.dumps({item.nodeid: g for g in order for item in groups[g]}))
        os.replace(tmp, _groups_file())


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler, with the groups above as scopes (only for the default ``--dist load``)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Whole groups to a worker, in the collection's order (the workers' groups.json).

        A worker asks for the next group when it has two tests or fewer left, so a group's tests
        never split, and queueing longest first is what balances the two workers.
        """

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.config.option.loadscopereorder = False  # keep the collection's order
            self.groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once every worker has collected, i.e. written it
                self.groups = json.loads(_groups_file().read_text())
            return self.groups[nodeid]

    return GroupScheduling(config, log)


# The machine lock (workers only): every worker holds it shared for its whole session; the worker
# that reaches the serial group converts it to exclusive, which waits until every other worker has
# run its last test and torn down its servers. The serial group is queued last, so no other test
# starts after it either: its tests run alone, after everything else.
#
# The vLLM lock (workers only): a worker holds it shared from its first vLLM test to its last, and
# exclusive from its first timed test to its last, so a timed test never runs beside a vLLM test
# (whole groups: a lock taken test by test would let the two groups take turns across the workers).
#
# The snakemake lock (workers only): every worker holds it shared while it may still run a test
# that starts snakemake, i.e. until it reaches the serial group (whose install rerun starts none)
# or ends. The Slurm cluster's teardown takes it exclusive (``until_no_other_worker_starts_snakemake``),
# so Slurm's daemons stop only once no other worker will start snakemake any more.
_lock = None
_snake_lock = None
_vllm_lock = None
_vllm_held: int | None = None   # the mode this worker holds the vLLM lock in, if any
_VLLM_MODES = {VLLM: fcntl.LOCK_SH, TIMED: fcntl.LOCK_EX}


def pytest_sessionstart(session):
    global _lock, _snake_lock, _vllm_lock
    if is_worker():
        shared = Path(os.environ[SHARED_DIR_ENV])
        _lock = open(shared / "machine.lock", "a")
        fcntl.flock(_lock, fcntl.LOCK_SH)
        _snake_lock = open(shared / "snakemake.lock", "a")
        fcntl.flock(_snake_lock, fcntl.LOCK_SH)
        _vllm_lock = open(shared / "vllm.lock", "a")


def until_no_other_worker_starts_snakemake() -> None:
    """Block until every other worker has reached the serial group or ended (no-op without workers)."""
    if _snake_lock is not None:
        fcntl.flock(_snake_lock, fcntl.LOCK_EX)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _vllm_held
    group = group_of(item)
    if _lock is not None and group == SERIAL:
        if _snake_lock is not None:
            fcntl.flock(_snake_lock, fcntl.LOCK_UN)  # before waiting: a cluster's teardown may wait on it
        fcntl.flock(_lock, fcntl.LOCK_EX)  # held to the end of this worker's session
    mode = _VLLM_MODES.get(group)
    if _vllm_lock is not None and mode is not None and _vllm_held != mode:
        fcntl.flock(_vllm_lock, mode)
        _vllm_held = mode
    yield
    if _vllm_lock is not None and _vllm_held is not None and (nextitem is None or group_of(nextitem) != group):
        fcntl.flock(_vllm_lock, fcntl.LOCK_UN)  # the group's last test: the other kind may run
        _vllm_held = None


def pytest_sessionfinish(session):
    global _lock, _snake_lock, _vllm_lock
    if _vllm_lock is not None:
        _vllm_lock.close()
        _vllm_lock = None
    if _snake_lock is not None:
        _snake_lock.close()
        _snake_lock = None
    if _lock is not None:
        _lock.close()  # drops the lock: a worker waiting for the serial group goes on
        _lock = None
