"""The report people read: Markdown, its HTML page and the Snakemake-report RST block.

Pure functions on the artifacts' records (``core.readers``: decision.json as
``DecisionDoc``, the stages' artifacts as theirs; a JSON dict given instead is
read through its record): the paired tables are shown as the paired stage made
them, nothing is adjusted.

The HTML report's items (``promotion_stage``'s optional outputs): the report
as one HTML page (``markdown_html``), the front-page block ``summary.rst``
(included by ``report/workflow.rst``), the paired-outcomes figure (per item
when score files are given), divergence positions and top-2 margins in grid
steps, the boundary cases side by side, speed per repeat with the bracket
and the win bar, and the control archive. A stage without an artifact gets a
"not run" figure and section; nothing crashes on its absence.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from markdown_it import MarkdownIt

from pairaudit import gates
from pairaudit.core.contracts import (
    ARMS,
    BOUNDARY_GATE_SCHEMA,
    DIVERGENCE_SCHEMA,
    PAIRED_SCHEMA,
    PATHS,
    PREFLIGHT_SCHEMA,
    SPEED_DECISION_SCHEMA,
    Decision,
)
from pairaudit.core.readers import (
    BoundaryGateDoc,
    DecisionDoc,
    GateEntry,
    LedgerLine,
    LossFacts,
    Paired,
    Preflight,
    SpeedDecisionDoc,
    as_record,
)
from pairaudit.promotion.decision import check_decision_word
from pairaudit.timeplan.actual import PlannedActual

NOT_ADJUSTED = (
    "Nothing is adjusted. Scores are the scorer's strict verdicts: a strict-extractor miss stays a "
    "miss, no diagnostic or rerun replaces a primary answer or score, and a net difference whose "
    "McNemar p is above alpha is an unresolved difference, not evidence of equivalence. The "
    "measured differences are kept visible above."
)


# --------------------------------------------------------------- markdown

def _cell(v: Any) -> str:
    """One Markdown table cell: pipes and newlines would break the row."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def _code(v: Any) -> str:
    return "`" + _cell(v).replace("`", "'") + "`"


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _idx(xs: Sequence[int] | None) -> str:
    xs = list(xs or [])
    if not xs:
        return "none"
    return ("index " if len(xs) == 1 else "indices ") + ", ".join(str(x) for x in xs)


def _p(p: Any) -> str:
    return "n/a" if p is None else f"{p:.4g}"


def _cmd(c: Any) -> str:
    if isinstance(c, (list, tuple)):
        return " ".join(str(x) for x in c)
    return "(attach)" if c is None else str(c)


# --------------------------------------------------------------- front page

# What a gate's outcome does to the decision, in words: the gate's own verdict
# (PASS, STOP, WIN ...) is shown beside it, never re-labelled as a decision.
_EFFECT = {"PROMOTE": "no objection", "REJECT": "rejects", "HOLD": "holds", "INCONCLUSIVE": "incomplete",
           "INFORMATIONAL": "informational only"}
REASON_CHARS = 140  # one line in a table cell; the gate's details keep every reason in full


def slug(text: str) -> str:
    """The anchor GitHub and markdown_html give a heading: lowercase, punctuation dropped, spaces -> '-'."""
    import re

    return re.sub(r"[^a-z0-9 _-]", "", text.strip().lower()).replace(" ", "-")


def _gate_heading(name: str) -> str:
    return f"Gate {name}"


def _one_line(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def decision_doc(decision: DecisionDoc | Mapping[str, Any]) -> DecisionDoc:
    """decision.json as its record (``core.readers.DecisionDoc``): every reader below reads it through this."""
    out = as_record(DecisionDoc, decision, where="decision")
    assert out is not None
    return out


def _evidence_path(kind: str, ds: str) -> str | None:
    # grid-tie judges the whole audit: its evidence is every dataset's divergence file
    divergence = PATHS[DIVERGENCE_SCHEMA].format(dataset=ds) if ds else PATHS[DIVERGENCE_SCHEMA].partition("{")[0]
    evidence = {"quality": PATHS[PAIRED_SCHEMA].format(dataset=ds), "grid_tie": divergence,
                "determinism": divergence, "boundary": PATHS[BOUNDARY_GATE_SCHEMA],
                "speed": PATHS[SPEED_DECISION_SCHEMA], "preflight": PATHS[PREFLIGHT_SCHEMA].format(arm=ds)}
    return evidence[kind] if kind in evidence else None


def gate_rows(decision: DecisionDoc | Mapping[str, Any]) -> list[dict]:
    """One row per gate for the front page: name, verdict, effect, first reason, evidence artifact."""
    rows = []
    for name, g in decision_doc(decision).gates.items():
        kind, _, ds = name.partition(":")
        evidence = _evidence_path(kind, ds)
        if g is None:
            rows.append({"gate": name, "verdict": "not evaluated", "effect": _EFFECT["INCONCLUSIVE"],
                         "reason": "its stage produced no result", "evidence": evidence})
            continue
        verdict = g.verdict or "?"
        if g.stage_verdict not in (None, verdict):
            verdict += f" (stage {g.stage_verdict})"
        rows.append({"gate": name, "verdict": verdict, "effect": _effect(g.outcome),
                     "reason": _one_line(_headline(g)), "evidence": evidence})
    return rows


def _effect(outcome: str | None) -> str | None:
    return _EFFECT[outcome] if outcome in _EFFECT else outcome


def _headline(g: GateEntry) -> str:
    """The reason that explains the gate's verdict: for a flagged determinism gate, a flagged arm's line
    (its first line may be the other arm's clean repeats); otherwise the first reason."""
    reasons = [str(r) for r in g.reasons]
    if not reasons:
        return "(no reason recorded)"
    flagged = g.nondeterministic_arms or []
    if g.rule in gates.rules_of("determinism") and flagged:
        return next((r for r in reasons if r.split(":", 1)[0] in flagged), reasons[0])
    return reasons[0]


def deviations(decision: DecisionDoc | Mapping[str, Any]) -> list[dict]:
    """decision.json's ``deviations`` ({gate, what, detail})."""
    return [{"gate": d.gate, "what": d.what, "detail": d.detail} for d in decision_doc(decision).deviations]


def loss_text(q: Mapping[str, Any]) -> str:
    """What one dataset's quality gate says about the candidate's loss, in a few words.

    ``q``: a quality rule result or decision.json's dataset summary. quality-v2:
    which loss it ruled out, or which it could not and the items that would;
    quality-v1 rules nothing out, so its detectable loss is shown instead.
    """
    facts = LossFacts.from_json(q, where="quality result")
    bound, needed, mde = facts.loss_bound, facts.needed, facts.mde
    if bound is not None and bound.upper_pct is not None:
        level = f"{100 * float(bound.level or 0):.4g} %"
        if bound.ruled_out:
            return f"loss >= {bound.upper_pct:.1f} points ruled out at {level}"
        items = needed["items"] if isinstance(needed, Mapping) else needed
        more = f"; about {items} items would" if items else ""
        return (f"cannot rule out a loss of {bound.upper_pct:.1f} points at {level} (margin "
                f"{bound.margin_pct:g}){more}")
    if mde is None or not mde.raw:
        return "n/a"
    if mde.net_loss is None:
        return "no loss ruled out; the table cannot show one"
    return f"no loss ruled out; detectable >= {mde.net_loss} items ({100 * (mde.rate or 0):.1f} %)"


def multiplicity_line(decision: DecisionDoc | Mapping[str, Any]) -> str | None:
    """decision.json's multiplicity statement, or None when no quality-v2 gate decided."""
    m = decision_doc(decision).multiplicity
    return str(m["statement"]) if m and "statement" in m and m["statement"] else None


def _also_short(doc: DecisionDoc) -> list[str]:
    # Gates that also fall short of PROMOTE but are outranked by the decision:
    # a reader must see them too (fixing the deciding gate does not clear them).
    return [f"{n} ({'not evaluated' if g is None else g.outcome})" for n, g in doc.gates.items()
            if n not in doc.deciding_gates and (g is None or g.outcome != "PROMOTE")]


def _banner(doc: DecisionDoc) -> list[str]:
    others = _also_short(doc)
    line = (f"> **{doc.decision}** — deciding gates: {', '.join(doc.deciding_gates) or 'none'}. "
            f"Rule {doc.rule}: PROMOTE only if every gate passes; precedence REJECT > HOLD > "
            f"INCONCLUSIVE > PROMOTE.")
    out = [line]
    if others:
        out += [">", "> Also short of PROMOTE: " + ", ".join(others) + "."]
    return out


def _deviations_box(doc: DecisionDoc) -> list[str]:
    if not doc.deviations:
        return []
    out = ["> **Deviations** from the registered procedure (they do not change a score; read them before the "
           "verdict):", ">", "> " + _row(["Gate", "what", "detail"]), "> " + _row(["---"] * 3)]
    out += ["> " + _row([_cell(d.gate), _cell(d.what), _cell(d.detail)]) for d in doc.deviations]
    return out


def calibration_line(decision: DecisionDoc | Mapping[str, Any], summary: Mapping[str, Any] | None = None) -> str:
    """The front page's calibration line: the calibration this decision cites, or that there is none.

    ``summary``: this decision's own calibration summary (a calibration run),
    whose headline comes first; the cited one is then the previous one.
    """
    doc = decision_doc(decision)
    ctrl = doc.arms["control"]
    host = (ctrl.machine or {}).get("hostname")
    ref = doc.calibration_ref
    which = "previous calibration" if summary is not None else "latest calibration"
    if ref:
        cited = (f"The {which} of this control on this host: {ref.headline} ({ref.time}, "
                 f"{_code(ref.path)}, sha256 {_code(str(ref.sha256)[:12])}); it does not change "
                 "the decision.")
    else:
        cited = (f"No {'earlier ' if summary is not None else ''}calibration of this control on this host "
                 f"(control spec {_code(str(ctrl.spec_sha256)[:12])}, host {_code(host)})"
                 + ("." if summary is not None else ": `snakemake --cores 4 calibrate` runs one."))
    if summary is None:
        return cited
    return f"This decision is the A/A calibration of audit {_code(summary['of_audit'])}: {summary['headline']}. " + cited


def calibration_markdown(summary: Mapping[str, Any] | None) -> list[str]:
    """The calibration run's section: what every gate flagged on A vs A, with the host's noise beside."""
    if summary is None:
        return []
    out = ["## A/A calibration", "", f"**{_cell(summary['headline'])}.** Control and candidate are the same server "
           f"spec ({_code(str(summary['control_spec_sha256'])[:12])}) on host {_code(summary['host']['hostname'])}: "
           "every gate that flags something here is a false alarm of this host and this control.", ""]
    out += [f"- {_cell(f)}" for f in summary["findings"]]
    out += [f"- note: {_cell(n)}" for n in summary["notes"]]
    out += ["", _row(["Gate", "verdict", "expected on A vs A", "flagged", "reason"]), _row(["---"] * 5)]
    for name, g in summary["gates"].items():
        out.append(_row([_cell(name), _cell(g["verdict"] or "not evaluated"), _cell("/".join(g["expected"] or []) or "-"),
                         "**yes**" if g["flagged"] else "no", _cell(_one_line(g["reason"]))]))
    sp = summary["speed"]
    if sp:
        out += ["", f"Speed ({sp['rule']}, bar {sp['win_pct']} %): {sp['verdict']}, pooled gain "
                f"{_num(sp['pooled_gain_pct'], 2)} %.", "",
                _row(["cell", "in-window control spread per repeat %", "max %", "archive spread before %",
                      "archive starts", "archive spread with this window %"]), _row(["---"] * 6)]
        for cell, c in sp["cells"].items():
            w = c["window_pct"]
            out.append(_row([_cell(cell), ", ".join(_num(x, 1) for x in (w if isinstance(w, list) else [w])),
                             _num(c["window_max_pct"], 1), _num(c["archive_pct"], 1),
                             _cell(c["archive_n"]), _num(c["archive_with_window_pct"], 1)]))
    out += ["", _row(["Dataset", "n", "control-only", "candidate-only", "McNemar p", "exact text matches",
                      "quality"]), _row(["---"] * 7)]
    for ds, q in summary["quality"].items():
        out.append(_row([_cell(ds), _cell(q["n"]), _idx(q["control_only"]), _idx(q["candidate_only"]),
                         _p(q["mcnemar_p"]), _cell(q["exact_text_matches"]), _cell(q["verdict"])]))
    if summary["greedy"]:
        out += ["", _row(["Dataset", "greedy selected", "compared", "diverged (server against itself)",
                          gates.default_rule("determinism").name]), _row(["---"] * 5)]
        for ds, g in summary["greedy"].items():
            out.append(_row([_cell(ds), _cell(g["selected"]), _cell(g["compared"]), _idx(g["diverged"]),
                             _cell(g["determinism"])]))
    b = summary["boundary"]
    out += ["", "Boundary: " + ("not run" if b is None else
                                f"{b['verdict']} over cases {_cell(b['cases'])}; control failures "
                                f"{_cell([f['case'] if isinstance(f, Mapping) else f for f in b['control_failures'] or []])}")
            + ". Preflight: " + ", ".join(f"{a} {v}" for a, v in summary["preflight"].items())
            + f". Servers: {summary['servers']}."]
    return out


def _gates_table(decision: DecisionDoc) -> list[str]:
    out = ["## Gates", "", _row(["Gate", "verdict", "effect on the decision", "reason", "evidence"]),
           _row(["---"] * 5)]
    for r in gate_rows(decision):
        link = f"[details](#{slug(_gate_heading(r['gate']))})"
        ev = link + (f" · {_code(r['evidence'])}" if r["evidence"] else "")
        out.append(_row([_cell(r["gate"]), _cell(r["verdict"]), r["effect"], _cell(r["reason"]), ev]))
    ne = decision.not_evaluated
    out += ["", (f"Not evaluated: {', '.join(ne)} (incomplete evidence: the decision cannot be PROMOTE)."
                 if ne else "Every gate was evaluated.")]
    return out


def _change_lines(change: Mapping[str, Any] | None) -> list[str]:
    """The change form's named change and its switches (nothing for a config that states two arms)."""
    if not change:
        return []
    what = f" ({change['description']})" if change["description"] else ""
    out = ["", f"### The change: {_code(change['name'])}{what}", "",
           "The control is the server with every switch at its rollback value, the candidate with every switch "
           "on; the arms differ in nothing else.", "",
           _row(["Switch", "kind", "control (rollback)", "candidate (on)"]), _row(["---"] * 4)]
    for s in change["switches"]:
        out.append(_row([_code(s["name"]), s["kind"] + (", speculative" if s["speculative"] else ""),
                         _code(s["rollback"]), _code(s["on"])]))
    if not change["receipts_agree"]:
        out += ["", "**The launch receipts do not show this change:** " + "; ".join(change["receipt_problems"])]
    return out


def _arms_section(decision: DecisionDoc) -> list[str]:
    c, k = decision.arms["control"], decision.arms["candidate"]
    out = ["## Arms", "", _row(["", "control (OFF)", "candidate (ON)"]), _row(["---"] * 3)]
    for label, key in (("mode", "mode"), ("model", "model"), ("served model name", "served_model_name"),
                       ("model sha256", "model_sha256"), ("max_model_len", "max_model_len"),
                       ("speculative", "speculative"), ("spec sha256", "spec_sha256"),
                       ("preflight", "preflight")):
        out.append(_row([label, _cell(getattr(c, key)), _cell(getattr(k, key))]))
    out.append(_row(["command", _code(_cmd(c.command) if c.mode != "attach" else c.url),
                     _code(_cmd(k.command) if k.mode != "attach" else k.url)]))
    out += _change_lines(decision.change)
    out += ["", "### Environment switches that differ", ""]
    diff = decision.switch_diff
    if not diff:
        out.append("None: both arms set the same environment switches.")
    else:
        out += [_row(["Switch", "control", "candidate"]), _row(["---"] * 3)]
        unset = "(unset: server default)"
        for d in diff:
            out.append(_row([_code(d["name"]),
                             unset if d["control"] is None else _code(d["control"]),
                             unset if d["candidate"] is None else _code(d["candidate"])]))
    c_env, k_env = c.env or {}, k.env or {}
    same = sorted(set(c_env) & set(k_env) - {d["name"] for d in diff})
    if same:
        out += ["", "Set identically in both arms: " + ", ".join(f"{_code(s)}={_code(c_env[s])}" for s in same)]
    for note in decision.notes:
        out += ["", f"**Note:** {note}"]
    return out


def _preflight_section(preflight: Mapping[str, Preflight | Mapping[str, Any] | None]) -> list[str]:
    out = ["## Preflight", "", _row(["Arm", "verdict", "failed probe", "probes passed", "reason"]),
           _row(["---"] * 5)]
    for arm in ARMS:
        doc = as_record(Preflight, preflight[arm] if arm in preflight else None, where=f"preflight {arm}")
        if doc is None:
            out.append(_row([arm, "not run", "", "", ""]))
            continue
        probes, failed = doc.probes, doc.failed_probe
        why = next((p.reason for p in probes if p.name == failed), "") if failed else ""
        out.append(_row([arm, doc.verdict, _cell(failed or ""),
                         f"{sum(p.passed for p in probes)}/{len(probes)}", _cell(why or "")]))
    return out


def _papers(paired: Mapping[str, Paired | Mapping[str, Any]]) -> dict[str, Paired]:
    return {ds: p for ds in sorted(paired) for p in [as_record(Paired, paired[ds], where=f"paired {ds}")]
            if p is not None}


def _paired_section(paired: Mapping[str, Paired | Mapping[str, Any]]) -> list[str]:
    head = ["Dataset", "control", "candidate", "control-only correct", "candidate-only correct",
            "McNemar p", "natural finish (control, candidate)", "exact text matches", "quality", "loss"]
    out = ["## Paired results", "", _row(head), _row(["---"] * len(head))]
    tot = {"n": 0, "c": 0, "k": 0, "co": 0, "ko": 0, "x": 0, "fc": 0, "fk": 0}
    papers = _papers(paired)
    for ds, doc in papers.items():
        t, q = doc.table, doc.quality
        n = t.n
        nf = {arm: t.natural_finish[arm] if arm in t.natural_finish else None for arm in ARMS}
        out.append(_row([_cell(ds), f"{t.control_correct}/{n}", f"{t.candidate_correct}/{n}",
                         _idx(t.control_only), _idx(t.candidate_only), _p(q.mcnemar_p),
                         f"{nf['control']}/{n}, {nf['candidate']}/{n}",
                         f"{t.exact_text_matches}/{n}", f"{q.rule} {q.verdict}",
                         _cell(loss_text(q.raw))]))
        for key, v in (("n", n), ("c", t.control_correct), ("k", t.candidate_correct),
                       ("co", len(t.control_only)), ("ko", len(t.candidate_only)),
                       ("x", t.exact_text_matches or 0), ("fc", nf["control"] or 0),
                       ("fk", nf["candidate"] or 0)):
            tot[key] += v
    if len(paired) > 1:
        # Counts only: a pooled McNemar p over datasets is not a registered rule.
        out.append(_row(["**Total**", f"{tot['c']}/{tot['n']}", f"{tot['k']}/{tot['n']}", tot["co"], tot["ko"],
                         "", f"{tot['fc']}/{tot['n']}, {tot['fk']}/{tot['n']}", f"{tot['x']}/{tot['n']}", "", ""]))
    out.append("")
    bad = [ds for ds, doc in papers.items() if not doc.table.bodies_identical]
    out.append("All paired request bodies match." if not bad else
               "Request bodies differ between arms for: " + ", ".join(bad) + " (the quality rule is INVALID there).")
    out.append("")
    for ds, doc in papers.items():
        b = doc.bootstrap
        if b:
            out.append(f"- {ds}: paired bootstrap of accuracy(candidate) - accuracy(control) = {b['diff']:+.4f}, "
                       f"{int(b['level'] * 100)} % interval [{b['lo']:+.4f}, {b['hi']:+.4f}] "
                       f"(n_boot {b['n_boot']}, seed {b['seed']}); reported only, it does not decide.")
    return out


def _indices_section(paired: Mapping[str, Paired | Mapping[str, Any]]) -> list[str]:
    out = ["## Item indices", ""]
    for ds, doc in _papers(paired).items():
        t = doc.table
        out.append(f"### {ds} ({doc.format}, n={t.n})")
        out.append("")
        out.append(f"- items: {', '.join(map(str, t.indices)) or 'none'}")
        out.append(f"- control-only correct: {_idx(t.control_only)}")
        out.append(f"- candidate-only correct: {_idx(t.candidate_only)}")
        out.append(f"- exact text matches: {_idx(t.exact_text_match_indices)}")
        out.append(f"- request body mismatches: {_idx(t.body_mismatch_indices)}")
        for per, what in ((t.unnatural_finish_indices, "did not finish naturally"),
                          (t.unanswered_indices, "unanswered"), (t.error_indices, "transport/HTTP error")):
            for arm in ARMS:
                if arm in per and per[arm]:
                    out.append(f"- {arm} {what}: {_idx(per[arm])}")
        out.append("")
    return out


def _gate_details(decision: DecisionDoc) -> list[str]:
    """Every reason of every gate, one heading each (the front page's evidence links land here)."""
    out = ["## Gate details", ""]
    for name, g in decision.gates.items():
        out += [f"### {_gate_heading(name)}", ""]
        if g is None:
            out += ["Not evaluated: its stage produced no result. A gate that was not evaluated counts as "
                    "incomplete evidence: the decision cannot be PROMOTE.", ""]
            continue
        out.append(f"Rule {g.rule}, verdict **{g.verdict}**"
                   + (f" (stage {g.stage_verdict})" if g.stage_verdict not in (None, g.verdict) else "")
                   + f"; effect on the decision: {_effect(g.outcome)}.")
        out.append("")
        out += [f"- {_cell(r)}" for r in g.reasons] or ["- (no reasons recorded)"]
        for k, d in g.deviations.items():   # gates.common.registered_params: {registered, used}
            out.append(f"- deviation: {k} = {d['used']!r} (registered {d['registered']!r})")
        out.append("")
    return out


def render_markdown(decision: Decision, paired: Mapping[str, Paired | Mapping[str, Any]],
                    launch: Mapping[str, Any],
                    preflight: Mapping[str, Preflight | Mapping[str, Any] | None],
                    calibration_summary: Mapping[str, Any] | None = None) -> str:
    """The report people read: a front page read at a glance, then the details.

    Front page: the decision as a banner (with the deciding gates and every
    other gate short of PROMOTE), a "Deviations" box when decision.json lists
    any, one table row per gate (verdict, its effect on the decision, its first
    reason, a link to its details and its artifact), and the paired table per
    dataset, with the calibration line (calibration_line) above the gates.
    Below: arms, preflight, item indices, every reason of every gate.

    ``launch`` is accepted for symmetry with decide(); the arms section reads
    the summary decide() already took from it, so the report and
    decision.json cannot disagree about an arm.
    """
    del launch  # see docstring
    check_decision_word(decision)  # a decision word its own gates do not give is never rendered
    doc = decision_doc(decision)
    out = [f"# pairaudit decision: {doc.decision}", ""] + _banner(doc) + [""]
    box = _deviations_box(doc)
    if box:
        out += box + [""]
    out += [f"**Calibration:** {calibration_line(doc, calibration_summary)}", ""]
    out += _gates_table(doc) + [""]
    out += _paired_section(paired) + [""]
    if multiplicity_line(doc):
        out += [f"**Over the datasets:** {_cell(multiplicity_line(doc))}.", ""]
    out += ["## Details", "",
            "Below: [arms and switches](#arms), [preflight](#preflight), [item indices](#item-indices), "
            "[every reason of every gate](#gate-details), [what is not adjusted](#what-is-not-adjusted), "
            "then the boundary cases, the speed bracket and earlier decisions.", ""]
    out += _arms_section(doc) + [""]
    out += _preflight_section(preflight) + [""]
    out += _indices_section(paired)
    out += _gate_details(doc)
    out += ["## What is not adjusted", "", NOT_ADJUSTED, ""]
    prov = doc.provenance
    if prov:   # artifacts.provenance: consumed, code_version, created_at
        out += ["## Inputs", "", _row(["path", "sha256"]), _row(["---"] * 2)]
        out += [_row([_code(p), _code(h)]) for p, h in sorted(prov["consumed"].items())]
        out += ["", f"Code version {_code(prov['code_version'])}, created {prov['created_at']}.", ""]
    return "\n".join(out)


def code_judging_markdown(counts: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[str]:
    """Code answers per dataset and arm, by where they were judged (``quality.split.judged_counts``)."""
    if not counts:
        return []
    out = ["## Code answers: where they were judged", "",
           _row(["Dataset", "arm", "outside the sandbox (split)", "inside the sandbox"]), _row(["---"] * 4)]
    for ds in sorted(counts):
        for arm in ARMS:
            if arm in counts[ds]:
                out.append(_row([_cell(ds), arm, counts[ds][arm]["split"], counts[ds][arm]["in_sandbox"]]))
    return out + ["", "A test that splits runs only its call in the sandbox and is compared here; a score judged "
                      "inside the sandbox is one the program could forge (docs/sandbox.md).", ""]


def boundary_markdown(doc: BoundaryGateDoc | Mapping[str, Any] | None) -> list[str]:
    """Boundary cases side by side (control | candidate), from the boundary gate artifact.

    Reads ``cases: [{"case", "expected", "identical_text", "control": side,
    "candidate": side}]`` as pairaudit/boundary/cases.py documents it, through
    ``readers.BoundaryGateDoc``.
    """
    out = [f"## Long-context boundary ({gates.default_rule('boundary').name})", ""]
    if doc is None:
        return out + ["Not run: the boundary stage has not produced `boundary/gate.json` for this audit, so the "
                      "boundary gate is not evaluated (the decision cannot be PROMOTE)."]
    b = as_record(BoundaryGateDoc, doc, where="boundary gate")
    assert b is not None
    gate = b.gate
    out += [f"Verdict: **{None if gate is None else gate.verdict}**", ""]
    out += [f"- {_cell(r)}" for r in ([] if gate is None else gate.reasons)]
    mml = b.max_model_len
    if mml:
        out += ["", "max_model_len: " + ", ".join(f"{arm} {mml[arm] if arm in mml else None}" for arm in ARMS)]
    cases = b.cases
    if cases:
        def side(c: Any, arm: str) -> list[str]:
            s = getattr(c, arm)
            if s is None:
                return ["not run", "", "", "", ""]
            text = s.text or s.config_error or s.error or "(no text)"
            return [_code(str(text)[:120]), _cell(s.correct), _cell(s.finish_reason),
                    _cell(f"{s.prompt_tokens} + {s.max_tokens}"), _num(s.ttft_s)]

        head = ["case", "expected"] + [f"{arm} {f}" for arm in ARMS
                                       for f in ("answer", "correct", "finish", "tokens in + out", "TTFT s")]
        head += ["same text"]
        out += ["", _row(head), _row(["---"] * len(head))]
        for c in cases:
            out.append(_row([_cell(c.case), _code(c.expected)] + side(c, "control")
                            + side(c, "candidate") + [_cell(c.identical_text)]))
    longs = [(arm, fl) for arm, fl in b.first_long.items() if fl is not None and fl.ttft_s is not None]
    if longs:
        out.append("")
    for arm, fl in longs:
        out.append(f"- {arm}: first long request ({fl.case}, {fl.prompt_tokens} tokens) "
                   f"TTFT {fl.ttft_s:.3f} s, {fl.input_tokens_per_s or 0:.1f} input tokens/s")
    return out


def _num(v: Any, digits: int = 3) -> str:
    return "n/a" if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:.{digits}f}"


def _speed_repeat_rows(doc: SpeedDecisionDoc, primary: str) -> list[str]:
    """Per cell and repeat: every start's primary metric (controls at odd starts), the control mean, the ratio."""
    series = {cell: m[primary] if primary in m else [] for cell, m in (doc.series or {}).items()}
    n = max((len(trio) for reps in series.values() for trio in reps), default=3)
    heads = [f"s{k + 1} {'control' if k % 2 == 0 else 'candidate'} {primary}" for k in range(n)]
    out = [_row(["cell", "repeat", *heads, "control mean", "candidate / control", "control spread / control"]),
           _row(["---"] * (n + 5))]
    for cell, reps in series.items():
        for r, vals in enumerate(reps, start=1):
            vals = (list(vals) + [None] * n)[:n]
            nums = all(isinstance(v, (int, float)) for v in vals)
            ctrl = sum(vals[0::2]) / len(vals[0::2]) if nums else None
            cand = sum(vals[1::2]) / len(vals[1::2]) if nums else None
            ratio = cand / ctrl if nums and ctrl else None
            spread = (max(vals[0::2]) - min(vals[0::2])) / ctrl if nums and ctrl else None
            out.append(_row([_cell(cell), r, *(_num(v) for v in vals), _num(ctrl), _num(ratio),
                             "n/a" if spread is None else f"{100 * spread:.1f} %"]))
    return out


def _speed_bench_rows(doc: SpeedDecisionDoc) -> list[str]:
    """`vllm bench serve`'s summary per cell and start (medians; ITL is per streamed chunk, not per token)."""
    head = ["cell", "start", "completed", "failed", "output tok/s", "median TTFT ms", "median TPOT ms",
            "median ITL ms", "p99 ITL ms", "median E2EL ms"]
    out = [_row(head), _row(["---"] * len(head))]
    for cell, starts in doc.bench_serve.items():
        for start, b in starts.items():
            if b is None:
                continue
            out.append(_row([_cell(cell), _cell(start), _cell(b.completed), _cell(b.failed),
                             _num(b.output_throughput, 2), _num(b.ttft_ms.median, 1), _num(b.tpot_ms.median, 1),
                             _num(b.itl_ms.median, 2), _num(b.itl_ms.p99, 1), _num(b.e2el_ms.median, 0)]))
    return out


def _ungated_speed_rule() -> gates.Rule:
    """The rule a speed section with no gate is shown under: a decision that records none combined its cells
    the per-cell way (``speed.decision.combine``), that of the registered speed rule that decides each cell on
    its own."""
    return next(gates.REGISTERED[n] for n in gates.rules_of("speed") if not gates.REGISTERED[n].pooled)


def speed_markdown(doc: SpeedDecisionDoc | Mapping[str, Any] | None) -> list[str]:
    out = [f"## Speed ({_ungated_speed_rule().name})", ""]
    speed = as_record(SpeedDecisionDoc, doc, where="speed decision")
    if speed is None:
        return out + ["Not run: the speed stage has not produced `speed/decision.json` for this audit, so the "
                      "speed gate is not evaluated (the decision cannot be PROMOTE)."]
    gate = speed.gate
    out[0] = f"## Speed ({(None if gate is None else gate.rule) or _ungated_speed_rule().name})"
    out += [f"Verdict: **{None if gate is None else gate.verdict}**" + (" (informational: only a LOSS gates)"
                                                                         if gate and gate.informational else ""), ""]
    out += [f"- {_cell(r)}" for r in ([] if gate is None else gate.reasons)]
    spread = speed.spread or {}
    if spread:
        out += ["", _row(["cell", "in-window control spread (max %)", "archive spread before this window %",
                          "archive starts", "win bar %"]), _row(["---"] * 5)]
        for cell, sp in spread.items():
            w = sp.window_pct
            vals = [v for v in (w if isinstance(w, list) else [w]) if isinstance(v, (int, float))]
            # A repeat without a value (no rounds measured) has no spread: not zero, just absent.
            wmax = sp.window_max_pct if "window_max_pct" in sp.raw else (max(vals) if vals else None)
            out.append(_row([_cell(cell), _num(wmax, 1), _num(sp.archive_pct, 1),
                             _cell(sp.archive_n), _cell(sp.win_pct)]))
    primary = speed.primary
    if primary and speed.series:
        # the registered rule's own wording; a decision without a gate was made by the per-cell combination
        spec = _ungated_speed_rule() if gate is None else gates.rule(gate.rule, "speed")
        how = spec.need("compares")
        out += ["", f"Primary metric `{primary}` per repeat ({how}):", ""]
        out += _speed_repeat_rows(speed, primary)
    if speed.bench_serve:
        out += ["", "Client timings per start, as `vllm bench serve` reports them:", ""] + _speed_bench_rows(speed)
    return out


def ledger_markdown(earlier: Sequence[Mapping[str, Any]], spec: str | None) -> list[str]:
    out = ["## Earlier decisions for this candidate", ""]
    if not earlier:
        return out + [f"None: this is the first decision recorded in the ledger for candidate spec {_code(spec)}."]
    out += [f"{len(earlier)} earlier decision(s) for candidate spec {_code(spec)} — a sweep repeated until the score "
            "looked better shows up here:", "",
            _row(["time", "audit", "decision", "config sha256", "not evaluated"]), _row(["---"] * 5)]
    for e in (LedgerLine.from_json(x, where="ledger line") for x in earlier):
        out.append(_row([_cell(e.time), _cell(e.audit), e.decision, _code(str(e.config_sha256)[:12]),
                         _cell(", ".join(e.not_evaluated))]))
    return out


def time_markdown(pa: PlannedActual | None) -> list[str]:
    """Each phase's planned (expected, worst case) and actual time of the run that decided, and its starts."""
    out = ["## Time: planned against actual", ""]
    if pa is None:
        return out + ["No time plan was written for this run (a plan is written when a run with jobs to run "
                      "starts: `pairaudit plan` shows it)."]
    note = " Steps marked assumed in the plan had no history on this host." if pa.assumed else ""
    out += [f"The plan `{pa.plan_path}` (written {pa.plan_created_at}, when this run started), against the "
            f"server starts this run recorded and its wall time up to the decision.{note}", "",
            _row(["phase", "expected", "worst case", "actual", "actual / expected", "server starts (planned, actual)"]),
            _row(["---"] * 6)]
    for r in (*pa.phases, pa.total):
        ratio = f"{r.actual_s / r.expected_s:.2f}" if r.expected_s > 0 else "-"
        starts = f"{r.planned_starts}, {r.actual_starts}" if r.phase != "other" else "-"
        out.append(_row([f"**{r.phase}**" if r.phase == "total" else r.phase, f"{r.expected_s:.0f} s",
                         f"{r.worst_s:.0f} s", f"{r.actual_s:.0f} s", ratio, starts]))
    return out


# ------------------------------------------------------------------ html

# Only in-page anchors and relative paths: a report never links out of itself.
_LOCAL_LINK = re.compile(r"#[A-Za-z0-9_-]+|[A-Za-z0-9_][A-Za-z0-9_./-]*")


def _ids_and_boxes(state) -> None:
    # Headings get the anchor ids the gate table links to; the first top-level
    # quote of a page is the verdict banner, later ones are notices (deviations).
    boxes = 0
    for k, tok in enumerate(state.tokens):
        if tok.type == "heading_open":
            tok.attrSet("id", slug(state.tokens[k + 1].content))
        elif tok.type == "blockquote_open" and tok.level == 0:
            tok.meta["box"] = "banner" if boxes == 0 else "notice"
            boxes += 1


def _markdown_renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    # markdown-it-py's documented hook for link validation is replacing this method
    md.validateLink = lambda url: bool(_LOCAL_LINK.fullmatch(url))  # type: ignore[method-assign]
    md.core.ruler.push("pairaudit_ids_and_boxes", _ids_and_boxes)
    md.add_render_rule("blockquote_open", lambda self, tokens, k, options, env:
                       f'<div class="box {tokens[k].meta.get("box", "notice")}">\n')
    md.add_render_rule("blockquote_close", lambda self, tokens, k, options, env: "</div>\n")
    return md


VERDICT_COLORS = {"PROMOTE": "#2e7d32", "HOLD": "#ef6c00", "REJECT": "#c62828"}


def markdown_html(md: str, *, title: str, verdict: str | None = None) -> str:
    """The Markdown this module writes as one self-contained page (markdown-it, CommonMark + tables, no raw
    HTML, only in-page and relative links); ``verdict`` colours the banner."""
    import html

    lines = md.splitlines()
    if verdict and lines and lines[0].startswith("# pairaudit decision"):
        lines = lines[1:]  # the coloured banner below says it
    body = _markdown_renderer().render("\n".join(lines)).rstrip("\n").split("\n")
    color = VERDICT_COLORS.get(verdict or "", "#616161")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:1.5em;max-width:75em}table{border-collapse:collapse;"
            "margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;font-size:.9em;text-align:left;"
            "vertical-align:top}td:last-child{white-space:nowrap}code{font-size:.85em;word-break:break-all}"
            f"#decision{{background:{color};color:#fff;padding:.4em .8em;border-radius:4px;font-size:1.6em;"
            "font-weight:bold}"
            f".box{{padding:.3em .8em;margin:.6em 0;border-radius:4px}}.banner{{border-left:.5em solid {color};"
            "background:#f5f5f5}.notice{border:2px solid #b71c1c;background:#fff3f3}"
            "h2{border-bottom:1px solid #ddd;margin-top:1.4em}</style></head><body>\n"
            + (f"<div id=\"decision\" data-decision=\"{html.escape(verdict)}\">Decision: {html.escape(verdict)}</div>\n"
               if verdict else "")
            + "\n".join(body) + "\n</body></html>\n")


# Where each kind of gate's evidence sits in the Snakemake report (report/workflow.rst's categories).
_RST_CATEGORY = {"quality": "2. Quality", "grid_tie": "3. Greedy divergence", "determinism": "3. Greedy divergence",
                 "boundary": "4. Boundary", "speed": "5. Speed", "preflight": "1. Decision"}


def _rst_esc(t: Any) -> str:
    return (str(t).replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("_", "\\_")
            .replace("|", "\\|"))


def _rst_table(head: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int] = ()) -> list[str]:
    """A docutils list-table (cells already escaped; an empty cell is written as a space)."""
    out = [".. list-table::", "   :header-rows: 1"] + ([f"   :widths: {' '.join(map(str, widths))}"] if widths else [])
    out.append("")
    for r in [list(head), *rows]:
        out.append(f"   * - {r[0] or ' '}")
        out += [f"     - {c or ' '}" for c in r[1:]]
    return out + [""]


def summary_rst(decision: Decision, earlier: Sequence[Mapping[str, Any]],
                calibration_summary: Mapping[str, Any] | None = None) -> str:
    """The report's front page block (included by report/workflow.rst), read at a glance.

    The decision as a banner, a Deviations box when decision.json lists any,
    the gates (verdict, effect, first reason, the category holding the
    evidence) and the paired table per dataset; the full report is item 1.
    """
    check_decision_word(decision)  # as render_markdown: never a word the gates do not give
    doc = decision_doc(decision)
    deciding = doc.deciding_gates
    out = [f".. admonition:: Decision: {doc.decision}", "   :class: pairaudit-decision", "",
           f"   Deciding gates: {_rst_esc(', '.join(deciding) or 'none')}. Rule {doc.rule}: PROMOTE only "
           f"if every gate passes; precedence REJECT > HOLD > INCONCLUSIVE > PROMOTE.", ""]
    others = _also_short(doc)
    if others:
        out += ["   Also short of PROMOTE: " + _rst_esc(", ".join(others)) + ".", ""]
    if doc.deviations:
        out += [".. warning:: **Deviations** from the registered procedure:", ""]
        out += [f"   - {_rst_esc(d.gate)}: {_rst_esc(d.what)} — {_rst_esc(d.detail)}" for d in doc.deviations]
        out.append("")
    # backquotes are literals in the Markdown line, not reST references
    out += [f"**Calibration:** {_rst_esc(calibration_line(doc, calibration_summary).replace('`', ''))}", ""]
    rows = []
    for r in gate_rows(doc):
        kind = r["gate"].partition(":")[0]
        cat = _RST_CATEGORY[kind] if kind in _RST_CATEGORY else None
        rows.append([_rst_esc(r["gate"]), _rst_esc(r["verdict"]), _rst_esc(r["effect"]), _rst_esc(r["reason"]),
                     f"`{cat}`_" if cat else ""])
    out += ["**Gates**", ""] + _rst_table(["Gate", "verdict", "effect on the decision", "reason", "evidence"], rows,
                                          widths=(14, 10, 10, 50, 16))
    ds_rows = []
    for ds, t in doc.datasets.items():
        n = t.n
        nf = {arm: t.natural_finish[arm] if arm in t.natural_finish else None for arm in ARMS}
        ds_rows.append([_rst_esc(ds), f"{t.control_correct}/{n}", f"{t.candidate_correct}/{n}",
                        _rst_esc(_idx(t.control_only)), _rst_esc(_idx(t.candidate_only)),
                        _p(t.mcnemar_p), f"{nf['control']}/{n}, {nf['candidate']}/{n}",
                        _rst_esc(t.verdict), _rst_esc(loss_text(t.raw))])
    if ds_rows:
        out += ["**Paired results**", ""] + _rst_table(
            ["Dataset", "control", "candidate", "control-only correct", "candidate-only correct", "McNemar p",
             "natural finish (control, candidate)", "quality", "loss"], ds_rows)
        if multiplicity_line(doc):
            out += [_rst_esc(str(multiplicity_line(doc))), ""]
    ne = doc.not_evaluated
    out += ["Not evaluated (the decision cannot be PROMOTE): " + (_rst_esc(", ".join(ne)) if ne else "none") + "."]
    out += ["", f"Earlier decisions for this candidate in the ledger: {len(earlier)}"
            + (" (" + _rst_esc(", ".join(f"{e['audit']}: {e['decision']}" for e in earlier)) + ")"
               if earlier else "") + ". Every reason of every gate: `1. Decision`_.", ""]
    return "\n".join(out)
