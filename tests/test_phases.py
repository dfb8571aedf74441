"""Answers phases on a failing server: the failure is evidence, confirmed once on a fresh start.

The servers here are tests/fake_server.py run as real child processes in
launch mode (error paths only); the real reference server runs through the
phases in the workflow tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_launch import fake_cfg

from pairaudit.answers import stage as answers_stage
from pairaudit.core import artifacts, contracts, defaults
from pairaudit.core.jsonlog import read_log
from pairaudit.core.settings import SamplingSettings
from pairaudit.gates import server_failure
from pairaudit.plans import stage as plan_stage
from pairaudit.serving import failures
from pairaudit.speed import bracket as speed_bracket
from pairaudit.speed import stage as speed_stage

SAMPLING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "base_seed": 1000, "max_tokens": 16,
            "concurrency": 1, "request_timeout_s": 30}


def dataset(tmp_path: Path) -> str:
    path = tmp_path / "datasets" / "tiny.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    artifacts.write_json(path, {"schema": "pairaudit.dataset/v1", "name": "tiny", "format": "gsm8k",
                                "items": [{"index": i, "messages": [{"role": "user", "content": f"{i} + 1 ="}],
                                           "answer": str(i + 1)} for i in range(3)]})
    return str(path)


def run_answers(tmp_path: Path, arm: str, cfg: dict, **greedy) -> dict:
    out = tmp_path / "results"
    spec, requests = str(out / f"specs/{arm}.json"), str(out / f"requests/tiny/{arm}.json")
    plan_stage.arm_spec_stage(arm=arm, arm_cfg=cfg, out_path=spec)
    plan_stage.requests_stage(dataset_path=dataset(tmp_path), spec_path=spec, sampling=SAMPLING, audit="t",
                         out_path=requests)
    return answers_stage.answers_phase(
        arm=arm, spec_path=spec, requests_paths={"tiny": requests}, sampling=SamplingSettings.from_json(defaults.filled({"api": "chat", **SAMPLING}, "sampling")), audit="t",
        boundary_plan_path=None, journal_dir=str(out / "journal"), receipt_path=str(out / f"launch/{arm}.json"),
        preflight_path=str(out / f"preflight/{arm}.json"), phase_path=str(out / f"answers/{arm}.json"),
        boundary_path=None, server_log=str(out / f"logs/answers-{arm}.log"),
        starts_log=str(out / "servers/starts.jsonl"), **greedy)


def test_an_engine_that_dies_on_a_probe_the_control_answers_is_a_confirmed_rejection(tmp_path):
    doc = run_answers(tmp_path, "candidate", fake_cfg("chat500_dies"))
    f = doc["failure"]
    assert f["stage"] == "preflight" and f["status"] == 500 and f["kind"] in (server_failure.SERVER_ERROR, server_failure.DEAD)
    assert "index out of bounds" in json.dumps(f["error_body"])
    assert f["request"]["path"] == "/v1/chat/completions" and f["request"]["body"]["seed"] is not None
    assert server_failure.is_server_failure(f["confirmation"]["kind"])  # the fresh start failed the same way
    starts = [r for r in read_log(tmp_path / "results/servers/starts.jsonl") if r["event"] == "ready"]
    assert [r["phase"] for r in starts] == ["answers", "answers-confirm"]
    # the first failure and its confirmation are both kept; nothing was sampled after the failure
    kept = read_log(tmp_path / "results/journal/failures/candidate.jsonl")
    assert kept[0]["status"] == 500 and kept[0]["confirmation"]["kind"] == f["confirmation"]["kind"]
    assert doc["datasets"] == {}
    assert artifacts.read_json(tmp_path / "results/preflight/candidate.json")["verdict"] == "FAIL"
    gate = server_failure.server_failure_v1({"control": None, "candidate": f})
    assert gate["verdict"] == "FAIL" and "HTTP 500" in gate["reasons"][0]


def test_a_probe_whose_answer_fails_its_check_is_not_confirmed_and_holds(tmp_path):
    doc = run_answers(tmp_path, "candidate", fake_cfg("logprobs21_ok"))
    f = doc["failure"]
    assert f["stage"] == "preflight" and f["what"] == "probe known_bad_400" and f["kind"] == server_failure.FAILED_CHECK
    assert "confirmation" not in f
    assert server_failure.server_failure_v1({"control": None, "candidate": f})["verdict"] == "HOLD"


def test_a_healthy_phase_records_no_failure_and_answers_every_item(tmp_path):
    greedy = {"greedy_max_tokens": 4, "determinism_repeats": 2}
    doc = run_answers(tmp_path, "control", fake_cfg(), **greedy)
    assert doc["failure"] is None and doc["starts"] == 1
    assert doc["datasets"]["tiny"] == {"items": 3, "from_journal": 0, "asked": 3}
    # on the same start: a greedy run of every item and two repeats of the first
    g = doc["greedy"]["tiny"]
    assert (g["runs"], g["asked"], g["items"], g["determinism_repeats"], g["open"]) == (5, 5, 3, 2, 0)
    assert g["key"]["determinism_index"] == 0 and g["journal"].endswith("journal/greedy/tiny/control.jsonl")
    again = run_answers(tmp_path, "control", fake_cfg(), **greedy)  # a rerun asks nothing already answered
    assert again["datasets"]["tiny"] == {"items": 3, "from_journal": 3, "asked": 0}
    assert (again["greedy"]["tiny"]["from_journal"], again["greedy"]["tiny"]["asked"]) == (5, 0)


@pytest.mark.parametrize("status, alive, kind", [
    (None, True, "dead"), (500, False, "dead"), (500, True, "server_error"), (503, True, "server_error"),
    (429, True, "server_error"), (400, True, "refused"), (404, True, "refused"), (422, True, "refused"),
    # accepted, then the answer broke (a stream cut before its finish_reason): the server's failure
    (200, True, "server_error"),
])
def test_failure_kinds_known_answers(status, alive, kind):
    assert failures.classify(status, server_alive=alive) == kind


def test_a_failed_wave_leads_with_the_stream_the_server_answered_with_an_error():
    from pairaudit.speed.bracket import failed_streams
    cut = {"status": 200, "error": "stream: ended without a finish_reason"}
    http = {"status": 500, "error": "HTTP 500", "body": "EngineCore died"}
    ok = {"status": 200, "error": None}
    assert failed_streams([cut, ok, http]) == [(2, http), (0, cut)]
    assert failed_streams([http, cut]) == [(0, http), (1, cut)]
    assert failed_streams([ok, ok]) == []


def _f(kind, confirmed=None, arm="candidate"):
    rec = {"arm": arm, "stage": "sampled", "what": "ds item 3", "kind": kind,
           "status": {"refused": 400, "server_error": 500, "dead": None, "failed_check": 200}[kind],
           "error_body": "boom", "error": None}
    if confirmed is not None:
        rec["confirmation"] = {"kind": confirmed}
    return rec


@pytest.mark.parametrize("control, candidate, verdict", [
    (None, None, "PASS"),
    (None, _f("server_error", "server_error"), "FAIL"),
    (None, _f("dead", "dead"), "FAIL"),
    (None, _f("server_error", "answered"), "HOLD"),
    (None, _f("refused"), "INCONCLUSIVE"),
    (None, _f("failed_check"), "HOLD"),
    (_f("failed_check", arm="control"), None, "INCONCLUSIVE"),
    (_f("dead", "dead", arm="control"), None, "INCONCLUSIVE"),
    (_f("dead", "dead", arm="control"), _f("dead", "dead"), "INCONCLUSIVE"),
])
def test_server_failure_rule_known_answers(control, candidate, verdict):
    assert server_failure.server_failure_v1({"control": control, "candidate": candidate})["verdict"] == verdict


def _speed_bracket(tmp_path: Path, candidate_cfg: dict) -> tuple[dict, Path]:
    from test_speed import bracket_inputs

    arms = {"control": fake_cfg(), "candidate": candidate_cfg}
    lp, pp, sp = bracket_inputs(tmp_path, arms)
    cfg = {"cells": [{"name": "pair-c2", "prompt": "random", "input_len": 16, "concurrency": 2}],
           "repeats": 2, "waves": 1, "output_len": 8, "accept_unverifiable_clock": True,
           "max_starts": 3, "repeat_s": None}  # one bracket: these tests look at a start's failure and the record
    logs = {s: str(tmp_path / f"logs/speed-{s}.log") for s in ("s1", "s2", "s3")}
    doc = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(cfg), audit="t",
                            out_path=str(tmp_path / "speed/decision.json"),
                            streams_path=str(tmp_path / "speed/streams.jsonl"),
                            archive_path=str(tmp_path / "archive.jsonl"), server_logs=logs,
                            starts_log=str(tmp_path / "servers/starts.jsonl"))
    return doc, tmp_path


def test_an_engine_that_dies_under_the_speed_bracket_is_evidence_confirmed_on_a_fresh_start(tmp_path):
    doc, out = _speed_bracket(tmp_path, fake_cfg("concurrent_stream_dies"))
    saved = artifacts.check_schema(artifacts.read_json(out / "speed/decision.json"), contracts.SPEED_DECISION_SCHEMA,
                                   out / "speed/decision.json")
    assert saved["gate"]["verdict"] == "INCONCLUSIVE" and saved["not_run"].startswith("the candidate server failed")
    f = saved["failure"]
    # the candidate's warm-up wave (two streams, as every measured wave) is its first batch of two
    assert (f["arm"], f["stage"], f["what"]) == ("candidate", "speed", "s2 warm-up")
    # both streams of the wave failed (one answered 500, one cut off when the process died);
    # the record leads with the one that carries the engine's words, whichever finished first
    assert f["status"] == 500 and "batch of 2 streams" in json.dumps(f["error_body"])
    assert len(f["request"]["bodies"]) == 2  # the wave that failed, as sent
    assert f["confirmation"]["kind"] in (server_failure.SERVER_ERROR, server_failure.DEAD)  # the fresh start failed too
    # the control start measured before the failure is kept, with its streams
    assert [s["start"] for s in saved["starts"]] == ["s1", "s2"] and "failure" in saved["starts"][1]
    _, streams = artifacts.read_jsonl(out / "speed/streams.jsonl")
    assert {r["start"] for r in streams} == {"s1"} and len(streams) == 6  # a warm-up wave + two repeats, two streams each
    starts = [(r["phase"], r["arm"], r["event"]) for r in read_log(out / "servers/starts.jsonl")]
    assert starts == [("speed", "control", "ready"), ("speed", "control", "stopped"), ("speed", "candidate", "ready"),
                      ("speed", "candidate", "stopped"), ("speed-confirm", "candidate", "ready"),
                      ("speed-confirm", "candidate", "stopped")]   # every start ends, the failed ones too
    gate = server_failure.server_failure_v1({"control": None, "candidate": f})
    assert gate["verdict"] == "FAIL" and "again on a fresh start" in gate["reasons"][0]
    # the promotion reads it into the servers gate, beside answers phases that failed nowhere
    from pairaudit.promotion import stage as report
    answers = []
    for arm in ("control", "candidate"):
        answers.append(str(out / f"answers/{arm}.json"))
        artifacts.write_json(answers[-1], {"schema": contracts.PHASE_SCHEMA, "arm": arm, "failure": None})
    kw, _, _ = report._load_later({"speed": str(out / "speed/decision.json"), "answers": answers})
    assert kw["servers"]["verdict"] == "FAIL" and kw["servers"]["failures"]["candidate"]["stage"] == "speed"
    assert kw["speed"]["verdict"] == "INCONCLUSIVE"


def test_a_control_that_completes_the_bracket_on_fake_servers_is_decided(tmp_path):
    doc, out = _speed_bracket(tmp_path, fake_cfg())
    assert "failure" not in doc and doc["gate"]["verdict"] in ("WIN", "NO_WIN", "LOSS", "INCONCLUSIVE")
    assert [s["start"] for s in doc["starts"]] == ["s1", "s2", "s3"]
