"""A sweep's summary: every candidate's decision against the shared control in one table.

``sweep/summary.json`` (``SWEEP_SUMMARY``)::

    {"schema": SWEEP_SUMMARY (contracts), "audit": str,
     "candidates": [CandidateRow.to_json(), ...],      # in the config's order
     "may_ship": [name, ...], "provenance": {...}}

Each row is read from the candidate's own ``decision.json`` (content hash,
fields and decision word checked as ``pairaudit verdict`` checks them): every
gate's verdict, the speed gate's pooled gain and its lower bound, the quality
loss each dataset ruled out, and whether the candidate may ship. A candidate
may ship exactly when its decision is PROMOTE: promotion-v1 gives PROMOTE
only when every gate was evaluated and passed, so the summary adds no rule of
its own and cannot be looser than a decision.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, cast

from pairaudit.core import artifacts
from pairaudit.core.contracts import DECISION_SCHEMA, SWEEP_SUMMARY, Decision
from pairaudit.core.readers import DecisionDoc
from pairaudit.promotion.decision import DecisionMismatch, check_decision_word
from pairaudit.promotion.render import markdown_html

NOT_EVALUATED = "not evaluated"


@dataclass(frozen=True)
class CandidateRow:
    """One candidate of a sweep as its decision states it."""

    name: str
    decision: str
    gates: dict[str, str]                    # gate -> its verdict, or "not evaluated"
    speed_gain_pct: float | None             # the speed gate's gain (positive: the candidate is faster)
    speed_lower_pct: float | None            # its one-sided lower bound
    loss_ruled_out_pct: dict[str, float | None]   # dataset -> the loss quality-v2 ruled out (None: none ruled out)
    may_ship: bool
    decision_path: str
    decision_sha256: str

    def to_json(self) -> dict:
        return asdict(self)


def read_decision(path: str | os.PathLike) -> Decision:
    """A candidate's decision.json, refused (ArtifactError naming the file) unless it is one its gates give."""
    p = Path(path)
    if not p.is_file():
        raise artifacts.ArtifactError(f"{p}: not found (has this candidate's decision run? `snakemake --cores 4 "
                                      "promotion`)")
    doc = artifacts.check_schema(artifacts.read_json(p), DECISION_SCHEMA, p)
    DecisionDoc.from_json(doc, where=p)
    try:
        check_decision_word(doc)
    except DecisionMismatch as exc:
        raise artifacts.ArtifactError(f"{p}: {exc} (stated {exc.stated}, derived {exc.derived})") from None
    return cast(Decision, doc)


def may_ship(decision: Mapping[str, Any]) -> bool:
    """The sweep's rule: a candidate may ship exactly when its decision is PROMOTE."""
    return decision.get("decision") == "PROMOTE"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def candidate_row(name: str, decision: Mapping[str, Any], path: str, sha256: str) -> CandidateRow:
    gates = {g: NOT_EVALUATED if v is None else str(v.get("verdict")) for g, v in (decision.get("gates") or {}).items()}
    speed = (decision.get("gates") or {}).get("speed") or {}
    loss: dict[str, float | None] = {}
    for ds, line in (decision.get("datasets") or {}).items():
        bound = line.get("loss_bound") or {}
        loss[ds] = _number(bound.get("upper_pct")) if bound.get("ruled_out") else None
    return CandidateRow(name=name, decision=str(decision.get("decision")), gates=gates,
                        # win2-v3/v4 name it point_gain_pct, win2-v1/v2 pooled_gain_pct
                        speed_gain_pct=_number(speed.get("point_gain_pct", speed.get("pooled_gain_pct"))),
                        speed_lower_pct=_number(speed.get("lower_bound_pct")),
                        loss_ruled_out_pct=loss, may_ship=may_ship(decision), decision_path=str(path),
                        decision_sha256=sha256)


def summarize(audit: str, decisions: Mapping[str, str | os.PathLike]) -> dict:
    """The summary of every candidate's decision (``decisions``: name -> decision.json, in the config's order)."""
    rows = []
    for name, path in decisions.items():
        doc = read_decision(path)
        rows.append(candidate_row(name, doc, str(path), artifacts.sha256_file(path)))
    return {"schema": SWEEP_SUMMARY, "audit": audit, "candidates": [r.to_json() for r in rows],
            "may_ship": [r.name for r in rows if r.may_ship],
            "provenance": artifacts.provenance([str(p) for p in decisions.values()], {"audit": audit})}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The sweep's table: one row per candidate, every gate a column."""
    rows = summary["candidates"]
    gates: list[str] = []
    for r in rows:
        gates += [g for g in r["gates"] if g not in gates]
    ship = summary.get("may_ship") or []
    out = [f"# pairaudit sweep ({summary.get('audit')}): {len(ship)} of {len(rows)} may ship", "",
           f"May ship: {', '.join(ship) if ship else 'none'}. A candidate may ship only when its own decision is "
           "PROMOTE (every gate evaluated and passed against the shared control).", "",
           "| candidate | decision | may ship | speed gain (lower bound) | loss ruled out | "
           + " | ".join(_cell(g) for g in gates) + " |",
           "| --- " * (5 + len(gates)) + "|"]
    for r in rows:
        loss = "; ".join(f"{ds} >= {v:.1f} pt" if v is not None else f"{ds}: none"
                         for ds, v in r["loss_ruled_out_pct"].items()) or "n/a"
        speed = (f"{_pct(r['speed_gain_pct'])} ({_pct(r['speed_lower_pct'])})"
                 if r["speed_gain_pct"] is not None else "n/a")
        out.append(f"| [{_cell(r['name'])}](../candidates/{r['name']}/promotion/report.md) | **{r['decision']}** | "
                   f"{'yes' if r['may_ship'] else 'no'} | {speed} | {_cell(loss)} | "
                   + " | ".join(_cell(r["gates"].get(g, "-")) for g in gates) + " |")
    out += ["", "Each candidate's decision, reasons and evidence: `candidates/<name>/promotion/` "
            "(`pairaudit verdict results/<audit> --candidate NAME`)."]
    return "\n".join(out) + "\n"


def sweep_stage(*, audit: str, candidates: Sequence[str], decision_paths: Sequence[str], out_summary: str,
                out_markdown: str, out_html: str) -> dict:
    """Read every candidate's decision and write the summary (JSON, Markdown, and its HTML page)."""
    if len(candidates) != len(decision_paths):
        raise ValueError(f"{len(candidates)} candidates but {len(decision_paths)} decisions")
    summary = summarize(audit, dict(zip(candidates, decision_paths)))
    artifacts.write_json(out_summary, summary)
    md = summary_markdown(summary)
    artifacts._atomic_write(Path(out_markdown), md)
    # the banner is green only when every candidate may ship; otherwise the table says which
    verdict = "PROMOTE" if len(summary["may_ship"]) == len(candidates) else None
    artifacts._atomic_write(Path(out_html), markdown_html(md, title=f"pairaudit sweep ({audit})", verdict=verdict))
    return summary
