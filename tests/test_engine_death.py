"""A server's engine killed under the audit: evidence, not a traceback; the same call goes on.

In the answers phase: once the candidate has journaled an answer its engine is killed; the phase ends
with a failure record the servers gate reads, and the same phase run again asks only what the journal
lacks (every item answered once). Under the speed bracket: two arms, one short bracket; while the
candidate's start (s2) is being measured its engine is killed with SIGKILL.
The stage returns a decision that says so: the failure record with the server's log tail, the start
measured before it kept with its streams, a confirmation on a fresh start, a speed gate that is not
measured and a servers gate that reads the failure. The same stage call again (what the workflow's
rerun does) measures the whole bracket.

The engine: the reference server's main process (its API runs in a child process); vLLM's
``EngineCore`` child of the API server it launched. The arms are the reference server's here; on a
GPU host ``PAIRAUDIT_ENGINE_DEATH_CONFIG=config/examples/vllm-gpu.yaml`` takes the server of that
config (its control arm, both arms alike) instead.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from test_speed import _arm, bracket_inputs

from pairaudit.core import artifacts
from pairaudit.core.jsonlog import read_log
from pairaudit.gates import server_failure
from pairaudit.serving import launch
from pairaudit.speed import bracket as speed_bracket
from pairaudit.speed import stage as speed_stage

pytestmark = pytest.mark.server
CONFIG_ENV = "PAIRAUDIT_ENGINE_DEATH_CONFIG"


@pytest.fixture(autouse=True)
def a_new_job_after_each_test():
    """Each test stands for jobs of its own: what a job keeps in its process does not reach the next test."""
    from pairaudit.core import lifecycle

    yield
    launch._KEPT.clear()
    lifecycle._STOP.clear()


def arm_cfg() -> dict:
    """The arm both sides run: the reference server, or the control of the config named in the environment."""
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return _arm(0)
    import yaml

    from pairaudit.plans.change import derive_arms

    config = yaml.safe_load(Path(path).read_text())
    assert derive_arms(config) == [], path
    return config["arms"]["control"]


def engine_pid(server_pid: int) -> int:
    """The process that runs the model: vLLM's EngineCore child, else the server's own process."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children")
    todo = [int(p) for p in children.read_text().split()] if children.exists() else []
    while todo:
        pid = todo.pop()
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
            todo += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
    return server_pid

CFG = {"cells": [{"name": "rnd-c1", "prompt": "random", "input_len": 16, "concurrency": 1}],
       "repeats": 3, "waves": 2, "output_len": 48, "accept_unverifiable_clock": True, "max_starts": 3,
       "repeat_s": None}


def _kill_engine_when(starts_log: Path, arm: str, phase: str, killed: dict, ready_to_kill=None) -> None:
    """Kill the engine of ``arm``'s first start in ``phase`` once it is ready (and ``ready_to_kill()``)."""
    deadline = time.time() + 1800
    while time.time() < deadline:
        ready = [r for r in read_log(starts_log) if r.get("event") == "ready" and r.get("arm") == arm
                 and r.get("phase") == phase]
        if ready and (ready_to_kill is None or ready_to_kill()):
            if ready_to_kill is None:
                time.sleep(1.5)                  # into its warm-up or measured waves
            pid = engine_pid(int(ready[0]["pid"]))
            killed.update(pid=pid, server_pid=ready[0]["pid"], at=time.time())
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def run(tmp_path: Path, lp, pp, sp) -> dict:
    return speed_stage.speed_stage(
        launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(dict(CFG)), audit="t",
        out_path=str(tmp_path / "speed/decision.json"), streams_path=str(tmp_path / "speed/streams.jsonl"),
        archive_path=str(tmp_path / "archive.jsonl"),
        server_logs={s: str(tmp_path / f"logs/servers/speed-{s}.log") for s in ("s1", "s2", "s3")},
        starts_log=str(tmp_path / "servers/starts.jsonl"))


def test_an_engine_killed_in_the_bracket_is_evidence_and_the_same_call_measures_again(tmp_path):
    lp, pp, sp = bracket_inputs(tmp_path, {"control": arm_cfg(), "candidate": arm_cfg()})
    killed: dict = {}
    killer = threading.Thread(target=_kill_engine_when,
                              args=(tmp_path / "servers/starts.jsonl", "candidate", "speed", killed), daemon=True)
    killer.start()
    doc = run(tmp_path, lp, pp, sp)
    killer.join(5)
    assert killed, "the candidate's start never became ready"
    saved = artifacts.read_json(tmp_path / "speed/decision.json")
    assert saved == json.loads(json.dumps(doc)) or saved["failure"] == doc["failure"]
    f = saved["failure"]
    assert (f["arm"], f["stage"]) == ("candidate", "speed") and f["what"].startswith("s2")
    assert f["kind"] in (server_failure.DEAD, server_failure.SERVER_ERROR), f
    assert f["log_tail"].strip()
    # killed by hand, not by its own fault: the same request answered on a fresh start
    assert f["confirmation"]["kind"] == "answered", f["confirmation"]
    assert saved["gate"]["verdict"] == "INCONCLUSIVE" and saved["not_run"].startswith("the candidate server failed")
    assert [s["start"] for s in saved["starts"]] == ["s1", "s2"] and "failure" in saved["starts"][1]
    _, streams = artifacts.read_jsonl(tmp_path / "speed/streams.jsonl")
    assert {r["start"] for r in streams} == {"s1"}       # what s1 measured stays
    gate = server_failure.server_failure_v1({"control": None, "candidate": f})
    assert gate["verdict"] == "HOLD", gate              # a failure a fresh start does not repeat: not confirmed
    events = [(r["phase"], r["arm"], r["event"]) for r in read_log(tmp_path / "servers/starts.jsonl")]
    assert events[:4] == [("speed", "control", "ready"), ("speed", "control", "stopped"),
                          ("speed", "candidate", "ready"), ("speed", "candidate", "stopped")]
    assert not any(_alive(int(killed["pid"])) for _ in range(1))

    # the same call again, as the workflow's rerun makes it (a new job: nothing of this one's module state)
    launch._KEPT.clear()
    again = run(tmp_path, lp, pp, sp)
    assert "failure" not in again and [s["start"] for s in again["starts"]] == ["s1", "s2", "s3"]
    assert again["gate"]["verdict"] in ("WIN", "NO_WIN", "LOSS", "INCONCLUSIVE")
    # the killed start's log is kept beside the new one's
    kept = tmp_path / "logs/servers/speed-s2.1.log"
    assert kept.exists() and "=== pairaudit launch arm=candidate" in kept.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


ITEMS = 12


def test_an_engine_killed_in_the_answers_phase_is_evidence_and_the_phase_resumes_from_its_journal(tmp_path):
    from test_phases import SAMPLING

    from pairaudit.answers import stage as answers_stage
    from pairaudit.core import defaults
    from pairaudit.core.settings import SamplingSettings
    from pairaudit.plans import stage as plan_stage

    out = tmp_path / "results"
    data = out / "datasets" / "tiny.json"
    artifacts.write_json(data, {"schema": "pairaudit.dataset/v1", "name": "tiny", "format": "gsm8k",
                                "items": [{"index": i, "messages": [{"role": "user", "content": f"Count from {i} "
                                                                     "to 40, one number a line."}],
                                           "answer": str(i)} for i in range(ITEMS)]})
    sampling = {**SAMPLING, "max_tokens": 48, "request_timeout_s": 300}
    spec, requests = str(out / "specs/candidate.json"), str(out / "requests/tiny/candidate.json")
    plan_stage.arm_spec_stage(arm="candidate", arm_cfg=arm_cfg(), out_path=spec)
    plan_stage.requests_stage(dataset_path=str(data), spec_path=spec, sampling=sampling, audit="t",
                              out_path=requests)
    journal = out / "journal" / "sampled" / "tiny" / "candidate.jsonl"

    def answers() -> list[dict]:
        return [r for r in read_log(journal) if r.get("status") == 200]

    def phase() -> dict:
        return answers_stage.answers_phase(
            arm="candidate", spec_path=spec, requests_paths={"tiny": requests},
            sampling=SamplingSettings.from_json(defaults.filled({"api": "chat", **sampling}, "sampling")),
            audit="t", boundary_plan_path=None, journal_dir=str(out / "journal"),
            receipt_path=str(out / "launch/candidate.json"), preflight_path=str(out / "preflight/candidate.json"),
            phase_path=str(out / "answers/candidate.json"), boundary_path=None,
            server_log=str(out / "logs/servers/answers-candidate.log"), starts_log=str(out / "servers/starts.jsonl"))

    killed: dict = {}
    killer = threading.Thread(target=_kill_engine_when, args=(out / "servers/starts.jsonl", "candidate", "answers",
                                                               killed, lambda: bool(answers())), daemon=True)
    killer.start()
    phase()                                        # returns: the failure is the phase's record, not an exception
    killer.join(5)
    assert killed, "the candidate's answers phase never answered"
    doc = artifacts.read_json(out / "answers/candidate.json")
    f = doc["failure"]
    assert f is not None and f["arm"] == "candidate" and f["stage"] == "sampled", f
    assert f["kind"] in (server_failure.DEAD, server_failure.SERVER_ERROR) and f["log_tail"].strip()
    assert f["confirmation"]["kind"] == "answered", f["confirmation"]   # killed by hand: a fresh start answers
    gate = server_failure.server_failure_v1({"control": None, "candidate": f})
    assert gate["verdict"] == "HOLD", gate
    before = {r["index"]: r for r in answers()}
    assert 1 <= len(before) < ITEMS

    # the phase again (the workflow's rerun of it, a new job: none of this one's process state -- its kept
    # logs, the stop its failed request loop raised): only what the journal lacks is asked
    from pairaudit.core import lifecycle

    launch._KEPT.clear()
    lifecycle._STOP.clear()
    phase()
    doc = artifacts.read_json(out / "answers/candidate.json")
    assert doc["failure"] is None
    after = answers()
    assert sorted(r["index"] for r in after) == list(range(ITEMS))      # every item answered exactly once
    for r in after:
        if r["index"] in before:
            assert r["response"]["id"] == before[r["index"]]["response"]["id"]
