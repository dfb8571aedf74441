"""``kill -9`` of the snakemake that submits to a real one-node Slurm, then the same command: it resumes.

The answers phase runs as a Slurm job; once its journal holds an answer, the submitting snakemake is
killed with SIGKILL (Slurm keeps the job running). The job watches the snakemake that submitted it
(``pairaudit.core.lifecycle``: the record it inherited, on its own host here) and ends itself and its
server within seconds; the same command then resumes: every item answered exactly once, the answers
from before the kill kept as they were.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from slurm_cluster import slurm_cluster  # noqa: F401  (session fixture)
from test_slurm import SNAKEMAKE, finish, start
from test_workflow import _answers, _check_resumed, _job_pids, answers_only_config, make_project, read_jsonl, refserver_pids

pytestmark = [pytest.mark.workflow, pytest.mark.cluster]

ITEMS = 6


def _running_jobs(partition: str) -> list[str]:
    out = subprocess.run(["squeue", "--noheader", "--partition", partition, "--states=RUNNING,PENDING",
                          "--format=%i"], capture_output=True, text=True).stdout
    return out.split()


def test_kill_9_of_the_submitting_snakemake_then_the_same_command_resumes(slurm_cluster, tmp_path):  # noqa: F811
    config = answers_only_config("slurm-resume", ITEMS)
    project = make_project(tmp_path / "p", config)
    env = {"PAIRAUDIT_SLURM_PARTITION": slurm_cluster.partition}
    target = "results/slurm-resume/sampled/arith/control.jsonl"
    journal = project / "results" / "slurm-resume" / "journal" / "sampled" / "arith" / "control.jsonl"

    proc = subprocess.Popen([SNAKEMAKE, "--profile", "profiles/slurm", target], cwd=project,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **env})
    deadline = time.time() + 1200
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and _answers(journal):
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run finished before it could be killed; make the dataset larger"
    os.kill(proc.pid, signal.SIGKILL)          # the submitting snakemake alone: its Slurm job keeps running
    proc.wait()
    t0 = time.time()
    while time.time() - t0 < 60 and (refserver_pids(project) or _job_pids(project)
                                      or _running_jobs(slurm_cluster.partition)):
        time.sleep(0.5)
    ended_s = time.time() - t0
    assert refserver_pids(project) == [], "a server outlived the snakemake that submitted its job"
    assert _job_pids(project) == [], "a job outlived the snakemake that submitted it"
    assert ended_s < 30, f"the job took {ended_s:.0f} s to end itself"
    before = {r["index"]: r for r in _answers(journal)}
    assert 1 <= len(before) < ITEMS

    # the same command, nothing else: no --unlock, no scancel
    out, _ = finish(start(project, "--profile", "profiles/slurm", target, env=env))
    _check_resumed(project, journal, project / target, before, ITEMS)
    by_index: dict = {}
    for r in read_jsonl(journal):
        by_index.setdefault(r["index"], []).append(r["attempt"])
    assert all(a == list(range(1, len(a) + 1)) for a in by_index.values()), by_index
