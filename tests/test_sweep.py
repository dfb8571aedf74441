"""Sweeps: several candidates against one control, derived and checked at load, summarized per candidate.

Known answers: the example sweep derives the control with every candidate's
switches at rollback and each candidate with only its own on; every refusal
(a name colliding with the control or another candidate, an unsafe name, an
empty change, two identical candidates, two rollback values for one switch,
a second form at once) names the candidate; a candidate audited on its own
gets the shared control; the summary's "may ship" is exactly PROMOTE; the
verdict of a sweep exits 0 only when every candidate asked about is PROMOTE.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
import yaml

from pairaudit.cli import verdict
from pairaudit.core import artifacts, contracts
from pairaudit.plans import change as changes
from pairaudit.promotion import calibration, sweep

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "config" / "examples" / "sweep.yaml"
DELAY, TAIL = "PAIRAUDIT_REF_STEP_DELAY_US", "PAIRAUDIT_REF_FAULT_TAIL"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def server() -> dict:
    return {"mode": "launch", "command": ["vllm", "serve", "{model}", "--port", "{port}"], "env": {"A": "1"},
            "model": "m", "max_model_len": 4096}


def sweep_config(*candidates) -> dict:
    return {"server": server(), "candidates": list(candidates)}


def cand(name, *switches) -> dict:
    return {"name": name, "switches": list(switches)}


# ------------------------------------------------------------- derivation

def test_the_example_derives_a_shared_control_and_one_arm_per_candidate():
    cfg = example()
    assert changes.derive_arms(cfg) == []
    arms = cfg["arms"]
    assert list(arms) == ["control", "fast", "tail", "slow"]
    # the control sets every candidate's switch at its rollback value, explicitly
    assert arms["control"]["env"][DELAY] == "50000" and arms["control"]["env"][TAIL] == "0"
    assert (arms["fast"]["env"][DELAY], arms["fast"]["env"][TAIL]) == ("0", "0")
    assert (arms["tail"]["env"][DELAY], arms["tail"]["env"][TAIL]) == ("50000", "16")
    assert (arms["slow"]["env"][DELAY], arms["slow"]["env"][TAIL]) == ("150000", "0")
    for name in ("fast", "tail", "slow"):
        diff = changes.arm_differences(arms["control"], arms[name])
        assert len(diff["env"]) == 1 and not diff["command"] and diff["other"] == []
    assert changes.candidate_names(cfg) == ["fast", "tail", "slow"]
    assert changes.is_sweep(cfg) and not changes.is_sweep({"server": {}, "change": {}})


def test_two_candidates_may_set_one_flag_to_different_values():
    cfg = sweep_config(cand("fp8", {"flag": "--quantization", "rollback": "absent", "on": "fp8"}),
                       cand("awq", {"flag": "--quantization", "rollback": "absent", "on": "awq"}))
    assert changes.derive_arms(cfg) == []
    assert cfg["arms"]["control"]["command"][-1] == "{port}"
    assert cfg["arms"]["fp8"]["command"][-2:] == ["--quantization", "fp8"]
    assert cfg["arms"]["awq"]["command"][-2:] == ["--quantization", "awq"]


@pytest.mark.parametrize("candidates, expected", [
    ([cand("control", {"env": "X", "rollback": "0", "on": "1"})],
     "candidates[0].name: 'control' is the control's arm name"),
    ([cand("a", {"env": "X", "rollback": "0", "on": "1"}), cand("a", {"env": "Y", "rollback": "0", "on": "1"})],
     "candidates[1].name: 'a' is already the name of candidates[0]"),
    ([cand(".hidden", {"env": "X", "rollback": "0", "on": "1"})],
     "candidates[0].name: '.hidden' is no safe arm name"),
    ([cand("a/b", {"env": "X", "rollback": "0", "on": "1"})], "candidates[0].name: 'a/b'"),
    ([cand("empty")], "candidates[0].switches: [] (allowed: a non-empty list of switches"),
    ([cand("a", {"env": "X", "rollback": "0", "on": "1"}), cand("b", {"env": "X", "rollback": "0", "on": "1"})],
     "candidates[1]: 'b' has the same switches and values as candidates[0] 'a'"),
    ([cand("a", {"env": "X", "rollback": "0", "on": "1"}), cand("b", {"env": "X", "rollback": "2", "on": "1"})],
     "candidates[1].switches[0].rollback: X rolls back to '2', candidates[0].switches[0] to '0'"),
    ([cand("a", {"env": "A", "rollback": "0", "on": "2"})],
     "candidates[0].switches[0].rollback: '0', but server.env sets A to '1'"),
    ([], "candidates: [] (allowed: a non-empty list of changes"),
])
def test_every_refusal_names_the_candidate(candidates, expected):
    cfg = sweep_config(*candidates)
    problems = changes.derive_arms(cfg)
    assert any(expected in p for p in problems), problems
    assert "arms" not in cfg


def test_a_variable_server_env_states_at_rollback_keeps_the_control_whatever_the_candidates():
    one = sweep_config(cand("a", {"env": "A", "rollback": "1", "on": "2"}))
    two = sweep_config(cand("a", {"env": "A", "rollback": "1", "on": "2"}),
                       cand("b", {"env": "A", "rollback": "1", "on": "3"}))
    assert changes.derive_arms(one) == [] and changes.derive_arms(two) == []
    # the control is the server as stated: adding or removing a candidate over A changes no control work
    assert one["arms"]["control"] == two["arms"]["control"]
    assert one["arms"]["control"]["env"] == {"A": "1"} and two["arms"]["b"]["env"] == {"A": "3"}
    # a variable only a switch sets is added to the control with it (the control then changes)
    three = sweep_config(cand("a", {"env": "A", "rollback": "1", "on": "2"}), cand("c", {"env": "Z", "rollback": "0",
                                                                                            "on": "1"}))
    assert changes.derive_arms(three) == [] and three["arms"]["control"]["env"] == {"A": "1", "Z": "0"}


def test_the_same_switches_in_another_order_are_identical_candidates():
    a = cand("a", {"env": "X", "rollback": "0", "on": "1"}, {"env": "Y", "rollback": "0", "on": "1"})
    b = cand("b", {"env": "Y", "rollback": "0", "on": "1"}, {"env": "X", "rollback": "0", "on": "1"})
    assert any("same switches and values" in p for p in changes.derive_arms(sweep_config(a, b)))


@pytest.mark.parametrize("extra", ["change", "arms"])
def test_a_sweep_with_another_form_is_refused(extra):
    cfg = sweep_config(cand("a", {"env": "X", "rollback": "0", "on": "1"}))
    cfg[extra] = {}
    assert any("two forms at once" in p for p in changes.derive_arms(cfg))


def test_a_candidate_on_its_own_has_the_shared_control():
    cfg = example()
    changes.derive_arms(cfg)
    one = changes.candidate_config(cfg, "tail")
    assert "candidates" not in one and one["change"]["name"] == "tail"
    assert one["arms"] == {"control": cfg["arms"]["control"], "candidate": cfg["arms"]["tail"]}
    # the others' switches at rollback are part of its server: its change alone gives the same two arms
    assert one["server"]["env"][DELAY] == "50000" and TAIL not in one["server"]["env"]
    alone = {"server": one["server"], "change": one["change"]}
    assert changes.derive_arms(alone) == []
    assert alone["arms"]["control"]["env"] == cfg["arms"]["control"]["env"]
    assert alone["arms"]["candidate"]["env"] == cfg["arms"]["tail"]["env"]
    with pytest.raises(KeyError, match="no candidate 'nope'"):
        changes.candidate_config(cfg, "nope")


def test_a_sweeps_calibration_is_its_control_against_itself_once():
    cfg = example()
    changes.derive_arms(cfg)
    cal = calibration.calibration_config(cfg)
    assert set(cal["arms"]) == {"control", "candidate"}
    assert cal["arms"]["candidate"] == cal["arms"]["control"] == cfg["arms"]["control"]
    assert not {"candidates", "server", "change"} & set(cal)
    assert changes.derive_arms(copy.deepcopy(cal)) == [] and calibration.check(cal) == []


def test_roles():
    assert contracts.arm_role("control") == "control"
    assert contracts.arm_role("candidate") == contracts.arm_role("fast") == "candidate"
    assert contracts.candidate_path(contracts.DECISION_SCHEMA, "s", "fast") == \
        "results/s/candidates/fast/promotion/decision.json"


# ------------------------------------------------------------- summary

GATES_PROMOTE = {"servers": "PASS", "quality:arith": "PASS", "boundary": "PASS", "speed": "WIN"}


def decision(word: str, **gates) -> dict:
    """A decision record as the summary reads it (the word, every gate, a dataset line)."""
    gate_docs = {g: None if v is None else {"verdict": v, "point_gain_pct": 12.5, "lower_bound_pct": 4.0}
                 if g == "speed" else None if v is None else {"verdict": v} for g, v in gates.items()}
    return {"decision": word, "gates": gate_docs,
            "datasets": {"arith": {"loss_bound": {"upper_pct": 21.7, "ruled_out": word == "PROMOTE"}}}}


@pytest.mark.parametrize("word, ships", [("PROMOTE", True), ("HOLD", False), ("REJECT", False),
                                         ("INCONCLUSIVE", False)])
def test_may_ship_is_exactly_promote(word, ships):
    assert sweep.may_ship({"decision": word}) is ships
    row = sweep.candidate_row("c", decision(word, **GATES_PROMOTE), "p", "0" * 64)
    assert row.may_ship is ships


def test_a_row_carries_every_gate_the_speed_gain_and_the_loss_ruled_out():
    row = sweep.candidate_row("c", decision("PROMOTE", **GATES_PROMOTE), "p", "0" * 64)
    assert row.gates == GATES_PROMOTE
    assert (row.speed_gain_pct, row.speed_lower_pct) == (12.5, 4.0)
    assert row.loss_ruled_out_pct == {"arith": 21.7}
    held = sweep.candidate_row("d", decision("INCONCLUSIVE", **{**GATES_PROMOTE, "speed": None}), "p", "0" * 64)
    assert held.gates["speed"] == sweep.NOT_EVALUATED and held.speed_gain_pct is None
    assert held.loss_ruled_out_pct == {"arith": None}
    md = sweep.summary_markdown({"audit": "s", "candidates": [row.to_json(), held.to_json()], "may_ship": ["c"]})
    assert "1 of 2 may ship" in md and "May ship: c." in md
    assert "| **PROMOTE** | yes | +12.50 % (+4.00 %) | arith >= 21.7 pt |" in md
    assert "| **INCONCLUSIVE** | no | n/a | arith: none |" in md


@pytest.mark.parametrize("words, code", [
    ({"a": "PROMOTE", "b": "PROMOTE"}, 0),
    ({"a": "PROMOTE", "b": "INCONCLUSIVE"}, 4),
    ({"a": "HOLD", "b": "INCONCLUSIVE"}, 3),
    ({"a": "HOLD", "b": "REJECT", "c": "PROMOTE"}, 1),
    ({"a": "PROMOTE", "b": None}, 2),
])
def test_a_sweeps_exit_code_is_zero_only_when_every_candidate_promotes(words, code):
    assert verdict.sweep_code(words) == code


def test_verdict_on_a_sweep_reads_each_decision_and_refuses_an_unknown_candidate(tmp_path, capsys):
    audit = tmp_path / "results" / "s"
    for name in ("a", "b"):
        (audit / "candidates" / name / "promotion").mkdir(parents=True)
    # a decision that is no decision: refused by its schema, and the sweep exits 2
    artifacts.write_json(audit / "candidates" / "a" / "promotion" / "decision.json", {"schema": "something/v1"})
    args = argparse.Namespace(audit=str(audit), summary=None, candidate=None, deep=False)
    assert verdict.sweep_candidates(audit) == ["a"]
    assert verdict.run(args) == 2
    assert "a refused" in capsys.readouterr().out
    args.candidate = ["zzz"]
    assert verdict.run(args) == 2
    assert "no candidate zzz" in capsys.readouterr().err
    plain = argparse.Namespace(audit=str(tmp_path / "results" / "plain"), summary=None, candidate=["a"], deep=False)
    assert verdict.run(plain) == 2


def test_an_edited_candidate_report_is_refused_at_load_by_its_manifest(tmp_path):
    from test_report import _write_inputs, launches, passing_pair, preflights
    from test_report_ledger import outputs

    from pairaudit import configcheck
    from pairaudit.promotion.stage import promotion_stage

    res = tmp_path / "results" / "s"
    cand_dir = res / "candidates" / "fast"
    ins = _write_inputs(cand_dir, passing_pair(), launches(), preflights())
    outs = outputs(cand_dir / "promotion")
    promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs)
    assert configcheck.check_results(res) == []
    md = Path(outs["out_report"])
    md.write_text(md.read_text().replace("INCONCLUSIVE", "PROMOTE"))
    problems = configcheck.check_results(res)
    assert len(problems) == 1 and problems[0].startswith(f"{md}: sha256 ")


def test_a_candidate_arm_named_by_its_change_is_decided_as_the_candidate(tmp_path):
    """The receipts of a sweep's candidate carry its own name; the decision keys them by role."""
    from test_report import _write_inputs, launch_rec, launches, passing_pair, preflight_doc, preflights
    from test_report_ledger import outputs

    from pairaudit.promotion.stage import promotion_stage

    def decide(root, name):
        la = {"control": launches()["control"], name: launch_rec(name, {"SHARED": "1"})}
        pre = {"control": preflights()["control"], name: preflight_doc(name)}
        ins = _write_inputs(root, passing_pair(), la, pre)
        outs = outputs(root / "promotion")
        promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs)
        return artifacts.read_json(outs["out_decision"])

    named, plain = decide(tmp_path / "named", "fast"), decide(tmp_path / "plain", "candidate")
    assert set(named["arms"]) == {"control", "candidate"}
    assert named["arms"]["candidate"]["env"] == plain["arms"]["candidate"]["env"] == {"SHARED": "1"}
    assert (named["decision"], named["gates"].keys()) == (plain["decision"], plain["gates"].keys())
    # a second candidate in one decision is two artifacts for one role: refused, naming the file
    root = tmp_path / "two"
    la = {"control": launches()["control"], "fast": launch_rec("fast", {"SHARED": "1"}),
          "slow": launch_rec("slow", {"SHARED": "1"})}
    ins = _write_inputs(root, passing_pair(), la, {"control": preflights()["control"]})
    with pytest.raises(artifacts.ArtifactError, match="a second artifact for arm 'candidate'"):
        promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outputs(root / "promotion"))


def test_a_sweeps_answers_are_exported_for_every_arm(tmp_path):
    """lm-eval sample logs for the control and every candidate a sweep scored, found by their score files."""
    from test_interop_lmeval import build_audit

    from pairaudit.interop import lmeval

    root = tmp_path / "results" / "s"
    build_audit(root)
    assert set(lmeval.export_audit(root)) == {"control", "candidate"}
    (root / "candidates").mkdir()
    for kind in ("sampled", "scores"):
        # a second candidate's files, as its answers phase and score stage name them
        header, recs = artifacts.read_jsonl(root / kind / "hand" / "candidate.jsonl")
        artifacts.write_jsonl(root / kind / "hand" / "fast.jsonl", {**header, "arm": "fast"}, recs)
    exported = lmeval.export_audit(root)
    assert list(exported) == ["control", "candidate", "fast"]
    assert Path(exported["fast"].results).parent == root / "exports" / "lm-eval" / "fast"
