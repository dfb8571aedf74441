"""Planted defects are caught: each fault switch's example config gives its verdict and names its case.

Each ``config/examples/fault-*.yaml`` is a complete audit (the embedded
default with one fault switch in the candidate). Here its defining part —
the audit name, each arm's switches and which gates it leaves out — is put
onto the tiny test audit (its items, sampling and boundary sizes: minutes,
not a full audit), and the real workflow runs its ``promotion`` target in a
scratch project copy. Only decision.json is read, so the test does not
depend on how the workflow arranges its jobs.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from test_workflow import REPO, TINY, make_project, snake

from pairaudit.plans.change import derive_arms

pytestmark = pytest.mark.workflow

EXAMPLES = REPO / "config" / "examples"


def tiny_with(example: str) -> dict:
    ex = yaml.safe_load((EXAMPLES / example).read_text())
    assert derive_arms(ex) == []  # the example states its fault as a change: its arms, as the workflow derives them
    cfg = copy.deepcopy(yaml.safe_load(TINY.read_text()))
    cfg["audit"] = ex["audit"]
    for arm in ("control", "candidate"):
        cfg["arms"][arm]["env"] = dict(ex["arms"][arm]["env"])
        cfg["arms"][arm]["speculative"] = ex["arms"][arm]["speculative"]
    for stage in ("boundary", "speed"):
        if "enabled" in (ex.get(stage) or {}):
            cfg.setdefault(stage, {})["enabled"] = ex[stage]["enabled"]
    return cfg


def run_decision(tmp_path_factory, example: str) -> dict:
    config = tiny_with(example)
    project = make_project(tmp_path_factory.mktemp(example.split(".")[0]) / "project", config)
    snake(project, "promotion", timeout=3000)
    return json.loads((project / "results" / config["audit"] / "promotion" / "decision.json").read_text())


def test_merge_keeps_the_tiny_audit_and_plants_one_switch():
    cfg = tiny_with("fault-tail.yaml")
    assert cfg["audit"] == "fault-tail" and cfg["datasets"] == yaml.safe_load(TINY.read_text())["datasets"]
    c, k = cfg["arms"]["control"], cfg["arms"]["candidate"]
    assert {n for n in set(c["env"]) | set(k["env"]) if c["env"].get(n) != k["env"].get(n)} == \
        {"PAIRAUDIT_REF_FAULT_TAIL"}
    assert c["command"] == k["command"] and k["model"] == c["model"]  # merged, not replaced
    noise = tiny_with("fault-noise.yaml")
    n_c, n_k = noise["arms"]["control"]["env"], noise["arms"]["candidate"]["env"]
    assert {n for n in n_k if n_c.get(n) != n_k[n]} == {"PAIRAUDIT_REF_FAULT_NOISE"}
    assert noise["boundary"]["enabled"] is False and noise["speed"]["enabled"] is False


def test_capacity_tail_fault_is_rejected_at_the_max_model_len_minus_16_case(tmp_path_factory):
    d = run_decision(tmp_path_factory, "fault-tail.yaml")
    assert d["decision"] == "REJECT", d["reasons"]
    assert d["deciding_gates"] == ["boundary"], d["reasons"]
    gate = d["gates"]["boundary"]
    assert gate["verdict"] == "FAIL"
    assert gate["candidate_failures"] == ["tail-16"]  # its max-32 control case still passes
    assert any(r.startswith("candidate tail-16:") for r in gate["reasons"]), gate["reasons"]
    # The fault is at the context's end only: no other gate rejects (the tiny audit's own
    # items may run into its 48-token budget, which makes a quality gate INVALID, not REJECT).
    for name, g in d["gates"].items():
        if name != "boundary":
            assert g is None or g["outcome"] != "REJECT", (name, g)


# The noise touches greedy requests only (a nondeterministic argmax), so the candidate's
# rehearsal passes -- its seeded sampled request repeats exactly -- and the sampled answers of
# both arms are the same; the greedy repeats of the diagnostics phase then differ, and
# determinism-v1 STOPs on the candidate alone.
def test_logit_noise_fault_is_held_at_the_determinism_repeats(tmp_path_factory):
    d = run_decision(tmp_path_factory, "fault-noise.yaml")
    assert d["decision"] == "HOLD", d["reasons"]
    assert d["gates"]["preflight:candidate"]["verdict"] == "PASS", d["gates"]["preflight:candidate"]
    assert d["gates"]["servers"]["verdict"] == "PASS", d["gates"]["servers"]
    stopped = [name for name, g in d["gates"].items() if name.startswith("determinism:") and g["verdict"] == "STOP"]
    assert stopped and set(stopped) <= set(d["deciding_gates"]), d["reasons"]
    for name in stopped:
        gate = d["gates"][name]
        assert gate["nondeterministic_arms"] == ["candidate"], gate["reasons"]
        assert any(r.startswith("candidate: nondeterministic, ") for r in gate["reasons"]), gate["reasons"]
        assert any(r.startswith(f"{name}: determinism-v1 STOP -> HOLD") for r in d["reasons"]), d["reasons"]
    assert not any(g and g["outcome"] == "REJECT" for g in d["gates"].values())
