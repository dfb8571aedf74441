"""Artifacts read back through their records: a renamed or dropped field is refused, naming the file and field."""

from __future__ import annotations

import pytest
from test_report import _write_inputs, launches, passing_pair, preflights
from test_report_ledger import outputs, speed_doc

from pairaudit.core.artifacts import read_json, write_json
from pairaudit.core.readers import FieldError, Paired, SpeedDecisionDoc
from pairaudit.promotion import stage as report


def _inputs(tmp_path):
    return _write_inputs(tmp_path / "in", passing_pair(), launches(), preflights())


def _rewrite(path, edit):
    doc = read_json(path)
    doc.pop("content_sha256", None)  # re-hashed by write_json: a changed writer, not a hand edit
    edit(doc)
    write_json(path, doc)


@pytest.mark.parametrize("artifact,edit,field", [
    ("paired", lambda d: d.update(tables=d.pop("table")), "table"),
    ("paired", lambda d: d["table"].update(controls_only=d["table"].pop("control_only")), "table.control_only"),
    ("paired", lambda d: d["quality"].pop("verdict"), "quality.verdict"),
    ("launch", lambda d: d.update(spec=d.pop("spec_sha256")), "spec_sha256"),
    ("preflight", lambda d: d.update(failed=d.pop("failed_probe")), "failed_probe"),
])
def test_a_renamed_field_of_a_written_artifact_is_refused_by_name(tmp_path, artifact, edit, field):
    ins = _inputs(tmp_path)
    path = ins[artifact][0]
    _rewrite(path, edit)
    with pytest.raises(FieldError) as ei:
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outputs(tmp_path / "out"))
    assert ei.value.field == field and str(path) in str(ei.value) and f"'{field}' is missing" in str(ei.value)


def test_a_mistyped_field_is_refused_by_name(tmp_path):
    ins = _inputs(tmp_path)
    _rewrite(ins["paired"][0], lambda d: d["table"].update(n="300"))
    with pytest.raises(FieldError, match=r"field 'table.n' is str, expected int"):
        Paired.read(ins["paired"][0])


def test_a_measured_speed_decision_without_its_bar_is_refused(tmp_path):
    ins = _inputs(tmp_path)
    sp = tmp_path / "in" / "speed.json"
    doc = speed_doc()
    write_json(sp, doc)
    assert SpeedDecisionDoc.read(sp).win_pct == 2.0
    doc["bars"] = doc.pop("bar")  # a renamed field no longer falls back to a default bar
    write_json(sp, doc)
    with pytest.raises(FieldError, match=r"speed.json: field 'bar' is missing"):
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outputs(tmp_path / "out"),
                               later={"speed": str(sp)})
    doc["bar"] = {**doc.pop("bars"), "win_pct": "2"}
    write_json(sp, doc)
    with pytest.raises(FieldError, match=r"field 'bar.win_pct' is str, expected float"):
        SpeedDecisionDoc.read(sp)


def test_a_wrong_schema_is_refused():
    with pytest.raises(Exception, match="expected 'pairaudit.paired/v1'"):
        Paired.from_json({"schema": "pairaudit.divergence/v1"}, where="x.json")


def test_a_decision_written_with_a_renamed_field_is_refused_by_the_report_and_the_verdict(tmp_path, capsys):
    from test_report import passing_later

    from pairaudit.cli import main
    from pairaudit.cli.codes import REFUSED
    from pairaudit.promotion import decision, render

    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    path = tmp_path / "results" / "a" / "promotion" / "decision.json"
    write_json(path, {**{k: v for k, v in d.items() if k != "deciding_gates"}, "deciding": d["deciding_gates"]})
    assert main(["verdict", str(path)]) == REFUSED
    assert f"{path}: field 'deciding_gates' is missing" in capsys.readouterr().err
    with pytest.raises(FieldError, match="field 'deciding_gates' is missing"):
        render.render_markdown(read_json(path), pair, launches(), preflights())
    gates = {**d["gates"], "speed": {k: v for k, v in d["gates"]["speed"].items() if k != "outcome"}}
    with pytest.raises(FieldError, match=r"field 'gates.speed.outcome' is missing"):
        render.summary_rst({**d, "gates": gates}, [])


def test_the_answers_phases_failure_reaches_the_servers_gate_and_a_renamed_one_is_refused(tmp_path):
    ins = _inputs(tmp_path)
    answers = []
    for arm in ("control", "candidate"):
        p = tmp_path / "in" / "answers" / f"{arm}.json"
        failure = None if arm == "control" else {"arm": arm, "stage": "sampled", "what": "gsm8k item 3",
                                                "kind": "dead", "status": None, "error": "connection reset"}
        write_json(p, {"schema": "pairaudit.phase/v1", "phase": "answers", "arm": arm, "failure": failure})
        answers.append(str(p))
    outs = outputs(tmp_path / "out")
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs, later={"answers": answers})
    d = read_json(outs["out_decision"])
    assert d["gates"]["servers"]["rule"] == "server-failure-v1" and d["gates"]["servers"]["verdict"] != "PASS"
    _rewrite(answers[1], lambda doc: doc.update(failures=doc.pop("failure")))
    with pytest.raises(FieldError, match=rf"{answers[1]}: field 'failure' is missing"):
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outputs(tmp_path / "o2"),
                               later={"answers": answers})


def test_a_sweep_decision_names_each_starts_role_for_its_candidate():
    two_arm = SpeedDecisionDoc.from_json({"schema": "pairaudit.speed_decision/v1", "gate": None})
    assert two_arm.start_roles(5) == ["control", "candidate", "control", "candidate", "control"]
    shared = SpeedDecisionDoc.from_json({"schema": "pairaudit.speed_decision/v1", "gate": None, "sweep": {
        "candidate": "b", "candidates": ["a", "b"], "arms": ["control", "a", "control", "b", "control"]}})
    assert shared.start_roles(5) == ["control", "other", "control", "candidate", "control"]
    # a record shorter than the series it is asked about is not trusted: the two-arm alternation
    assert shared.start_roles(7)[:2] == ["control", "candidate"]
