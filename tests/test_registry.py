"""One registry of rules (gates.REGISTERED): every decision selects its rule by name through it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_report import launches, paired_doc, passing_later, passing_pair, preflights
from test_speed import CFG, CFG_V2, bracket, quiet_clock

from pairaudit import gates
from pairaudit.promotion import calibration, decision
from pairaudit.speed import bracket as speedbracket
from pairaudit.speed import decision as speeddecision

REPO = Path(__file__).resolve().parents[1]


def spy_on(monkeypatch, name):
    """Replace the registered function of ``name`` by one that records its calls and then runs the rule."""
    calls: list[dict] = []
    rule = gates.REGISTERED[name]

    def spy(data, **kw):
        calls.append(kw)
        return rule.fn(data, **kw)

    monkeypatch.setitem(gates.REGISTERED, name, dataclasses.replace(rule, fn=spy))
    return calls


def test_each_gates_rules_come_from_the_registry_default_first():
    assert gates.rules_of("quality") == gates.QUALITY_RULES == ("quality-v2", "quality-v1")
    assert gates.rules_of("speed") == speeddecision.RULES == ("win2-v5", "win2-v4", "win2-v3", "win2-v2", "win2-v1")
    assert gates.rules_of("promotion") == decision.DECISION_RULES == ("promotion-v1",)
    assert {r.decides for r in gates.REGISTERED.values()} == {"quality", "grid_tie", "determinism", "boundary",
                                                                 "speed", "promotion", "servers"}
    # the speed config names a rule the registry holds, and nothing else
    assert speedbracket.resolve_config({"rule": "win2-v2"})["rule"] == "win2-v2"
    with pytest.raises(speedbracket.SpeedConfigError, match="win2-v5, win2-v4, win2-v3, win2-v2, win2-v1"):
        speedbracket.resolve_config({"rule": "win2-v0"})


def test_an_unknown_name_or_a_rule_of_another_gate_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown speed rule 'win2-v0' \(registered: win2-v5, win2-v4, win2-v3, win2-v2, win2-v1\)"):
        gates.rule("win2-v0", "speed")
    with pytest.raises(ValueError, match="unknown speed rule 'quality-v2'"):
        gates.rule("quality-v2", "speed")
    with pytest.raises(ValueError, match=r"unknown quality rule 'quality-v9' \(registered: quality-v2, quality-v1\)"):
        gates.apply_quality("quality-v9", paired_doc("x", both=range(3))["table"], {})


def test_the_quality_decision_dispatches_through_the_registry_with_its_own_parameters(monkeypatch):
    table = paired_doc("x", both=range(10), control_only=(20,))["table"]
    calls = spy_on(monkeypatch, "quality-v1")
    res = gates.apply_quality("quality-v1", table, {"max_net_loss": 1, "margin_pct": 5.0}, datasets=3)
    # only quality-v1's registered parameters reach it; it takes no family size
    assert calls == [{"max_net_loss": 1}] and res["params"]["max_net_loss"] == 1
    assert res["deviations"] == {"max_net_loss": {"registered": 0, "used": 1}}
    v2 = spy_on(monkeypatch, "quality-v2")
    gates.apply_quality("quality-v2", table, {"max_net_loss": 1, "margin_pct": 5.0}, datasets=3)
    assert v2 == [{"margin_pct": 5.0, "datasets": 3}]


@pytest.mark.parametrize("cfg,name", [(CFG, "win2-v1"), (CFG_V2, "win2-v2")])
def test_the_speed_decision_dispatches_through_the_registry(monkeypatch, cfg, name):
    calls = spy_on(monkeypatch, name)
    gate = speeddecision.decide(bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0]), cfg, quiet_clock())[2]
    assert calls and gate["rule"] == name
    # the registered parameters the config sets, never a bracket input the rule does not take
    assert all(kw["win_pct"] == cfg["win_pct"] and "evidence" not in kw and "max_starts" not in kw for kw in calls)


def test_the_promotion_decision_and_its_re_derivation_dispatch_through_the_registry(monkeypatch):
    pair = passing_pair()
    calls = spy_on(monkeypatch, "promotion-v1")
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    assert len(calls) == 1
    decision.check_decision_word(d)
    assert len(calls) == 2
    with pytest.raises(decision.DecisionMismatch, match="'promotion-v0' is not a registered decision rule"):
        decision.check_decision_word({**d, "rule": "promotion-v0"})


# ---------------------------------------------- what the decision's neighbours read of a rule, from the rule


def without(monkeypatch, name, what):
    """The registry with rule ``name`` registering no ``what``, as a rule added without it would."""
    monkeypatch.setitem(gates.REGISTERED, name, dataclasses.replace(gates.REGISTERED[name], **{what: None}))


def test_every_registered_rule_carries_what_its_gate_reads_and_a_missing_field_is_named_at_load(monkeypatch,
                                                                                                 tmp_path):
    assert gates.registry_problems() == []
    # the default speed rule needs no why-not; every other speed rule does, and each its report wording
    assert gates.REGISTERED[gates.rules_of("speed")[0]].why_not is None
    assert all(gates.REGISTERED[n].why_not and gates.REGISTERED[n].compares for n in gates.rules_of("speed")[1:])
    without(monkeypatch, "win2-v2", "why_not")
    without(monkeypatch, "boundary-v1", "on_identical_arms")
    problems = ["rule boundary-v1 registers no on_identical_arms (pairaudit.gates.REGISTERED)",
                "rule win2-v2 registers no why_not (pairaudit.gates.REGISTERED)"]
    assert sorted(gates.registry_problems()) == problems
    # the workflow's load check refuses the config while the registry lacks them
    from test_settings import validated

    from pairaudit import configcheck
    res = configcheck.check_config(validated("config/config.yaml"), base_dir=REPO, cache_dir=tmp_path / "cache")
    assert [p for p in res.problems if p in problems] == problems and res.settings is None


def test_the_speed_deviation_of_a_non_default_rule_is_its_registered_why_not_and_never_a_lookup_miss(monkeypatch):
    gate = speeddecision.decide(bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0]), CFG_V2, quiet_clock())[2]
    rule_dev = [d["detail"] for d in gate["stage_deviations"] if d["what"] == "rule"]
    assert rule_dev == [f"speed.rule win2-v2 instead of the default {gates.rules_of('speed')[0]} "
                        f"({gates.REGISTERED['win2-v2'].why_not})"]
    without(monkeypatch, "win2-v2", "why_not")
    with pytest.raises(ValueError, match="rule win2-v2 registers no why_not"):
        speeddecision.decide(bracket([100.0, 101.0, 99.0], [110.0, 111.5, 109.0]), CFG_V2, quiet_clock())


def test_the_calibration_expects_each_rules_registered_verdicts_and_refuses_an_unknown_rule(monkeypatch):
    assert calibration.expected("quality-v2") == ("PASS", "INCONCLUSIVE")
    assert calibration.expected("win2-v1") == ("NO_WIN",) and calibration.expected("preflight") == ("PASS",)
    # an unknown rule was silently expected to PASS; now it is refused
    with pytest.raises(ValueError, match="gate rule 'win2-v0' is not registered"):
        calibration.expected("win2-v0")
    pair = {"gsm8k": paired_doc("gsm8k", both=range(20), neither=(20, 21))}
    later = passing_later(pair)
    later["speed"] = gates.win2_v1({"output_tok_s": [[100.0, 100.2, 100.1], [100.1, 99.9, 100.0],
                                                     [100.0, 100.1, 100.2]]}, primary="output_tok_s")
    launched = launches()
    launched["candidate"] = launched["control"]
    d = decision.decide(pair, launched, preflights(), calibration=True, **later)
    s = calibration.summarize(d, audit="x-calibration", of_audit="x")
    assert s["gates"]["speed"]["expected"] == list(gates.REGISTERED["win2-v1"].on_identical_arms)
    without(monkeypatch, "win2-v1", "on_identical_arms")
    with pytest.raises(ValueError, match="rule win2-v1 registers no on_identical_arms"):
        calibration.summarize(d, audit="x-calibration", of_audit="x")


def test_the_report_words_each_speed_rule_as_it_registered_and_refuses_an_unknown_one(monkeypatch):
    from test_report_ledger import speed_doc

    from pairaudit.promotion import render
    for name in gates.rules_of("speed"):
        doc = speed_doc()
        doc["gate"]["rule"] = name
        md = "\n".join(render.speed_markdown(doc))
        assert f"per repeat ({gates.REGISTERED[name].compares}):" in md
    doc = speed_doc()
    doc["gate"]["rule"] = "win2-v0"   # was worded as win2-v1
    with pytest.raises(ValueError, match="win2-v0"):
        render.speed_markdown(doc)
    without(monkeypatch, "win2-v1", "compares")
    with pytest.raises(ValueError, match="rule win2-v1 registers no compares"):
        render.speed_markdown(speed_doc())


def test_the_gates_no_config_selects_dispatch_through_the_registry(monkeypatch):
    from pairaudit.boundary import stage as boundary_stage
    from pairaudit.diagnostics import divergence

    grid, det = spy_on(monkeypatch, "grid-tie-v1"), spy_on(monkeypatch, "determinism-v1")
    headers = {arm: {"determinism": {"hashes": ["h", "h", "h"]}} for arm in ("control", "candidate")}
    doc = divergence.divergence_doc("ds", headers, {"control": {}, "candidate": {}}, [], [], [], 2)
    assert grid == [{"max_divergent": 2, "selected": 0, "compared": 0}] and det == [{}]
    assert doc["grid_tie"]["rule"] == "grid-tie-v1" and doc["determinism"]["rule"] == "determinism-v1"
    calls = spy_on(monkeypatch, "boundary-v1")
    monkeypatch.setattr(boundary_stage.armspec, "read_spec", lambda path, arm: dataclasses.make_dataclass(
        "Spec", [("spec_sha256", str)])("s"))
    monkeypatch.setattr(boundary_stage.artifacts, "check_consumed", lambda *a, **k: None)
    monkeypatch.setattr(boundary_stage.artifacts, "provenance", lambda *a, **k: {})
    monkeypatch.setattr(boundary_stage.artifacts, "write_json", lambda *a, **k: None)
    docs = {"control": {"schema": "pairaudit.boundary/v1", "cases": [], "max_model_len": 64, "first_long": None},
            "candidate": {"schema": "pairaudit.boundary/v1", "cases": [], "max_model_len": 64, "first_long": None},
            "launch": {"schema": "pairaudit.launch/v1", "spec_sha256": "s"}}
    monkeypatch.setattr(boundary_stage.artifacts, "read_json", lambda p: docs[p])
    monkeypatch.setattr(boundary_stage.artifacts, "check_schema", lambda doc, schema, where: doc)
    out = boundary_stage.boundary_gate_stage(arm_paths={"control": "control", "candidate": "candidate"},
                                             launch_paths={"control": "launch", "candidate": "launch"},
                                             spec_paths={"control": "x", "candidate": "x"}, out_path="o")
    assert len(calls) == 1 and out["gate"]["rule"] == "boundary-v1"


def test_the_promotion_decision_knows_a_family_bounded_quality_rule_from_the_registry():
    # quality-v2 takes the number of datasets (its Bonferroni family): the registry says so, not its name
    assert decision._bounds_a_family("quality-v2") and not decision._bounds_a_family("quality-v1")
    with pytest.raises(ValueError, match="unknown quality rule 'quality-v9'"):
        decision._bounds_a_family("quality-v9")
