"""A tiny audit against real vLLM through every stage, and the speed bracket launching real vLLM.

The workflow test attaches to the session's two vLLM servers (float32
control, bfloat16 or float16 candidate: a real precision change), started once by
``vllm_fixture``; the speed test launches vLLM itself, three fresh starts
(control, candidate, control), from arm specs written the way
``config/examples/vllm-cpu.yaml`` writes them. Sizes are the tiny config's:
the plumbing against the real server, in minutes, not a measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_workflow import TINY, make_project, read_jsonl, snake
from vllm_fixture import HALF, MML, MODEL, VLLM_ENV, vllm_python_or_skip

from pairaudit.core import artifacts
from pairaudit.plans import stage as plan_stage
from pairaudit.serving import armspec, launch
from pairaudit.serving.client import Endpoint
from pairaudit.serving.preflight import run_preflight
from pairaudit.speed import bracket as speed_bracket
from pairaudit.speed import stage as speed_stage

pytestmark = [pytest.mark.vllm, pytest.mark.workflow]

REPO = Path(__file__).resolve().parents[1]
GATES = ("quality", "grid_tie", "determinism", "boundary", "speed")  # preflight: checked per arm below


def attach_arm(url: str) -> dict:
    return {"mode": "attach", "url": url, "model": MODEL, "max_model_len": MML, "speculative": False,
            "health_timeout_s": 120}


def vllm_launch_arm(dtype: str) -> dict:
    """A launch arm as in config/examples/vllm-cpu.yaml, at the tests' small context and KV cache."""
    return {"mode": "launch", "model": MODEL, "max_model_len": MML, "speculative": False,
            "health_timeout_s": 900, "stop_grace_s": 30, "env": dict(VLLM_ENV),
            "command": ["{vllm_python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}",
                        "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}",
                        "--max-model-len", "{max_model_len}", "--dtype", dtype, "--enforce-eager",
                        "--max-num-seqs", "4", "--seed", "0"]}


@pytest.fixture(scope="module")
def attach_audit(vllm_pair, tmp_path_factory):
    config = yaml.safe_load(TINY.read_text())
    config["audit"] = "tiny-vllm"
    # Both formats (chat answers scored as GSM8K and as MATH), fewer and shorter answers: the
    # plumbing against the real server, not a measurement.
    config["datasets"][0]["select"]["count"] = 2
    config["datasets"][1]["select"]["count"] = 1
    config["sampling"]["max_tokens"] = 32
    config["greedy"].update(max_tokens=12, concordant=1, determinism_repeats=2)
    config["arms"] = {"control": attach_arm(vllm_pair["fp32"].url), "candidate": attach_arm(vllm_pair["half"].url)}
    project = make_project(tmp_path_factory.mktemp("wf-vllm") / "project", config)
    snake(project, "promotion", timeout=3000)
    return project, config


def test_tiny_audit_against_real_vllm_evaluates_every_gate(attach_audit, vllm_pair):
    project, config = attach_audit
    res = project / "results" / "tiny-vllm"
    decision = json.loads((res / "promotion" / "decision.json").read_text())
    assert decision["not_evaluated"] == [], decision["not_evaluated"]
    assert decision["decision"] in ("PROMOTE", "HOLD", "REJECT", "INCONCLUSIVE")
    for prefix in GATES:
        assert any(name.startswith(prefix) for name in decision["gates"]), (prefix, sorted(decision["gates"]))
    for arm, server in (("control", "fp32"), ("candidate", "half")):
        rec = json.loads((res / "launch" / f"{arm}.json").read_text())
        # what the server itself reported, kept in the receipt
        assert rec["server"]["version"] == "0.32.0"
        assert rec["server"]["model_card"]["root"] and rec["server"]["max_model_len"] == MML
        pre = json.loads((res / "preflight" / f"{arm}.json").read_text())
        assert pre["verdict"] == "PASS", pre["failed_probe"]
        refusal = next(p for p in pre["probes"] if p["name"] == "max_model_len")["facts"]["refusal"]
        assert f"your prompt contains at least {MML + 1} input tokens" in refusal
        assert vllm_pair[server].alive()  # attach mode starts and stops nothing
    for ds in [d["name"] for d in config["datasets"]]:
        for arm in ("control", "candidate"):
            scores = read_jsonl(res / "scores" / ds / f"{arm}.jsonl")[1:]
            assert scores and all("clamped" in s and not s["clamped"] for s in scores)
            assert all(s["answered"] for s in scores)  # content, never null, without a reasoning parser
    # the greedy runs were made in each arm's answers phase (one start each; attach mode: none); grid-tie reads
    # each arm's own top-20 at a divergence from them, which needs one top list per generated token and the
    # served prompt count to be the prompt sent (prefix length = usage.prompt_tokens + k)
    assert not [r for r in read_jsonl(res / "servers" / "starts.jsonl") if r.get("phase") == "diagnostics"]
    for ds in [d["name"] for d in config["datasets"]]:
        div = json.loads((res / "divergence" / f"{ds}.json").read_text())
        assert div["top_lists"]["source"] == "greedy"
        for arm in ("control", "candidate"):
            for r in read_jsonl(res / "greedy" / ds / f"{arm}.jsonl")[1:]:
                assert r["error"] is None and len(r["top20"]) == len(r["token_ids"]) > 0
                assert r["usage"]["prompt_tokens"] == len(r["prompt_ids"])
        for arm in ("control", "candidate"):
            for top in div["probes"][arm]:
                assert top["source"] == "greedy"
                assert top["error"] is not None or len(top["top20"]) == 20
    gate = json.loads((res / "boundary" / "gate.json").read_text())
    for row in gate["cases"]:
        for arm in ("control", "candidate"):
            side = row[arm]
            assert side["status"] == 200 and side["clamped"] is False and side["config_error"] is None
    # salts the boundary stage sent are within vLLM's limits
    for arm in ("control", "candidate"):
        doc = json.loads((res / "boundary" / f"{arm}.json").read_text())
        assert all(len(c["request"]["cache_salt"]) <= 128 for c in doc["cases"])


def test_speed_bracket_launches_real_vllm_three_times(vllm_pair, tmp_path):
    vllm_python_or_skip()
    arm_cfgs = {"control": vllm_launch_arm("float32"), "candidate": vllm_launch_arm(HALF)}
    launch_paths, preflight_paths, spec_paths = {}, {}, {}
    for arm, server in (("control", "fp32"), ("candidate", "half")):
        spec_paths[arm] = str(tmp_path / f"specs/{arm}.json")
        plan_stage.arm_spec_stage(arm=arm, arm_cfg=arm_cfgs[arm], out_path=spec_paths[arm])
        spec = armspec.read_spec(spec_paths[arm], arm=arm)
        rec = launch.receipt(spec)
        assert rec["server_packages"]["vllm-cpu"] == "0.32.0" and rec["server_packages"]["vllm"] is None
        launch_paths[arm] = str(tmp_path / f"launch-{arm}.json")
        artifacts.write_json(launch_paths[arm], rec)
        # the preflight of this spec, run on the session's server started with the same arguments
        pf = run_preflight(Endpoint(vllm_pair[server].url, model=MODEL, timeout_s=300), spec)
        assert pf["verdict"] == "PASS", pf["failed_probe"]
        preflight_paths[arm] = str(tmp_path / f"preflight-{arm}.json")
        artifacts.write_json(preflight_paths[arm], pf)
    cfg = {"cells": [{"name": "short-c1", "prompt": "short", "input_len": 16, "concurrency": 1, "decide": True}],
           "repeats": 2, "waves": 1, "output_len": 8, "informational": True, "repeat_s": None, "max_starts": 3}
    doc = speed_stage.speed_stage(launch_paths=launch_paths, preflight_paths=preflight_paths, spec_paths=spec_paths,
                            speed=speed_bracket.resolve(cfg), audit="vllm-speed", out_path=str(tmp_path / "decision.json"),
                            streams_path=str(tmp_path / "streams.jsonl"),
                            archive_path=str(tmp_path / "control-archive.jsonl"),
                            server_logs={s: str(tmp_path / f"{s}.log") for s in ("s1", "s2", "s3")})
    assert [s["arm"] for s in doc["starts"]] == ["control", "candidate", "control"]
    pids = {s["server"]["pid"] for s in doc["starts"]}
    assert len(pids) == 3  # three fresh vLLM processes
    for s in doc["starts"]:
        assert s["server"]["identity_check"]["ok"] and s["server"]["identity_check"]["reported"]["version"] == "0.32.0"
    # every start's server was stopped on the way out (its facts are taken while it runs)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert "--dtype" in Path(tmp_path / "s2.log").read_text(errors="replace")
    assert doc["gate"]["verdict"] in ("WIN", "NO_WIN", "LOSS", "INCONCLUSIVE")
    streams = read_jsonl(tmp_path / "streams.jsonl")[1:]
    assert streams and all(r.get("error") is None for r in streams if r.get("cell") != "warmup")
