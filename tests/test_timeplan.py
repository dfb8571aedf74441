"""The time plan and the window: known answers from a recorded GPU run, the load refusal, the bracket's deadline.

The recorded run is the project's own: real vLLM 0.26 on one H100 (2026-12-06), its starts log and
decision copied unchanged into ``tests/data/h100-runs/results/vllm-gpu-small/`` (their paths were
rewritten when they were kept, so their content hashes no longer match: the history reads times and
counts only). The numbers below were read off those files by hand.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from pairaudit import configcheck
from pairaudit.cli import main as cli_main
from pairaudit.core import artifacts, contracts, readers
from pairaudit.plans import change
from pairaudit.serving import armspec
from pairaudit.speed import bracket as speed
from pairaudit.speed import stage as speed_stage
from pairaudit.timeplan import actual, history, plan as timeplan

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "h100-runs"
CONFIG = DATA / "vllm-gpu-small.yaml"
RECORDED = {"control": "2d485417286acab028cd19400dc5578eae88127e1d5d39da8bb563c30f052e36",
            "candidate": "f62b002d6b9bdd26accd2912aa3dfba32f0723c039684c1eb24789b2a2712b8a"}


def _checked(path: Path = CONFIG) -> configcheck.CheckResult:
    cfg = yaml.safe_load(path.read_text())
    assert change.derive_arms(cfg) == []
    validate(cfg, str(ROOT / "config" / "schema.yaml"))
    res = configcheck.check_config(copy.deepcopy(cfg), base_dir=ROOT)
    assert res.problems == [] and res.settings is not None
    return res


def _recorded_arms(res: configcheck.CheckResult) -> dict[str, timeplan.ArmFacts]:
    # the recorded run's servers: the same config, their identity hashes as that host recorded them (its
    # command names that host's paths, so the hash computed here differs)
    return {arm: dataclasses.replace(f, spec_sha256=RECORDED[arm]) for arm, f in timeplan.arm_facts(res.specs).items()}


@pytest.fixture(scope="module")
def checked() -> configcheck.CheckResult:
    return _checked()


def test_history_reads_the_recorded_run():
    h = history.host_history(DATA / "results", host="vm")
    starts = h.starts(RECORDED["control"])
    assert [s.phase for s in starts] == ["answers", "speed", "speed", "speed", "diagnostics", "diagnostics"]
    # the control's first start compiled (187.39 s); the first start of each server is the cold one
    assert [s.cold for s in starts] == [True] + [False] * 5 and starts[0].ready_s == pytest.approx(187.395, abs=1e-3)
    # healthy 12:28:44.142 -> stopped 12:29:06.402 (ready_s 187.395 after launch at 12:25:36.747)
    assert starts[0].served_s == pytest.approx(22.26, abs=0.01)
    assert h.audits[0].items == {"control": 800, "candidate": 800}
    assert history.host_history(DATA / "results", host="another-host").audits == ()


def test_plan_of_a_second_run_from_the_recorded_first(checked):
    h = history.host_history(DATA / "results", host="vm")
    p = timeplan.build_plan(checked.settings, _recorded_arms(checked), h, audit="vllm-gpu-small",
                            sampling={"max_tokens": 160, "concurrency": 16})
    assert all(s.source == "history" for s in p.steps) and not p.assumed
    starts = [s for s in p.steps if s.what.startswith("server start") or s.phase == "speed"]
    assert all("warm" in s.what for s in starts)   # every server here has started once: no start compiles again
    ans = {(s.arm, s.what.split(" ")[1]): s for s in p.steps if s.phase == "answers"}
    # warm control starts 57.025, 57.328, 62.616, 65.076, 68.092 s -> median 62.616, slowest x 1.25 = 85.1
    start = ans[("control", "start")]
    assert start.expected_s == pytest.approx(62.616, abs=0.01) and start.worst_s == pytest.approx(85.115, abs=0.01)
    # its answers phase served 800 items in 22.26 s; 800 again (the record keeps no boundary cases apart, so
    # they are in the items' time, and the boundary step adds nothing)
    assert ans[("control", "sampled")].expected_s == pytest.approx(22.26, abs=0.01)
    assert ans[("control", "boundary")].expected_s == 0 and "no boundary case recorded" in ans[("control", "boundary")].basis
    # warm candidate starts 56.537, 59.283, 67.124 s -> median 59.283
    assert ans[("candidate", "start")].expected_s == pytest.approx(59.283, abs=0.01)
    speed_steps = [s for s in p.steps if s.phase == "speed"]
    # max_starts 5, and the recorded bracket ran all 5: control 62.616 + 19.451 s served (median of its
    # three bracket starts 20.464, 19.451, 18.760), candidate 59.283 + 19.361 (19.055, 19.666)
    assert len(speed_steps) == 5 and [s.arm for s in speed_steps] == ["control", "candidate"] * 2 + ["control"]
    assert speed_steps[0].expected_s == pytest.approx(82.067, abs=0.02)
    assert speed_steps[1].expected_s == pytest.approx(78.644, abs=0.02)
    # the diagnostics start no server now (each arm's greedy runs are in its answers phase): no step of theirs
    assert [s for s in p.steps if s.phase == "diagnostics"] == []
    # the recorded run took 947 s, of it 148 s more than a warm run in its two first (compiling) starts
    # (187.4 + 83.4 against 62.6 + 59.3) and 203 s in its diagnostics (three starts, 170.9 s of it, and their
    # greedy runs and probes), which a run now makes on its answers servers: planned at about 582 s
    assert p.expected_s == pytest.approx(582, abs=3)
    assert p.expected_s < p.worst_s < 947 * 1.4


def test_plan_from_the_config_alone_is_assumed_and_bounds_the_recorded_run(checked):
    p = timeplan.build_plan(checked.settings, timeplan.arm_facts(checked.specs), history.History(host="vm"),
                            audit="vllm-gpu-small", sampling={"max_tokens": 160, "concurrency": 16})
    assert all(s.source == "assumed" for s in p.steps) and p.assumed and p.assumptions
    assert any("vllm-gpu" in a for a in p.assumptions)
    text = timeplan.render_text(p)
    assert "ASSUMED" in text and "history)" not in text and "no earlier audit" in text
    # each server's first start compiles; the plan says so
    assert [s.what for s in p.steps if s.phase == "answers" and s.what.startswith("server")] == [
        "server start (cold)", "server start (cold)"]
    # the worst case holds the real run (947 s) with room; a start never past its health_timeout_s (900 s)
    assert p.worst_s >= 947 and all(s.worst_s <= 900 for s in p.steps if s.what.startswith("server"))
    # the bracket at max_starts in the worst case, at its first look (3 starts) expected
    sp = [s for s in p.steps if s.phase == "speed"]
    assert len(sp) == 5 and sum(1 for s in sp if s.expected_s > 0) == 3


def test_planned_against_actual_of_the_recorded_run(checked, tmp_path):
    p = timeplan.build_plan(checked.settings, timeplan.arm_facts(checked.specs), history.History(host="vm"),
                            audit="vllm-gpu-small", sampling={"max_tokens": 160, "concurrency": 16})
    # the run began at 12:25:34 (its log) and decided at 12:41:13 (decision.json's created_at)
    p = dataclasses.replace(p, created_at="2026-12-06T12:25:34+00:00")
    end = history.epoch("2026-12-06T12:41:13+00:00")
    pa = actual.planned_actual(p, "plan.json", DATA / "results/vllm-gpu-small/servers/starts.jsonl", now=end)
    got = {r.phase: r for r in pa.phases}
    # answers: control 187.395 + 22.26, candidate 83.438 + 25.31 s
    assert got["answers"].actual_s == pytest.approx(318.4, abs=0.2) and got["answers"].actual_starts == 2
    # speed: to healthy 68.09 + 59.28 + 62.62 + 67.12 + 65.08, served 20.46 + 19.06 + 19.45 + 19.67 + 18.76
    assert got["speed"].actual_starts == 5 and got["speed"].actual_s == pytest.approx(419.6, abs=0.3)
    assert got["diagnostics"].actual_starts == 3 and got["diagnostics"].actual_s == pytest.approx(189.4, abs=0.3)
    assert pa.total.actual_s == pytest.approx(939.0, abs=0.5)
    assert got["other"].actual_s == pytest.approx(939.0 - 318.4 - 419.6 - 189.4, abs=1.0)
    assert pa.total.expected_s == pytest.approx(p.expected_s) and pa.assumed
    assert json.loads(json.dumps(pa.to_json()))["total"]["actual_s"] == pytest.approx(939.0, abs=0.5)


def test_the_plan_is_an_artifact_with_its_content_hash(checked, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = timeplan.build_plan(checked.settings, timeplan.arm_facts(checked.specs), history.History(host="vm"),
                            audit="planned", sampling={"max_tokens": 160, "concurrency": 16}, window_min=60)
    path = timeplan.write_plan(p, "planned")
    assert path.startswith("results/planned/plan/") and path.endswith(".json")
    doc = artifacts.read_json(path)
    assert doc["schema"] == contracts.TIME_PLAN_SCHEMA and doc["fits"] == (p.worst_s <= 3600)
    found = timeplan.latest_plan("planned")
    assert found is not None and found[1].expected_s == pytest.approx(p.expected_s)
    # an edited plan is refused by name, like every artifact
    raw = json.loads(Path(path).read_text())
    raw["expected_s"] = 1.0
    Path(path).write_text(json.dumps(raw))
    with pytest.raises(artifacts.ArtifactError, match="content sha256"):
        artifacts.read_json(path)
    assert timeplan.latest_plan("planned") is None


def test_window_refusal_names_the_phase_and_how_much(checked):
    h = history.host_history(DATA / "results", host="vm")
    p = timeplan.build_plan(checked.settings, _recorded_arms(checked), h, audit="vllm-gpu-small",
                            sampling={"max_tokens": 160, "concurrency": 16}, window_min=12)
    assert p.worst_s > 12 * 60   # 13.1 min worst, the bracket 9.2 min of it
    msg = timeplan.window_problem(p, checked.settings)
    assert msg is not None and msg.startswith("window_min: 12 min is shorter than the audit's worst case")
    assert "shrink the speed phase" in msg and "speed.max_starts 5 -> 3 saves" in msg
    fits = dataclasses.replace(p, window_min=p.worst_s / 60 + 0.1)
    assert timeplan.window_problem(fits, checked.settings) is None
    # the bracket's deadline leaves the worst case of what may still follow it
    t0 = 1_000_000.0
    after = fits.phase("diagnostics")[1] + fits.phase("other")[1]
    assert timeplan.speed_deadline(fits, t0) == pytest.approx(t0 + 60 * fits.window_min - after)


def test_pairaudit_plan_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert cli_main(["plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("time plan of audit default") and "server start" in out
    assert cli_main(["plan", "--window-min", "1"]) == 1
    err = capsys.readouterr().err
    assert "window_min: 1 min is shorter" in err and "shrink the" in err
    assert cli_main(["plan", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == contracts.TIME_PLAN_SCHEMA and doc["window_min"] is None and doc["fits"] is None


@pytest.mark.workflow
def test_snakemake_refuses_a_window_too_small_before_any_server_starts():
    """A real invocation (not a dry run): the window is judged at load, and nothing runs."""
    audit = "timeplan-window-refused"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--cores", "1", "promotion",
                           "--config", f"audit={audit}", "window_min=1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"time plan of audit {audit}" in out and "window 1 min: does NOT fit" in out
    assert "window_min: 1 min is shorter than the audit's worst case" in out and "shrink the" in out, out[-3000:]
    assert "nothing has run" in out
    assert not (ROOT / "results" / audit).exists()   # no server started, no plan written


# ------------------------------------------------------------------ the bracket's deadline

def test_a_deadline_already_passed_starts_no_server(tmp_path):
    from tests.test_speed import _arm, bracket_inputs

    lp, pp, sp = bracket_inputs(tmp_path, {"control": _arm(0), "candidate": _arm(4)})
    cfg = {"cells": [{"name": "rep-c1", "prompt": "repetitive", "input_len": 40, "concurrency": 1}],
           "repeats": 2, "waves": 1, "output_len": 8, "archive": str(tmp_path / "archive.jsonl"),
           "accept_unverifiable_clock": True, "repeat_s": None}
    out, streams, starts_log = tmp_path / "decision.json", tmp_path / "streams.jsonl", tmp_path / "starts.jsonl"
    doc = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed.resolve(cfg),
                                  audit="late", out_path=str(out), streams_path=str(streams),
                                  archive_path=str(tmp_path / "archive.jsonl"), starts_log=str(starts_log),
                                  server_logs={s: str(tmp_path / f"{s}.log") for s in ("s1", "s2", "s3")},
                                  deadline=time.time() - 1)
    saved = artifacts.read_json(out)
    assert saved == {k: v for k, v in doc.items() if k != artifacts.CONTENT_KEY}
    gate = saved["gate"]
    assert gate["verdict"] == "INCONCLUSIVE" and gate["stopped_by"] == "window"
    assert gate["window"]["starts_had"] == 0 and gate["window"]["starts_needed"] == 3
    assert gate["reasons"][0].startswith("window: the bracket stopped after 0 of the 3 starts")
    assert saved["starts"] == [] and not starts_log.exists()   # no server was started
    assert artifacts.read_jsonl(streams)[1] == []
    # the promotion reads it as any bracket that was not measured: its gate INCONCLUSIVE, its reason the window
    read = readers.SpeedDecisionDoc.read(out)
    assert read.not_run is not None and read.gate is not None and read.gate.verdict == "INCONCLUSIVE"


@pytest.mark.server
def test_a_deadline_inside_the_bracket_ends_it_for_the_window_keeping_its_evidence(tmp_path):
    from tests.test_speed import _arm, bracket_inputs

    lp, pp, sp = bracket_inputs(tmp_path, {"control": _arm(0), "candidate": _arm(4)})
    archive = tmp_path / "results" / "control-archive.jsonl"
    # win2-v4 with a start-noise fallback no 3-start window can beat: the rule asks for five starts
    cfg = {"cells": [{"name": "rep-c1", "prompt": "repetitive", "input_len": 40, "concurrency": 1}],
           "repeats": 2, "waves": 1, "output_len": 16, "archive": str(archive), "accept_unverifiable_clock": True,
           "max_starts": 5, "start_noise_pct": 50.0, "repeat_s": None}
    out, streams, starts_log = tmp_path / "decision.json", tmp_path / "streams.jsonl", tmp_path / "starts.jsonl"

    def stopped_starts() -> int:
        return sum(1 for line in starts_log.read_text().splitlines()
                   if json.loads(line).get("event") == "stopped") if starts_log.exists() else 0

    # The window's hour passes once the bracket's third start has stopped: the wall clock the bracket reads is
    # real time until then, an hour and a second later after (the starts themselves run in real time).
    deadline = time.time() + 3600

    def wall_clock() -> float:
        return time.time() + (3601 if stopped_starts() >= 3 else 0)

    doc = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed.resolve(cfg),
                                  audit="windowed", out_path=str(out), streams_path=str(streams),
                                  archive_path=str(archive), starts_log=str(starts_log),
                                  server_logs={s: str(tmp_path / f"{s}.log") for s in ("s1", "s2", "s3")},
                                  deadline=deadline, wall_clock=wall_clock)
    saved = artifacts.read_json(out)
    gate = saved["gate"]
    assert gate == doc["gate"]
    assert gate["verdict"] == "INCONCLUSIVE" and gate["stopped_by"] == "window"
    assert gate["window"]["starts_had"] == 3 and gate["window"]["starts_needed"] == 5
    assert gate["reasons"][0].startswith("window: the bracket stopped after 3 of the 5 starts")
    # the rule's own look at three starts is kept beside the window's outcome: it asked for more
    assert gate["stage_verdict"] == saved["looks"][0]["verdict"] and saved["looks"][0]["more_starts"] is True
    assert [lk["starts"] for lk in saved["looks"]] == [3]
    # no evidence lost: three measured starts, their streams, their pooled counters, the controls archived
    assert [s["start"] for s in saved["starts"]] == ["s1", "s2", "s3"]
    assert {r["start"] for r in artifacts.read_jsonl(streams)[1]} == {"s1", "s2", "s3"}
    assert set(saved["pooled"]["rep-c1"]) == {"s1", "s2", "s3"}
    archived = [json.loads(line) for line in archive.read_text().splitlines()]
    assert sorted(r["start"] for r in archived) == ["s1", "s3"] and saved["archive"]["appended"] == 2
    assert stopped_starts() == 3   # no fourth server was started
    read = readers.SpeedDecisionDoc.read(out)   # what the promotion reads: a measured bracket, undecided
    assert read.gate is not None and read.gate.verdict == "INCONCLUSIVE" and read.not_run is None


def test_a_sweep_past_its_deadline_ends_every_candidate_for_the_window(tmp_path):
    from tests.test_speed import _arm, bracket_inputs

    lp, pp, sp = bracket_inputs(tmp_path, {"control": _arm(0), "ngram": _arm(4), "wide": _arm(2)})
    cfg = {"cells": [{"name": "rep-c1", "prompt": "repetitive", "input_len": 40, "concurrency": 1}],
           "repeats": 2, "waves": 1, "output_len": 8, "archive": str(tmp_path / "archive.jsonl"),
           "accept_unverifiable_clock": True, "repeat_s": None, "max_starts": 5}
    outs = {c: str(tmp_path / c / "decision.json") for c in ("ngram", "wide")}
    starts_log = tmp_path / "starts.jsonl"
    docs = speed_stage.speed_stage(launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed.resolve(cfg),
                                   audit="late-sweep", candidates=["ngram", "wide"], out_paths=outs,
                                   streams_path=str(tmp_path / "streams.jsonl"),
                                   archive_path=str(tmp_path / "archive.jsonl"), starts_log=str(starts_log),
                                   server_logs={"s1": str(tmp_path / "s1-control.log")}, deadline=time.time() - 1)
    assert set(docs) == {"ngram", "wide"} and not starts_log.exists()
    for c, path in outs.items():
        gate = artifacts.read_json(path)["gate"]
        assert gate["verdict"] == "INCONCLUSIVE" and gate["stopped_by"] == "window", c
        assert gate["window"]["starts_had"] == 0 and gate["window"]["starts_needed"] == 5   # C, T1, C, T2, C


def test_the_report_sets_each_phase_planned_against_actual(checked):
    from pairaudit.promotion.render import time_markdown

    p = timeplan.build_plan(checked.settings, timeplan.arm_facts(checked.specs), history.History(host="vm"),
                            audit="vllm-gpu-small", sampling={"max_tokens": 160, "concurrency": 16})
    p = dataclasses.replace(p, created_at="2026-12-06T12:25:34+00:00")
    pa = actual.planned_actual(p, "results/vllm-gpu-small/plan/x.json",
                               DATA / "results/vllm-gpu-small/servers/starts.jsonl",
                               now=history.epoch("2026-12-06T12:41:13+00:00"))
    md = "\n".join(time_markdown(pa))
    assert "## Time: planned against actual" in md and "`results/vllm-gpu-small/plan/x.json`" in md
    speed_row = next(line for line in md.splitlines() if line.startswith("| speed |"))
    assert f"| {p.phase('speed')[0]:.0f} s |" in speed_row and "| 420 s |" in speed_row and "| 3, 5 |" in speed_row
    assert "| **total** |" in md and "| 939 s |" in md
    assert "No time plan was written" in "\n".join(time_markdown(None))


@pytest.mark.parametrize("rule, max_starts, expected", [
    ("win2-v5", 15, 7),     # sized from a pilot of 7 starts: no two-arm bracket of it ends sooner
    ("win2-v5", 5, 5),      # a pilot never longer than the bracket may grow
    ("win2-v4", 15, 3),     # a rule that looks after every candidate start: its first look at 3
])
def test_the_bracket_is_planned_to_its_first_look(checked, rule, max_starts, expected):
    speed = dataclasses.replace(checked.settings.speed, rule=rule, max_starts=max_starts)
    p = timeplan.build_plan(dataclasses.replace(checked.settings, speed=speed), timeplan.arm_facts(checked.specs),
                            history.History(host="vm"), audit="first-look",
                            sampling={"max_tokens": 160, "concurrency": 16})
    sp = [s for s in p.steps if s.phase == "speed"]
    assert len(sp) == max_starts and sum(1 for s in sp if s.expected_s > 0) == expected


@pytest.mark.parametrize("config, kind", [
    ("config/config.yaml", "refserver-cpu"),
    ("config/examples/gpu-refserver.yaml", "refserver-gpu"),
    ("config/examples/vllm-cpu-fp16.yaml", "vllm-cpu"),
    ("tests/data/h100-runs/vllm-gpu-small.yaml", "vllm-gpu"),
    ("config/examples/vllm-attach.yaml", "attach"),
])
def test_a_server_without_history_is_planned_by_its_kind(config, kind):
    cfg = yaml.safe_load((ROOT / config).read_text())
    assert change.derive_arms(cfg) == []
    spec = armspec.resolve_spec("control", cfg["arms"]["control"])
    assert timeplan.server_kind(spec) == kind


# The embedded default audited twice on this project's 2-core CPU host by bench/timeplan.py (2026-12-06,
# a quiet machine): timeplan-1 as a fresh clone's first run, timeplan-2 planned from timeplan-1's records.
# The records are copied unchanged from that run, with the config it ran.
CPU = ROOT / "tests" / "data" / "cpu-default-runs"


def test_the_second_cpu_run_was_planned_from_the_first_and_took_what_was_planned():
    res = _checked(CPU / "config.yaml")
    sampling = yaml.safe_load((CPU / "config.yaml").read_text())["sampling"]
    h = history.host_history(CPU / "results", host="vm", exclude=["timeplan-2"])
    (first,) = h.audits
    assert first.items == {"control": 64, "candidate": 64}
    # boundary/<arm>.json: five cases each, first sent to last answered 15.10 s (control), 14.87 s (candidate)
    assert first.boundary["control"][0] == 5 and first.boundary["control"][1] == pytest.approx(15.10, abs=0.01)
    # the run began when it wrote its plan, 15:04:47, and decided at 15:08:36
    assert first.began_at == history.epoch("2026-12-06T15:04:47+00:00")
    assert first.finished_at == history.epoch("2026-12-06T15:08:36+00:00")
    p = timeplan.build_plan(res.settings, timeplan.arm_facts(res.specs), h, audit="timeplan-2", sampling=sampling)
    assert not p.assumed
    ans = {(s.arm, s.what.split(" ")[1]): s for s in p.steps if s.phase == "answers"}
    # the control's answers phase: healthy at 15:04:50.388, stopped at 15:05:28.089, of which the boundary
    # cases 15.10 s; the same 64 items and 5 cases again
    served = history.read_starts(CPU / "results/timeplan-1/servers/starts.jsonl", "timeplan-1")[0].served_s
    assert served == pytest.approx(37.70, abs=0.01)
    assert ans[("control", "boundary")].expected_s == pytest.approx(15.10, abs=0.01)
    assert ans[("control", "sampled")].expected_s + ans[("control", "boundary")].expected_s == pytest.approx(served)
    # what the workflow printed and wrote at the second run's start is this plan
    (path,) = (CPU / "results/timeplan-2/plan").glob("*.json")
    recorded = timeplan.TimePlan.from_json(artifacts.read_json(path), where=str(path))
    assert recorded.history == ("results/timeplan-1/servers/starts.jsonl",)
    # the plan now is the recorded one less its diagnostics phase (three starts and their greedy runs, which a
    # run now makes on its answers servers, already in the answers phase's served time)
    diag = recorded.phase("diagnostics")
    assert diag[0] > 0 and p.phase("diagnostics") == (0, 0)
    assert p.expected_s == pytest.approx(recorded.expected_s - diag[0])
    assert p.worst_s == pytest.approx(recorded.worst_s - diag[1])
    assert recorded.expected_s == pytest.approx(229.0, abs=0.5)
    # and the second run took 229.0 s from its plan to its decision: within 20 % of the plan (the aim)
    end = history.epoch(artifacts.read_json(CPU / "results/timeplan-2/promotion/decision.json")
                        ["provenance"]["created_at"])
    pa = actual.planned_actual(recorded, str(path), CPU / "results/timeplan-2/servers/starts.jsonl", now=end)
    assert pa.total.actual_s == pytest.approx(229.0, abs=1.0)
    assert abs(pa.total.actual_s / pa.total.expected_s - 1) <= 0.2
    assert [r.actual_starts for r in pa.phases] == [2, 3, 3, 0]
