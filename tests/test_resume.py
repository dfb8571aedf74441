"""Resuming after a crash: a dead snakemake's lock is cleared, a live one's never; a killed start's evidence is kept."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from pairaudit.core import resume
from pairaudit.serving import armspec, launch
from pairaudit.serving.armspec import ArmSpec


def _lock(workdir: Path, n: int = 0) -> Path:
    d = workdir / resume.LOCKS
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{n}.output.lock"
    p.write_text("results/x/answers/control.json\n")
    return p


def _owner(workdir: Path, rec: dict) -> Path:
    path = resume.owner_path(workdir, rec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def _finished_pid() -> dict:
    """The identity a process had while it ran; it has exited since."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    rec = resume.identity(proc.pid)
    proc.kill()
    proc.wait()
    return rec


def test_a_dead_owners_lock_is_cleared_and_a_live_owners_never(tmp_path):
    lock = _lock(tmp_path)
    dead = _owner(tmp_path, _finished_pid())
    cleared, said = resume.clear_stale_locks(tmp_path)
    assert cleared and not lock.exists() and not dead.exists()
    assert any("no longer runs" in s for s in said), said

    # a live snakemake (here: a sleeping process recorded as one) keeps its lock, and a dead one's with it
    live_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = _lock(tmp_path)
        live = _owner(tmp_path, resume.identity(live_proc.pid))
        _owner(tmp_path, _finished_pid())
        cleared, said = resume.clear_stale_locks(tmp_path)
        assert not cleared and lock.exists() and live.exists()
        assert any("lock kept" in s and "still runs" in s for s in said), said
    finally:
        live_proc.kill()
        live_proc.wait()
    # the same pid, reused by another process, is not the owner: its start time differs
    reused = {**resume.identity(), "pid": os.getpid(), "start_ticks": resume.start_ticks(os.getpid()) - 1}
    live.unlink()
    _owner(tmp_path, reused)
    cleared, said = resume.clear_stale_locks(tmp_path, me=-1)
    assert cleared and not lock.exists(), said
    assert any("another process now" in s for s in said)


def test_a_rebooted_host_an_unknown_host_and_an_unowned_lock(tmp_path, monkeypatch):
    lock = _lock(tmp_path)
    # this host, an earlier boot: whatever runs with that pid now is not it
    _owner(tmp_path, {**resume.identity(), "boot_id": "an-earlier-boot"})
    cleared, said = resume.clear_stale_locks(tmp_path, me=-1)
    assert cleared and any("rebooted" in s for s in said)
    # another host, no Slurm job: cannot be judged from here, so the lock stays
    lock = _lock(tmp_path)
    other = _owner(tmp_path, {"pid": 4242, "host": "elsewhere-" + socket.gethostname(), "boot_id": "b",
                              "start_ticks": 1, "slurm_job_id": None})
    cleared, said = resume.clear_stale_locks(tmp_path)
    assert not cleared and lock.exists() and any("another host" in s for s in said)
    # ... unless it ran as the Slurm job this process is (a requeued job's earlier run is over)
    other.unlink()
    _owner(tmp_path, {"pid": 4242, "host": "node-7", "boot_id": "b", "start_ticks": 1, "slurm_job_id": "991"})
    monkeypatch.setenv("SLURM_JOB_ID", "991")
    cleared, said = resume.clear_stale_locks(tmp_path)
    assert cleared and not lock.exists() and any("requeued" in s for s in said)
    # a lock without any owner record is never taken for stale
    lock = _lock(tmp_path)
    cleared, said = resume.clear_stale_locks(tmp_path)
    assert not cleared and lock.exists() and any("no recorded owner" in s for s in said)


def _spec() -> ArmSpec:
    return armspec.resolve_spec("control", {
        "mode": "launch", "model": "m", "max_model_len": 64,
        "command": ["{python}", "-m", "x", "--port", "{port}", "--host", "{host}"]})


def test_a_killed_start_gets_a_lost_end_and_its_log_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_KEPT", {})
    log = tmp_path / "logs" / "servers" / "answers-control.log"
    log.parent.mkdir(parents=True)
    log.write_text("=== pairaudit launch (the killed start)\n")
    starts = tmp_path / "servers" / "starts.jsonl"
    spec = _spec()
    # the killed start: its job and its server gone, no stop recorded
    job = _finished_pid()
    server = _finished_pid()
    starts.parent.mkdir(parents=True)
    starts.write_text(json.dumps({
        "schema": "pairaudit.server-start/v1", "event": "ready", "phase": "answers", "arm": "control",
        "pid": server["pid"], "ready_at": "t0", "log_path": str(log), "host": job["host"], "boot_id": job["boot_id"],
        "job_pid": job["pid"], "job_start_ticks": job["start_ticks"], "slurm_job_id": None}) + "\n")
    # a start of a job still running beside this one (this process): stays open
    me = resume.identity()
    with open(starts, "a") as f:
        f.write(json.dumps({"event": "ready", "phase": "answers", "arm": "candidate", "pid": os.getpid(),
                            "host": me["host"], "boot_id": me["boot_id"], "job_pid": me["pid"],
                            "job_start_ticks": me["start_ticks"]}) + "\n")
    kept = launch.claim_log(log)
    assert kept == str(log.with_name("answers-control.1.log")) and not log.exists()
    assert Path(kept).read_text() == "=== pairaudit launch (the killed start)\n"
    assert launch.claim_log(log) == kept   # once per job: a second start of the same log appends to it
    launch.log_start_event(starts, event="ready", phase="answers", spec=spec, receipt=None,
                           facts={"pid": 1234, "log_path": str(log)})
    events = [json.loads(line) for line in starts.read_text().splitlines()]
    assert [e["event"] for e in events] == ["ready", "ready", "lost", "ready"]
    lost = events[2]
    assert (lost["phase"], lost["arm"], lost["pid"]) == ("answers", "control", server["pid"])
    assert lost["log_path"] == kept and "no longer runs" in lost["why"]
    assert events[3]["job_pid"] == os.getpid() and events[3]["log_path"] == str(log)
    # the next start closes nothing twice
    launch.log_start_event(starts, event="ready", phase="answers", spec=spec, receipt=None, facts={"pid": 1235})
    assert sum(1 for line in starts.read_text().splitlines() if json.loads(line)["event"] == "lost") == 1
    # a second kill: the next job's log numbers on
    monkeypatch.setattr(launch, "_KEPT", {})
    log.write_text("second\n")
    assert launch.claim_log(log) == str(log.with_name("answers-control.2.log"))


def test_every_profile_reruns_incomplete_outputs():
    import yaml

    root = Path(__file__).resolve().parents[1] / "profiles"
    for name in ("default", "gpu-host", "slurm"):
        assert yaml.safe_load((root / name / "config.yaml").read_text()).get("rerun-incomplete") is True, name
