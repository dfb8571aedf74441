"""The example sweep end to end: three candidates against one control decide as planted, the control's
answers phase runs once, and a fourth candidate added to the finished sweep runs only its own jobs.

Runs config/examples/sweep.yaml as shipped (its own small suite) in a scratch copy of the project.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_workflow import REPO, make_project, planned_jobs, read_jsonl, refserver_pids, snake

from pairaudit.cli.codes import EXIT

pytestmark = [pytest.mark.workflow, pytest.mark.timed]

EXAMPLE = REPO / "config" / "examples" / "sweep.yaml"
PLANTED = {"fast": "PROMOTE", "tail": "REJECT", "slow": "REJECT"}
FOURTH = {"name": "short", "description": "a 1 us step delay instead of the control's 50 ms (a known speedup)",
          "switches": [{"env": "PAIRAUDIT_REF_STEP_DELAY_US", "rollback": "50000", "on": "1"}]}


def decision(project: Path, name: str) -> dict:
    return json.loads((project / "results" / "sweep" / "candidates" / name / "promotion" / "decision.json").read_text())


def speed_decision(project: Path, name: str) -> Path:
    return project / "results" / "sweep" / "candidates" / name / "speed" / "decision.json"


def answers_starts(project: Path) -> dict[str, int]:
    """How often each arm's answers-phase server became ready (the starts log)."""
    counts: dict[str, int] = {}
    for r in read_jsonl(project / "results" / "sweep" / "servers" / "starts.jsonl"):
        if r.get("event") == "ready" and r.get("phase") == "answers":
            counts[r["arm"]] = counts.get(r["arm"], 0) + 1
    return counts


def verdict(project: Path, *args: str) -> int:
    return subprocess.run([sys.executable, "-m", "pairaudit.cli", "verdict", "results/sweep", *args], cwd=project,
                          capture_output=True, text=True).returncode


def test_the_example_sweep_decides_as_planted_and_adds_a_candidate_alone(tmp_path):
    config = yaml.safe_load(EXAMPLE.read_text())
    project = make_project(tmp_path / "project", config)
    jobs = planned_jobs(project, "promotion")
    # one answers job per arm: the control's once, not once per candidate
    assert sorted(wc["arm"] for rule, wc in jobs if rule == "answers") == ["control", "fast", "slow", "tail"]
    assert sorted(wc["candidate"] for rule, wc in jobs if rule == "decision") == ["fast", "slow", "tail"]

    snake(project, "promotion", timeout=1200)
    assert refserver_pids(project) == [], "a server outlived the workflow"
    got = {name: decision(project, name)["decision"] for name in PLANTED}
    assert got == PLANTED
    assert decision(project, "tail")["gates"]["boundary"]["verdict"] == "FAIL"
    assert decision(project, "slow")["gates"]["speed"]["verdict"] == "LOSS"
    assert answers_starts(project) == {"control": 1, "fast": 1, "tail": 1, "slow": 1}
    summary = json.loads((project / "results" / "sweep" / "sweep" / "summary.json").read_text())
    assert [r["name"] for r in summary["candidates"]] == list(PLANTED) and summary["may_ship"] == ["fast"]
    assert verdict(project) == EXIT["REJECT"]
    assert verdict(project, "--candidate", "fast") == EXIT["PROMOTE"]

    # Removing a candidate reruns nothing but the summary; adding one runs only its own jobs (and the summary):
    # the three measured candidates keep their speed bracket, the fourth gets one of its own.
    speed_jobs = [rule for rule, _ in jobs if rule.startswith("speed_bracket")]
    assert len(speed_jobs) == 1, speed_jobs   # one shared-control bracket for the three candidates
    joint = {"promotion"}
    fewer = {**config, "candidates": [c for c in config["candidates"] if c["name"] != "slow"]}
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(fewer, sort_keys=False))
    removed = planned_jobs(project, "promotion")
    assert ("promotion", {}) in removed and {rule for rule, _ in removed} <= joint, removed
    more = {**config, "candidates": [*config["candidates"], FOURTH]}
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(more, sort_keys=False))
    added = planned_jobs(project, "promotion")
    brackets = [rule for rule, _ in added if rule.startswith("speed_bracket")]
    assert len(brackets) == 1 and brackets != speed_jobs, (brackets, speed_jobs)   # the fourth's own bracket
    others = [(rule, wc) for rule, wc in added
              if rule not in joint and rule not in brackets and "short" not in (wc.get("arm"), wc.get("candidate"))]
    assert others == [], others
    assert ("answers", {"arm": "short"}) in added and ("decision", {"candidate": "short"}) in added
    assert ("diagnostics", {"candidate": "short"}) in added
    measured = {n: speed_decision(project, n).read_bytes() for n in PLANTED}
    snake(project, "promotion", timeout=600)
    # the measured candidates' speed decisions stand as they were; the fourth's bracket is its own
    assert {n: speed_decision(project, n).read_bytes() for n in PLANTED} == measured
    assert json.loads(speed_decision(project, "short").read_text())["sweep"]["candidates"] == ["short"]
    assert answers_starts(project) == {"control": 1, "fast": 1, "tail": 1, "slow": 1, "short": 1}
    assert decision(project, "short")["decision"] == "PROMOTE"
    assert verdict(project, "--candidate", "fast", "--candidate", "short") == EXIT["PROMOTE"]
