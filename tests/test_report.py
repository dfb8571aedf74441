"""Tests for the promotion: the decision (decision.py), the report (render.py), the manifest.

Paired docs are built through the real stats.paired_table and gates.quality_v1,
later gates through the real rules, so the decision is exercised on the same
shapes the workflow produces.
"""

import copy
import hashlib
import json

import pytest

from pairaudit.core.artifacts import ArtifactError, read_json, sha256_file, write_json
from pairaudit.core.stats import paired_bootstrap_ci, paired_table
from pairaudit.gates.boundary import boundary_v1
from pairaudit.gates.determinism import determinism_v1
from pairaudit.gates.grid_tie import grid_tie_v1
from pairaudit.gates.quality import quality_v1, quality_v2
from pairaudit.gates.speed import win2_v1
from pairaudit.promotion import decision, figures, render
from pairaudit.promotion import stage as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ builders

def paired_doc(name, *, control_only=(), candidate_only=(), both=(), neither=(), fmt="gsm8k",
               body_bad=(), unnatural_candidate=(), same_text=(), rule="quality-v2"):
    """A pairaudit.paired/v1 doc whose items have exactly the given outcomes, judged by ``rule``."""
    groups = [set(control_only), set(candidate_only), set(both), set(neither)]
    assert sum(map(len, groups)) == len(set().union(*groups)), "an item has two outcomes"
    idx = sorted(set().union(*groups))
    cs, ks, cr, kr = [], [], [], []
    for i in idx:
        a = i in control_only or i in both
        b = i in candidate_only or i in both
        text_c = f"answer {i}"
        text_k = text_c if i in same_text else f"other {i}"
        cs.append({"index": i, "correct": a, "answered": True, "finish_reason": "stop", "text": text_c})
        ks.append({"index": i, "correct": b, "answered": True,
                   "finish_reason": "length" if i in unnatural_candidate else "stop", "text": text_k})
        cr.append({"index": i, "body_sha256": f"h{i}", "response": {}, "error": None})
        kr.append({"index": i, "body_sha256": f"x{i}" if i in body_bad else f"h{i}", "response": {}, "error": None})
    table = paired_table(cs, ks, cr, kr)
    return {"schema": "pairaudit.paired/v1", "dataset": name, "format": fmt, "table": table,
            "quality": quality_v1(table) if rule == "quality-v1" else quality_v2(table),
            "bootstrap": paired_bootstrap_ci([c["correct"] for c in cs], [k["correct"] for k in ks],
                                             n_boot=200, seed=1),
            "provenance": {}}


def passing_pair():
    """Two datasets large enough for quality-v2 to rule out its 3-point margin (Tango bound 1.3 and 1.5 points)."""
    return {
        "gsm8k": paired_doc("gsm8k", both=range(0, 300), neither=(300, 301), same_text=(0, 1, 2)),
        "mbpp": paired_doc("mbpp", fmt="mbpp", both=range(1000, 1300), control_only=(211,),
                           candidate_only=(273,), neither=(230,)),
    }


def launch_rec(arm, env, *, model="tiny-instruct", spec=None):
    return {"schema": "pairaudit.launch/v1", "arm": arm, "mode": "launch",
            "command": ["{python}", "-m", "pairaudit.refserver", "--port", "{port}"],
            "command_identity": ["{python}", "-m", "pairaudit.refserver", "--port", "{port}"],
            "env": env, "model": model, "served_model_name": model, "max_model_len": 2048,
            "host": "127.0.0.1", "port": 0, "url": None, "speculative": False,
            "model_sha256": "ab" * 32, "packages": {"python": "3.12"},
            "machine": {"hostname": "node1", "platform": "linux", "cpu_count": 4, "accelerators": []},
            "identity": {}, "spec_sha256": spec or hashlib.sha256(arm.encode()).hexdigest(),
            "run": {"pid": 1, "port": 1234}}


def launches():
    return {"control": launch_rec("control", {"PAIRAUDIT_REF_BF16_HEAD": "0", "PAIRAUDIT_REF_NGRAM": "0",
                                              "SHARED": "1"}),
            "candidate": launch_rec("candidate", {"SHARED": "1"})}


def preflight_doc(arm, verdict="PASS"):
    probes = [{"name": "health", "pass": True, "reason": "ok"},
              {"name": "completion_logprobs20", "pass": verdict == "PASS",
               "reason": "ok" if verdict == "PASS" else "only 5 logprobs returned"}]
    return {"schema": "pairaudit.preflight/v1", "arm": arm, "verdict": verdict,
            "failed_probe": None if verdict == "PASS" else "completion_logprobs20", "probes": probes}


def preflights(control="PASS", candidate="PASS"):
    return {"control": preflight_doc("control", control), "candidate": preflight_doc("candidate", candidate)}


def passing_later(datasets):
    return {
        # Greedy compared each dataset's discordant items and two concordant ones; none diverged.
        "divergence": {ds: grid_tie_v1([], selected=4, compared=4) for ds in datasets},
        "determinism": {ds: determinism_v1({"control": ["a", "a", "a"], "candidate": ["b", "b", "b"]})
                        for ds in datasets},
        "boundary": boundary_v1([
            {"arm": arm, "case": case, "correct": True, "finish_reason": "stop", "expected": "173", "text": "173"}
            for arm in ("control", "candidate") for case in ("retrieval-0.5", "tail-16", "tail-32")]),
        "speed": win2_v1({"output_tok_s": [[100.0, 110.0, 100.0], [101.0, 111.5, 100.0], [100.0, 110.2, 101.0]]},
                         primary="output_tok_s"),
    }


# ------------------------------------------------------------------ gates

def test_gates_from_lists_unbuilt_gates_as_none():
    g = decision.gates_from(passing_pair())
    # grid-tie is one audit-wide gate: its cap counts every dataset's divergences together
    assert list(g) == ["quality:gsm8k", "quality:mbpp", "grid_tie", "determinism", "boundary", "speed"]
    assert g["quality:gsm8k"]["verdict"] == "PASS"
    assert all(g[k] is None for k in ("grid_tie", "determinism", "boundary", "speed"))


def test_gates_from_per_dataset_determinism_and_missing_divergence():
    later = passing_later(["gsm8k"])  # mbpp's divergence never ran
    g = decision.gates_from(passing_pair(), **later)
    # one dataset's divergence missing: the audit's grid-tie names it and cannot pass
    assert g["grid_tie"]["verdict"] == "INCONCLUSIVE" and g["grid_tie"]["not_evaluated_datasets"] == ["mbpp"]
    assert g["grid_tie"]["datasets"]["gsm8k"]["recorded_verdict"] == "PASS"
    assert g["determinism:gsm8k"]["verdict"] == "PASS" and g["determinism:mbpp"] is None
    assert "determinism" not in g


def test_gates_from_rejects_wrong_rule_and_unknown_dataset():
    later = passing_later(["gsm8k", "mbpp"])
    with pytest.raises(ValueError, match="boundary-v1"):
        decision.gates_from(passing_pair(), boundary=later["speed"])
    with pytest.raises(ValueError, match="without a paired result"):
        decision.gates_from(passing_pair(), divergence={"math": grid_tie_v1([])})


def test_tampered_quality_verdict_is_an_error():
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=range(20, 28))  # a real FAIL
    assert pair["mbpp"]["quality"]["verdict"] == "FAIL"
    pair["mbpp"]["quality"]["verdict"] = "PASS"
    with pytest.raises(ValueError, match="disagrees"):
        decision.gates_from(pair)


def test_quality_with_registered_deviation_is_recomputed_with_its_params():
    doc = paired_doc("mbpp", both=range(10), control_only=(20,))
    doc["quality"] = quality_v1(doc["table"], max_net_loss=1)  # a declared, visible deviation
    g = decision.gates_from({"mbpp": doc})
    assert g["quality:mbpp"]["verdict"] == "PASS"
    d = decision.decide({"mbpp": doc}, launches(), preflights())
    assert d["gates"]["quality:mbpp"]["deviations"] == {"max_net_loss": {"registered": 0, "used": 1}}


# ------------------------------------------------------------------ decide

def test_all_quality_pass_without_later_gates_is_inconclusive_never_promote():
    d = decision.decide(passing_pair(), launches(), preflights())
    assert d["schema"] == "pairaudit.decision/v1" and d["rule"] == "promotion-v1"
    assert d["decision"] == "INCONCLUSIVE"
    assert d["not_evaluated"] == ["grid_tie", "determinism", "boundary", "speed"]
    assert set(d["deciding_gates"]) == set(d["not_evaluated"])
    assert any(r == "speed: not evaluated" for r in d["reasons"])
    json.dumps(d)  # plain JSON


def test_every_gate_passing_promotes():
    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    assert d["decision"] == "PROMOTE", d["reasons"]
    assert d["not_evaluated"] == []
    assert d["gates"]["speed"]["verdict"] == "WIN" and d["gates"]["speed"]["point_gain_pct"] > 2
    assert d["gates"]["preflight:candidate"]["outcome"] == "PROMOTE"


def test_one_fail_rejects_even_with_a_failed_preflight():
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=range(20, 28))  # p = 2/256
    d = decision.decide(pair, launches(), preflights(candidate="FAIL"), **passing_later(pair))
    assert d["decision"] == "REJECT"
    assert d["deciding_gates"] == ["quality:mbpp"]
    assert d["datasets"]["mbpp"]["verdict"] == "FAIL"
    assert d["datasets"]["mbpp"]["control_only"] == list(range(20, 28))
    assert d["datasets"]["mbpp"]["mcnemar_p"] == pytest.approx(2 / 256)


def test_hold_holds():
    pair = passing_pair()
    # quality-v1 (selectable): an unresolved loss holds
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=(20, 21), rule="quality-v1")  # p = 0.5
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    assert d["decision"] == "HOLD"
    assert d["deciding_gates"] == ["quality:mbpp"]
    assert {"gate": "quality:mbpp", "what": "rule"} == {k: d["deviations"][0][k] for k in ("gate", "what")}


def test_an_unresolved_loss_is_inconclusive_under_quality_v2_with_the_items_that_would_resolve_it():
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=(20, 21))  # 12 items, p = 0.5
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    assert d["decision"] == "INCONCLUSIVE" and d["deciding_gates"] == ["quality:mbpp"]
    ds = d["datasets"]["mbpp"]
    assert ds["verdict"] == "INCONCLUSIVE" and ds["loss_bound"]["ruled_out"] is False
    assert ds["needed"] > 12
    assert d["gates"]["quality:mbpp"]["reasons"][0].startswith(
        f"cannot rule out a loss of {ds['loss_bound']['upper_pct']:.1f} points with 12 items; about {ds['needed']} "
        "items would")
    assert d["deviations"] == []


def test_invalid_is_inconclusive_even_when_everything_else_passes():
    pair = passing_pair()
    pair["gsm8k"] = paired_doc("gsm8k", both=range(10), body_bad=(3,))
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    assert d["datasets"]["gsm8k"]["verdict"] == "INVALID"
    assert d["decision"] == "INCONCLUSIVE"
    assert d["deciding_gates"] == ["quality:gsm8k"]


def test_failed_preflight_makes_otherwise_passing_evidence_inconclusive():
    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights(control="FAIL"), **passing_later(pair))
    assert d["decision"] == "INCONCLUSIVE"
    assert d["deciding_gates"] == ["preflight:control"]
    assert d["preflight"] == {"control": "FAIL", "candidate": "PASS"}
    g = d["gates"]["preflight:control"]
    assert g["stage_verdict"] == "FAIL" and g["failed_probe"] == "completion_logprobs20"
    assert "only 5 logprobs" in g["reasons"][0]


def test_missing_preflight_is_not_evaluated():
    pair = passing_pair()
    d = decision.decide(pair, launches(), {"control": preflight_doc("control")}, **passing_later(pair))
    assert d["decision"] == "INCONCLUSIVE"
    assert d["not_evaluated"] == ["preflight:candidate"]


def test_decide_needs_both_launch_receipts():
    with pytest.raises(ValueError, match="launch receipts"):
        decision.decide(passing_pair(), {"control": launches()["control"]}, preflights())


def test_arms_and_switch_diff():
    d = decision.decide(passing_pair(), launches(), preflights())
    assert d["switch_diff"] == [{"name": "PAIRAUDIT_REF_BF16_HEAD", "control": "0", "candidate": None},
                                {"name": "PAIRAUDIT_REF_NGRAM", "control": "0", "candidate": None}]
    assert d["arms"]["control"]["spec_sha256"] == launches()["control"]["spec_sha256"]
    assert d["arms"]["candidate"]["preflight"] == "PASS"
    assert d["notes"] == []


def test_notes_flag_different_models_and_identical_specs():
    la = launches()
    la["candidate"] = launch_rec("candidate", {}, model="other-model", spec=la["control"]["spec_sha256"])
    d = decision.decide(passing_pair(), la, preflights())
    assert any("model differs" in n for n in d["notes"])
    assert any("same spec_sha256" in n for n in d["notes"])


# ------------------------------------------------------------------ markdown

def test_render_markdown_has_decision_reasons_indices_and_switches():
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", fmt="mbpp", both=range(100, 120), control_only=(211, 244),
                              candidate_only=(273,), neither=(230,), unnatural_candidate=(230,))
    d = decision.decide(pair, launches(), preflights())
    md = render.render_markdown(d, pair, launches(), preflights())
    assert md.startswith("# pairaudit decision: INCONCLUSIVE\n\n> **INCONCLUSIVE** — deciding gates: quality:mbpp")
    # Every reason of every gate is in the details; a gate's verdict is never relabelled as a decision.
    for g in d["gates"].values():
        for r in (g or {}).get("reasons", []):
            assert "- " + r.replace("|", "\\|") in md
    assert "-> PROMOTE" not in md and "-> HOLD" not in md
    # The front page: one row per gate (verdict, effect, first reason, link to details and artifact).
    front = md[:md.index("## Details")]
    assert ("| quality:mbpp | INVALID | incomplete | candidate did not finish naturally at indices [230] | "
            "[details](#gate-qualitymbpp) · `paired/mbpp.json` |") in front
    assert "| quality:gsm8k | PASS | no objection | loss >= 1.3 points ruled out at 97.5 %" in front
    assert "| speed | not evaluated | incomplete | its stage produced no result |" in front
    assert "### Gate quality:mbpp" in md  # the anchor the link points to
    # The campaign-report row: counts, discordant indices, McNemar p, natural finishes, verdict.
    assert ("| mbpp | 22/24 | 21/24 | indices 211, 244 | index 273 | 1 | 24/24, 23/24 | 0/24 | quality-v2 INVALID |"
            in front)
    assert "**Total** | 322/326 | 321/326 | 2 | 1 |  | 326/326, 325/326 | 3/326 |" in front
    # how the per-dataset bounds hold together over the audit
    assert "**Over the datasets:** each dataset's loss bound is at 97.5 % (Bonferroni over 2 dataset(s))" in front
    assert "candidate did not finish naturally: index 230" in md
    assert "`PAIRAUDIT_REF_BF16_HEAD` | `0` | (unset: server default)" in md
    assert "Not evaluated: grid_tie, determinism, boundary, speed" in front
    assert "strict-extractor miss stays a miss" in md
    # gates not applied are loosenings the front page shows, one row each
    assert "> **Deviations**" in front
    assert "> | speed | not evaluated | its stage did not run or is disabled" in front


def test_front_page_shows_the_deviations_box_when_listed():
    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights())
    d["deviations"] = [{"gate": "quality:gsm8k", "what": "max_tokens", "detail": "used 64, registered 512"}]
    md = render.render_markdown(d, pair, launches(), preflights())
    front = md[:md.index("## Gates")]
    assert "> **Deviations**" in front and "> | quality:gsm8k | max_tokens | used 64, registered 512 |" in front
    html = render.markdown_html(md, title="t", verdict=d["decision"])
    notice = html[html.index('<div class="box notice">'):]
    assert notice.index("<td>max_tokens</td>") < notice.index("</div>")
    assert html.index('class="box banner"') < html.index('class="box notice"') < html.index('id="gates"')


def test_html_front_page_links_land_on_their_gate():
    import re
    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    html = render.markdown_html(render.render_markdown(d, pair, launches(), preflights()), title="t",
                                verdict=d["decision"])
    targets = re.findall(r'<a href="#([^"]+)">details</a>', html)
    assert len(targets) == len(d["gates"])
    for t in targets:
        assert f'id="{t}"' in html, t
    assert '<div id="decision" data-decision="PROMOTE">Decision: PROMOTE</div>' in html
    assert "-&gt; PROMOTE" not in html and "-> PROMOTE" not in html


def test_summary_rst_is_a_banner_and_two_tables_that_docutils_renders():
    from docutils.core import publish_parts
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=range(20, 28))
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    d["deviations"] = [{"gate": "speed", "what": "repeats", "detail": "2 instead of 3"}]
    rst = render.summary_rst(d, [{"audit": "old", "decision": "HOLD"}])
    assert "-> PROMOTE" not in rst
    # The category targets exist in report/workflow.rst; stand-ins here so docutils resolves them.
    targets = "".join(f"\n\n.. _{c}:\n\n{c}\n{'-' * len(c)}\n\ntext"
                      for c in ("1. Decision", "2. Quality", "3. Greedy divergence", "4. Boundary", "5. Speed"))
    out = publish_parts(rst + targets, writer="html",
                        settings_overrides={"report_level": 2, "halt_level": 2})["html_body"]
    assert "Decision: REJECT" in out and "pairaudit-decision" in out
    assert "Deviations" in out and "2 instead of 3" in out
    assert "<td>quality:mbpp</td>" in out.replace("<p>", "").replace("</p>", "")
    assert "indices 20, 21, 22, 23, 24, 25, 26, 27" in out
    assert "old: HOLD" in out


def test_render_markdown_keeps_outranked_gates_visible():
    # REJECT outranks a failed preflight, but the report must still show it.
    pair = passing_pair()
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=range(20, 28))
    pre = preflights(candidate="FAIL")
    d = decision.decide(pair, launches(), pre, **passing_later(pair))
    md = render.render_markdown(d, pair, launches(), pre)
    assert md.startswith("# pairaudit decision: REJECT")
    assert "> **REJECT** — deciding gates: quality:mbpp." in md
    assert "> Also short of PROMOTE: preflight:candidate (INCONCLUSIVE)." in md
    assert "| preflight:candidate | INCONCLUSIVE (stage FAIL) | incomplete |" in md
    assert "| candidate | FAIL | completion_logprobs20 | 1/2 | only 5 logprobs returned |" in md


def test_render_markdown_lists_provenance_when_present():
    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights())
    d["provenance"] = {"consumed": {"results/a/paired/gsm8k.json": "f" * 64}, "code_version": "c" * 64,
                       "created_at": "2026-01-01T00:00:00+00:00"}
    md = render.render_markdown(d, pair, launches(), preflights())
    assert "`results/a/paired/gsm8k.json` | `" + "f" * 64 + "`" in md


# ------------------------------------------------------------------ manifest, plot

def test_manifest_hashes_sizes_and_order(tmp_path):
    b, a = tmp_path / "b.json", tmp_path / "a.txt"
    b.write_bytes(b'{"x": 1}\n')
    a.write_bytes(b"hello")
    m = report.manifest([str(b), str(a), str(b)])
    assert m["schema"] == "pairaudit.manifest/v1"
    assert [e["path"] for e in m["artifacts"]] == [str(a), str(b)]
    assert m["artifacts"][0] == {"path": str(a), "sha256": hashlib.sha256(b"hello").hexdigest(), "bytes": 5}
    a.write_bytes(b"hellO")
    m2 = report.manifest([str(a), str(b)])
    assert m2["artifacts"][0]["sha256"] != m["artifacts"][0]["sha256"]
    assert m2["artifacts"][1] == m["artifacts"][1]


def test_plot_is_a_png(tmp_path):
    out = tmp_path / "plots" / "paired.png"
    figures.plot_paired(passing_pair(), out)
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_paired_counts_sum_to_n():
    t = passing_pair()["mbpp"]["table"]
    c = figures.paired_counts(t)
    assert c == {"both correct": 300, "control only": 1, "candidate only": 1, "neither": 1}
    assert sum(c.values()) == t["n"]


# ------------------------------------------------------------------ stage end to end

def _write_inputs(root, pair, la, pre):
    paths = {"paired": [], "launch": [], "preflight": []}
    for ds, doc in pair.items():
        p = root / "paired" / f"{ds}.json"
        write_json(p, doc)
        paths["paired"].append(str(p))
    for kind, docs in (("launch", la), ("preflight", pre)):
        for arm, doc in docs.items():
            p = root / kind / f"{arm}.json"
            write_json(p, doc)
            paths[kind].append(str(p))
    return paths


def test_promotion_stage_end_to_end(tmp_path):
    pair = passing_pair()
    ins = _write_inputs(tmp_path / "in", pair, launches(), preflights())
    out = tmp_path / "out"
    outs = {k: str(out / n) for k, n in (("out_decision", "decision.json"), ("out_report", "report.md"),
                                         ("out_manifest", "manifest.json"), ("out_plot", "paired.png"))}
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], **outs)

    d = read_json(outs["out_decision"])
    assert d["decision"] == "INCONCLUSIVE"
    inputs = ins["paired"] + ins["launch"] + ins["preflight"]
    assert d["provenance"]["consumed"] == {p: sha256_file(p) for p in inputs}
    md = (out / "report.md").read_text()
    assert "# pairaudit decision: INCONCLUSIVE" in md and "index 273" in md
    assert (out / "paired.png").read_bytes()[:8] == PNG_MAGIC

    m = read_json(outs["out_manifest"])
    listed = [e["path"] for e in m["artifacts"]]
    assert listed == sorted(inputs + [outs["out_decision"], outs["out_report"], outs["out_plot"]])
    assert outs["out_manifest"] not in listed
    for e in m["artifacts"]:
        assert e["sha256"] == sha256_file(e["path"])


def test_promotion_stage_reads_later_stages_and_promotes(tmp_path):
    pair = passing_pair()
    ins = _write_inputs(tmp_path / "in", pair, launches(), preflights())
    lg = passing_later(pair)
    div = []
    for ds in pair:
        p = tmp_path / "in" / "divergence" / f"{ds}.json"
        write_json(p, {"schema": "pairaudit.divergence/v1", "dataset": ds, "divergences": [],
                       "grid_tie": lg["divergence"][ds], "determinism": lg["determinism"][ds]})
        div.append(str(p))
    bp, sp = tmp_path / "in" / "boundary_gate.json", tmp_path / "in" / "speed_decision.json"
    write_json(bp, {"schema": "pairaudit.boundary_gate/v1", "gate": lg["boundary"]})
    write_json(sp, {"schema": "pairaudit.speed_decision/v1", "gate": lg["speed"]})
    out = tmp_path / "out"
    report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], out / "d.json", out / "r.md",
                           out / "m.json", out / "p.png",
                           later={"divergence": div, "boundary": str(bp), "speed": str(sp)})
    d = read_json(out / "d.json")
    assert d["decision"] == "PROMOTE", d["reasons"]
    assert str(bp) in d["provenance"]["consumed"] and div[0] in d["provenance"]["consumed"]
    assert str(sp) in [e["path"] for e in read_json(out / "m.json")["artifacts"]]


def test_promotion_stage_checks_schemas_and_duplicates(tmp_path):
    pair = passing_pair()
    ins = _write_inputs(tmp_path / "in", pair, launches(), preflights())
    outs = [tmp_path / "o" / n for n in ("d.json", "r.md", "m.json", "p.png")]
    bad = copy.deepcopy(pair["gsm8k"])
    bad["schema"] = "pairaudit.paired/v0"
    write_json(ins["paired"][0], bad)
    with pytest.raises(ArtifactError, match="expected 'pairaudit.paired/v1'"):
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], *outs)
    write_json(ins["paired"][0], pair["gsm8k"])
    with pytest.raises(ArtifactError, match="second artifact"):
        report.promotion_stage(ins["paired"] + ins["paired"][:1], ins["launch"], ins["preflight"], *outs)
    assert not (tmp_path / "o" / "d.json").exists()  # nothing written on a bad input


# ------------------------------------------------------------------ decision integrity
#
# Known-answer cases for the paths that used to PROMOTE by accident.

def one_step_flip(index):
    """A divergence that passes every grid-tie clause: a full, unrounded top-20 on a 0.125 grid."""
    import numpy as np
    top = [[k, float(np.float32(-1 / 3 - 0.125 * k))] for k in range(20)]
    return {"index": index, "candidate_token_id": 0, "control_token_id": 1, "candidate_top": top,
            "control_top": top, "control_prefix_len": 30, "candidate_prefix_len": 30}


def test_three_datasets_with_three_passing_flips_each_hold():
    pair = {ds: paired_doc(ds, both=range(100, 600), control_only=(20, 21, 22), candidate_only=(23, 24, 25))
            for ds in ("a", "b", "c")}
    assert all(doc["quality"]["verdict"] == "PASS" for doc in pair.values())
    later = passing_later(pair)
    later["divergence"] = {ds: grid_tie_v1([one_step_flip(i) for i in (20, 21, 22)], selected=8, compared=8)
                           for ds in pair}
    assert all(r["verdict"] == "PASS" for r in later["divergence"].values())
    d = decision.decide(pair, launches(), preflights(), **later)
    assert d["decision"] == "HOLD" and d["deciding_gates"] == ["grid_tie"]
    g = d["gates"]["grid_tie"]
    assert g["verdict"] == "STOP" and g["failed_clauses"] == ["at_most_3_divergent"]
    assert g["n_divergent"] == 9 and g["selected"] == 24 and g["compared"] == 24
    assert g["probe_verdicts"] == {f"{ds}:{i}": "PASS" for ds in pair for i in (20, 21, 22)}
    # one flip per dataset is three over the audit: PROMOTE
    later["divergence"] = {ds: grid_tie_v1([one_step_flip(20)], selected=8, compared=8) for ds in pair}
    assert decision.decide(pair, launches(), preflights(), **later)["decision"] == "PROMOTE"


def test_an_empty_greedy_selection_cannot_pass_grid_tie():
    pair = passing_pair()
    later = passing_later(pair)
    later["divergence"] = {ds: grid_tie_v1([], selected=0, compared=0) for ds in pair}
    d = decision.decide(pair, launches(), preflights(), **later)
    assert d["decision"] == "INCONCLUSIVE" and d["deciding_gates"] == ["grid_tie"]
    g = d["gates"]["grid_tie"]
    assert g["verdict"] == "INCONCLUSIVE" and (g["selected"], g["compared"]) == (0, 0)
    assert any("nothing compared: 0 items selected, 0 compared over 2 dataset(s)" in r for r in g["reasons"])


def test_identical_arms_are_no_change_under_audit_except_in_calibration():
    pair = passing_pair()
    la = launches()
    la["candidate"] = launch_rec("candidate", la["control"]["env"], spec=la["control"]["spec_sha256"])
    d = decision.decide(pair, la, preflights(), **passing_later(pair))
    assert d["identical_arms"] is True and d["calibration"] is False
    assert d["decision"] == "INCONCLUSIVE" and d["gate_verdict"] == "PROMOTE"
    assert d["reasons"][0].startswith("no change under audit")
    assert d["deciding_gates"] == ["arms"]
    assert {"gate": "promotion", "what": "no change under audit",
            "detail": "identical arms: the decision is INCONCLUSIVE whatever the gates say"} in d["deviations"]
    cal = decision.decide(pair, la, preflights(), calibration=True, **passing_later(pair))
    assert cal["decision"] == "PROMOTE" and cal["calibration"] is True and cal["deciding_gates"] != ["arms"]
    assert [x["what"] for x in cal["deviations"]] == ["calibration"]
    # different arms: nothing changes
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    assert d["decision"] == "PROMOTE" and d["identical_arms"] is False and d["deviations"] == []
    with pytest.raises(TypeError):
        decision.decide(pair, la, preflights(), calibration="yes")


def test_informational_speed_and_looser_parameters_are_listed_as_deviations():
    pair = passing_pair()
    later = passing_later(pair)
    flat = win2_v1({"output_tok_s": [[100.0, 100.5, 100.0], [101.0, 100.0, 100.0], [100.0, 101.0, 101.0]]},
                   primary="output_tok_s")
    assert flat["verdict"] == "NO_WIN"
    later["speed"] = {**flat, "informational": True}
    pair["mbpp"] = paired_doc("mbpp", both=range(10), control_only=(20,))
    pair["mbpp"]["quality"] = quality_v1(pair["mbpp"]["table"], max_net_loss=1)
    d = decision.decide(pair, launches(), preflights(), **later)
    assert d["decision"] == "PROMOTE"  # informational NO_WIN still does not block: but it is visible
    assert d["deviations"] == [
        {"gate": "quality:mbpp", "what": "parameter max_net_loss", "detail": "used 1, registered 0"},
        {"gate": "quality:mbpp", "what": "rule",
         "detail": "rules.quality.rule quality-v1 instead of the default quality-v2 (quality-v1 passes any net >= 0, "
                   "so a table too small to see a loss passes as if it had ruled one out)"},
        {"gate": "speed", "what": "informational",
         "detail": "configured informational (speed.informational: true): only a LOSS of this gate gates the "
                   "decision; its verdict NO_WIN neither allowed nor blocked PROMOTE"},
    ]
    json.dumps(d["deviations"])


def test_gates_not_evaluated_and_partial_gates_are_deviations():
    pair = passing_pair()
    later = passing_later(pair)
    del later["speed"]
    later["divergence"] = {"gsm8k": later["divergence"]["gsm8k"]}
    d = decision.decide(pair, launches(), preflights(), **later)
    assert d["decision"] == "INCONCLUSIVE"
    whats = {(x["gate"], x["what"]) for x in d["deviations"]}
    assert whats == {("speed", "not evaluated"), ("grid_tie", "datasets not evaluated")}


def test_a_boundary_pass_without_the_capacity_tail_is_not_the_gate():
    pair = passing_pair()
    later = passing_later(pair)
    later["boundary"] = boundary_v1([
        {"arm": arm, "case": case, "correct": True, "finish_reason": "stop", "expected": "173", "text": "173"}
        for arm in ("control", "candidate") for case in ("retrieval-0.5", "tail-32")])
    assert later["boundary"]["verdict"] == "PASS"
    d = decision.decide(pair, launches(), preflights(), **later)
    assert d["decision"] == "INCONCLUSIVE" and d["deciding_gates"] == ["boundary"]
    g = d["gates"]["boundary"]
    assert g["verdict"] == "INCONCLUSIVE" and g["stage_verdict"] == "PASS" and g["missing_cases"] == ["tail-16"]
    assert g["reasons"][0].startswith("boundary-v1 not applied in full")
    assert any(x["gate"] == "boundary" and x["what"] == "required cases missing" for x in d["deviations"])
    # a FAIL without the tail stays a FAIL
    later["boundary"] = boundary_v1([{"arm": "candidate", "case": "tail-32", "correct": False,
                                      "finish_reason": "stop", "expected": "1", "text": "2"}])
    assert decision.decide(pair, launches(), preflights(), **later)["decision"] == "REJECT"


def test_every_paired_table_states_its_minimum_detectable_loss():
    pair = passing_pair()
    d = decision.decide(pair, launches(), preflights(), **passing_later(pair))
    for ds, doc in pair.items():
        m = d["datasets"][ds]["mde"]
        assert m == doc["quality"]["mde"] and m["n"] == doc["table"]["n"]
        assert d["gates"][f"quality:{ds}"]["mde"] == m
        assert any(r.startswith("detectable:") for r in d["gates"][f"quality:{ds}"]["reasons"])
    # a paired doc written before the field existed gets it from the same rule
    old = copy.deepcopy(pair)
    for doc in old.values():
        del doc["quality"]["mde"]
        doc["quality"]["reasons"] = doc["quality"]["reasons"][:-1]
    d2 = decision.decide(old, launches(), preflights(), **passing_later(old))
    assert d2["datasets"]["mbpp"]["mde"] == d["datasets"]["mbpp"]["mde"]


def test_promotion_stage_counts_compared_items_from_the_divergence_artifact(tmp_path):
    pair = passing_pair()
    ins = _write_inputs(tmp_path / "in", pair, launches(), preflights())
    lg = passing_later(pair)

    def run(items, divergences, name):
        div = []
        for ds in pair:
            p = tmp_path / name / f"{ds}.json"
            # a per-dataset record without counts (as the divergence stage wrote it before they existed)
            write_json(p, {"schema": "pairaudit.divergence/v1", "dataset": ds, "items": items,
                           "divergences": divergences, "grid_tie": grid_tie_v1([]),
                           "determinism": lg["determinism"][ds]})
            div.append(str(p))
        bp, sp = tmp_path / name / "boundary_gate.json", tmp_path / name / "speed_decision.json"
        write_json(bp, {"schema": "pairaudit.boundary_gate/v1", "gate": lg["boundary"]})
        write_json(sp, {"schema": "pairaudit.speed_decision/v1", "gate": lg["speed"]})
        out = tmp_path / name / "out"
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], out / "d.json", out / "r.md",
                               out / "m.json", out / "p.png",
                               later={"divergence": div, "boundary": str(bp), "speed": str(sp)})
        return read_json(out / "d.json")

    d = run([3, 7], [{"index": 3, "diverged": False}, {"index": 7, "diverged": False}], "two")
    assert d["decision"] == "PROMOTE", d["reasons"]
    assert (d["gates"]["grid_tie"]["selected"], d["gates"]["grid_tie"]["compared"]) == (4, 4)
    assert d["provenance"]["params"]["calibration"] is False
    d = run([], [], "none")
    assert d["decision"] == "INCONCLUSIVE" and d["deciding_gates"] == ["grid_tie"]
