"""Print an audit's decision (its front page) and exit with the decision's code.

``pairaudit verdict [results/<audit> | path/to/decision.json] [--summary FILE]``

Reads ``promotion/decision.json`` through ``artifacts.read_json``: a file
whose content no longer matches the ``content_sha256`` recorded when it was
written is refused, like every reader of the audit refuses it. Prints the
decision, the deciding gates, one line per gate (its verdict, what it does
to the decision, its first reason), the deviations, what was not evaluated
and one line per dataset. ``--summary FILE`` appends the same front page as
Markdown (for ``$GITHUB_STEP_SUMMARY``); a refused or missing decision
appends why. The decision word is re-derived from the gates the file holds
under the rule it names (promotion-v1): a word they do not give -- a file
re-sealed to say PROMOTE while its gates say HOLD -- is refused, naming the
stated and the derived decision. Then the decision is re-derived from what it consumed
(``pairaudit.promotion.verify``): every consumed artifact's sha256 (``provenance.consumed``)
against the file, each stage artifact's gate recomputed from the evidence it records with the
registered rule it names, and the decision made again from those artifacts; a gate, a decision
or a reason that does not follow is refused by name. ``--deep`` also follows the chain to the
primary records (the answer journals, the scores, the speed streams) and recomputes the
artifacts themselves. What each level proves and cannot: docs/interop.md. Exit: PROMOTE 0,
REJECT 1, HOLD 3, INCONCLUSIVE 4; 2 when the decision is missing, unreadable, refused, not a
decision, not the one its gates give, or not what its evidence gives.

A sweep (``results/<audit>`` holding ``candidates/<name>/``, docs/sweeps.md): the table of
every candidate (``pairaudit.promotion.sweep``), each decision read and checked as above,
then each candidate's front page; exit 0 only when every candidate asked about is PROMOTE,
else the code of the most severe of their decisions (REJECT 1 > HOLD 3 > INCONCLUSIVE 4; 2
when any is missing or refused). ``--candidate NAME`` (repeatable) asks about those only;
one candidate exits with its own decision's code.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, cast

from pairaudit.core import artifacts
from pairaudit.core.contracts import CANDIDATES_DIR, DECISION_SCHEMA, PATHS, SWEEP_PATHS, SWEEP_SUMMARY, Decision
from pairaudit.core.readers import DecisionDoc
from pairaudit.promotion import render
from pairaudit.promotion import sweep
from pairaudit.promotion.decision import DecisionMismatch, check_decision_word
from pairaudit.promotion.verify import Verification, verify

from .codes import EXIT, REFUSED

HELP = "print an audit's decision and exit with its code (PROMOTE 0, REJECT 1, HOLD 3, INCONCLUSIVE 4, 2 missing)"
DECISION_REL = PATHS[DECISION_SCHEMA]  # promotion/decision.json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("audit", nargs="?", default=None,
                   help="results/<audit>, or a decision.json (default: results/<audit of config/config.yaml>)")
    p.add_argument("--summary", metavar="FILE", help="append the front page as Markdown (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--candidate", metavar="NAME", action="append", default=None,
                   help="a sweep: ask about this candidate only (repeatable; default: every candidate)")
    p.add_argument("--deep", action="store_true",
                   help="also recompute the consumed artifacts from the primary records (journals, scores, streams)")


def default_audit_dir(cwd: Path | None = None) -> Path:
    """results/<audit> of the workflow's config/config.yaml in this directory; results/default without one."""
    cwd = cwd or Path.cwd()
    cfg = cwd / "config" / "config.yaml"
    try:
        import yaml

        audit = (yaml.safe_load(cfg.read_text()) or {}).get("audit")
    except (OSError, ValueError, AttributeError):
        audit = None
    return cwd / "results" / (audit if isinstance(audit, str) and audit else "default")


def decision_path(arg: str | None) -> Path:
    p = Path(arg) if arg else default_audit_dir()
    return p if p.suffix == ".json" else p / DECISION_REL


def load(path: Path) -> Decision:
    """The decision, content hash checked; ArtifactError naming the file otherwise."""
    if not path.is_file():
        raise artifacts.ArtifactError(f"{path}: not found (has the promotion stage run? `snakemake --cores 4 "
                                      "promotion`)")
    doc = artifacts.check_schema(artifacts.read_json(path), DECISION_SCHEMA, path)
    DecisionDoc.from_json(doc, where=path)   # every field the report reads, there and of its type
    if doc.get("decision") not in ("PROMOTE", "REJECT", "HOLD", "INCONCLUSIVE") or not isinstance(doc.get("gates"),
                                                                                                    Mapping):
        raise artifacts.ArtifactError(f"{path}: decision {doc.get('decision')!r} is not one of PROMOTE, REJECT, "
                                      "HOLD, INCONCLUSIVE (or it has no gates)")
    # The content hash proves the file is as written, not that what was written is consistent: a
    # decision word its own gates do not give is refused, naming both.
    try:
        check_decision_word(doc)
    except DecisionMismatch as exc:
        raise artifacts.ArtifactError(f"{path}: {exc} (stated {exc.stated}, derived {exc.derived})") from None
    return cast(Decision, doc)   # its schema, decision and gates checked above


def load_verified(path: Path, *, deep: bool = False) -> tuple[Decision, Verification]:
    """The decision (``load``), re-derived from what it consumed (``promotion.verify``); ArtifactError
    naming the file, and the gate or field that does not follow, otherwise."""
    decision = load(path)
    return decision, verify(path, decision, deep=deep)


# ------------------------------------------------------------------ text

def _one_line(text: Any, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _cell(v: Any) -> str:
    """One Markdown table cell: a pipe or a newline would break the row."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def _idx(xs: Any) -> str:
    xs = list(xs or [])
    return ", ".join(map(str, xs)) if xs else "none"


def _rule(ds: Mapping[str, Any]) -> str:
    return str(ds.get("rule") or "quality")


def _also_short(decision: Decision) -> list[str]:
    deciding = decision.get("deciding_gates") or []
    return [f"{n} ({'not evaluated' if g is None else g.get('outcome')})" for n, g in decision["gates"].items()
            if n not in deciding and (g is None or g.get("outcome") != "PROMOTE")]


def front_page_text(decision: Decision, source: str) -> str:
    rows = render.gate_rows(decision)
    width = max([len(r["gate"]) for r in rows] + [4])
    vwidth = max([len(r["verdict"]) for r in rows] + [7])
    out = [f"pairaudit verdict: {decision['decision']}  ({source}, rule {decision.get('rule')})",
           f"deciding gates: {', '.join(decision.get('deciding_gates') or []) or 'none'}"]
    short = _also_short(decision)
    if short:
        out.append(f"also short of PROMOTE: {', '.join(short)}")
    out.append("")
    out.append(f"  {'gate':<{width}}  {'verdict':<{vwidth}}  {'effect':<18}  reason")
    for r in rows:
        out.append(f"  {r['gate']:<{width}}  {r['verdict']:<{vwidth}}  {r['effect']:<18}  {r['reason']}")
    ne = decision.get("not_evaluated") or []
    out += ["", f"not evaluated: {', '.join(ne) if ne else 'none'}"]
    devs = render.deviations(decision)
    if devs:
        out.append(f"deviations ({len(devs)}):")
        out += [f"  - {d.get('gate')}: {d.get('what')}: {_one_line(d.get('detail', ''))}" for d in devs]
    datasets = decision.get("datasets") or {}
    if datasets:
        out.append("datasets:")
        for name, ds in datasets.items():
            n = ds.get("n")
            p = ds.get("mcnemar_p")
            out.append(f"  {name}: n={n}, control {ds.get('control_correct')}/{n}, candidate "
                       f"{ds.get('candidate_correct')}/{n}, control-only {ds.get('control_only')}, candidate-only "
                       f"{ds.get('candidate_only')}, McNemar p={'n/a' if p is None else f'{p:.4g}'}, "
                       f"{_rule(ds)} {ds.get('verdict')}: {render.loss_text(ds)}")
    if render.multiplicity_line(decision):
        out.append(f"over the datasets: {render.multiplicity_line(decision)}")
    return "\n".join(out)


# -------------------------------------------------------------- markdown

def front_page_markdown(decision: Decision, source: str, sha256: str | None = None) -> str:
    cell = _cell
    out = [f"## pairaudit: {decision['decision']}", "",
           f"**{decision['decision']}**, deciding gates: {', '.join(decision.get('deciding_gates') or []) or 'none'}. "
           f"Rule {decision.get('rule')}: PROMOTE only if every gate passes; precedence REJECT > HOLD > "
           "INCONCLUSIVE > PROMOTE."]
    short = _also_short(decision)
    if short:
        out += ["", f"Also short of PROMOTE: {', '.join(short)}."]
    out += ["", "| Gate | verdict | effect on the decision | reason |", "| --- | --- | --- | --- |"]
    out += [f"| {cell(r['gate'])} | {cell(r['verdict'])} | {r['effect']} | {cell(r['reason'])} |"
            for r in render.gate_rows(decision)]
    devs = render.deviations(decision)
    if devs:
        out += ["", "**Deviations** from the registered procedure:", "", "| Gate | what | detail |", "| --- | --- | --- |"]
        out += [f"| {cell(d.get('gate', ''))} | {cell(d.get('what', ''))} | {cell(d.get('detail', ''))} |" for d in devs]
    datasets = decision.get("datasets") or {}
    if datasets:
        out += ["", "| Dataset | control | candidate | control-only | candidate-only | McNemar p | quality | loss |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, ds in datasets.items():
            n, p = ds.get("n"), ds.get("mcnemar_p")
            out.append(f"| {cell(name)} | {ds.get('control_correct')}/{n} | {ds.get('candidate_correct')}/{n} | "
                       f"{_idx(ds.get('control_only'))} | {_idx(ds.get('candidate_only'))} | "
                       f"{'n/a' if p is None else f'{p:.4g}'} | {cell(_rule(ds))} {cell(ds.get('verdict'))} | "
                       f"{cell(render.loss_text(ds))} |")
        if render.multiplicity_line(decision):
            out += ["", f"Over the datasets: {cell(render.multiplicity_line(decision))}."]
    ne = decision.get("not_evaluated") or []
    out += ["", f"Not evaluated: {', '.join(ne) if ne else 'none'}.",
            f"Source: `{source}`" + (f" (sha256 `{sha256[:12]}`)" if sha256 else "") + "."]
    return "\n".join(out) + "\n"


def refused_markdown(source: str, why: str) -> str:
    return f"## pairaudit: no decision\n\n`{source}`: refused or missing (exit {REFUSED}).\n\n```\n{why}\n```\n"


def _append(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")


def after_run(audit_dirs: list[str | Path], since: float) -> str:
    """What a finished ``snakemake`` run prints last: the front page of every decision it wrote.

    ``audit_dirs``: the workflow's audits (its own, then its calibration's);
    ``since``: when the run started. When the run decided nothing new (all
    up to date), the first audit's existing decision is shown, so the
    terminal always ends on the verdict of what was asked.
    """
    # A sweep's own audit (its calibration is a two-arm audit) ends on the sweep's table.
    first, *_ = [Path(d) for d in audit_dirs] or [Path()]
    names = sweep_candidates(first) if audit_dirs else None
    pages = []
    if names:
        page = sweep_page(first, names, check=False)
        pages.append(page.table + f"\n(`pairaudit verdict {first}` prints this again and exits "
                                  f"{sweep_code(page.words)})")
    found = [decision_path(str(d)) for d in audit_dirs]
    fresh = [p for p in found if p.is_file() and p.stat().st_mtime >= since]
    shown = fresh or ([] if names else [p for p in found[:1] if p.is_file()])
    for path in shown:
        try:
            decision = load(path)
        except artifacts.ArtifactError as exc:
            pages.append(f"pairaudit: {exc}")
            continue
        pages.append(front_page_text(decision, str(path)) + f"\n(`pairaudit verdict {path.parent.parent}` "
                     f"prints this again and exits {EXIT[decision['decision']]})")
    return "\n\n".join(pages)


# ------------------------------------------------------------------ sweeps

# A sweep's candidates' decisions, most severe first: the code of several decisions is the first found.
SEVERITY = ("REJECT", "HOLD", "INCONCLUSIVE", "PROMOTE")


def sweep_candidates(audit_dir: Path) -> list[str] | None:
    """The candidates of a sweep's audit directory (the summary's order, else by name); None for no sweep."""
    root = audit_dir / CANDIDATES_DIR
    if not root.is_dir():
        return None
    summary = audit_dir / SWEEP_PATHS[SWEEP_SUMMARY]
    try:
        names = [r["name"] for r in artifacts.read_json(summary)["candidates"]]
    except (OSError, ValueError, KeyError, TypeError, artifacts.ArtifactError):
        names = []
    return names or sorted(p.name for p in root.iterdir() if (p / DECISION_REL).is_file())


def sweep_code(decisions: Mapping[str, str | None]) -> int:
    """The exit code of several candidates' decisions (None: missing or refused)."""
    if any(d is None for d in decisions.values()):
        return REFUSED
    worst = min((SEVERITY.index(d) for d in decisions.values() if d is not None), default=SEVERITY.index("PROMOTE"))
    return EXIT[SEVERITY[worst]]


@dataclass
class SweepPage:
    """What a sweep's verdict shows: the table, each readable candidate's front page, each one's decision word."""
    table: str
    pages: list[str]
    words: dict[str, str | None]            # None: missing or refused
    refused: dict[str, tuple[Path, str]]    # name -> (decision path, why)


def sweep_page(audit_dir: Path, asked: list[str], *, check: bool = True, deep: bool = False) -> SweepPage:
    """``check``: each candidate's decision re-derived from what it consumed (``load_verified``)."""
    rows, pages = [], []
    words: dict[str, str | None] = {}
    refused: dict[str, tuple[Path, str]] = {}
    for name in asked:
        path = audit_dir / CANDIDATES_DIR / name / DECISION_REL
        try:
            doc = load_verified(path, deep=deep)[0] if check else load(path)
        except artifacts.ArtifactError as exc:
            words[name] = None
            refused[name] = (path, str(exc))
            continue
        words[name] = doc["decision"]
        rows.append(sweep.candidate_row(name, doc, str(path), artifacts.sha256_file(path)).to_json())
        pages.append(front_page_text(doc, str(path)))
    table = sweep.summary_markdown({"audit": audit_dir.name, "candidates": rows,
                                    "may_ship": [r["name"] for r in rows if r["may_ship"]]})
    return SweepPage(table=table, pages=pages, words=words, refused=refused)


def run_sweep(args: argparse.Namespace, audit_dir: Path, names: list[str]) -> int:
    asked = args.candidate or names
    unknown = [n for n in asked if n not in names]
    if unknown:
        print(f"pairaudit verdict: {audit_dir}: no candidate {', '.join(unknown)} (candidates: "
              f"{', '.join(names) or 'none'})", file=sys.stderr)
        return REFUSED
    page = sweep_page(audit_dir, asked, deep=args.deep)
    for path, why in page.refused.values():
        print(f"pairaudit verdict: {why}", file=sys.stderr)
        if args.summary:
            _append(args.summary, refused_markdown(str(path), why))
    print(page.table)
    for text in page.pages:
        print(text + "\n")
    words = page.words
    table = page.table
    code = sweep_code(words)
    said = ", ".join(f"{n} {w or 'refused'}" for n, w in words.items())
    print(f"exit {code} ({said})")
    if args.summary:
        _append(args.summary, table)
    return code


def run(args: argparse.Namespace) -> int:
    audit_dir = Path(args.audit) if args.audit else default_audit_dir()
    names = None if audit_dir.suffix == ".json" else sweep_candidates(audit_dir)
    if names is not None:
        return run_sweep(args, audit_dir, names)
    if args.candidate:
        print(f"pairaudit verdict: {audit_dir}: --candidate is for a sweep (results/<audit> with "
              f"{CANDIDATES_DIR}/), and this is none", file=sys.stderr)
        return REFUSED
    path = decision_path(args.audit)
    try:
        decision, checked = load_verified(path, deep=args.deep)
    except artifacts.ArtifactError as exc:
        print(f"pairaudit verdict: {exc}", file=sys.stderr)
        if args.summary:
            _append(args.summary, refused_markdown(str(path), str(exc)))
        return REFUSED
    print(front_page_text(decision, str(path)))
    print(checked.summary())
    code = EXIT[decision["decision"]]
    print(f"exit {code} ({decision['decision']})")
    if args.summary:
        _append(args.summary, front_page_markdown(decision, str(path), artifacts.sha256_file(path)))
    return code
