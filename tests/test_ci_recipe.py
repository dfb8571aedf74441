"""The CI recipe of docs/interop.md decides on a fresh runner: its steps, as the page writes them, run here.

The workflow block under "CI: the audit as a GitHub Actions job" is read from the page and its ``run:``
steps are executed in order, as GitHub's runner would (``bash -eo pipefail``; after a failed step only the
steps marked ``if: always()``), in a fresh copy of the project with no ``results/``. Stood in for: the
install step (this test's venv is the install: ``.venv`` is linked into the copy), the ``uses:`` steps
(checkout, Python, the artifact upload), the job's one expression, ``CLAIMS_SPEED``, false as for a pull
request without the ``claims-speed`` label, and the runner's ``GITHUB_STEP_SUMMARY`` and ``RUNNER_TEMP``. The embedded default is shrunk (four items per suite, one
short speed cell, one retrieval case at a 1024-token context, a quality margin of 99 points) so that the
audit runs in minutes; everything else is the default as shipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pairaudit.cli.codes import EXIT

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "interop.md"

pytestmark = pytest.mark.workflow


def recipe() -> dict:
    text = PAGE.read_text()
    section = text[text.index("## CI: the audit as a GitHub Actions job"):]
    block = re.search(r"```yaml\n(# \.github/workflows/.*?)```", section, re.S)
    assert block, "docs/interop.md: no workflow block in the CI section"
    return yaml.safe_load(block.group(1))


def test_the_recipes_path_filter_matches_files_of_this_project():
    doc = recipe()
    on = doc.get("on", doc.get(True))   # YAML 1.1 reads the bare key `on` as true
    for pattern in on["pull_request"]["paths"]:
        # GitHub's `dir/**` is every file below dir; pathlib's `**` alone matches directories
        files = [p for p in REPO.glob(re.sub(r"\*\*$", "**/*", pattern)) if p.is_file()]
        assert files, f"{pattern} matches no file of the project"


def shrunk_default() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["server"]["command"] = [*config["server"]["command"], "--threads", "1"]   # tests/refserver_fixture.py
    config["server"]["max_model_len"] = 1024
    for entry in config["datasets"]:
        entry["select"] = {"count": 4, "seed": entry["select"]["seed"]}
    config["rules"]["quality"]["margin_pct"] = 99.0   # four items rule out only a near-total loss
    config["speed"].update(cells=[{"name": "short-c1", "prompt": "short", "input_len": 16, "concurrency": 1,
                                   "decide": True}], repeats=2, waves=1, output_len=8)
    config["boundary"]["fractions"] = [0.25]
    return config


def run_recipe(tmp_path: Path, *, claims_speed: bool) -> tuple[Path, dict[str, int], Path]:
    """The recipe's steps in a fresh copy of the project: (the project, each step's exit code, the summary)."""
    from test_workflow import make_project

    assert (REPO / ".venv" / "bin" / "snakemake").exists(), "the recipe's steps run .venv/bin/...: ./install.sh first"
    project = make_project(tmp_path / "runner", shrunk_default())
    (project / ".venv").symlink_to(REPO / ".venv")
    assert not (project / "results").exists()
    job = recipe()["jobs"]["audit"]
    assert set(job.get("env", {})) == {"CLAIMS_SPEED"}, "a job expression this test does not stand in for"
    summary = tmp_path / "step-summary.md"
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    env = {**os.environ, "CLAIMS_SPEED": "true" if claims_speed else "false", "GITHUB_STEP_SUMMARY": str(summary),
           "RUNNER_TEMP": str(runner_temp), "CI": "true"}
    codes: dict[str, int] = {}
    failed = False
    for step in job["steps"]:
        name = step.get("name", step.get("uses", ""))
        if "uses" in step or step["run"].startswith("./install.sh"):
            continue
        if failed and step.get("if") != "always()":
            continue
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=project,
                              env=env, capture_output=True, text=True, timeout=3600)
        codes[name] = proc.returncode
        failed = failed or proc.returncode != 0
        if name == "Run the audit":
            assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return project, codes, summary


def test_the_recipe_decides_on_a_fresh_runner(tmp_path):
    project, codes, summary = run_recipe(tmp_path, claims_speed=False)
    decision = json.loads((project / "results" / "default" / "promotion" / "decision.json").read_text())
    assert codes["Decision"] == EXIT[decision["decision"]]
    assert decision["decision"] in ("PROMOTE", "HOLD", "REJECT"), (decision["decision"], decision["reasons"])
    assert any(d["gate"] == "speed" and d["what"] == "informational" for d in decision["deviations"])
    assert decision["decision"] in summary.read_text()
    assert (project / "results" / "default" / "exports" / "lm-eval").is_dir()   # the export step ran


def test_a_change_that_claims_speed_is_audited_after_calibrating_the_runner(tmp_path):
    # the other branch: the runner calibrated first, so the bracket reads this runner's own noise; whether the
    # bracket then decides depends on the runner's noise, so only what the branch runs is asserted here
    project, codes, _ = run_recipe(tmp_path, claims_speed=True)
    decision = json.loads((project / "results" / "default" / "promotion" / "decision.json").read_text())
    assert codes["Decision"] == EXIT[decision["decision"]]
    assert (project / "results" / "default-calibration" / "promotion" / "decision.json").is_file()
    assert decision["calibration_ref"] is not None, "the audit does not cite the runner's calibration"
    assert not any(d["gate"] == "speed" and d["what"] == "informational" for d in decision["deviations"])
    speed = json.loads((project / "results" / "default" / "speed" / "decision.json").read_text())
    assert speed["gate"]["verdict"] in ("WIN", "NO_WIN", "LOSS", "INCONCLUSIVE")
    assert speed["gate"]["noise"]["evidence_windows"] >= 1   # the calibration's control starts were its evidence
