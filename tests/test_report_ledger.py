"""The decision report's later parts: ledger, per-item outcomes, figures, HTML, "not run" sections."""

from __future__ import annotations

import json

import pytest
from test_report import PNG_MAGIC, _write_inputs, launch_rec, launches, passing_pair, preflights

from pairaudit.core import artifacts, jsonlog
from pairaudit.core.artifacts import ArtifactError, read_json, write_json, write_jsonl
from pairaudit.promotion import decision, figures, ledger, render
from pairaudit.promotion import stage as report

OUT_KEYS = ("out_decision", "out_report", "out_manifest", "out_plot", "out_html", "out_summary",
            "out_divergence_plot", "out_boundary", "out_speed_plot", "out_archive_plot")
NAMES = ("decision.json", "report.md", "manifest.json", "paired.png", "decision.html", "summary.rst",
         "divergence.png", "boundary.html", "speed.png", "control_archive.png")


def outputs(root):
    return {k: str(root / n) for k, n in zip(OUT_KEYS, NAMES)}


def score_files(root, pair, flip=None):
    """Per-item score files matching each paired doc (``flip``: (dataset, arm, index) made wrong)."""
    paths = []
    for ds, doc in pair.items():
        t = doc["table"]
        both = set(t["indices"]) - set(t["control_only"]) - set(t["candidate_only"])
        # both-correct vs neither is not stored per index in the table: rebuild from the counts
        both_idx = sorted(both)[: t["both_correct"]]
        for arm in ("control", "candidate"):
            own = set(t["control_only"] if arm == "control" else t["candidate_only"])
            recs = [{"kind": "record", "index": i, "correct": i in own or i in both_idx} for i in t["indices"]]
            if flip and flip[:2] == (ds, arm):
                for r in recs:
                    if r["index"] == flip[2]:
                        r["correct"] = not r["correct"]
            p = root / "scores" / ds / f"{arm}.jsonl"
            p.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(p, {"schema": "pairaudit.scores/v1", "dataset": ds, "arm": arm}, recs)
            paths.append(str(p))
    return paths


def test_item_outcomes_known_answer_and_disagreement():
    t = passing_pair()["mbpp"]["table"]
    both = sorted(set(t["indices"]) - {211, 273, 230})
    correct = {"control": {i: i in both or i == 211 for i in t["indices"]},
               "candidate": {i: i in both or i == 273 for i in t["indices"]}}
    out = figures.item_outcomes(t, correct)
    assert out[211] == "control only" and out[273] == "candidate only" and out[230] == "neither"
    assert all(out[i] == "both correct" for i in both)
    correct["candidate"][211] = True  # now 211 is both correct: the table says control only
    with pytest.raises(ArtifactError, match="disagree with the paired table"):
        figures.item_outcomes(t, correct)


def test_stage_writes_every_output_says_not_run_and_appends_the_ledger(tmp_path):
    pair = passing_pair()
    ins = _write_inputs(tmp_path / "in", pair, launches(), preflights())
    scores = score_files(tmp_path / "in", pair)
    ledger = tmp_path / "results" / "ledger.jsonl"
    outs = outputs(tmp_path / "a")
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs, score_paths=scores,
                           ledger_path=str(ledger), audit="a1", config={"audit": "a1", "x": 1})
    for k in OUT_KEYS:
        assert (tmp_path / "a" / NAMES[OUT_KEYS.index(k)]).stat().st_size > 0
    for k in ("out_plot", "out_divergence_plot", "out_speed_plot", "out_archive_plot"):
        assert open(outs[k], "rb").read(8) == PNG_MAGIC
    md = (tmp_path / "a" / "report.md").read_text()
    assert "## Speed (win2-v1)\n\nNot run" in md and "## Long-context boundary (boundary-v1)\n\nNot run" in md
    assert "None: this is the first decision" in md
    html = (tmp_path / "a" / "decision.html").read_text()
    assert 'data-decision="INCONCLUSIVE"' in html and "<table>" in html and "<li>" in html
    assert "| " not in html  # every pipe table became an HTML table
    assert "Not run" in (tmp_path / "a" / "boundary.html").read_text()
    assert ".. admonition:: Decision: INCONCLUSIVE" in (tmp_path / "a" / "summary.rst").read_text()
    d = read_json(outs["out_decision"])
    assert all(p in d["provenance"]["consumed"] for p in scores)
    listed = {e["path"] for e in read_json(outs["out_manifest"])["artifacts"]}
    assert {outs["out_html"], outs["out_speed_plot"], *scores} <= listed

    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert len(lines) == 1
    e = lines[0]
    assert e["decision"] == "INCONCLUSIVE" and e["audit"] == "a1"
    assert e["candidate"]["spec_sha256"] == launches()["candidate"]["spec_sha256"]
    assert e["inputs"] == d["provenance"]["consumed"]
    assert e["decision_sha256"] == artifacts.sha256_file(outs["out_decision"])

    # The same candidate decided again (another audit name, another config): listed as earlier, appended.
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outputs(tmp_path / "b"),
                           score_paths=scores, ledger_path=str(ledger), audit="a2", config={"audit": "a2"})
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert [x["audit"] for x in lines] == ["a1", "a2"] and lines[0] == e  # never rewritten
    assert lines[0]["config_sha256"] != lines[1]["config_sha256"]
    md = (tmp_path / "b" / "report.md").read_text()
    assert "1 earlier decision(s) for candidate spec" in md and "| a1 | INCONCLUSIVE |" in md

    # A different candidate does not see them.
    other = launches()
    other["candidate"] = launch_rec("candidate", {"SHARED": "1", "NEW": "1"}, spec="cd" * 32)
    ins2 = _write_inputs(tmp_path / "in2", pair, other, preflights())
    report.promotion_stage(ins2["paired"], ins2["launch"], ins2["preflight"], **outputs(tmp_path / "c"),
                           ledger_path=str(ledger), audit="a3")
    assert "None: this is the first decision" in (tmp_path / "c" / "report.md").read_text()
    assert len(ledger.read_text().splitlines()) == 3


def test_stale_score_file_is_refused(tmp_path):
    pair = passing_pair()
    # the paired doc records the hash of the score file it consumed
    scores = score_files(tmp_path / "in", pair)
    for ds, doc in pair.items():
        doc["provenance"] = {"consumed": {p: artifacts.sha256_file(p) for p in scores if f"/{ds}/" in p}}
    ins = _write_inputs(tmp_path / "in", pair, launches(), preflights())
    score_files(tmp_path / "in", pair, flip=("mbpp", "candidate", 211))
    with pytest.raises(ArtifactError, match="changed since it was consumed"):
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outputs(tmp_path / "o"),
                               score_paths=scores)
    assert not (tmp_path / "o" / "decision.json").exists()


def test_ledger_append_survives_a_cut_last_line(tmp_path):
    p = tmp_path / "ledger.jsonl"
    p.write_text('{"schema": "pairaudit.ledger/v1", "audit": "x", "candidate": {"spec_sha256": "s"}}\n{"cut')
    ledger.append_ledger(p, {"schema": "pairaudit.ledger/v1", "audit": "y", "candidate": {"spec_sha256": "s"}})
    rows = jsonlog.read_log(p)
    assert [r["audit"] for r in rows] == ["x", "y"]
    assert [r["audit"] for r in ledger.earlier_decisions(rows, "s")] == ["x", "y"]
    assert ledger.earlier_decisions(rows, "t") == []


def divergence_doc(ds, *, step=0.125, control_gap=0.05):
    top_c = [[198, -0.75], [2, -0.75 - control_gap], [7, -4.0]]
    top_k = [[2, -0.75], [198, -0.75], [7, -4.0]]
    return {"schema": "pairaudit.divergence/v1", "dataset": ds,
            "divergences": [{"index": 5, "diverged": True, "first_divergence": 12, "control_len": 40,
                             "candidate_len": 38, "control_token_id": 198, "candidate_token_id": 2},
                            {"index": 9, "diverged": False}],
            "probes": {"control": [{"index": 5, "top20": top_c}], "candidate": [{"index": 5, "top20": top_k}]},
            "grid_tie": {"rule": "grid-tie-v1", "verdict": "PASS", "reasons": [],
                         "probes": [{"index": 5, "step": step, "gap_in_steps": 0.0, "verdict": "PASS"}]}}


def test_divergence_points_margins_in_steps(tmp_path):
    rows = figures.divergence_points({"arith": divergence_doc("arith")})
    assert len(rows) == 1  # the concordant greedy item is not a divergence
    r = rows[0]
    assert (r["position"], r["index"], r["verdict"]) == (12, 5, "PASS")
    assert r["control_margin"] == pytest.approx(0.05) and r["candidate_margin"] == 0.0 and r["step"] == 0.125
    figures.plot_divergence({"arith": divergence_doc("arith")}, tmp_path / "d.png")
    assert (tmp_path / "d.png").read_bytes()[:8] == PNG_MAGIC
    none = divergence_doc("x")
    none["divergences"] = [{"index": 9, "diverged": False}]
    assert figures.plot_divergence({"x": none}, tmp_path / "n.png") == []
    assert (tmp_path / "n.png").read_bytes()[:8] == PNG_MAGIC


def speed_doc():
    # Shaped as pairaudit/speed.py documents pairaudit.speed_decision/v1.
    return {"schema": "pairaudit.speed_decision/v1", "audit": "a1",
            "gate": {"rule": "win2-v1", "verdict": "NO_WIN", "reasons": ["c1: gain 1.0 % <= 2 %"],
                     "cells": {"c1": "NO_WIN"}},
            "bar": {"win_pct": 2.0, "primary": "pooled_rate_tps", "lower_is_better": ["ms_per_round"]},
            "series": {"c1": {"pooled_rate_tps": [[10.0, 10.1, 10.0], [10.2, 10.3, 10.1], [9.9, 10.0, 10.0]]}},
            "win2": {"c1": {"verdict": "NO_WIN", "primary": {"point_gain_pct": 1.0}}},
            "spread": {"c1": {"window_pct": [0.0, None, 1.0], "window_max_pct": 1.0, "archive_pct": 3.1,
                              "archive_n": 3, "win_pct": 2.0, "config_hash": "h1",
                              "archive_with_window_pct": 3.1, "archive_with_window_n": 4}},
            "archive": {"path": None, "appended": 2},
            "bench_serve": {"c1": {"s2": {"completed": 3, "failed": 0, "output_throughput": 27.25,
                                          "ttft_ms": {"median": 120.04}, "tpot_ms": {"median": 36.7},
                                          "itl_ms": {"median": 36.5, "p99": 80.0}, "e2el_ms": {"median": 2431.2}}}}}


def test_speed_plot_section_and_archive(tmp_path):
    doc = speed_doc()
    figures.plot_speed(doc, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == PNG_MAGIC
    md = "\n".join(render.speed_markdown(doc))
    assert "Verdict: **NO_WIN**" in md and "| c1 | 1.0 | 3.1 | 3 | 2.0 |" in md
    # repeat 2: control mean (10.2 + 10.1) / 2 = 10.15, candidate 10.3 -> ratio 1.015, spread 0.1 / 10.15
    assert "| c1 | 2 | 10.200 | 10.300 | 10.100 | 10.150 | 1.015 | 1.0 % |" in md
    assert "| c1 | s2 | 3 | 0 | 27.25 | 120.0 | 36.7 | 36.50 | 80.0 | 2431 |" in md
    archive = [{"audit": a, "cell": "c1", "config_hash": h, "metrics": {"pooled_rate_tps": v}} for a, v, h in
               (("old", 9.8, "h1"), ("old", None, "h1"), ("other", 50.0, "h2"), ("a1", 10.0, "h1"))]
    assert [a["audit"] for a in figures.archive_rows(doc, archive)["c1"]] == ["old", "a1"]
    figures.plot_control_archive(doc, archive, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG_MAGIC
    figures.plot_control_archive(doc, archive[1:3], tmp_path / "none.png")  # nothing comparable: "not run"
    assert (tmp_path / "none.png").read_bytes()[:8] == PNG_MAGIC


def test_markdown_html_escapes_and_keeps_code():
    html = render.markdown_html("# T <x>\n\n| a | `b\\|c` |\n| --- | --- |\n| **1** | <script> |\n\n- item `<y>`\n",
                                title="t", verdict="REJECT")
    assert "<h1 id=\"t-x\">T &lt;x&gt;</h1>" in html and "<th>a</th>" in html and "<code>b|c</code>" in html
    assert "<strong>1</strong>" in html and "&lt;script&gt;" in html and "<script>" not in html
    assert "<li>item <code>&lt;y&gt;</code></li>" in html and 'data-decision="REJECT"' in html


def test_boundary_section_sets_the_arms_side_by_side(tmp_path):
    # Shaped as pairaudit/boundary.py documents pairaudit.boundary_gate/v1.
    def side(text, correct, finish="stop"):
        return {"text": text, "finish_reason": finish, "correct": correct, "prompt_tokens": 1008, "max_tokens": 16,
                "ttft_s": 2.5 if correct else None}
    doc = {"schema": "pairaudit.boundary_gate/v1",
           "gate": {"rule": "boundary-v1", "verdict": "FAIL", "reasons": ["candidate tail-16 wrong"]},
           "max_model_len": {"control": 1024, "candidate": 1024},
           "cases": [{"case": "tail-16", "expected": "173 9", "identical_text": False,
                      "control": side("173 9", True), "candidate": side("17 | 9", False, "length")},
                     {"case": "tail-32", "expected": "5", "identical_text": None, "control": side("5", True),
                      "candidate": None}],
           "first_long": {"control": {"case": "tail-16", "prompt_tokens": 1008, "ttft_s": 2.5,
                                      "input_tokens_per_s": 403.2}, "candidate": None}}
    write_json(tmp_path / "g.json", doc)
    md = "\n".join(render.boundary_markdown(read_json(tmp_path / "g.json")))
    assert "Verdict: **FAIL**" in md and "candidate tail-16 wrong" in md
    assert ("| tail-16 | `173 9` | `173 9` | True | stop | 1008 + 16 | 2.500 | `17 \\| 9` | False | length | "
            "1008 + 16 | n/a | False |") in md
    assert "| tail-32 | `5` | `5` | True | stop | 1008 + 16 | 2.500 | not run |  |  |  |  | None |" in md
    assert "control: first long request (tail-16, 1008 tokens) TTFT 2.500 s, 403.2 input tokens/s" in md
    html = render.markdown_html(md, title="b")
    assert "<td><code>17 | 9</code></td>" in html


def test_decision_json_carries_every_boundary_case_and_the_speed_table(tmp_path):
    b = {"schema": "pairaudit.boundary_gate/v1", "gate": None, "cases": [{"case": "tail-16", "planted": [173, 9], "expected": "173 9", "identical_text": False,
                    "control": {"text": "173, 9.", "correct": True, "finish_reason": "stop", "ttft_s": 2.5,
                                "prompt_tokens": 1008, "max_tokens": 16, "error_body": "x"},
                    "candidate": None}]}
    ev = decision.boundary_evidence(b)
    assert ev[0]["case"] == "tail-16" and ev[0]["planted"] == [173, 9] and ev[0]["candidate"] is None
    assert ev[0]["control"]["ttft_s"] == 2.5 and ev[0]["control"]["finish_reason"] == "stop"
    assert "error_body" not in ev[0]["control"]  # the full record stays in boundary/gate.json
    assert decision.boundary_evidence(None) is None and decision.speed_evidence(None) is None
    sp = decision.speed_evidence(speed_doc())
    assert sp["primary"] == "pooled_rate_tps" and sp["win_pct"] == 2.0
    assert sp["cells"]["c1"]["verdict"] == "NO_WIN" and sp["cells"]["c1"]["point_gain_pct"] == 1.0
    assert sp["cells"]["c1"]["repeats_s1_s2_s3"][1] == [10.2, 10.3, 10.1]
