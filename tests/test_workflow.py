"""The real Snakemake DAG on a tiny config against the real reference server.

The workflow runs in a scratch copy of the project (its Snakefile, rules,
scripts, library and profile) so the tests never touch the checkout's
results/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pairaudit import gates
from pairaudit.cli.codes import EXIT

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TINY = REPO / "tests" / "data" / "tiny_config.yaml"
COPY = ["Snakefile", "rules", "scripts", "config", "profiles", "envs", "pairaudit", "report"]

pytestmark = pytest.mark.workflow


def make_project(root: Path, config: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def snake(project: Path, *args, timeout=1200, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([SNAKEMAKE, "--cores", "2", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def dry_run_jobs(out: str) -> list[tuple[str, dict, dict]]:
    """(rule, wildcards, resources) of every job in a dry run's output."""
    def fields(block: str, name: str) -> dict:
        m = re.search(rf"{name}: (.*)", block)
        return dict(kv.split("=", 1) for kv in m.group(1).split(", ")) if m else {}

    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        m = re.match(r"(?:local)?rule (\w+):", block.strip())
        if m:
            jobs.append((m.group(1), fields(block, "wildcards"), fields(block, "resources")))
    return jobs


def planned_jobs(project: Path, *args) -> list[tuple[str, dict]]:
    """(rule, wildcards) of every job a dry run would execute."""
    return [(rule, wc) for rule, wc, _ in dry_run_jobs(snake(project, "-n", *args).stdout)]


def refserver_pids(project: Path) -> list[int]:
    """Reference servers started from ``project`` (their working directory is inside it)."""
    out = subprocess.run(["pgrep", "-f", "pairaudit.refserver"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if _cwd(int(p)).startswith(str(project))]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def tiny(tiny_audit):
    """The tiny audit, run once per worker (conftest.tiny_audit; test_report_html.py renders its report)."""
    return tiny_audit


def test_identical_arms_give_identical_answers_and_pass(tiny):
    project, config = tiny
    res = project / "results" / "tiny"
    for ds in ("arith", "algebra"):
        control = read_jsonl(res / "sampled" / ds / "control.jsonl")[1:]
        candidate = read_jsonl(res / "sampled" / ds / "candidate.jsonl")[1:]
        assert [r["body_sha256"] for r in control] == [r["body_sha256"] for r in candidate]
        texts = [[r["response"]["choices"][0]["message"]["content"] for r in arm] for arm in (control, candidate)]
        assert texts[0] == texts[1]
        paired = json.loads((res / "paired" / f"{ds}.json").read_text())
        assert paired["table"]["exact_text_matches"] == paired["table"]["n"]
        assert paired["table"]["bodies_identical"] is True
        # quality-v2: a server against itself loses nothing here, but 2-3 items cannot rule out a loss of
        # 3 points (the bound with no discordant item is z^2 / (n + z^2), over 50 points): INCONCLUSIVE,
        # with the items that would (quality-v1 passed these tables as if they had ruled a loss out)
        q = paired["quality"]
        assert q["rule"] == "quality-v2" and q["verdict"] in ("INCONCLUSIVE", "INVALID")
        assert q["multiplicity"]["datasets"] == 2 and q["loss_bound"]["level"] == 0.975
        if q["verdict"] == "INVALID":  # only an unnatural finish may make it so
            assert paired["table"]["unnatural_finish_indices"]["control"]
        else:
            assert paired["table"]["control_only"] == [] and paired["table"]["candidate_only"] == []
            n = paired["table"]["n"]
            assert q["loss_bound"]["upper_pct"] > 50 and q["needed"]["items"] > n
            assert q["reasons"][0].startswith(f"cannot rule out a loss of {q['loss_bound']['upper_pct']:.1f} "
                                              f"points with {n} items; about {q['needed']['items']} items would")
        divergence = json.loads((res / "divergence" / f"{ds}.json").read_text())
        assert divergence["items"] and not any(d["diverged"] for d in divergence["divergences"])
        assert divergence["grid_tie"]["verdict"] == "PASS" and divergence["determinism"]["verdict"] == "PASS"
    boundary = json.loads((res / "boundary" / "gate.json").read_text())
    assert boundary["gate"]["verdict"] == "PASS", boundary["gate"]["reasons"]
    assert sorted(boundary["gate"]["identical_text_cases"]) == sorted(boundary["gate"]["candidate_cases"])
    speed = json.loads((res / "speed" / "decision.json").read_text())
    assert [s["arm"] for s in speed["starts"]] == ["control", "candidate", "control"]
    decision = json.loads((res / "promotion" / "decision.json").read_text())
    assert decision["not_evaluated"] == []
    cases = decision["evidence"]["boundary_cases"]
    assert sorted(c["case"] for c in cases) == sorted(boundary["gate"]["candidate_cases"])
    assert all(c[arm]["ttft_s"] > 0 and c[arm]["finish_reason"] == "stop" and c[arm]["extracted"] == c["planted"]
               for c in cases for arm in ("control", "candidate"))
    assert set(decision["evidence"]["speed"]["cells"]) == {c["name"] for c in config["speed"]["cells"]}
    # Identical arms: every gate but quality (too few items to rule out the margin,
    # checked above) and speed must pass; speed is a noisy measurement
    # of nothing, marked informational in the tiny config, so only a noise LOSS
    # could gate -- the decision must be exactly what promotion-v1 makes of them.
    for name, gate in decision["gates"].items():
        if not name.startswith(("quality", "speed")):
            assert gate["verdict"] == "PASS", (name, gate)
    assert decision["gates"]["speed"]["outcome"] in ("INFORMATIONAL", "REJECT")
    verdicts = {n: {"verdict": g["verdict"], "rule": g["rule"], "informational": g["outcome"] == "INFORMATIONAL"}
                for n, g in decision["gates"].items()}
    # identical arms: no change under audit, whatever the gates found
    assert decision["decision"] == "INCONCLUSIVE" and decision["reasons"][0].startswith("no change under audit")
    assert decision["multiplicity"]["method"] == "bonferroni" and decision["multiplicity"]["datasets"] == 2
    assert decision["gate_verdict"] == gates.promotion_v1(verdicts)["verdict"]
    # the phases: exactly one start per arm outside the speed bracket (the answers phase's, which also made the
    # greedy runs the diagnostics read), none for the diagnostics, the bracket's three
    starts = [json.loads(line) for line in (res / "servers" / "starts.jsonl").read_text().splitlines()]
    ready = [(s["phase"], s["arm"]) for s in starts if s["event"] == "ready"]
    by_phase = {ph: [a for p, a in ready if p == ph] for ph in ("answers", "diagnostics", "speed")}
    assert sorted(a for p, a in ready if p != "speed") == ["candidate", "control"], ready
    assert sorted(by_phase["answers"]) == ["candidate", "control"] and by_phase["diagnostics"] == []
    assert by_phase["speed"] == ["control", "candidate", "control"]
    diagnostics = json.loads((res / "diagnostics" / "phase.json").read_text())
    assert diagnostics["starts"] == []
    for arm in ("control", "candidate"):
        answers = json.loads((res / "answers" / f"{arm}.json").read_text())
        assert answers["starts"] == 1 and all(g["open"] == 0 for g in answers["greedy"].values())
    assert decision["gates"]["servers"]["verdict"] == "PASS"
    manifest = json.loads((res / "promotion" / "manifest.json").read_text())
    paths = {a["path"] for a in manifest["artifacts"]}
    assert any(p.endswith("paired/arith.json") for p in paths)
    report = (res / "promotion" / "report.md").read_text()
    assert report.count("arith") >= 1
    # every start, with why it was fresh, in the report: one row per ready line of the starts log
    section = report[report.index("## Server starts"):]
    assert f"{len(ready)} starts" in section and section.count("| speed | ") == len(by_phase["speed"])


def test_the_terminal_shows_each_job_on_one_line_and_ends_on_the_decision(tiny):
    project, _ = tiny
    err = (project / ".terminal-stderr.txt").read_text()
    out = (project / ".terminal-stdout.txt").read_text()
    # one line when a job starts, one when it ends (profiles/default's logger plugin), no rule blocks
    assert re.search(r"started answers \(arm=control\); log results/tiny/logs/answers/control\.log", err)
    assert "finished answers (arm=control)" in err and "finished promotion" in err
    assert not re.search(r"^\s+(output|jobid|wildcards|reason): ", err, re.M), err[:3000]
    assert "Shell command: None" not in err and "steps (100%) done" in err
    assert "Select jobs to execute" not in err and not re.search(r"^Execute \d+ jobs", err, re.M)
    # the phases' own progress: items done of total, rate, ETA
    assert re.search(r"sampled arith/control: \d+/\d+ \(\d+ %\), [\d.]+/s, ETA", err)
    # the last thing printed is the decision's front page, with the command that prints it again
    decision = json.loads((project / "results/tiny/promotion/decision.json").read_text())
    assert out.strip().splitlines()[-1] == f"(`pairaudit verdict results/tiny` prints this again and exits {EXIT[decision['decision']]})"
    assert f"pairaudit verdict: {decision['decision']}" in out


def test_rerun_same_config_runs_nothing_even_after_touch(tiny):
    project, _ = tiny
    assert planned_jobs(project, "promotion") == []
    now = time.time() + 5
    for path in project.rglob("*"):
        if path.is_file() and ".snakemake" not in path.parts:
            os.utime(path, (now, now))
    assert planned_jobs(project, "promotion") == []


def test_a_moved_project_reruns_nothing(tiny, tmp_path):
    """A finished audit copied elsewhere (times kept, Snakemake's records with it) is up to date there: no rule
    holds a path of the project's own location in what Snakemake compares between runs."""
    project, _ = tiny
    moved = tmp_path / "elsewhere" / "project"
    shutil.copytree(project, moved, symlinks=True)
    assert planned_jobs(moved, "promotion") == []


def test_disabled_gates_leave_their_stages_out_and_only_redecide(tiny, tmp_path):
    project, config = tiny
    changed = json.loads(json.dumps(config))
    changed["boundary"]["enabled"] = False
    changed["speed"]["enabled"] = False
    cfg = tmp_path / "disabled.yaml"
    cfg.write_text(yaml.safe_dump(changed, sort_keys=False))
    # The gates drop out of the decision's inputs (it will list them as not evaluated); the boundary
    # cases were part of each arm's answers phase, so the phases rerun -- their journals supply every
    # answer -- and nothing per dataset and no speed bracket is redone; the diagnostics, which read what
    # the phases journaled and start no server, follow the phases.
    jobs = planned_jobs(project, "promotion", "--configfile", str(cfg))
    assert sorted((rule, sorted(wc.items())) for rule, wc in jobs) == [
        ("answers", [("arm", "candidate")]), ("answers", [("arm", "control")]), ("diagnostics", []),
        ("promotion", [])]


def test_changing_one_dataset_reruns_only_that_dataset(tiny, tmp_path):
    project, config = tiny
    changed = json.loads(json.dumps(config))
    changed["datasets"][1]["select"]["seed"] = 99
    cfg = tmp_path / "changed.yaml"
    cfg.write_text(yaml.safe_dump(changed, sort_keys=False))
    jobs = planned_jobs(project, "promotion", "--configfile", str(cfg))
    rules = sorted(r for r, _ in jobs)
    # one start per arm for the answers (the journals supply the other dataset's answers),
    # one diagnostics phase, and only this dataset's assembly, scoring and pairing
    assert rules == sorted(["dataset", "requests", "requests", "answers", "answers", "sampled", "sampled", "score",
                            "score", "paired", "diagnostics", "promotion"])
    assert all(w.get("dataset", "algebra") == "algebra" for _, w in jobs)


def test_readme_one_liner_reruns_one_dataset(tiny):
    project, _ = tiny
    readme = (REPO / "README.md").read_text()
    assert "promotion --forcerun results/default/datasets/arith.json" in readme
    jobs = planned_jobs(project, "promotion", "--forcerun", "results/tiny/datasets/arith.json")
    assert sorted(r for r, _ in jobs) == sorted(["dataset", "requests", "requests", "answers", "answers", "sampled",
                                                 "sampled", "score", "score", "paired", "diagnostics", "promotion"])
    assert all(w.get("dataset", "arith") == "arith" for _, w in jobs)


def test_changing_the_candidate_reuses_the_control(tiny, tmp_path):
    project, config = tiny
    changed = json.loads(json.dumps(config))
    changed["arms"]["candidate"]["env"]["PAIRAUDIT_REF_LM_HEAD_BF16"] = "1"
    cfg = tmp_path / "changed.yaml"
    cfg.write_text(yaml.safe_dump(changed, sort_keys=False))
    jobs = planned_jobs(project, "promotion", "--configfile", str(cfg))
    assert jobs, "a changed candidate must rerun something"
    # the control's server, rehearsal, answers and scores are reused; the diagnostics phase
    # reruns (its selection depends on the pairing) but its journals keep every generation made
    assert all(w.get("arm") != "control" for _, w in jobs)
    assert ("answers", {"arm": "candidate"}) in jobs and ("speed", {}) in jobs and ("boundary_gate", {}) in jobs
    assert sorted(r for r, _ in jobs if r == "sampled") == ["sampled", "sampled"]


def test_the_greedy_selection_reruns_the_diagnostics_alone_and_the_greedy_runs_the_answers_phases(tiny, tmp_path):
    project, config = tiny
    changed = json.loads(json.dumps(config))
    changed["greedy"]["concordant"] = 2
    cfg = tmp_path / "selection.yaml"
    cfg.write_text(yaml.safe_dump(changed, sort_keys=False))
    # which items are compared is the diagnostics' alone: no server starts, every greedy run is journaled
    assert sorted(r for r, _ in planned_jobs(project, "promotion", "--configfile", str(cfg))) == [
        "diagnostics", "promotion"]
    changed["greedy"]["max_tokens"] = 16
    cfg.write_text(yaml.safe_dump(changed, sort_keys=False))
    # what the greedy runs are asked with is the answers phases': one start per arm, and what reads the runs
    assert sorted(r for r, _ in planned_jobs(project, "promotion", "--configfile", str(cfg))) == [
        "answers", "answers", "diagnostics", "promotion"]


def test_bad_config_key_fails_naming_it(tmp_path):
    config = yaml.safe_load(TINY.read_text())
    config["sampling"]["temprature"] = 0.5
    project = make_project(tmp_path / "p", config)
    proc = snake(project, "-n", "promotion", check=False)
    assert proc.returncode != 0
    assert "temprature" in proc.stdout + proc.stderr


def test_bad_config_value_names_key_and_allowed_values(tmp_path):
    config = yaml.safe_load(TINY.read_text())
    config["datasets"][0]["format"] = "gsm9k"
    project = make_project(tmp_path / "p", config)
    proc = snake(project, "-n", "promotion", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "gsm9k" in text and "format" in text and "gsm8k" in text and "humaneval" in text


def _start_and_wait_for_answers(project: Path, target: str, journal: Path, *, new_session=True) -> subprocess.Popen:
    proc = subprocess.Popen([SNAKEMAKE, "--cores", "2", target], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=new_session)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and any(r["status"] == 200 for r in read_jsonl(journal)):
            return proc
        time.sleep(0.05)
    raise AssertionError("the run finished before it could be killed; make the dataset larger")


def _answers(journal: Path) -> list[dict]:
    return [r for r in read_jsonl(journal) if r["status"] == 200]


def _check_resumed(project: Path, journal: Path, output: Path, answered_before: dict, n: int) -> None:
    after = read_jsonl(journal)
    final = read_jsonl(output)[1:]
    assert sorted(r["index"] for r in final) == sorted({r["index"] for r in after})
    assert len(final) == n
    for r in final:  # every answer from before the crash is the one kept, not asked again
        if r["index"] in answered_before:
            assert r["response"]["id"] == answered_before[r["index"]]["response"]["id"]
            assert r["attempt"] == answered_before[r["index"]]["attempt"]
    assert sum(1 for r in after if r["status"] == 200) == n  # nothing answered twice
    assert refserver_pids(project) == []


def _job_pids(project: Path) -> list[int]:
    """Job scripts still running for ``project`` (their working directory is inside it)."""
    out = subprocess.run(["pgrep", "-f", ".snakemake/scripts"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if _cwd(int(p)).startswith(str(project))]


def _wait_gone(project: Path, timeout_s: float = 30) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and (refserver_pids(project) or _job_pids(project)):
        time.sleep(0.2)
    assert refserver_pids(project) == [], "a server outlived its snakemake"
    assert _job_pids(project) == [], "a job outlived its snakemake"


def answers_only_config(audit: str, count: int) -> dict:
    """The tiny audit cut to ``count`` items of its first dataset, without the boundary and speed stages."""
    config = yaml.safe_load(TINY.read_text())
    config["audit"] = audit
    config["datasets"] = [config["datasets"][0]]
    config["datasets"][0]["select"] = {"count": count, "seed": 5}
    config["boundary"]["enabled"] = False
    config["speed"]["enabled"] = False
    return config


@pytest.fixture
def resume_project(tmp_path):
    return make_project(tmp_path / "p", answers_only_config("resume", 4))


def test_resume_after_server_dies_and_after_the_job_is_killed(resume_project):
    project = resume_project
    res = project / "results" / "resume"

    # 1. the server dies mid-phase: evidence, not a crash -- the phase records the failure with the
    # server's log tail and a confirmation on a fresh start; after the cause is gone, rerunning the
    # phase resumes from the journal
    journal = res / "journal" / "sampled" / "arith" / "control.jsonl"
    target = "results/resume/sampled/arith/control.jsonl"
    proc = _start_and_wait_for_answers(project, target, journal)
    for pid in refserver_pids(project):
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=600)
    assert proc.returncode == 0
    failure = json.loads((res / "answers" / "control.json").read_text())["failure"]
    assert failure["kind"] == "dead" and failure["stage"] == "sampled" and failure["log_tail"].strip()
    assert failure["confirmation"]["kind"] == "answered"  # a fresh start answers: the kill was not the server's
    assert json.loads((project / target).read_text().splitlines()[0])["arm_failed"]
    before = {r["index"]: r for r in _answers(journal)}
    assert 1 <= len(before) < 4
    snake(project, target, "--forcerun", "results/resume/answers/control.json")  # the target first: --forcerun takes a list
    _check_resumed(project, journal, project / target, before, 4)
    assert json.loads((res / "answers" / "control.json").read_text())["failure"] is None

    # 2. the whole Snakemake process group is killed (a crash): the same command resumes, nothing lost or redone
    journal = res / "journal" / "sampled" / "arith" / "candidate.jsonl"
    target = "results/resume/sampled/arith/candidate.jsonl"
    proc = _start_and_wait_for_answers(project, target, journal)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    _wait_gone(project)  # a launched server dies with its parent (PR_SET_PDEATHSIG)
    before = {r["index"]: r for r in _answers(journal)}
    assert 1 <= len(before) < 4
    snake(project, target)
    _check_resumed(project, journal, project / target, before, 4)


def test_sigkill_of_snakemake_alone_stops_its_job_and_server_then_the_same_command_resumes(resume_project):
    project = resume_project
    journal = project / "results" / "resume" / "journal" / "sampled" / "arith" / "control.jsonl"
    target = "results/resume/sampled/arith/control.jsonl"
    proc = _start_and_wait_for_answers(project, target, journal)
    proc.kill()  # snakemake alone: its job and that job's server are orphans now
    proc.communicate()
    _wait_gone(project)
    before = {r["index"]: r for r in _answers(journal)}
    assert 1 <= len(before) < 4
    snake(project, target)   # the same command: no --unlock, no --rerun-incomplete (docs/reruns.md)
    _check_resumed(project, journal, project / target, before, 4)
    # one writer at a time: every item's attempts are numbered 1, 2, ... in journal order, never twice
    by_index = {}
    for r in read_jsonl(journal):
        by_index.setdefault(r["index"], []).append(r["attempt"])
    assert all(a == list(range(1, len(a) + 1)) for a in by_index.values()), by_index


def test_sigint_stops_the_phase_within_seconds_and_sends_nothing_new(resume_project):
    project = resume_project
    journal = project / "results" / "resume" / "journal" / "sampled" / "arith" / "control.jsonl"
    proc = _start_and_wait_for_answers(project, "results/resume/sampled/arith/control.jsonl", journal)
    at_interrupt = len(_answers(journal))
    t0 = time.time()
    proc.send_signal(signal.SIGINT)  # snakemake alone, as `kill -INT` would
    proc.communicate(timeout=120)
    _wait_gone(project)
    assert time.time() - t0 < 60
    # concurrency 1: at most the one request already in flight may still be answered
    assert len(_answers(journal)) <= at_interrupt + 1 < 4


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def test_a_candidate_whose_engine_dies_is_rejected_with_the_evidence_not_a_traceback(tmp_path):
    """The candidate's server dies on a seeded sampled request the control answers: REJECT, snakemake exits 0."""
    config = answers_only_config("dies", 1)
    fake = str(REPO / "tests" / "fake_server.py")
    config["arms"]["candidate"] = {
        "mode": "launch", "model": "fake-model", "max_model_len": 256, "health_timeout_s": 60,
        "env": {"PAIRAUDIT_REF_LM_HEAD_BF16": "0"},
        "command": ["{python}", fake, "--host", "{host}", "--port", "{port}", "--model", "{model}",
                    "--max-model-len", "{max_model_len}", "--switches-from-env", "--fault", "chat500_dies"]}
    config["arms"]["control"] = {**config["arms"]["candidate"], "command": config["arms"]["candidate"]["command"][:-2]}
    project = make_project(tmp_path / "p", config)
    proc = snake(project, "promotion")
    assert "Traceback" not in proc.stdout + proc.stderr
    res = project / "results" / "dies"
    decision = json.loads((res / "promotion" / "decision.json").read_text())
    assert decision["decision"] == "REJECT"
    gate = decision["gates"]["servers"]
    assert gate["verdict"] == "FAIL" and "HTTP 500" in gate["reasons"][0] and "fresh start" in gate["reasons"][0]
    phase = json.loads((res / "answers" / "candidate.json").read_text())
    assert phase["failure"]["stage"] == "preflight" and phase["failure"]["confirmation"]["kind"] in ("server_error",
                                                                                                    "dead")
    assert "index out of bounds" in json.dumps(phase["failure"]["error_body"])
    assert refserver_pids(project) == []


def test_your_own_qa_and_multiple_choice_sets_run_through_the_tiny_audit(tmp_path):
    """A team's own regression sets (qa, multiple_choice) go through the real DAG to their paired tables."""
    config = yaml.safe_load(TINY.read_text())
    config["datasets"] = [
        {"name": "facts", "format": "qa", "source": {"local": "tests/data/qa_facts.jsonl"},
         "select": {"count": 3, "seed": 1}, "prompt_template": "default", "extract": {"method": "exact"}},
        {"name": "choices", "format": "multiple_choice", "source": {"local": "tests/data/mc_facts.jsonl"},
         "select": {"count": 3, "seed": 2}, "prompt_template": "default"},
    ]
    config["boundary"] = {**config.get("boundary", {}), "enabled": False}
    config["speed"] = {**config.get("speed", {}), "enabled": False}
    project = make_project(tmp_path / "own", config)
    (project / "tests" / "data").mkdir(parents=True)
    for name in ("qa_facts.jsonl", "mc_facts.jsonl"):
        shutil.copy2(REPO / "tests" / "data" / name, project / "tests" / "data" / name)
    snake(project, "results/tiny/paired/facts.json", "results/tiny/paired/choices.json")
    for name, fmt in (("facts", "qa"), ("choices", "multiple_choice")):
        paired = json.loads((project / f"results/tiny/paired/{name}.json").read_text())
        assert paired["table"]["n"] == 3 and paired["quality"]["rule"] == "quality-v2"
        for arm in ("control", "candidate"):
            lines = read_jsonl(project / f"results/tiny/scores/{name}/{arm}.jsonl")
            header, scores = lines[0], [r for r in lines if r.get("kind") == "record"]
            assert header["dataset"] == name and len(scores) == 3, (header, scores)
            # judged by the format's own reading (no code runs), right or wrong with the reason kept
            assert all(isinstance(s["correct"], bool) and "extracted" in s for s in scores), (fmt, scores)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wait_for(proc: subprocess.Popen, what: str, ready, timeout_s: float = 900) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if ready():
            return
        time.sleep(0.05)
    out = proc.stdout.read() if proc.poll() is not None and proc.stdout else ""
    raise AssertionError(f"snakemake ended (or took too long) before {what}:\n{out[-4000:]}")


def _readies(starts: Path, phase: str) -> int:
    return sum(1 for r in read_jsonl(starts) if r.get("event") == "ready" and r.get("phase") == phase) \
        if starts.exists() else 0


def _finished_outputs(project: Path, res: Path) -> dict[Path, str]:
    """sha256 of every stage output under ``res`` whose job has finished (Snakemake marks none of it incomplete)."""
    import base64

    marked = set()
    inc = project / ".snakemake" / "incomplete"
    for f in inc.rglob("*") if inc.is_dir() else []:
        if f.is_file() and f.name != "migration_underway":
            b64 = "".join(part.lstrip("@") for part in f.relative_to(inc).parts)
            marked.add(base64.urlsafe_b64decode(b64.encode()).decode())
    out = {}
    for sub in ("answers", "sampled", "scores", "paired", "greedy", "divergence", "speed"):
        for p in (res / sub).rglob("*") if (res / sub).is_dir() else []:
            if p.is_file() and str(p.relative_to(project)) not in marked:
                out[p] = _sha(p)
    return out


def test_a_crash_at_any_phase_resumes_with_the_same_command(tmp_path):
    """kill -9 of snakemake (answers), of a job (the speed bracket's, the only later phase with a server) and of
    snakemake again (in the bracket's rerun): each time `snakemake --cores 2 promotion` resumes.

    Nothing is answered twice, no finished job reruns, every killed start's log is kept and its start record
    ends (``stopped``, or ``lost`` for a start whose job was killed under it).
    """
    config = answers_only_config("crash", 4)
    config["speed"]["enabled"] = True
    project = make_project(tmp_path / "p", config)
    res = project / "results" / "crash"
    starts = res / "servers" / "starts.jsonl"
    journal = res / "journal" / "sampled" / "arith" / "control.jsonl"
    command = [SNAKEMAKE, "--cores", "2", "promotion"]

    def start() -> subprocess.Popen:
        return subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    # 1. answers: snakemake alone is killed; its lock and the phase's incomplete outputs stay behind
    proc = start()
    _wait_for(proc, "the first answer", lambda: journal.exists() and any(r["status"] == 200
                                                                       for r in read_jsonl(journal)))
    proc.kill()
    proc.communicate()
    _wait_gone(project)
    assert list((project / ".snakemake" / "locks").glob("*.lock")), "a killed snakemake leaves its lock"
    answered_before = {r["index"]: r for r in _answers(journal)}

    # 2. the same command resumes; the speed job is killed once its server is up (the server dies with it)
    proc = start()
    _wait_for(proc, "the speed phase", lambda: _readies(starts, "speed"))
    job_killed = "speed"
    finished = _finished_outputs(project, res)
    assert {p.name for p in finished} >= {"control.json", "candidate.json"}   # the answers phases, at least
    jobs = [pid for pid in _job_pids(project) if f".{job_killed}.py" in " ".join(lifecycle_argv(pid))]
    assert len(jobs) == 1, jobs
    os.kill(jobs[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert "cleared the lock of snakemake pid" in out and "no longer runs" in out, out[-3000:]
    _wait_gone(project)

    # 3. the same command again; in the bracket's rerun snakemake alone is killed
    other = "speed"
    before = _readies(starts, other)
    proc = start()
    _wait_for(proc, f"the {other} phase", lambda: _readies(starts, other) > before)
    finished.update(_finished_outputs(project, res))
    proc.kill()
    proc.communicate()
    _wait_gone(project)

    # 4. and once more, to the end
    done = snake(project, "promotion")
    assert "cleared the lock of snakemake pid" in done.stderr + done.stdout
    assert json.loads((res / "promotion" / "decision.json").read_text())["decision"] == "INCONCLUSIVE"
    changed = sorted(str(p.relative_to(res)) for p, h in finished.items() if not p.exists() or _sha(p) != h)
    assert changed == [], f"finished jobs reran: {changed}"
    _check_resumed(project, journal, res / "sampled" / "arith" / "control.jsonl", answered_before, 4)
    for arm_journal in res.glob("journal/sampled/*/*.jsonl"):
        indices = [r["index"] for r in _answers(arm_journal)]
        assert sorted(indices) == sorted(set(indices)), f"{arm_journal}: an item answered twice"
    # every start ends: stopped, or lost when its job was killed under it; a killed start's log is kept aside
    events = read_jsonl(starts)
    ends = {(r["phase"], r["arm"], r["pid"]) for r in events if r["event"] in ("stopped", "lost")}
    assert [r for r in events if r["event"] == "ready" and (r["phase"], r["arm"], r["pid"]) not in ends] == []
    lost = [r for r in events if r["event"] == "lost"]
    assert any(r["phase"] == job_killed for r in lost), lost
    assert all("no longer runs" in r["why"] and Path(project, r["log_path"]).is_file() for r in lost), lost
    logs = res / "logs" / "servers"
    killed_log = "speed-s1-control"
    for name in ("answers-control", killed_log):
        kept, current = logs / f"{name}.1.log", logs / f"{name}.log"
        assert kept.is_file() and current.is_file(), sorted(p.name for p in logs.iterdir())
        assert "=== pairaudit launch" in kept.read_text() and "=== pairaudit launch" in current.read_text()
    assert not list((project / ".snakemake" / "locks").glob("*.lock"))


def lifecycle_argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a for a in raw.decode(errors="replace").split("\0") if a]
