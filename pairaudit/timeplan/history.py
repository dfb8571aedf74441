"""This host's own record of earlier audits: every server start and how long its phase kept it.

The source is what every audit already writes: ``results/<audit>/servers/starts.jsonl``
(one ``ready`` event per server that came up, with its time to healthy, and a
``stopped`` event when its phase let it go) of every audit and calibration
under ``results/``, and the item counts the audit's answers phase records
(``answers/<arm>.json``; the decision's dataset sizes where that record is
gone).  A start is matched to its stop by its pid and server identity; a start
never stopped (a killed job) has no served time and is left out of the
phase's work, not guessed.

Nothing here decides anything: :mod:`pairaudit.timeplan.plan` turns these
records into the expected and worst-case time of each phase.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Iterable, Mapping

from pairaudit.core import artifacts
from pairaudit.core.contracts import (
    BOUNDARY_SCHEMA,
    DECISION_SCHEMA,
    PATHS,
    PHASE_SCHEMA,
    RESULTS,
    SERVER_START_SCHEMA,
    TIME_PLAN_SCHEMA,
)
from pairaudit.core.jsonlog import read_log


def epoch(iso: str | None) -> float | None:
    """An artifact's ISO-8601 UTC time as seconds since the epoch (None stays None)."""
    if not iso:
        return None
    return dt.datetime.fromisoformat(iso).timestamp()


@dataclass(frozen=True)
class Start:
    """One server start of an earlier audit, as its starts log recorded it."""
    audit: str
    phase: str                    # answers | diagnostics | speed (and their -confirm starts)
    arm: str
    spec_sha256: str | None       # the server's identity hash (the launch receipt's)
    host: str | None
    started_at: float             # epoch seconds, when the server was launched
    ready_s: float                # launch to healthy: what the start cost
    served_s: float | None        # healthy to stopped: the phase's work on it (None: never stopped)
    cold: bool = False            # the first start of this server on this host in the history


@dataclass(frozen=True)
class AuditRecord:
    """What one earlier audit directory says about its timing: its starts and its answers' item counts."""
    audit: str
    starts: tuple[Start, ...]
    items: Mapping[str, int]      # arm -> sampled items its answers phase asked for (all datasets)
    finished_at: float | None     # the decision's creation time (None: no decision yet)
    # arm -> (boundary cases, seconds from the first case sent to the last one answered), where recorded
    boundary: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    began_at: float | None = None  # when its last run began (its latest plan before its decision), if recorded


@dataclass(frozen=True)
class AnswersPhase:
    """One earlier answers phase of a server: its served time, items, and the part its boundary cases took."""
    served_s: float
    items: int
    cases: int
    boundary_s: float


def read_starts(path: str | Path, audit: str) -> list[Start]:
    """Every start of one starts log that came up, with its served time where its stop was recorded."""
    starts: list[Start] = []
    open_: dict[tuple, int] = {}
    for rec in read_log(path):
        if rec.get("schema") != SERVER_START_SCHEMA:
            continue
        key = (rec.get("pid"), rec.get("spec_sha256"))
        if rec.get("event") == "ready" and isinstance(rec.get("ready_s"), (int, float)):
            t0 = epoch(rec.get("started_at"))
            if t0 is None:
                continue
            open_[key] = len(starts)
            starts.append(Start(audit=audit, phase=str(rec.get("phase")), arm=str(rec.get("arm")),
                                spec_sha256=rec.get("spec_sha256"), host=rec.get("host"), started_at=t0,
                                ready_s=float(rec["ready_s"]), served_s=None))
        elif rec.get("event") == "stopped" and key in open_:
            i = open_.pop(key)
            ready_at = starts[i].started_at + starts[i].ready_s
            stop = epoch(rec.get("at"))
            if stop is not None:
                s = starts[i]
                starts[i] = Start(**{**s.__dict__, "served_s": max(0.0, stop - ready_at)})
    return starts


# The history reads counts and times only, and never decides: a record whose content hash no longer
# matches (a copy with its paths rewritten, as the project keeps its GPU hosts' runs) still says how
# long a phase took. The audit's own load check refuses an edited artifact of the audit it runs.
_VERIFY = False


def _items(audit_dir: Path) -> dict[str, int]:
    """Arm -> items the answers phase asked for, from its phase records, else the decision's dataset sizes."""
    out: dict[str, int] = {}
    for p in sorted((audit_dir / Path(PATHS[PHASE_SCHEMA]).parent).glob("*.json")):
        try:
            doc = artifacts.read_json(p, verify=_VERIFY)
        except artifacts.ArtifactError:
            continue
        if doc.get("schema") == PHASE_SCHEMA and doc.get("phase") == "answers":
            counts = doc.get("datasets") or {}
            out[str(doc.get("arm"))] = sum(int(c.get("items", 0)) for c in counts.values() if isinstance(c, dict))
    if out:
        return out
    dpath = audit_dir / PATHS[DECISION_SCHEMA]
    if dpath.is_file():
        try:
            doc = artifacts.read_json(dpath, verify=_VERIFY)
        except artifacts.ArtifactError:
            return out
        n = sum(int(d.get("n") or 0) for d in (doc.get("datasets") or {}).values() if isinstance(d, dict))
        if n:
            out = {arm: n for arm in (doc.get("arms") or {})}
    return out


def _boundary(audit_dir: Path) -> dict[str, tuple[int, float]]:
    """Arm -> (cases, seconds) of the boundary cases its answers phase ran, from ``boundary/<arm>.json``."""
    out: dict[str, tuple[int, float]] = {}
    for p in sorted((audit_dir / Path(PATHS[BOUNDARY_SCHEMA]).parent).glob("*.json")):
        try:
            doc = artifacts.read_json(p, verify=_VERIFY)
        except artifacts.ArtifactError:
            continue
        if doc.get("schema") != BOUNDARY_SCHEMA:
            continue
        sent = [(epoch(c.get("started_at")), c.get("e2el_s")) for c in doc.get("cases") or []]
        spans = [(t, float(e)) for t, e in sent if t is not None and isinstance(e, (int, float))]
        if spans:
            out[str(doc.get("arm"))] = (len(spans), max(t + e for t, e in spans) - min(t for t, _ in spans))
    return out


def _began(audit_dir: Path, finished: float | None) -> float | None:
    """When the audit's last run began: the latest plan it wrote at or before its decision."""
    times = []
    for p in (audit_dir / Path(PATHS[TIME_PLAN_SCHEMA]).parent).glob("*.json"):
        try:
            t = epoch(artifacts.read_json(p, verify=_VERIFY).get("created_at"))
        except (artifacts.ArtifactError, ValueError):
            continue
        if t is not None and (finished is None or t <= finished):
            times.append(t)
    return max(times, default=None)


def _finished(audit_dir: Path) -> float | None:
    dpath = audit_dir / PATHS[DECISION_SCHEMA]
    if not dpath.is_file():
        return None
    try:
        doc = artifacts.read_json(dpath, verify=_VERIFY)
    except artifacts.ArtifactError:
        return None
    return epoch((doc.get("provenance") or {}).get("created_at"))


def read_audit(audit_dir: str | Path) -> AuditRecord:
    """One audit directory's record (an audit that never started a server has no starts)."""
    d = Path(audit_dir)
    finished = _finished(d)
    return AuditRecord(audit=d.name, starts=tuple(read_starts(d / PATHS[SERVER_START_SCHEMA], d.name)),
                       items=_items(d), finished_at=finished, boundary=_boundary(d), began_at=_began(d, finished))


@dataclass(frozen=True)
class History:
    """Every earlier audit of one host (its starts marked cold where a server was first started)."""
    host: str | None
    audits: tuple[AuditRecord, ...] = ()
    sources: tuple[str, ...] = field(default=())   # the starts logs read

    def starts(self, spec: str | None, phase: str | None = None) -> list[Start]:
        """The starts of server ``spec`` on this host, oldest first (of ``phase`` only, when given)."""
        return [s for a in self.audits for s in a.starts
                if s.spec_sha256 == spec and (phase is None or s.phase == phase)]

    def answers_phases(self, spec: str | None) -> list[AnswersPhase]:
        """Every earlier answers phase of server ``spec`` that ended, with its audit's counts for that arm."""
        out = []
        for a in self.audits:
            for s in a.starts:
                if s.spec_sha256 == spec and s.phase == "answers" and s.served_s is not None:
                    cases, secs = a.boundary.get(s.arm, (0, 0.0))
                    out.append(AnswersPhase(s.served_s, a.items.get(s.arm, 0), cases, min(secs, s.served_s)))
        return out

    def warm(self, spec: str | None) -> list[float]:
        return [s.ready_s for s in self.starts(spec) if not s.cold]

    def cold(self, spec: str | None) -> list[float]:
        return [s.ready_s for s in self.starts(spec) if s.cold]


def mark_cold(audits: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
    """Each server's first start on the host (by launch time, over every audit) marked cold.

    A first start builds what later starts find ready (vLLM's compile cache:
    187 s against 57-68 s on an H100); a plan counts it apart.
    """
    audits = list(audits)
    first: dict[str | None, float] = {}
    for a in audits:
        for s in a.starts:
            if s.spec_sha256 not in first or s.started_at < first[s.spec_sha256]:
                first[s.spec_sha256] = s.started_at
    out = []
    for a in audits:
        marked = tuple(Start(**{**s.__dict__, "cold": s.started_at == first[s.spec_sha256]}) for s in a.starts)
        out.append(AuditRecord(audit=a.audit, starts=marked, items=a.items, finished_at=a.finished_at,
                                boundary=a.boundary, began_at=a.began_at))
    return tuple(out)


def host_history(results_dir: str | Path = RESULTS, *, host: str | None, exclude: Iterable[str] = ()) -> History:
    """Every audit under ``results_dir`` with server starts on ``host`` (None: any host), ``exclude`` left out.

    An audit's own directory is excluded by the plan of a run of that audit only
    when asked: a rerun's plan learns from its own earlier run like any other.
    """
    root = Path(results_dir)
    skip = set(exclude)
    audits, sources = [], []
    if root.is_dir():
        for log in sorted(root.glob(f"*/{PATHS[SERVER_START_SCHEMA]}")):
            audit_dir = log.parent.parent
            if audit_dir.name in skip:
                continue
            rec = read_audit(audit_dir)
            kept = tuple(s for s in rec.starts if host is None or s.host == host)
            if kept:
                audits.append(AuditRecord(audit=rec.audit, starts=kept, items=rec.items,
                                          finished_at=rec.finished_at, boundary=rec.boundary,
                                          began_at=rec.began_at))
                sources.append(str(log))
    return History(host=host, audits=mark_cold(audits), sources=tuple(sources))


def med(xs: Iterable[float]) -> float:
    """The median (0.0 of nothing: callers ask only where a record exists, or fall back on ``or``)."""
    xs = list(xs)
    return float(median(xs)) if xs else 0.0
