"""An artifact edited after it was written is refused by every stage that reads it, naming the file.

Each producer records its output's content sha256 (pairaudit.core.artifacts); each
consumer recomputes it before using the file.  The stages that start a server
get an arm whose command cannot start one: reaching the server would fail
with a ServerError, so an ArtifactError proves the edit was caught first.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pairaudit import configcheck
from pairaudit.answers import stage as answers_stage
from pairaudit.answers.sampled import Journal
from pairaudit.boundary import cases as boundary_cases
from pairaudit.boundary import stage as boundary_stage
from pairaudit.core import artifacts, contracts, defaults
from pairaudit.core.settings import QualitySettings, SamplingSettings
from pairaudit.core.artifacts import ArtifactError
from pairaudit.core.settings import BoundarySettings, GreedySettings
from pairaudit.diagnostics import stage as diagnostics_stage
from pairaudit.plans import stage as plan_stage
from pairaudit.plans.requests import body_sha256
from pairaudit.promotion import stage as report
from pairaudit.quality import stage as quality_stage
from pairaudit.serving import armspec
from pairaudit.serving.launch import ServerError
from pairaudit.speed import bracket
from pairaudit.speed import stage as speed_stage

ROOT = Path(__file__).resolve().parents[1]
# a launch arm that never becomes a server: its process exits at once
DEAD_ARM = {"mode": "launch", "model": "m", "max_model_len": 256, "health_timeout_s": 20,
            "command": ["{python}", "-c", "import sys; sys.exit(7)", "{port}"]}
SAMPLING = {"api": "chat", "base_seed": 1, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0,
            "max_tokens": 8, "concurrency": 1}
ARMS = ("control", "candidate")


def hand_edit(path: Path) -> None:
    """Change the content as an editor would, leaving the recorded self-hash as it was."""
    if path.suffix == ".jsonl":
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        (lines[1] if len(lines) > 1 else lines[0])["edited_by_hand"] = True
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    else:
        doc = json.loads(path.read_text())
        doc["edited_by_hand"] = True
        path.write_text(json.dumps(doc, indent=1) + "\n")


def write_inputs(root: Path) -> dict[str, Path]:
    """One minimal, validly written artifact per kind a consumer reads."""
    p = {name: root / rel for name, rel in {
        "dataset": "datasets/ds.json", "spec_control": "specs/control.json", "spec_candidate": "specs/candidate.json",
        "requests_control": "requests/ds/control.json", "boundary_plan": "boundary/plan.json",
        "launch_control": "launch/control.json",
        "launch_candidate": "launch/candidate.json", "preflight_control": "preflight/control.json",
        "preflight_candidate": "preflight/candidate.json", "answers_control": "answers/control.json",
        "answers_candidate": "answers/candidate.json",
        "sampled_control": "sampled/ds/control.jsonl",
        "sampled_candidate": "sampled/ds/candidate.jsonl", "scores_control": "scores/ds/control.jsonl",
        "scores_candidate": "scores/ds/candidate.jsonl", "paired": "paired/ds.json",
        "greedy_control": "greedy/ds/control.jsonl", "greedy_candidate": "greedy/ds/candidate.jsonl",
        "divergence": "divergence/ds.json", "boundary_control": "boundary/control.json",
        "boundary_candidate": "boundary/candidate.json", "boundary_gate": "boundary/gate.json",
        "speed": "speed/decision.json"}.items()}
    item = {"index": 0, "id": "0", "format": "gsm8k", "question": "1 + 1?",
            "reference": {"answer": "2", "solution": "#### 2"}, "messages": [{"role": "user", "content": "1 + 1?"}]}
    artifacts.write_json(p["dataset"], {"schema": "pairaudit.dataset/v1", "name": "ds", "format": "gsm8k",
                                        "indices": [0], "items": [item]})
    plan_stage.boundary_plan_stage(boundary=BoundarySettings.from_json(boundary_cases.settings({})),
                                   out_path=str(p["boundary_plan"]))
    for arm in ARMS:
        plan_stage.arm_spec_stage(arm=arm, arm_cfg=DEAD_ARM, out_path=str(p[f"spec_{arm}"]))
        spec = armspec.read_spec(p[f"spec_{arm}"])
        artifacts.write_json(p[f"launch_{arm}"], {"schema": "pairaudit.launch/v1", "arm": arm,
                                                  "mode": "launch", "model": "m",
                                                  "spec_sha256": spec.spec_sha256, "max_model_len": 256})
        artifacts.write_json(p[f"preflight_{arm}"], {"schema": "pairaudit.preflight/v1", "arm": arm,
                                                     "verdict": "PASS", "failed_probe": None, "probes": []})
        artifacts.write_jsonl(p[f"sampled_{arm}"], {"schema": "pairaudit.sampled/v1", "dataset": "ds", "arm": arm},
                              [{"index": 0, "text": "#### 2"}])
        artifacts.write_jsonl(p[f"scores_{arm}"], {"schema": "pairaudit.scores/v1", "dataset": "ds", "arm": arm},
                              [{"index": 0, "correct": True}])
        artifacts.write_jsonl(p[f"greedy_{arm}"], {"schema": "pairaudit.greedy/v1", "dataset": "ds", "arm": arm,
                                                   "determinism": {"hashes": ["h", "h"]}},
                              [{"index": 0, "prompt_ids": [1], "output_sha256": "h"}])
        artifacts.write_json(p[f"boundary_{arm}"], {"schema": contracts.BOUNDARY_SCHEMA, "arm": arm, "max_model_len": 256,
                                                    "cases": [], "first_long": None})
    plan_stage.requests_stage(dataset_path=str(p["dataset"]), spec_path=str(p["spec_control"]), sampling=SAMPLING,
                              audit="t", out_path=str(p["requests_control"]))
    for arm in ARMS:
        artifacts.write_json(p[f"answers_{arm}"], {"schema": contracts.PHASE_SCHEMA, "phase": "answers", "arm": arm,
                                                   "failure": None})
    # the answers phase's journal (not an artifact): the item answered, so the assembly has it
    body = artifacts.read_json(p["requests_control"])["items"][0]["body"]
    with Journal(journal_of(p)) as j:
        j.append({"index": 0, "attempt": 1, "body_sha256": body_sha256(body), "body": body, "status": 200,
                  "response": {"choices": [{"message": {"content": "#### 2"}, "finish_reason": "stop"}]},
                  "error": None, "finish_reason": "stop", "usage": None, "timings": {}, "server": {}})
    artifacts.write_json(p["paired"], {"schema": "pairaudit.paired/v1", "dataset": "ds", "format": "gsm8k",
                                       "table": {"indices": [0], "control_only": [], "candidate_only": []}})
    artifacts.write_json(p["divergence"], {"schema": "pairaudit.divergence/v1", "dataset": "ds"})
    artifacts.write_json(p["boundary_gate"], {"schema": "pairaudit.boundary_gate/v1", "gate": None})
    artifacts.write_json(p["speed"], {"schema": "pairaudit.speed_decision/v1", "gate": None})
    return p


def journal_of(p: dict[str, Path]) -> Path:
    return p["dataset"].parents[1] / "journal" / "sampled" / "ds" / "control.jsonl"


def _specs(p):
    return {a: str(p[f"spec_{a}"]) for a in ARMS}


# stage -> (call with the artifact paths and an output dir, the inputs it reads)
CONSUMERS = {
    "requests": (lambda p, o: plan_stage.requests_stage(
        dataset_path=str(p["dataset"]), spec_path=str(p["spec_control"]), sampling=SAMPLING, audit="t",
        out_path=str(o / "r.json")),
        ["dataset", "spec_control"]),
    "answers": (lambda p, o: answers_stage.answers_phase(
        arm="control", spec_path=str(p["spec_control"]), requests_paths={"ds": str(p["requests_control"])},
        sampling=SamplingSettings.from_json(defaults.filled({"api": "chat", **SAMPLING}, "sampling")), audit="t", boundary_plan_path=str(p["boundary_plan"]),
        journal_dir=str(o / "journal"),
        receipt_path=str(o / "launch.json"), preflight_path=str(o / "preflight.json"), phase_path=str(o / "phase.json"),
        boundary_path=str(o / "boundary.json"), server_log=str(o / "s.log"), starts_log=str(o / "starts.jsonl")),
        ["spec_control", "requests_control", "boundary_plan"]),
    "sampled": (lambda p, o: answers_stage.assemble(
        dataset_path=str(p["dataset"]), requests_path=str(p["requests_control"]), journal_path=str(journal_of(p)),
        out_path=str(o / "s.jsonl"), receipt_path=str(p["launch_control"]), preflight_path=str(p["preflight_control"]),
        phase_path=str(p["answers_control"])),
        ["dataset", "requests_control", "launch_control", "preflight_control", "answers_control"]),
    "score": (lambda p, o: quality_stage.score_stage(
        dataset_path=str(p["dataset"]), sampled_path=str(p["sampled_control"]), out_path=str(o / "sc.jsonl"),
        sandbox_limits={}),
        ["dataset", "sampled_control"]),
    "paired": (lambda p, o: quality_stage.paired_stage(
        dataset_path=str(p["dataset"]),
        sampled_paths={a: str(p[f"sampled_{a}"]) for a in ARMS},
        score_paths={a: str(p[f"scores_{a}"]) for a in ARMS}, out_path=str(o / "p.json"),
        quality=QualitySettings.from_json(defaults.filled({}, "rules", "quality"))),
        ["dataset", "sampled_control", "sampled_candidate", "scores_control", "scores_candidate"]),
    "diagnostics": (lambda p, o: diagnostics_stage.diagnostics_phase(
        dataset_paths={"ds": str(p["dataset"])}, paired_paths={"ds": str(p["paired"])},
        receipt_paths={a: str(p[f"launch_{a}"]) for a in ARMS},
        preflight_paths={a: str(p[f"preflight_{a}"]) for a in ARMS},
        answers_paths={a: str(p[f"answers_{a}"]) for a in ARMS},
        greedy=GreedySettings.from_json(defaults.filled({}, "greedy")), max_divergent=3, chat_template_kwargs={},
        journal_dir=str(p["dataset"].parents[1] / "journal"),
        greedy_paths={"ds": {a: str(o / f"g-{a}.jsonl") for a in ARMS}},
        divergence_paths={"ds": str(o / "d.json")}, phase_path=str(o / "phase.json")),
        ["dataset", "paired", "launch_control", "launch_candidate", "preflight_control", "preflight_candidate",
         "answers_control", "answers_candidate"]),
    "boundary_gate": (lambda p, o: boundary_stage.boundary_gate_stage(
        arm_paths={a: str(p[f"boundary_{a}"]) for a in ARMS},
        launch_paths={a: str(p[f"launch_{a}"]) for a in ARMS}, spec_paths=_specs(p), out_path=str(o / "bg.json")),
        ["boundary_control", "boundary_candidate", "launch_control", "launch_candidate", "spec_control",
         "spec_candidate"]),
    "speed": (lambda p, o: speed_stage.speed_stage(
        launch_paths={a: str(p[f"launch_{a}"]) for a in ARMS},
        preflight_paths={a: str(p[f"preflight_{a}"]) for a in ARMS}, spec_paths=_specs(p),
        speed=bracket.resolve({"cells": [{"name": "c", "prompt": "short"}], "repeats": 2, "waves": 1,
                               "output_len": 4, "repeat_s": None, "max_starts": 3}),
        audit="t", out_path=str(o / "sp.json"), streams_path=str(o / "st.jsonl"),
        archive_path=str(o / "archive.jsonl"), server_logs={s: str(o / f"{s}.log") for s in ("s1", "s2", "s3")}),
        ["launch_control", "launch_candidate", "preflight_control", "preflight_candidate", "spec_control",
         "spec_candidate"]),
    "promotion": (lambda p, o: report.promotion_stage(
        [p["paired"]], [p["launch_control"], p["launch_candidate"]],
        [p["preflight_control"], p["preflight_candidate"]], o / "decision.json", o / "report.md",
        o / "manifest.json", o / "paired.png",
        later={"divergence": [p["divergence"]], "boundary": p["boundary_gate"], "speed": p["speed"]},
        score_paths=[p["scores_control"], p["scores_candidate"]]),
        ["paired", "launch_control", "launch_candidate", "preflight_control", "preflight_candidate", "divergence",
         "boundary_gate", "speed", "scores_control", "scores_candidate"]),
}
CASES = [(stage, name) for stage, (_, names) in CONSUMERS.items() for name in names]


@pytest.mark.parametrize("stage,name", CASES, ids=[f"{s}-{n}" for s, n in CASES])
def test_every_consumer_refuses_an_edited_input_by_name(stage, name, tmp_path):
    paths = write_inputs(tmp_path / "results")
    hand_edit(paths[name])
    call, _ = CONSUMERS[stage]
    with pytest.raises(ArtifactError) as ei:
        call(paths, tmp_path / "out")
    msg = str(ei.value)
    assert str(paths[name]) in msg and "does not match the content_sha256" in msg
    assert "edited after it was written" in msg
    assert not [p for p in (tmp_path / "out").glob("*") if p.suffix in (".json", ".jsonl")]  # nothing written


@pytest.mark.parametrize("stage", [s for s in CONSUMERS if s in ("answers", "speed")])
def test_unedited_inputs_get_as_far_as_the_server(stage, tmp_path):
    """The control case: the same inputs unedited pass every read, so the server start is what fails."""
    paths = write_inputs(tmp_path / "results")
    call, _ = CONSUMERS[stage]
    if stage == "speed":
        # the bracket records a server that does not start as evidence rather than raising
        doc = call(paths, tmp_path / "out")
        assert doc["failure"]["what"] == "s1 server start" and doc["failure"]["kind"] == "dead"
        return
    with pytest.raises(ServerError):
        call(paths, tmp_path / "out")


def test_unedited_diagnostics_inputs_get_as_far_as_the_greedy_journal(tmp_path):
    """The control case of the diagnostics (no server): every read passes; the answers phases' greedy runs are
    what is missing here, and nothing is written without them."""
    paths = write_inputs(tmp_path / "results")
    call, _ = CONSUMERS["diagnostics"]
    with pytest.raises(ArtifactError, match="greedy runs without an answer"):
        call(paths, tmp_path / "out")
    assert not [p for p in (tmp_path / "out").glob("*") if p.suffix in (".json", ".jsonl")]


@pytest.mark.parametrize("stage", ["requests", "sampled", "boundary_gate"])
def test_unedited_inputs_are_used_by_the_stages_without_a_server(stage, tmp_path):
    """The control case of the stages that start no server: unedited, every read passes and the output is written."""
    paths = write_inputs(tmp_path / "results")
    call, _ = CONSUMERS[stage]
    doc = call(paths, tmp_path / "out")
    assert doc["schema"] in (contracts.REQUESTS_SCHEMA, contracts.SAMPLED_SCHEMA, contracts.BOUNDARY_GATE_SCHEMA)
    assert len([p for p in (tmp_path / "out").glob("*") if p.suffix in (".json", ".jsonl")]) == 1


def test_reformatting_or_touching_an_artifact_is_not_an_edit(tmp_path):
    paths = write_inputs(tmp_path / "results")
    doc = json.loads(paths["paired"].read_text())
    paths["paired"].write_text(json.dumps(doc, sort_keys=True))  # other layout, same content
    os.utime(paths["dataset"], (1, 1))  # any mtime
    assert artifacts.read_json(paths["paired"])["dataset"] == "ds"
    assert configcheck.check_results(tmp_path / "results") == []


def test_a_removed_self_hash_is_refused(tmp_path):
    paths = write_inputs(tmp_path / "results")
    doc = json.loads(paths["paired"].read_text())
    del doc["content_sha256"]
    paths["paired"].write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="carries no content_sha256"):
        artifacts.read_json(paths["paired"])


# ---------------------------------------------------------------- the reported case, end to end

def test_a_flipped_score_is_refused_by_paired_promotion_and_the_load_check(tmp_path):
    """`correct` flipped in scores/<ds>/candidate.jsonl after scoring: no consumer trusts it."""
    from test_stages import CONTROL, dataset_doc, record, write_sampled

    res = tmp_path / "results" / "a"
    ds = res / "datasets" / "gsm_hand.json"
    artifacts.write_json(ds, dataset_doc())
    paths = {"sampled": {}, "scores": {}}
    for arm in ("control", "candidate"):
        sp = res / "sampled" / "gsm_hand" / f"{arm}.jsonl"
        write_sampled(sp, arm, [record(i, t) for i, t in sorted(CONTROL.items())], str(ds))
        paths["sampled"][arm] = str(sp)
        paths["scores"][arm] = str(res / "scores" / "gsm_hand" / f"{arm}.jsonl")
        quality_stage.score_stage(dataset_path=str(ds), sampled_path=str(sp), out_path=paths["scores"][arm],
                           sandbox_limits={})
    paired_path = res / "paired" / "gsm_hand.json"
    quality_stage.paired_stage(dataset_path=str(ds), sampled_paths=paths["sampled"], score_paths=paths["scores"],
                        out_path=str(paired_path),
                        quality=QualitySettings.from_json(defaults.filled({"max_net_loss": 0, "alpha": 0.05},
                                                                          "rules", "quality")))
    assert configcheck.check_results(res) == []

    scores = Path(paths["scores"]["candidate"])
    lines = [json.loads(x) for x in scores.read_text().splitlines()]
    lines[1]["correct"] = not lines[1]["correct"]
    scores.write_text("".join(json.dumps(x) + "\n" for x in lines))

    with pytest.raises(ArtifactError, match="does not match") as ei:
        quality_stage.paired_stage(dataset_path=str(ds), sampled_paths=paths["sampled"], score_paths=paths["scores"],
                            out_path=str(tmp_path / "p2.json"),
                            quality=QualitySettings.from_json(defaults.filled({}, "rules", "quality")))
    assert str(scores) in str(ei.value)
    others = write_inputs(tmp_path / "other")
    with pytest.raises(ArtifactError, match="does not match") as ei:
        report.promotion_stage([paired_path], [others["launch_control"], others["launch_candidate"]],
                               [others["preflight_control"], others["preflight_candidate"]],
                               tmp_path / "o" / "decision.json", tmp_path / "o" / "report.md",
                               tmp_path / "o" / "manifest.json", tmp_path / "o" / "paired.png",
                               score_paths=list(paths["scores"].values()))
    assert str(scores) in str(ei.value)
    problems = configcheck.check_results(res)
    assert len(problems) == 1 and str(scores) in problems[0]


def test_the_load_check_skips_journals_logs_and_temp_files(tmp_path):
    res = tmp_path / "results" / "a"
    paths = write_inputs(res)
    for rel in ("journal/sampled/ds/control.jsonl", "logs/servers/x.preflight.json", "paired/.ds.json.tmp1.json"):
        (res / rel).parent.mkdir(parents=True, exist_ok=True)
        (res / rel).write_text('{"not": "an artifact"}\n')
    assert configcheck.check_results(res) == []
    assert len(artifacts.artifact_paths(res)) == len(paths)


@pytest.mark.workflow
def test_snakemake_refuses_an_edited_artifact_at_load_even_with_nothing_to_rerun(tmp_path):
    """The dry run (and so any run) names the edited file before Snakemake decides what to rerun."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ["Snakefile", "rules", "scripts", "config", "profiles", "envs", "pairaudit", "report"]:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, project / name)
    cfg = yaml.safe_load((ROOT / "tests" / "data" / "tiny_config.yaml").read_text())
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    scores = project / "results" / cfg["audit"] / "scores" / "arith" / "candidate.jsonl"
    artifacts.write_jsonl(scores, {"schema": "pairaudit.scores/v1", "dataset": "arith", "arm": "candidate"},
                          [{"index": 0, "correct": True}])
    cmd = [str(Path(sys.executable).with_name("snakemake")), "-n", "promotion"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    hand_edit(scores)
    bad = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert f"results/{cfg['audit']}/scores/arith/candidate.jsonl: content sha256" in out, out[-3000:]


def test_an_edited_report_is_refused_at_load_by_the_manifest(tmp_path):
    from test_report import _write_inputs, launches, passing_pair, preflights
    from test_report_ledger import outputs

    res = tmp_path / "results" / "a"
    ins = _write_inputs(res, passing_pair(), launches(), preflights())
    outs = outputs(res / "promotion")
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs)
    assert configcheck.check_results(res) == []
    md = Path(outs["out_report"])
    md.write_text(md.read_text().replace("INCONCLUSIVE", "PROMOTE"))
    problems = configcheck.check_results(res)
    assert len(problems) == 1 and problems[0].startswith(f"{md}: sha256 ") and "manifest.json" in problems[0]
    # a run interrupted after rewriting decision.json (the manifest not yet rewritten) claims nothing
    artifacts.write_json(outs["out_decision"], {**artifacts.read_json(outs["out_decision"]), "rerun": 1})
    assert configcheck.check_results(res) == []
