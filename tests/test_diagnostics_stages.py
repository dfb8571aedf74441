"""The diagnostics phase (greedy runs, divergence probes) end to end on real reference servers (attach mode).

A BF16-head candidate against the fp32 control: divergences are found, both
arms are probed on the shared prefix and grid-tie-v1 classifies every one; a
candidate with per-request logit noise fails the determinism check.
"""

from __future__ import annotations

import pytest

from pairaudit.core import artifacts
from pairaudit.core.jsonlog import read_log
from pairaudit.datasets import formats as datasets
from pairaudit.diagnostics import stage as diagnostics_stage
from pairaudit.serving import launch

pytestmark = pytest.mark.server
MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"items": "all", "concordant": 0, "seed": 0, "max_tokens": 40, "determinism_repeats": 2}


@pytest.fixture(scope="module")
def servers(shared_server):
    return {"control": shared_server(None, 1024),
            "candidate": shared_server({"PAIRAUDIT_REF_LM_HEAD_BF16": "1"}, 1024),
            "noisy": shared_server({"PAIRAUDIT_REF_FAULT_NOISE": "2.0"}, 1024)}


def _inputs(tmp_path, url_by_arm):
    doc = datasets.prepare_dataset({"name": "algebra", "format": "math",
                                    "source": {"generated": {"kind": "algebra", "n": 30, "seed": 11}},
                                    "select": {"count": 4, "seed": 3}, "prompt_template": "default"},
                                   cache_dir=tmp_path / "cache", base_dir=tmp_path)
    dataset_path = tmp_path / "dataset.json"
    artifacts.write_json(dataset_path, doc)
    table = {"indices": doc["indices"], "control_only": [], "candidate_only": []}
    paired_path = tmp_path / "paired.json"
    artifacts.write_json(paired_path, {"schema": "pairaudit.paired/v1", "dataset": "algebra", "table": table})
    arm_cfgs, launch_paths = {}, {}
    for arm, url in url_by_arm.items():
        arm_cfgs[arm] = {"mode": "attach", "url": url, "model": MODEL, "max_model_len": 1024}
        launch_paths[arm] = str(tmp_path / f"launch-{arm}.json")
        artifacts.write_json(launch_paths[arm], launch.receipt(launch.resolve_spec(arm, arm_cfgs[arm])))
    preflight_path = tmp_path / "preflight.json"
    artifacts.write_json(preflight_path, {"verdict": "PASS"})
    return str(dataset_path), str(paired_path), str(preflight_path), arm_cfgs, launch_paths


def _run(tmp_path, url_by_arm, *, fresh=True):
    dataset_path, paired_path, preflight_path, arm_cfgs, launch_paths = _inputs(tmp_path, url_by_arm)
    greedy_paths = {"algebra": {arm: str(tmp_path / f"greedy-{arm}.jsonl") for arm in arm_cfgs}}
    out = tmp_path / "divergence.json"
    phase = diagnostics_stage.diagnostics_phase(
        dataset_paths={"algebra": dataset_path}, paired_paths={"algebra": paired_path}, receipt_paths=launch_paths,
        preflight_paths={a: preflight_path for a in arm_cfgs}, arm_cfgs=arm_cfgs, greedy_cfg=GREEDY,
        chat_template_kwargs={}, journal_dir=str(tmp_path / "journal"), greedy_paths=greedy_paths,
        divergence_paths={"algebra": str(out)}, server_logs={a: str(tmp_path / f"{a}.log") for a in arm_cfgs},
        starts_log=str(tmp_path / "starts.jsonl"), phase_path=str(tmp_path / "phase.json"))
    doc = artifacts.read_json(out)
    assert doc["schema"] == "pairaudit.divergence/v1"
    # one session per arm turn: control, candidate, and control again only to probe a divergence
    assert [s["arm"] for s in phase["starts"]] == ["control", "candidate", "control"]
    if fresh:
        assert phase["starts"][2]["starts"] == (1 if any(d["diverged"] for d in doc["divergences"]) else 0)
    else:  # everything is in the journals: no server is needed at all
        assert [s["starts"] for s in phase["starts"]] == [0, 0, 0]
    return doc, greedy_paths["algebra"]


def test_bf16_candidate_divergences_are_probed_and_classified(servers, tmp_path):
    doc, greedy_paths = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["candidate"].url})
    diverged = [d for d in doc["divergences"] if d["diverged"]]
    assert diverged, "a BF16 head flips near-tied argmaxes within 4 x 40 greedy tokens"
    assert all(d["prompt_ids_equal"] for d in doc["divergences"])
    # both arms probed on exactly the shared prefix, each with its own fresh salt
    for arm in ("control", "candidate"):
        probes = {p["index"]: p for p in doc["probes"][arm]}
        for d in diverged:
            p = probes[d["index"]]
            assert p["status"] == 200 and len(p["top20"]) == 20
            assert p["body"]["prompt"][-len(d["shared_prefix"]):] == d["shared_prefix"] or not d["shared_prefix"]
    salts = {r["salt"] for arm in greedy_paths for r in artifacts.read_jsonl(greedy_paths[arm])[1]}
    salts |= {p["salt"] for arm in doc["probes"] for p in doc["probes"][arm]}
    assert len(salts) == 2 * 4 + 2 * len(diverged)  # a fresh salt for every generation and probe
    grid = doc["grid_tie"]
    assert grid["verdict"] in ("PASS", "STOP") and len(grid["probes"]) == len(diverged)
    for probe in grid["probes"]:
        assert probe["clauses"]["finite_values"] and probe["clauses"]["equal_prefix_lengths"]
        assert probe["clauses"]["candidate_token_is_top"]  # greedy emits its own argmax
    if len(diverged) > 3:
        assert "at_most_3_divergent" in grid["failed_clauses"]
    assert doc["determinism"]["verdict"] == "PASS"
    # a rerun of the phase asks nothing its journals hold, and starts no server
    journals = {p: len(read_log(p)) for p in (tmp_path / "journal").rglob("*.jsonl")}
    again, _ = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["candidate"].url},
                    fresh=False)
    assert {p: len(read_log(p)) for p in (tmp_path / "journal").rglob("*.jsonl")} == journals
    assert again["divergences"] == doc["divergences"] and again["probes"] == doc["probes"]
    starts = [r for r in read_log(tmp_path / "starts.jsonl") if r["event"] == "ready"]
    assert len(starts) == 2 + 1  # the first run's: control, candidate, control again to probe


def test_noisy_candidate_fails_determinism(servers, tmp_path):
    doc, _ = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["noisy"].url})
    det = doc["determinism"]
    assert det["verdict"] == "STOP" and det["nondeterministic_arms"] == ["candidate"]


def test_identical_arms_find_no_divergence(servers, tmp_path):
    doc, _ = _run(tmp_path, {"control": servers["control"].url, "candidate": servers["control"].url})
    assert not any(d["diverged"] for d in doc["divergences"])
    assert doc["grid_tie"]["verdict"] == "PASS" and doc["probes"] == {"control": [], "candidate": []}
