"""pairaudit.serving.slots: at most N launched servers per machine, across every invocation.

Two processes stand in for two audits started beside each other: they share
nothing but the slot directory.  Order is asserted through an events file the
processes append to, never through timings.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pairaudit.serving import slots
from pairaudit.serving.modelstore import EMBEDDED_GGUF_SHA256, cache_root

ROOT = str(Path(__file__).resolve().parents[1])
HAVE_MODEL = (cache_root() / "models" / EMBEDDED_GGUF_SHA256 / "config.json").is_file()


def wait_for(predicate, what: str, limit_s: float = 300):
    # A guard against hanging forever, not a timing assertion.
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def events(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_no_count_means_no_machine_wide_bound(monkeypatch, tmp_path):
    monkeypatch.delenv(slots.SLOTS_ENV, raising=False)
    assert slots.acquire({"arm": "control"}, directory=tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(slots.SLOTS_ENV, "two")
    with pytest.raises(slots.SlotError, match="PAIRAUDIT_SERVER_SLOTS='two'"):
        slots.acquire(directory=tmp_path)


def test_slots_are_taken_in_order_and_given_back(tmp_path):
    a = slots.acquire({"audit": "a1", "arm": "control"}, count=2, directory=tmp_path)
    b = slots.acquire({"audit": "a1", "arm": "candidate"}, count=2, directory=tmp_path)
    assert (a.index, b.index) == (0, 1)
    info = slots.holder(a.path)
    assert info["pid"] == os.getpid() and info["audit"] == "a1" and info["arm"] == "control"
    # a third server in this same process could only wait for itself
    with pytest.raises(slots.SlotError, match="already holds all 2 server slot"):
        slots.acquire(count=2, directory=tmp_path)
    a.release()
    a.release()  # idempotent
    c = slots.acquire(count=2, directory=tmp_path)
    assert c.index == 0
    b.release()
    c.release()


HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pairaudit.serving import slots
    events = Path(sys.argv[2])
    slot = slots.acquire({{"audit": "first-audit", "arm": "control"}}, count=1, directory=Path(sys.argv[1]))
    with open(events, "a") as f:
        f.write("held\\n")
    print("held", flush=True)
    if sys.stdin.readline().strip() == "release":
        with open(events, "a") as f:
            f.write("releasing\\n")
        slot.release()
        sys.stdin.readline()
""")


def _holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(root=ROOT))
    ev = tmp_path / "events"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "slots"), str(ev)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc, ev


def test_a_second_process_waits_for_the_slot_and_logs_who_holds_it(tmp_path):
    proc, ev = _holder(tmp_path)
    waited, got = [], {}

    def second():
        got["slot"] = slots.acquire({"audit": "second-audit"}, count=1, directory=tmp_path / "slots", poll_s=0.05,
                                    on_wait=waited.append)
        with open(ev, "a") as f:
            f.write("acquired\n")

    t = threading.Thread(target=second, daemon=True)
    try:
        t.start()
        wait_for(lambda: waited, "the second process to wait")
        assert f"held by pid {proc.pid} (audit first-audit, arm control" in waited[0]
        assert "got" not in got and events(ev) == ["held"]  # still waiting while the first holds it
        proc.stdin.write("release\n")
        proc.stdin.flush()
        t.join(timeout=120)
        assert not t.is_alive()
        assert events(ev) == ["held", "releasing", "acquired"]
        assert got["slot"].index == 0 and slots.holder(got["slot"].path)["audit"] == "second-audit"
        got["slot"].release()
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_leaks_no_slot(tmp_path):
    proc, _ = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: the kernel drops the flock
    proc.wait()
    got = {}
    t = threading.Thread(target=lambda: got.update(slot=slots.acquire(count=1, directory=tmp_path / "slots",
                                                                      poll_s=0.05)), daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive() and got["slot"].index == 0
    got["slot"].release()


# ---------------------------------------------------------------- two audits, each holding a real Server

AUDIT = textwrap.dedent("""
    import logging, sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pairaudit.serving.armspec import resolve_spec
    from pairaudit.serving.launch import Server
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    name, events, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    def note(text):
        with open(events, "a") as f:
            f.write(f"{{name}} {{text}}\\n")
    spec = resolve_spec("control", {{
        "mode": "launch", "model": "SmolLM2-135M-Instruct", "max_model_len": 256, "health_timeout_s": 600,
        "command": ["{{python}}", "-m", "pairaudit.refserver", "--model", "{{model}}", "--host", "{{host}}",
                    "--port", "{{port}}", "--max-model-len", "{{max_model_len}}", "--threads", "1"],
        "env": {{"PAIRAUDIT_REF_LM_HEAD_BF16": "0"}}}})
    note("starting")
    with Server(spec, log_path=events.with_name(name + "-server.log")) as srv:
        note(f"ready server={{srv.pid}}")
        while not go.exists():
            time.sleep(0.05)
        note("stopping")
    note("stopped")
""")


@pytest.mark.server
@pytest.mark.skipif(not HAVE_MODEL, reason="the embedded model is not converted (python -m pairaudit.serving.modelstore)")
def test_two_audits_at_once_run_their_servers_one_after_the_other(tmp_path):
    script = tmp_path / "audit.py"
    script.write_text(AUDIT.format(root=ROOT))
    ev = tmp_path / "events"
    env = {**os.environ, "PYTHONPATH": ROOT, slots.SLOTS_ENV: "1", slots.SLOTS_DIR_ENV: str(tmp_path / "slots")}
    procs = {}
    try:
        for name in ("first", "second"):
            err = open(tmp_path / f"{name}.err", "w")
            procs[name] = subprocess.Popen([sys.executable, str(script), name, str(ev), str(tmp_path / f"go-{name}")],
                                           env={**env, slots.AUDIT_ENV: f"audit-{name}"}, cwd=ROOT, stderr=err,
                                           stdout=subprocess.DEVNULL)
            if name == "first":
                wait_for(lambda: any(e.startswith("first ready") for e in events(ev)), "the first server")
        second_err = tmp_path / "second.err"
        wait_for(lambda: "waiting for a server slot" in second_err.read_text(), "the second audit to wait")
        msg = second_err.read_text()
        assert f"held by pid {procs['first'].pid} (audit audit-first, arm control" in msg
        assert not any(e.startswith("second ready") for e in events(ev))  # no second server while the first runs
        (tmp_path / "go-first").touch()
        wait_for(lambda: any(e.startswith("second ready") for e in events(ev)), "the second server")
        (tmp_path / "go-second").touch()
        for name, p in procs.items():
            assert p.wait(timeout=300) == 0, (tmp_path / f"{name}.err").read_text()[-3000:]
        order = [e.split(" server=")[0] for e in events(ev)]
        assert order == ["first starting", "first ready", "second starting", "first stopping", "first stopped",
                         "second ready", "second stopping", "second stopped"]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_server_that_fails_to_start_gives_its_slot_back(monkeypatch, tmp_path):
    from pairaudit.serving.armspec import resolve_spec
    from pairaudit.serving.launch import Server, ServerError

    monkeypatch.setenv(slots.SLOTS_ENV, "1")
    monkeypatch.setenv(slots.SLOTS_DIR_ENV, str(tmp_path / "slots"))
    spec = resolve_spec("control", {"mode": "launch", "model": "m", "max_model_len": 64, "health_timeout_s": 20,
                                    "command": ["{python}", "-c", "import sys; sys.exit(3)", "{port}"]})
    with pytest.raises(ServerError):
        Server(spec, log_path=tmp_path / "s.log").start()
    slot = slots.try_acquire(1, tmp_path / "slots", {})  # free again, without waiting
    assert slot is not None and slot.index == 0
    slot.release()


def test_the_workflow_hands_its_server_slots_resource_to_the_jobs():
    from types import SimpleNamespace

    from snakemake.resources import Resources

    from pairaudit import configcheck

    wf = SimpleNamespace(global_resources=Resources.from_mapping({"server_slots": 3, "_cores": 2}))
    assert configcheck.server_slots(wf) == 3
    assert configcheck.server_slots(SimpleNamespace(global_resources=Resources.from_mapping({"_cores": 2}))) is None


@pytest.mark.workflow
@pytest.mark.server
@pytest.mark.skipif(not HAVE_MODEL, reason="the embedded model is not converted (python -m pairaudit.serving.modelstore)")
def test_a_workflow_job_waits_for_a_slot_another_audit_holds(tmp_path, monkeypatch):
    """Snakemake's own bound is per invocation; the slot held here stands in for another audit's server."""
    import shutil

    import yaml

    project = tmp_path / "project"
    project.mkdir()
    for name in ["Snakefile", "rules", "scripts", "config", "profiles", "envs", "pairaudit", "report"]:
        src = Path(ROOT) / name
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, project / name)
    cfg = yaml.safe_load((Path(ROOT) / "tests" / "data" / "tiny_config.yaml").read_text())
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    slot_dir = tmp_path / "slots"
    held = slots.acquire({"audit": "another-audit", "arm": "candidate"}, count=1, directory=slot_dir)
    env = {k: v for k, v in os.environ.items() if k != slots.SLOTS_ENV}
    env.update(PYTHONPATH=ROOT, **{slots.SLOTS_DIR_ENV: str(slot_dir)})
    target = f"results/{cfg['audit']}/launch/control.json"
    log = project / "results" / cfg["audit"] / "logs" / "answers" / "control.log"
    proc = subprocess.Popen([str(Path(sys.executable).with_name("snakemake")), "--cores", "1", target], cwd=project,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: log.exists() and "waiting for a server slot" in log.read_text(), "the job to wait")
        text = log.read_text()
        assert f"held by pid {os.getpid()} (audit another-audit, arm candidate" in text
        assert not (project / target).exists()
        held.release()
        # the waiting job takes the freed slot, labelled with its own audit ...
        wait_for(lambda: "got server slot 0" in log.read_text(), "the job to take the slot")
        assert slots.holder(slot_dir / "slot-0.lock")["audit"] == cfg["audit"]
        # ... and gives it back when it stops (interrupted here: the rest of the phase is not this test's)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=300)
        assert slots.try_acquire(1, slot_dir, {}) is not None
    finally:
        held.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
