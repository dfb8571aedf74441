"""A/A calibration: the config of the calibration module, its summary, the log and the citation."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from test_report import _write_inputs, launch_rec, paired_doc, passing_later, passing_pair, preflights
from test_workflow import TINY, dry_run_jobs, make_project, planned_jobs, snake

from pairaudit.core.artifacts import read_json, sha256_file
from pairaudit.core.jsonlog import read_log
from pairaudit.gates.speed import win2_v1
from pairaudit.promotion import calibration, decision
from pairaudit.promotion import stage as report

# ------------------------------------------------------------------ config


def audit_config():
    """The tiny audit with a real change under audit (the candidate's BF16 head on)."""
    config = yaml.safe_load(TINY.read_text())
    config["arms"]["candidate"]["env"]["PAIRAUDIT_REF_LM_HEAD_BF16"] = "1"
    return config


def test_calibration_config_runs_the_control_against_a_copy_of_itself_under_its_own_name():
    config = audit_config()
    before = copy.deepcopy(config)
    cal = calibration.calibration_config(config)
    assert config == before, "the audit's own config must not change"
    assert cal["audit"] == "tiny-calibration" and cal["calibration"] == {"of": "tiny"}
    assert cal["arms"]["candidate"] == cal["arms"]["control"] == config["arms"]["control"]
    assert cal["arms"]["candidate"] is not cal["arms"]["control"]  # a copy, not an alias
    assert {k: v for k, v in cal.items() if k not in ("audit", "arms", "calibration")} == \
        {k: v for k, v in config.items() if k not in ("audit", "arms", "calibration")}
    assert calibration.is_calibration(cal) and not calibration.is_calibration(config)
    assert calibration.check(cal) == [] and calibration.check(config) == []
    with pytest.raises(ValueError, match="already a calibration"):
        calibration.calibration_config(cal)
    # the log's path is kept
    logged = calibration.calibration_config({**config, "calibration": {"log": "elsewhere.jsonl"}})
    assert calibration.log_path(logged) == "elsewhere.jsonl" and calibration.log_path(config) == calibration.LOG


def test_check_names_a_calibration_that_is_not_one_and_a_reserved_audit_name():
    cal = calibration.calibration_config(audit_config())
    cal["arms"]["candidate"]["env"]["PAIRAUDIT_REF_LM_HEAD_BF16"] = "1"
    cal["audit"] = "other"
    problems = calibration.check(cal)
    assert len(problems) == 2
    assert "audit is 'other'" in problems[0] and "arms.candidate must equal arms.control" in problems[1]
    assert "names the calibration of audit 'tiny'" in calibration.check({**audit_config(), "audit": "tiny-calibration"})[0]


# ----------------------------------------------------------------- summary

def identical_launches(hostname="node1"):
    la = {"control": launch_rec("control", {"X": "0"}, spec="c" * 64),
          "candidate": launch_rec("candidate", {"X": "0"}, spec="c" * 64)}
    for rec in la.values():
        rec["machine"]["hostname"] = hostname
    return la


def speed_doc(window_max, archive):
    return {"schema": "pairaudit.speed_decision/v1", "gate": None,
            "bar": {"win_pct": 2.0, "primary": "output_tok_s", "lower_is_better": []},
            "spread": {"short-c1": {"window_pct": [window_max / 2, window_max], "window_max_pct": window_max,
                                    "archive_pct": archive, "archive_n": 4, "archive_with_window_pct": archive,
                                    "archive_with_window_n": 6, "win_pct": 2.0,
                                    "config_hash": "h"}}}


def divergence_docs(pair, diverged=()):
    return {ds: {"schema": "pairaudit.divergence/v1", "dataset": ds, "grid_tie": None, "items": [0, 1],
                 "divergences": [{"index": i, "diverged": i in diverged} for i in (0, 1)]}
            for ds in pair}


def a_a(pair, speed):
    later = passing_later(pair)
    later["speed"] = win2_v1({"output_tok_s": speed}, primary="output_tok_s")
    return decision.decide(pair, identical_launches(), preflights(), calibration=True, **later)


def test_a_quiet_host_flags_nothing():
    pair = {"gsm8k": paired_doc("gsm8k", both=range(20), neither=(20, 21))}
    decision = a_a(pair, [[100.0, 100.2, 100.1], [100.1, 99.9, 100.0], [100.0, 100.1, 100.2]])
    s = calibration.summarize(decision, audit="x-calibration", of_audit="x", speed_doc=speed_doc(0.2, 0.4),
                              divergence_docs=divergence_docs(pair))
    assert s["schema"] == "pairaudit.calibration/v1" and s["of_audit"] == "x"
    assert s["flagged"] == [] and s["findings"] == [] and s["notes"] == []
    assert s["headline"] == "A/A on node1: nothing flagged on identical arms"
    assert s["gates"]["speed"] == {"rule": "win2-v1", "verdict": "NO_WIN", "expected": ["NO_WIN"], "flagged": False,
                                   "reason": s["gates"]["speed"]["reason"]}
    assert s["quality"]["gsm8k"]["discordant"] == 0 and s["greedy"]["gsm8k"]["diverged"] == []
    assert s["greedy"]["gsm8k"]["determinism"] == "PASS" and s["boundary"]["verdict"] == "PASS"
    assert s["control_spec_sha256"] == "c" * 64 and s["host"]["hostname"] == "node1"
    assert s["host_sha256"] == calibration.host_sha256(calibration.host_facts(identical_launches()["control"]))


def test_a_noisy_host_shows_a_speed_loss_and_the_quality_and_greedy_discordances():
    pair = {"gsm8k": paired_doc("gsm8k", both=range(20), control_only=(20, 21, 22, 23, 24, 25), neither=(26,))}
    decision = a_a(pair, [[100.0, 90.0, 100.0], [101.0, 90.0, 100.0], [100.0, 89.0, 101.0]])
    assert decision["decision"] == "REJECT"  # calibration mode: the gates decide
    s = calibration.summarize(decision, audit="x-calibration", of_audit="x", speed_doc=speed_doc(7.5, 9.0),
                              divergence_docs=divergence_docs(pair, diverged=(1,)))
    assert s["flagged"] == ["quality:gsm8k", "speed"]
    assert s["quality"]["gsm8k"]["control_only"] == [20, 21, 22, 23, 24, 25]
    assert s["quality"]["gsm8k"]["mcnemar_p"] == pytest.approx(0.03125)
    assert s["speed"]["verdict"] == "LOSS" and s["speed"]["max_window_pct"] == 7.5
    assert s["greedy"]["gsm8k"]["diverged"] == [1]
    assert s["findings"][1] == ("speed LOSS on identical arms: this host's noise is too large for the bar "
                                "(in-window control spread up to 7.5 %, archive spread 9.0 %, against the 2.0 % bar)")
    assert s["findings"][0].startswith("quality:gsm8k FAIL on identical arms: control-only [20, 21, 22, 23, 24, 25]")
    assert s["headline"] == "A/A on node1: 2 gate(s) flagged identical arms: quality:gsm8k FAIL, speed LOSS"


def test_an_invalid_table_on_identical_arms_says_why_not_that_the_arms_disagree():
    pair = {"gsm8k": paired_doc("gsm8k", both=range(20), unnatural_candidate=(3,))}
    decision = a_a(pair, [[100.0, 100.2, 100.1], [100.1, 99.9, 100.0], [100.0, 100.1, 100.2]])
    s = calibration.summarize(decision, audit="x-calibration", of_audit="x")
    assert s["flagged"] == ["quality:gsm8k"]
    # quality-v2: INCONCLUSIVE on identical arms is a sizing fact, not a false alarm; INVALID is flagged
    assert s["findings"] == [f"quality:gsm8k INVALID on identical arms (expected PASS/INCONCLUSIVE): {decision['gates']['quality:gsm8k']['reasons'][0]}"]


def test_a_summary_needs_a_calibration_decision_and_says_what_was_not_evaluated():
    pair = passing_pair()
    with pytest.raises(ValueError, match="calibration mode"):
        calibration.summarize(decision.decide(pair, identical_launches(), preflights()), audit="a", of_audit="b")
    s = calibration.summarize(decision.decide(pair, identical_launches(), preflights(), calibration=True),
                              audit="a", of_audit="b")
    assert s["flagged"] == [] and s["speed"] is None and s["boundary"] is None
    assert s["not_evaluated"] == ["grid_tie", "determinism", "boundary", "speed"]
    assert s["headline"] == ("A/A on node1: nothing flagged on identical arms (4 gate(s) not evaluated: grid_tie, "
                             "determinism, boundary, speed)")


# ---------------------------------------------------------------- citation

def entry(spec, host_sha, time, path):
    return calibration.CalibrationEntry(
        time=time, audit="a-calibration", of_audit="a", control_spec_sha256=spec, host={"hostname": "h"},
        host_sha256=host_sha, decision="HOLD", headline=f"headline of {path}", flagged=[], summary_path=path,
        summary_sha256="0" * 64, decision_path="d.json", decision_sha256="1" * 64).to_json()


def test_cite_finds_the_latest_calibration_of_the_same_control_on_the_same_host():
    log = [entry("s", "h1", "2026-01-02T00:00:00Z", "new"), entry("s", "h1", "2026-01-01T00:00:00Z", "old"),
           entry("s", "h2", "2026-01-03T00:00:00Z", "other-host"),
           entry("t", "h1", "2026-01-04T00:00:00Z", "other-spec"), {"schema": "something else"}]
    ref = calibration.cite(log, "s", "h1")
    assert ref.path == "new" and ref.headline == "headline of new" and ref.time == "2026-01-02T00:00:00Z"
    assert calibration.cite(log, "s", "h3") is None and calibration.cite(log, "u", "h1") is None
    assert calibration.cite(log, None, "h1") is None
    # the same time: the later line wins
    assert calibration.cite(log + [entry("s", "h1", "2026-01-02T00:00:00Z", "newer")], "s", "h1").path == "newer"


def test_a_calibration_run_is_logged_and_the_next_decision_of_that_control_cites_it(tmp_path):
    log = tmp_path / "results" / "calibrations.jsonl"
    pair = passing_pair()
    # the audit: no calibration yet, and saying so
    la = identical_launches()
    la["candidate"] = launch_rec("candidate", {"X": "1"})
    la["candidate"]["machine"]["hostname"] = "node1"
    ins = _write_inputs(tmp_path / "audit", pair, la, preflights())
    out = tmp_path / "audit" / "promotion"
    outs = {"out_decision": str(out / "decision.json"), "out_report": str(out / "report.md"),
            "out_manifest": str(out / "manifest.json"), "out_plot": str(out / "paired.png"),
            "out_summary": str(out / "summary.rst")}
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs, calibrations_path=str(log))
    d = read_json(out / "decision.json")
    assert d["calibration_ref"] is None
    assert "No calibration of this control on this host" in (out / "report.md").read_text()
    # the calibration of its control
    cal_ins = _write_inputs(tmp_path / "cal", pair, identical_launches(), preflights())
    cal = tmp_path / "cal" / "promotion"
    cal_outs = {k: v.replace(str(out), str(cal)) for k, v in outs.items()}
    report.promotion_stage(cal_ins["paired"], cal_ins["launch"], cal_ins["preflight"], **cal_outs,
                           calibrations_path=str(log), calibration=True, out_calibration=str(cal / "calibration.json"),
                           audit="a-calibration", config={"audit": "a-calibration", "calibration": {"of": "a"}})
    summary = read_json(cal / "calibration.json")
    assert summary["of_audit"] == "a" and summary["audit"] == "a-calibration"
    [logged] = read_log(log)
    assert logged["summary_sha256"] == sha256_file(cal / "calibration.json")
    assert logged["decision_sha256"] == sha256_file(cal / "decision.json")
    assert logged["control_spec_sha256"] == "c" * 64 and logged["headline"] == summary["headline"]
    md = (cal / "report.md").read_text()
    assert "## A/A calibration" in md and "This decision is the A/A calibration of audit `a`" in md
    assert str(cal / "calibration.json") in {a["path"] for a in read_json(cal / "manifest.json")["artifacts"]}
    # the audit decided again cites it, verdict unchanged
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs, calibrations_path=str(log))
    again = read_json(out / "decision.json")
    assert again["calibration_ref"] == {"path": str(cal / "calibration.json"), "sha256": logged["summary_sha256"],
                                        "time": logged["time"], "audit": "a-calibration",
                                        "headline": summary["headline"], "flagged": summary["flagged"]}
    assert again["decision"] == d["decision"] and again["reasons"] == d["reasons"]
    assert summary["headline"] in (out / "report.md").read_text()
    assert "Calibration:" in (out / "summary.rst").read_text()
    # another host's control is not cited
    other = json.loads((tmp_path / "audit" / "launch" / "control.json").read_text())
    other["machine"]["hostname"] = "node2"
    assert calibration.lookup(log, other) is None


def test_a_calibration_decision_needs_somewhere_to_write_its_summary(tmp_path):
    ins = _write_inputs(tmp_path, passing_pair(), identical_launches(), preflights())
    with pytest.raises(ValueError, match="out_calibration"):
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], *(str(tmp_path / n) for n in
                               ("d.json", "r.md", "m.json", "p.png")), calibration=True)


# ---------------------------------------------------------------- workflow

@pytest.mark.workflow
def test_calibrate_targets_its_own_results_and_runs_the_control_as_both_arms(tmp_path):
    """``snakemake -n calibrate`` plans only the calibration's jobs, under results/<audit>-calibration/;
    its plans (no server) give the candidate the control's spec, and nothing of the audit is touched."""
    config = audit_config()
    project = make_project(tmp_path / "project", config)
    dry = snake(project, "-n", "calibrate").stdout
    jobs = dry_run_jobs(dry)
    assert sorted({r for r, _, _ in jobs}) == sorted(
        ["calibrate"] + [f"calibration_{r}" for r in ("arm_spec", "boundary_plan", "dataset", "requests", "answers",
                                                      "boundary_gate", "sampled", "speed", "score", "paired",
                                                      "diagnostics", "promotion")])
    outputs = [p for line in dry.splitlines() if line.strip().startswith("output:")
               for p in line.split(":", 1)[1].split(",")]
    assert outputs and all(p.strip().startswith("results/tiny-calibration/") for p in outputs)
    assert any(p.strip() == "results/tiny-calibration/promotion/calibration.json" for p in outputs)
    # the audit's own target plans none of the calibration's jobs
    assert not [r for r, _ in planned_jobs(project, "promotion") if r.startswith("calibrat")]
    cal = project / "results" / "tiny-calibration" / "specs"
    snake(project, str(cal.relative_to(project) / "control.json"), str(cal.relative_to(project) / "candidate.json"))
    assert not (project / "results" / "tiny").exists()
    specs = {arm: json.loads((cal / f"{arm}.json").read_text()) for arm in ("control", "candidate")}
    assert specs["candidate"]["spec_sha256"] == specs["control"]["spec_sha256"]
    snake(project, "results/tiny/specs/candidate.json")
    audit_candidate = json.loads((project / "results" / "tiny" / "specs" / "candidate.json").read_text())
    assert audit_candidate["spec_sha256"] != specs["control"]["spec_sha256"]
    # an audit named like another's calibration is refused at load, by name
    bad = snake(project, "-n", "--config", "audit=tiny-calibration", check=False)
    assert bad.returncode != 0 and "names the calibration of audit 'tiny'" in bad.stdout + bad.stderr
