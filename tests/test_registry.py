"""One registry of rules (gates.REGISTERED): every decision selects its rule by name through it."""

from __future__ import annotations

import dataclasses

import pytest
from test_report import launches, paired_doc, passing_later, passing_pair, preflights
from test_speed import CFG, CFG_V2, bracket, quiet_clock

from pairaudit import gates
from pairaudit.promotion import decision
from pairaudit.speed import bracket as speedbracket
from pairaudit.speed import decision as speeddecision


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
    assert gates.rules_of("speed") == speeddecision.RULES == ("win2-v4", "win2-v3", "win2-v2", "win2-v1")
    assert gates.rules_of("promotion") == decision.DECISION_RULES == ("promotion-v1",)
    assert {r.decides for r in gates.REGISTERED.values()} == {"quality", "grid_tie", "determinism", "boundary",
                                                                 "speed", "promotion", "servers"}
    # the speed config names a rule the registry holds, and nothing else
    assert speedbracket.resolve_config({"rule": "win2-v2"})["rule"] == "win2-v2"
    with pytest.raises(speedbracket.SpeedConfigError, match="win2-v4, win2-v3, win2-v2, win2-v1"):
        speedbracket.resolve_config({"rule": "win2-v0"})


def test_an_unknown_name_or_a_rule_of_another_gate_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown speed rule 'win2-v0' \(registered: win2-v4, win2-v3, win2-v2, win2-v1\)"):
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
