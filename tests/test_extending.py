"""docs/extending.md, walked through for real: a quality rule, a speed rule and a serving backend.

Each walk-through adds its piece the way the guide says (a rule is one entry
of ``gates.REGISTERED``; a backend is an arm config the API contract is
checked against) and runs it through the code an audit runs: the paired
stage, the speed stage's decision, an attached server's identity check and
the conformance checks. The dataset format's walk-through is in
tests/test_format_registry.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import pytest

from pairaudit import gates
from pairaudit.core import artifacts, defaults
from pairaudit.core.settings import QualitySettings
from pairaudit.gates.common import registered_params
from pairaudit.plans.requests import body_sha256
from pairaudit.quality import stage as quality_stage
from pairaudit.serving import armspec, conformance, launch, recording
from pairaudit.speed import bracket as speed
from pairaudit.speed import clock as speedclock
from pairaudit.speed import decision as speeddecision

# ------------------------------------------------------------------ a quality rule

NET_V0 = {"max_net_loss": 0}


def quality_net_v0(table: Mapping[str, Any], *, max_net_loss: int = 0) -> dict:
    """PASS when the candidate loses at most ``max_net_loss`` items net, else FAIL; INVALID when the arms'
    requests differ (a toy: no statistics, only the counting every quality rule starts from)."""
    params, dev, reasons = registered_params({"max_net_loss": max_net_loss}, NET_V0)
    c_only, k_only = list(table["control_only"]), list(table["candidate_only"])
    net = len(k_only) - len(c_only)
    if table.get("body_mismatch"):
        verdict = "INVALID"
        reasons.append(f"request bodies differ at items {table['body_mismatch']}")
    else:
        verdict = "PASS" if net >= -max_net_loss else "FAIL"
        reasons.append(f"net {net:+d} (candidate-only {k_only}, control-only {c_only}) "
                       f"{'>=' if verdict == 'PASS' else '<'} -{max_net_loss}")
    return {"rule": "quality-net-v0", "verdict": verdict, "reasons": reasons, "params": params,
            "deviations": dev, "net": net}


QUALITY_NET_V0 = gates.Rule("quality-net-v0", "quality", quality_net_v0, NET_V0, on_identical_arms=("PASS",),
                            why_not="quality-net-v0 has no margin: a table too small to see a loss passes")

ANSWERS = {"control": {0: "#### 5", 1: "#### 12", 2: "#### 7", 3: "#### 1"},
           "candidate": {0: "#### 5", 1: "#### 13", 2: "#### 7", 3: "#### 12"}}
GOLD = {0: "5", 1: "12", 2: "7", 3: "12"}


def _scored_dataset(root: Path) -> dict:
    """A gsm8k dataset of four items, both arms' sampled records and their scores, as the stages write them."""
    items = [{"index": i, "id": f"g{i}", "format": "gsm8k", "question": f"q{i}",
              "reference": {"answer": a, "solution": f"#### {a}"},
              "messages": [{"role": "user", "content": f"q{i}"}]} for i, a in GOLD.items()]
    ds = root / "datasets" / "hand.json"
    artifacts.write_json(ds, {"schema": "pairaudit.dataset/v1", "name": "hand", "format": "gsm8k",
                              "prompt_template": "brief", "source": {"kind": "local", "path": "hand.jsonl",
                                                                     "rows": 4, "sha256": "0" * 64},
                              "select": {"count": "all"}, "indices": list(GOLD), "items": items})
    paths: dict[str, Any] = {"dataset": str(ds), "sampled": {}, "scores": {}}
    for arm, texts in ANSWERS.items():
        recs = []
        for it in items:
            body = {"model": "m", "messages": it["messages"], "max_tokens": 16, "seed": it["index"]}
            recs.append({"index": it["index"], "attempt": 1, "body": body, "body_sha256": body_sha256(body),
                         "status": 200, "error": None, "finish_reason": "stop", "prior_attempts": [],
                         "response": {"choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant",
                                                               "content": texts[it["index"]]}}]}})
        sp, cp = root / "sampled" / f"{arm}.jsonl", root / "scores" / f"{arm}.jsonl"
        artifacts.write_jsonl(sp, {"schema": "pairaudit.sampled/v1", "dataset": "hand", "arm": arm,
                                   "n": len(recs), "provenance": artifacts.provenance([ds], {})}, recs)
        quality_stage.score_stage(dataset_path=str(ds), sampled_path=str(sp), out_path=str(cp), sandbox_limits={})
        paths["sampled"][arm], paths["scores"][arm] = str(sp), str(cp)
    return paths


def test_a_new_quality_rule_is_one_registry_entry_the_paired_stage_applies(tmp_path, monkeypatch):
    # what the load check asks of a rule: without its calibration expectation it is named, not defaulted
    bare = dataclasses.replace(QUALITY_NET_V0, on_identical_arms=None, why_not=None)
    assert gates.registry_problems({**gates.REGISTERED, bare.name: bare}) == [
        "rule quality-net-v0 registers no on_identical_arms (pairaudit.gates.REGISTERED)",
        "rule quality-net-v0 registers no why_not (pairaudit.gates.REGISTERED)"]
    assert gates.registry_problems({**gates.REGISTERED, QUALITY_NET_V0.name: QUALITY_NET_V0}) == []
    with pytest.raises(ValueError, match="unknown quality rule 'quality-net-v0'"):
        gates.rule("quality-net-v0", "quality")

    monkeypatch.setitem(gates.REGISTERED, QUALITY_NET_V0.name, QUALITY_NET_V0)
    assert "quality-net-v0" in gates.rules_of("quality")
    paths = _scored_dataset(tmp_path)
    settings = QualitySettings.from_json(defaults.filled({}, "rules", "quality"))

    def paired(**change) -> dict:
        return quality_stage.paired_stage(dataset_path=paths["dataset"], sampled_paths=paths["sampled"],
                                          score_paths=paths["scores"], out_path=str(tmp_path / "paired.json"),
                                          quality=dataclasses.replace(settings, rule="quality-net-v0", **change))

    # control right on 1, candidate right on 3: net 0, the candidate lost no item on balance
    doc = paired()
    assert doc["table"]["control_only"] == [1] and doc["table"]["candidate_only"] == [3]
    assert (doc["quality"]["rule"], doc["quality"]["verdict"], doc["quality"]["net"]) == ("quality-net-v0", "PASS", 0)
    assert doc["quality"]["deviations"] == {}
    # a stricter bar is the configured parameter, and never silent: a deviation and a reason
    strict = paired(max_net_loss=-1)["quality"]
    assert strict["verdict"] == "FAIL"
    assert strict["deviations"] == {"max_net_loss": {"registered": 0, "used": -1}}
    assert strict["reasons"][0] == "parameter max_net_loss=-1 differs from the registered 0"


# ------------------------------------------------------------------ a speed rule

TOY_SPEED = {"win_pct": 2.0}   # the schema's speed.win_pct default: every speed rule reads that one key


def win2_mean(cells: Mapping[str, Mapping[str, Any]], *, decide: list[str], primary: str, guards=(), reported=(),
              lower_is_better=(), win_pct: float = 2.0) -> dict:
    """WIN when the candidate start's mean primary beats the mean of its two control starts by more than
    ``win_pct`` over the deciding cells' repeats, LOSS for the mirror, else NO_WIN (a toy: no noise model)."""
    params, dev, reasons = registered_params({"win_pct": win_pct}, TOY_SPEED)
    sign = -1.0 if primary in lower_is_better else 1.0
    gains = [sign * 100.0 * (cand - (before + after) / 2) / ((before + after) / 2)
             for c in decide for before, cand, after in cells[c][primary]]
    gain = sum(gains) / len(gains)
    verdict = "WIN" if gain > win_pct else "LOSS" if gain < -win_pct else "NO_WIN"
    reasons.append(f"mean {primary} gain {gain:+.2f} % against a bar of {win_pct:g} %")
    return {"rule": "win2-mean", "verdict": verdict, "reasons": reasons, "params": params, "deviations": dev,
            "cells": {c: {"decides": c in decide, "verdict": verdict if c in decide else None} for c in cells},
            "gain_pct": gain}


WIN2_MEAN = gates.Rule(
    "win2-mean", "speed", win2_mean, TOY_SPEED, takes=("decide", "primary", "guards", "reported", "lower_is_better"),
    pooled=True, carries=("gain_pct",), on_identical_arms=("NO_WIN",),
    compares="win2-mean compares the candidate start with the mean of the control starts around it",
    why_not="win2-mean has no noise model: its false WIN rate is not bounded")


def _bracket(control: float, candidate: float) -> dict:
    """The speed stage's results of an OFF/ON/OFF bracket: one deciding cell, three repeats per start."""
    def pooled(rate: float) -> dict:
        return {"pooled_rate_tps": rate, "accepted_per_round": 0.0, "decode_tps": rate,
                "ms_per_round": 1000.0 / rate, "ttft_s": 0.1}
    rates = {"s1": control, "s2": candidate, "s3": control}
    return {st: {"short-c1": {"pooled": [pooled(r * f) for f in (1.0, 1.01, 0.99)]}} for st, r in rates.items()}


def test_a_new_speed_rule_is_one_registry_entry_the_speed_decision_applies(monkeypatch):
    # every field its gate's neighbours read, or the load check names what is missing
    lacking = dataclasses.replace(WIN2_MEAN, compares=None, why_not=None)
    assert gates.registry_problems({**gates.REGISTERED, "win2-mean": lacking}) == [
        "rule win2-mean registers no compares (pairaudit.gates.REGISTERED)",
        "rule win2-mean registers no why_not (pairaudit.gates.REGISTERED)"]
    assert gates.registry_problems({**gates.REGISTERED, "win2-mean": WIN2_MEAN}) == []

    monkeypatch.setitem(gates.REGISTERED, WIN2_MEAN.name, WIN2_MEAN)
    # speed.rule is checked against the rules registered when the package was imported (a rule added in
    # code is in them; the schema's enum too): the resolved section, then this rule selected in it
    cfg = {**speed.resolve_config({"cells": [{"name": "short-c1", "prompt": "short", "decide": True}],
                                   "repeats": 3}), "rule": "win2-mean"}
    quiet = {"governor": "performance", "scaling_max_freq_khz": 3000000, "cpu_mhz": 2990.0,
             "loadavg": [0.1, 0.1, 0.1], "gpu": None}
    clock = speedclock.clock_check([quiet] * 3, after=[quiet] * 3)
    _, _, gate = speeddecision.decide(_bracket(100.0, 110.0), cfg, clock)
    assert (gate["rule"], gate["verdict"]) == ("win2-mean", "WIN"), gate["reasons"]
    assert gate["gain_pct"] == pytest.approx(10.0)          # what the rule carries onto the gate
    # not the default rule: a deviation, in the rule's own words
    assert [d["what"] for d in gate["stage_deviations"]] == ["rule"]
    assert "win2-mean has no noise model" in gate["stage_deviations"][0]["detail"]
    assert speeddecision.decide(_bracket(100.0, 90.0), cfg, clock)[2]["verdict"] == "LOSS"
    assert speeddecision.decide(_bracket(100.0, 101.0), cfg, clock)[2]["verdict"] == "NO_WIN"


# ------------------------------------------------------------------ a serving backend

RECORDED = Path(__file__).parent / "data" / "recordings" / "vllm-0.26.0-h200.json"


def test_a_new_serving_backend_is_an_arm_config_checked_against_the_api_contract(tmp_path):
    """vLLM 0.26 on a GPU, replayed from its recording, stands in for a backend no CI machine runs."""
    rec = recording.load(RECORDED)
    about = rec["about"]
    with recording.ReplayServer(rec) as replay:
        # the arm as a config states it: attached here; a launched backend gives its command instead
        spec = armspec.resolve_spec("candidate", {"mode": "attach", "url": replay.url, "model": about["model"],
                                                  "max_model_len": about["max_model_len"]})
        # what every phase does first with its server: healthy, and the model and context it claims
        with launch.Server(spec) as server:
            facts = server.facts()
        assert facts["identity_check"]["ok"] is True, facts["identity_check"]
        outcomes = conformance.run(conformance.Target(replay.url, about["model"], about["max_model_len"]))
        assert replay.unrecorded == []
    # the contract the audit reads servers by: where this backend differs from vLLM 0.32's behaviour is
    # named check by check (docs/vllm.md's table), and its preflight still passes
    differ = conformance.differences(outcomes, conformance.known(about["model"], about["max_model_len"]))
    assert sorted(differ) == ["cache_salt", "prompt_fills_context", "prompt_over_context", "silent_clamp"]
    assert outcomes["preflight"]["verdict"] == "PASS"
    # a launched backend is its command line: what names the server (the identity hash) keeps the host's
    # interpreter, model directory and port symbolic; the launch fills them on the host that runs it
    launched = armspec.resolve_spec("candidate", {
        "mode": "launch", "model": about["model"], "max_model_len": about["max_model_len"],
        "command": ["{vllm_python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}",
                    "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}"]})
    assert launched.identity()["command"][:1] == ["{vllm_python}"] and "{port}" in launched.identity()["command"]
    assert launched.identity()["command"][6] == about["model"]   # {served_model_name}, filled at load
