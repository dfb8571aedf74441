"""A job never outlives its snakemake, also one whose snakemake died as it started the job (real processes).

A stand-in for snakemake (a script named ``snakemake``, so ``lifecycle.is_snakemake`` knows it) records
itself as the Snakefile does (``relay_interrupts`` -> ``mark_snakemake``) and starts a job that only
looks for its snakemake after a delay, as a job does after its imports. Killed with SIGKILL before that,
the job is an orphan before it can find its ancestor: the recorded process is what stops it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pairaudit.core import lifecycle

REPO = Path(__file__).resolve().parents[1]

FAKE_SNAKEMAKE = """
import os, subprocess, sys, time
sys.path.insert(0, {repo!r})
from pairaudit.core import lifecycle
if sys.argv[1] == "mark":
    lifecycle.mark_snakemake()
else:
    os.environ.pop(lifecycle.SNAKEMAKE_ENV, None)
job = subprocess.Popen([sys.executable, "-c", {job!r}, sys.argv[2], sys.argv[3]])
print(job.pid, flush=True)
time.sleep(600)
"""

# a job: its imports take a while, then it looks for its snakemake (lifecycle.install, as core.jobs.run_job)
JOB = """
import sys, time
time.sleep(float(sys.argv[1]))
sys.path.insert(0, {repo!r})
from pairaudit.core import lifecycle
watched = lifecycle.install(interval_s=0.2)
open(sys.argv[2], "w").write(str(watched))
time.sleep(120)
"""


def start(tmp_path, *, mark: bool, delay: float) -> tuple[subprocess.Popen, int, Path]:
    script = tmp_path / "snakemake"
    script.write_text(FAKE_SNAKEMAKE.format(repo=str(REPO), job=JOB.format(repo=str(REPO))))
    installed = tmp_path / "installed"
    proc = subprocess.Popen([sys.executable, str(script), "mark" if mark else "plain", str(delay), str(installed)],
                            stdout=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items()
                                                                    if k != lifecycle.SNAKEMAKE_ENV})
    job = int(proc.stdout.readline())
    return proc, job, installed


def wait_gone(pid: int, timeout_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not lifecycle._alive(pid):
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_job_whose_snakemake_died_as_it_started_it_ends_itself(tmp_path):
    proc, job, installed = start(tmp_path, mark=True, delay=2.0)
    try:
        proc.kill()            # kill -9 of snakemake before the job looked for it: the job is already an orphan
        proc.wait()
        assert lifecycle._alive(job)
        gone = wait_gone(job, 15)
        assert gone is not None, "the job outlived its snakemake"
        assert gone < 2.0 + 5.0   # its imports, then its watchdog's first look
    finally:
        kill(job)


def test_without_the_record_such_a_job_would_carry_on(tmp_path):
    """The same race with a snakemake that did not record itself: the ancestor is gone, nothing stops the job.
    This is what the record is for (and why this test can tell the two apart)."""
    proc, job, installed = start(tmp_path, mark=False, delay=1.0)
    try:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while not installed.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert installed.read_text() == "None"      # it found no snakemake to watch
        assert wait_gone(job, 3) is None
    finally:
        kill(job)


def test_a_job_of_a_living_snakemake_runs_and_ends_within_seconds_of_its_death(tmp_path):
    proc, job, installed = start(tmp_path, mark=True, delay=0.5)
    try:
        deadline = time.monotonic() + 15
        while not installed.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert installed.read_text() == str(proc.pid)
        assert wait_gone(job, 2) is None            # a living snakemake: the job carries on
        proc.kill()
        proc.wait()
        gone = wait_gone(job, 10)
        assert gone is not None and gone < 3, gone
    finally:
        kill(job)
        proc.kill()


def test_a_reused_pid_is_not_the_recorded_snakemake():
    me = os.getpid()
    started = lifecycle.start_time(me)
    assert started is not None and lifecycle._alive(me, started)
    assert not lifecycle._alive(me, started + 1)    # same pid, another process: gone
    # a snakemake inside a Slurm job appends itself to the submitter's record it inherited
    env = {lifecycle.SNAKEMAKE_ENV: "login-node:77:123"}
    value = lifecycle.mark_snakemake(env)
    assert value.startswith("login-node:77:123;") and env[lifecycle.SNAKEMAKE_ENV] == value
    assert lifecycle.mark_snakemake(env) == value            # loading the Snakefile again records it once
    # recorded on another host (the login node): not this host's process to watch
    assert lifecycle.recorded_snakemakes(env) == [(me, started)]
    assert lifecycle.recorded_snakemakes({}) == []


@pytest.mark.parametrize("argv, yes", [(["snakemake", "--cores", "1"], True),
                                       (["/usr/bin/python3", "/x/snakemake", "all"], True),
                                       (["python", "-m", "snakemake"], True), (["python", "job.py"], False)])
def test_is_snakemake(argv, yes):
    assert lifecycle.is_snakemake(argv) is yes


# ------------------------------------------------------------------ server logs over reruns

def test_server_logs_are_kept_per_start_up_to_the_bound(tmp_path, monkeypatch):
    """Every rerun's job moves the last log aside; of one phase and arm only the newest ``keep`` stay."""
    from pairaudit.core import defaults
    from pairaudit.serving import launch

    log = tmp_path / "logs" / "servers" / "answers-control.log"
    log.parent.mkdir(parents=True)
    other = log.with_name("answers-candidate.log")
    other.write_text("the other arm's start\n")
    for job in range(1, 8):
        launch._KEPT.clear()                      # a new job: the module state of the last one is gone
        kept = launch.claim_log(log, keep=3)
        if job > 1:
            assert kept == str(log.with_name(f"answers-control.{job - 1}.log")), kept   # newest: the highest number
        log.write_text(f"start of job {job}\n")
    names = sorted(p.name for p in log.parent.iterdir())
    assert names == ["answers-candidate.log", "answers-control.5.log", "answers-control.6.log", "answers-control.log"]
    assert log.with_name("answers-control.6.log").read_text() == "start of job 6\n"
    assert log.read_text() == "start of job 7\n" and other.read_text() == "the other arm's start\n"
    # the bound the workflow hands its jobs, else the schema's default
    monkeypatch.setenv(launch.KEEP_LOGS_ENV, "2")
    assert launch.logs_kept() == 2
    monkeypatch.delenv(launch.KEEP_LOGS_ENV)
    assert launch.logs_kept() == defaults.section("server_logs")["keep"] == 5
    launch._KEPT.clear()
    launch.claim_log(log, keep=1)                 # keep 1: the current log only
    assert sorted(p.name for p in log.parent.iterdir()) == ["answers-candidate.log"]
    launch._KEPT.clear()
