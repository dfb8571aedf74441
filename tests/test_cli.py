"""The ``pairaudit`` command: verdict's exit codes and front page, size, and the console script's declaration."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from decision_chain import write_chain
from test_report import launches, paired_doc, passing_later, passing_pair, preflights

from pairaudit.cli import main
from pairaudit.cli.codes import EXIT, REFUSED
from pairaudit.core.artifacts import write_json
from pairaudit.promotion import decision, render
from pairaudit.quality import sizing

REPO = Path(__file__).resolve().parents[1]


def audit_with(tmp_path, kind):
    """results/<audit>/promotion/decision.json decided by the real promotion stage on built evidence, with
    every artifact it consumed beside it (``verdict`` re-derives the decision from them: decision_chain)."""
    pair = passing_pair()
    later = True
    if kind == "REJECT":
        pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=range(20, 28))   # p = 2/256
    elif kind == "HOLD":
        # quality-v1 (selectable) holds an unresolved loss; quality-v2 calls it INCONCLUSIVE
        pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=(20, 21), rule="quality-v1")   # p = 0.5
    elif kind == "INCONCLUSIVE":
        later = False                                                                   # later gates not evaluated
    root = tmp_path / "results" / f"audit-{kind.lower()}"
    d = write_chain(root, pair, later=later)
    assert d["decision"] == kind, d["reasons"]
    return root, d


@pytest.mark.parametrize("kind", ["PROMOTE", "REJECT", "HOLD", "INCONCLUSIVE"])
def test_verdict_exit_code_and_front_page(tmp_path, capsys, kind):
    root, d = audit_with(tmp_path, kind)
    code = main(["verdict", str(root)])
    assert code == {"PROMOTE": 0, "REJECT": 1, "HOLD": 3, "INCONCLUSIVE": 4}[kind] == EXIT[kind]
    out = capsys.readouterr().out
    assert out.startswith(f"pairaudit verdict: {kind}")
    assert f"deciding gates: {', '.join(d['deciding_gates'])}" in out
    for gate in d["gates"]:   # one line per gate
        assert sum(1 for line in out.splitlines() if line.strip().startswith(gate + " ")) == 1, gate
    assert f"exit {code} ({kind})" in out
    if kind == "REJECT":
        assert "quality:mbpp" in out and "FAIL" in out and "rejects" in out
    if kind == "PROMOTE":
        # the front page says per dataset which loss was ruled out, and how the datasets hold together
        assert "gsm8k: n=302" in out and "quality-v2 PASS: loss >= 1.3 points ruled out at 97.5 %" in out
        assert "mbpp: n=303" in out and "quality-v2 PASS: loss >= 1.5 points ruled out at 97.5 %" in out
        assert "over the datasets: each dataset's loss bound is at 97.5 % (Bonferroni over 2 dataset(s))" in out


def test_verdict_exit_code_follows_a_loss_not_ruled_out(tmp_path, capsys):
    """Every other gate passes, but 12 items cannot rule out the margin: INCONCLUSIVE, exit 4, the items named."""
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), candidate_only=(20,), neither=(21,))   # net +1
    root = tmp_path / "results" / "small"
    d = write_chain(root, pair)
    assert main(["verdict", str(root)]) == EXIT["INCONCLUSIVE"] == 4
    out = capsys.readouterr().out
    need = d["datasets"]["mbpp"]["needed"]
    assert "quality-v2 INCONCLUSIVE: cannot rule out a loss of" in out and f"about {need} items would" in out


def test_verdict_accepts_the_decision_file_itself(tmp_path, capsys):
    root, _ = audit_with(tmp_path, "HOLD")
    assert main(["verdict", str(root / "promotion" / "decision.json")]) == 3


def test_verdict_refuses_an_edited_decision_by_its_own_hash(tmp_path, capsys):
    root, _ = audit_with(tmp_path, "REJECT")
    path = root / "promotion" / "decision.json"
    path.write_text(path.read_text().replace('"decision": "REJECT"', '"decision": "PROMOTE"'))
    summary = tmp_path / "summary.md"
    assert main(["verdict", str(root), "--summary", str(summary)]) == REFUSED == 2
    err = capsys.readouterr().err
    assert "does not match the content_sha256" in err and str(path) in err
    assert "no decision" in summary.read_text() and "does not match" in summary.read_text()


def test_verdict_refuses_a_resealed_decision_word_its_gates_do_not_give(tmp_path, capsys):
    """Re-written with the project's own writer (so the self-hash holds): PROMOTE over gates that say HOLD."""
    root, d = audit_with(tmp_path, "HOLD")
    path = root / "promotion" / "decision.json"
    forged = {k: v for k, v in d.items() if k not in ("content_sha256",)}
    forged["decision"] = "PROMOTE"
    write_json(path, forged)
    assert json.loads(path.read_text())["gates"]["quality:mbpp"]["verdict"] == "HOLD"
    summary = tmp_path / "summary.md"
    assert main(["verdict", str(root), "--summary", str(summary)]) == REFUSED == 2
    err = capsys.readouterr().err
    assert "stated PROMOTE, derived HOLD" in err and "promotion-v1" in err and str(path) in err
    assert "no decision" in summary.read_text() and "derived HOLD" in summary.read_text()
    # the report refuses it too, naming both
    with pytest.raises(decision.DecisionMismatch, match="states PROMOTE but its gates under promotion-v1 give HOLD"):
        render.render_markdown(json.loads(path.read_text()), {}, {}, {})
    # a gate's own outcome re-sealed to agree with the word is refused just the same
    forged["gates"]["quality:mbpp"]["outcome"] = "PROMOTE"
    forged["deciding_gates"] = []
    write_json(path, forged)
    assert main(["verdict", str(root)]) == REFUSED
    assert "gate quality:mbpp states the outcome PROMOTE but its verdict HOLD gives HOLD" in capsys.readouterr().err


def test_verdict_missing_and_not_a_decision(tmp_path, capsys):
    assert main(["verdict", str(tmp_path / "results" / "nothing")]) == 2
    assert "not found" in capsys.readouterr().err
    other = tmp_path / "other.json"
    write_json(other, {"schema": "pairaudit.paired/v1", "decision": "PROMOTE"})
    assert main(["verdict", str(other)]) == 2
    assert "expected 'pairaudit.decision/v1'" in capsys.readouterr().err


def test_verdict_summary_appends_markdown(tmp_path, capsys):
    root, d = audit_with(tmp_path, "REJECT")
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    assert main(["verdict", str(root), "--summary", str(summary)]) == 1
    md = summary.read_text()
    assert md.startswith("earlier step\n## pairaudit: REJECT")
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| Gate")
            and not line.startswith("| ---") and not line.startswith("| Dataset")]
    # one row per gate, per deviation (the built bracket runs the selectable win2-v1) and per dataset
    assert len(rows) == len(d["gates"]) + len(render.deviations(d)) + len(d["datasets"])
    assert "| quality:mbpp | FAIL | rejects |" in md


def test_verdict_as_a_process_exits_with_the_code(tmp_path):
    """The exit status a CI step sees, through ``python -m pairaudit.cli`` (what the console script calls)."""
    root, _ = audit_with(tmp_path, "HOLD")
    res = subprocess.run([sys.executable, "-m", "pairaudit.cli", "verdict", str(root)], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 3, res.stderr
    assert "pairaudit verdict: HOLD" in res.stdout


def test_default_audit_is_the_configs(tmp_path, monkeypatch, capsys):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("audit: audit-hold\n")
    root, _ = audit_with(tmp_path, "HOLD")
    monkeypatch.chdir(tmp_path)
    assert main(["verdict"]) == 3


def test_console_script_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["pairaudit"] == "pairaudit.cli:main"
    import importlib

    mod, _, fn = project["project"]["scripts"]["pairaudit"].partition(":")
    assert getattr(importlib.import_module(mod), fn) is main


# ------------------------------------------------------------------ size

def test_size_prints_the_exact_plan(capsys):
    assert main(["size", "--loss", "5", "--discordance", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "658 items" in out and str(sizing.items_needed(5, 0.2).items) == "658"
    assert main(["size", "--loss", "5", "--discordance", "0.2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["items"]
    assert plan["items"] == 658 and plan["alpha"] == 0.05 and plan["power"] == 0.8


def test_size_refuses_bad_input(capsys):
    assert main(["size", "--loss", "20", "--discordance", "0.1"]) == 2
    assert "discordance 0.1 is below the loss 0.2" in capsys.readouterr().err
    assert main(["size", "--loss", "5"]) == 2     # quality-v1's sizing needs a measured discordance
    assert "--loss needs --discordance or --calibration" in capsys.readouterr().err


def test_size_from_a_calibration_log(tmp_path, capsys):
    from pairaudit.core.artifacts import sha256_file
    from pairaudit.promotion import calibration

    summary = tmp_path / "results" / "a-calibration" / "promotion" / "calibration.json"
    write_json(summary, {"schema": "pairaudit.calibration/v1", "audit": "a-calibration", "of_audit": "a",
                         "quality": {"arith": {"n": 40, "discordant": 12}, "algebra": {"n": 40, "discordant": 1}}})
    log = tmp_path / "results" / "calibrations.jsonl"
    entry = calibration.CalibrationEntry(
        time="2026-12-01T00:00:00+00:00", audit="a-calibration", of_audit="a", control_spec_sha256="c" * 64,
        host={}, host_sha256="h" * 64, decision="PROMOTE", headline="nothing flagged", flagged=[],
        summary_path=str(summary), summary_sha256=sha256_file(summary), decision_path="d", decision_sha256="e")
    calibration.append(log, entry)
    assert main(["size", "--loss", "10", "--calibration", str(log)]) == 0
    out = capsys.readouterr().out
    arith = sizing.items_needed(10, 12 / 40).items          # 0.3 discordant
    algebra = sizing.items_needed(10, 0.1).items             # 1/40 raised to the loss
    assert "arith (12/40 discordant): a net loss of 10 points at discordance 0.3" in out and f"{arith} items" in out
    assert "algebra (1/40 discordant (raised to the loss))" in out and f"{algebra} items" in out
    # a summary replaced after the calibration is refused by the hash the log recorded
    write_json(summary, {"schema": "pairaudit.calibration/v1", "quality": {"arith": {"n": 40, "discordant": 0}}})
    assert main(["size", "--loss", "10", "--calibration", str(log)]) == 2
    assert "is not the" in capsys.readouterr().err


def test_the_workflow_ends_on_the_front_page_of_what_it_decided(tmp_path):
    """onsuccess: the decisions written since the run started are shown; when none was, the audit's own."""
    import os
    import time

    from pairaudit.cli import verdict

    old, _ = audit_with(tmp_path, "REJECT")
    new, _ = audit_with(tmp_path, "HOLD")
    started = time.time()
    os.utime(old / "promotion" / "decision.json", (started - 60, started - 60))
    os.utime(new / "promotion" / "decision.json", (started + 1, started + 1))
    page = verdict.after_run([old, new], started)
    assert page.startswith("pairaudit verdict: HOLD") and "REJECT" not in page.splitlines()[0]
    assert f"`pairaudit verdict {new}` prints this again and exits 3" in page
    # nothing decided in this run (all up to date): the first audit's standing decision
    assert verdict.after_run([old, new], started + 10).startswith("pairaudit verdict: REJECT")
    assert verdict.after_run([tmp_path / "results" / "none"], started) == ""


def test_size_for_the_margin_answers_with_the_rules_own_count(tmp_path, monkeypatch, capsys):
    """No --loss: quality-v2's items for the configured margin, at the discordance measured or a stated default."""
    from pairaudit.core.stats import noninferiority_items

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(
        "audit: a\ndatasets: [{name: x}, {name: y}]\nrules: {quality: {margin_pct: 5.0}}\n")
    assert main(["size"]) == 0
    out = capsys.readouterr().out
    want = noninferiority_items(0.05, 0.25, level=0.975)["items"]
    assert "rule out a loss of 5 points at 97.5 % per dataset (95 % over 2 dataset(s), Bonferroni)" in out
    assert "discordance from default 0.25" in out and f"about {want} items" in out
    # the last audit's observed discordance, per dataset, from the ledger's decision
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), candidate_only=(20,), neither=(21,))
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    write_json(tmp_path / "results" / "a" / "promotion" / "decision.json", d)
    (tmp_path / "results" / "ledger.jsonl").write_text(json.dumps(
        {"schema": "pairaudit.ledger/v1", "audit": "a", "calibration": False,
         "decision_path": "results/a/promotion/decision.json"}) + "\n")
    assert main(["size", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["discordance_source"].startswith("last audit a")
    assert doc["plans"]["mbpp"]["discordance"] == pytest.approx(1 / 12)
    assert doc["plans"]["mbpp"]["items"] == noninferiority_items(0.05, 1 / 12, level=0.975)["items"]
    assert main(["size", "--margin", "0"]) == 2
