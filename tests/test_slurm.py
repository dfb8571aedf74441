"""The audit submitted through profiles/slurm to a real one-node Slurm.

A tiny audit runs twice on the same config, each in its own scratch copy of
the project: once with ``--profile profiles/slurm`` (every job an sbatch job
on the cluster of ``slurm_cluster``), once locally with the default profile.
The decisions must be equal, every job of the DAG must have been a Slurm job,
and the speed bracket's three starts must have run on one node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_cluster import slurm_cluster  # noqa: F401  (session fixture)
from test_workflow import TINY, dry_run_jobs, make_project, planned_jobs, read_jsonl, refserver_pids

from pairaudit import gates

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

pytestmark = [pytest.mark.workflow, pytest.mark.cluster]


def tiny_cluster_config() -> dict:
    """tests/data/tiny_config.yaml cut further: one dataset of two items, short answers."""
    config = yaml.safe_load(TINY.read_text())
    config["audit"] = "tiny-slurm"
    config["datasets"] = [d for d in config["datasets"] if d["name"] == "arith"]
    config["datasets"][0]["select"]["count"] = 2
    config["sampling"]["max_tokens"] = 24
    config["greedy"]["max_tokens"] = 12
    return config


def start(project: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    log = open(project / "snakemake.out", "w")
    proc = subprocess.Popen([SNAKEMAKE, *args], cwd=project, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    proc.t0, proc.project, proc.args = time.monotonic(), project, args
    return proc


def finish(proc: subprocess.Popen, timeout: float = 2400) -> tuple[str, float]:
    """(output, seconds) of a run started by ``start``; a failed run fails the test with its tail."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out = (proc.project / "snakemake.out").read_text()
    if rc != 0:
        raise AssertionError(f"snakemake {' '.join(proc.args)} failed ({rc}) in {proc.project}:\n{out[-8000:]}")
    return out, time.monotonic() - proc.t0


def run(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([SNAKEMAKE, *args], cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    return proc


def slurm_jobs(run_id: str) -> list[dict]:
    """Every job Slurm still knows under this run's job name (MinJobAge keeps finished ones)."""
    out = subprocess.run(["squeue", "--states=all", "--noheader", "--name", run_id, "--format=%i|%T|%N|%C|%k"],
                         capture_output=True, text=True, check=True).stdout
    jobs = []
    for line in out.splitlines():
        job_id, state, node, cpus, comment = line.split("|", 4)
        jobs.append({"id": job_id, "state": state, "node": node, "cpus": int(cpus), "comment": comment})
    return jobs


@pytest.fixture(scope="module")
def both_runs(slurm_cluster, tmp_path_factory):  # noqa: F811
    config = tiny_cluster_config()
    root = tmp_path_factory.mktemp("slurm-audit")
    on_slurm = make_project(root / "slurm", config)
    local = make_project(root / "local", config)

    planned = planned_jobs(on_slurm, "promotion")
    env = {"PAIRAUDIT_SLURM_PARTITION": slurm_cluster.partition}
    # Side by side: the Slurm run spends much of its time in submission and status polling.
    local_run = start(local, "--cores", "2", "promotion")
    slurm_run = start(on_slurm, "--profile", "profiles/slurm", "promotion", env=env)
    slurm_out, slurm_s = finish(slurm_run)
    run_id = re.search(r"SLURM run ID: (\S+)", slurm_out).group(1)
    jobs = slurm_jobs(run_id)
    local_out, _ = finish(local_run)
    local_elapsed = re.findall(r"Elapsed time: (\S+)", local_out)
    for project in (on_slurm, local):
        assert refserver_pids(project) == [], f"a server outlived the workflow in {project}"
    print(f"\nslurm run {slurm_s:.0f} s ({len(jobs)} Slurm jobs), local run {local_elapsed[-1:]} (side by side)")
    return {"config": config, "slurm": on_slurm, "local": local, "planned": planned, "jobs": jobs,
            "run_id": run_id, "slurm_out": slurm_out, "cluster": slurm_cluster}


def decision(project: Path, audit: str) -> dict:
    return json.loads((project / "results" / audit / "promotion" / "decision.json").read_text())


def test_profile_is_the_cluster_one():
    profile = yaml.safe_load((Path(__file__).resolve().parents[1] / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm"
    # without accounting sacct cannot answer; squeue is what works on such clusters
    assert profile["slurm-status-command"] == "squeue"
    assert profile["latency-wait"] >= 30


def test_every_job_was_a_slurm_job(both_runs):
    jobs, planned = both_runs["jobs"], both_runs["planned"]
    assert len(planned) >= 10
    assert len(jobs) == len(planned), (jobs, planned)
    assert {j["state"] for j in jobs} == {"COMPLETED"}
    assert {j["node"] for j in jobs} == {both_runs["cluster"].node}
    # the plugin puts the rule and wildcards in each job's comment
    submitted = sorted(re.match(r"rule_(\w+?)(?:_wildcards_|$)", j["comment"]).group(1) for j in jobs)
    assert submitted == sorted(rule for rule, _ in planned)
    logs = list((both_runs["slurm"] / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert sorted(p.stem for p in logs) == sorted(j["id"] for j in jobs)


def declared_threads(project: Path) -> dict[str, int]:
    """rule -> its ``threads:`` as written in rules/*.smk (1 when absent)."""
    threads = {}
    for smk in (project / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=\s*rule \w+:)", smk.read_text()):
            m = re.match(r"\s*rule (\w+):", block)
            if m:
                t = re.search(r"\n\s*threads: (\d+)", block)
                threads[m.group(1)] = int(t.group(1)) if t else 1
    return threads


def test_jobs_got_their_rules_cpus(both_runs):
    # cpus-per-task comes from each rule's threads (servers 2; CPU-only steps as declared)
    threads = declared_threads(both_runs["slurm"])
    cpus = {re.match(r"rule_(\w+?)(?:_wildcards_|$)", j["comment"]).group(1): j["cpus"] for j in both_runs["jobs"]}
    assert cpus == {rule: min(threads[rule], both_runs["cluster"].cpus) for rule in cpus}
    assert set(cpus) == {rule for rule, _ in both_runs["planned"]}
    assert 1 in cpus.values() and 2 in cpus.values()  # both kinds were really submitted


def dry_run_resources(project: Path, env: dict) -> list[tuple[str, dict, dict]]:
    """(rule, wildcards, resources) of every job a dry run with the slurm profile would submit."""
    return dry_run_jobs(run(project, "-n", "--profile", "profiles/slurm", "promotion", env=env).stdout)


def test_server_jobs_request_their_arms_gpus_and_partition(tmp_path):
    config = tiny_cluster_config()
    config["arms"]["candidate"]["gpus"] = 2
    project = make_project(tmp_path / "p", config)
    env = {"PAIRAUDIT_SLURM_PARTITION": "cpuq", "PAIRAUDIT_SLURM_GPU_PARTITION": "gpuq",
           "PAIRAUDIT_SLURM_ACCOUNT": "lab"}
    jobs = dry_run_resources(project, env)
    # phase jobs run a server: one arm's (answers), or both one after the other (speed); the diagnostics none
    servers = {rule for rule, _, res in jobs if "server_slots" in res}
    assert servers == {"answers", "speed"}
    assert {rule for rule, _, _ in jobs} - servers >= {"dataset", "sampled", "score", "paired", "diagnostics",
                                                       "promotion"}
    for rule, wc, res in jobs:
        assert res["slurm_account"] == "lab", rule
        if rule in servers and wc.get("arm", "candidate") == "candidate":
            assert (res.get("gpu"), res["slurm_partition"]) == ("2", "gpuq"), (rule, wc)
        else:  # the CPU-only control and every scoring/decision job: no GPU, the CPU partition
            assert res.get("gpu", "0") == "0" and res["slurm_partition"] == "cpuq", (rule, wc, res)
    # nothing set: the cluster's default partition (the plugin's fallback), never a GPU
    for rule, wc, res in dry_run_resources(project, {"PAIRAUDIT_SLURM_PARTITION": "",
                                                     "PAIRAUDIT_SLURM_GPU_PARTITION": ""}):
        assert res["slurm_partition"] == "", rule


def recomputed(records: dict, **replace) -> str:
    """promotion-v1 over decision.json's gate records, with some gates replaced."""
    records = {**records, **replace}
    return gates.promotion_v1({
        name: None if g is None else {"rule": g["rule"], "verdict": g["verdict"], "reasons": g["reasons"],
                                      "informational": g["outcome"] == "INFORMATIONAL"}
        for name, g in records.items()})["verdict"]


def test_decision_on_slurm_equals_local(both_runs):
    audit = both_runs["config"]["audit"]
    on_slurm, local = decision(both_runs["slurm"], audit), decision(both_runs["local"], audit)
    assert sorted(on_slurm["gates"]) == sorted(local["gates"]) and on_slurm["gates"]
    assert on_slurm["not_evaluated"] == local["not_evaluated"]
    # every gate decided from answers (quality, grid-tie, determinism, boundary, preflight) is equal
    for name, gate in local["gates"].items():
        if name == "speed" or gate is None:
            assert (on_slurm["gates"][name] is None) == (gate is None), name
            continue
        mine = on_slurm["gates"][name]
        assert (mine["verdict"], mine["outcome"], mine["reasons"]) == (gate["verdict"], gate["outcome"],
                                                                         gate["reasons"]), name
    assert [r for r in on_slurm["reasons"] if not r.startswith("speed")] == \
        [r for r in local["reasons"] if not r.startswith("speed")]
    # The speed gate is a timing measurement: two runs on a noisy machine may differ, locally too.  The
    # decision must be the local one whenever its speed verdict is, and with the local speed gate otherwise.
    assert recomputed(local["gates"]) == local["decision"] and recomputed(on_slurm["gates"]) == on_slurm["decision"]
    if "speed" not in local["gates"] or (on_slurm["gates"]["speed"] or {}).get("verdict") == \
            (local["gates"]["speed"] or {}).get("verdict"):
        assert on_slurm["decision"] == local["decision"]
    else:
        assert recomputed(on_slurm["gates"], speed=local["gates"]["speed"]) == local["decision"]
    # same seeds, same bodies, same model on the same CPU: the answers themselves agree
    for arm in ("control", "candidate"):
        texts = [[r["response"]["choices"][0]["message"]["content"]
                  for r in read_jsonl(p / "results" / audit / "sampled" / "arith" / f"{arm}.jsonl")[1:]]
                 for p in (both_runs["slurm"], both_runs["local"])]
        assert texts[0] == texts[1] and texts[0]


def test_speed_bracket_ran_its_three_starts_on_one_node(both_runs):
    if not (Path(__file__).resolve().parents[1] / "rules" / "speed.smk").exists():
        pytest.skip("the speed stage (rules/speed.smk) is not in the workflow yet")
    audit = both_runs["config"]["audit"]
    path = both_runs["slurm"] / "results" / audit / "speed" / "decision.json"
    assert path.exists(), "the speed stage is in the workflow but wrote no decision on the cluster run"
    starts = json.loads(path.read_text())["starts"]
    assert [s["start"] for s in starts] == ["s1", "s2", "s3"]
    # one job runs all three starts: one Slurm job id, one node, one host
    assert len({s["slurm_job_id"] for s in starts}) == 1 and starts[0]["slurm_job_id"]
    assert len({s["slurmd_nodename"] for s in starts}) == 1 and starts[0]["slurmd_nodename"]
    assert len({s["host"] for s in starts}) == 1
    assert starts[0]["slurm_job_id"] in {j["id"] for j in both_runs["jobs"]}
