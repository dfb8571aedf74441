"""Planned against actual: what each phase of a run took, beside what its plan said.

A run's actual time per phase is read from the audit's starts log: every
server started since the run's plan was written, its time to healthy and the
time its phase kept it (``history.read_starts``). What no server held (the
datasets, scoring, pairing and promotion jobs, the gaps between them) is
``other``: the run's wall time so far less the servers' time. A phase that
ran nothing in this run (its outputs were current) shows 0 s against its plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pairaudit.core.contracts import SERVER_START_SCHEMA, audit_path
from pairaudit.timeplan.history import epoch, read_starts
from pairaudit.timeplan.plan import PHASES, TimePlan, latest_plan


@dataclass(frozen=True)
class PhaseTime:
    """One phase of one run: planned (expected, worst) and actual seconds, and its server starts."""
    phase: str
    expected_s: float
    worst_s: float
    actual_s: float
    planned_starts: int
    actual_starts: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PlannedActual:
    """A run's plan (its artifact's path) and each phase's planned and actual time; ``total`` last."""
    plan_path: str
    plan_created_at: str
    phases: tuple[PhaseTime, ...]
    total: PhaseTime
    assumed: bool

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan_path, "plan_created_at": self.plan_created_at, "assumed": self.assumed,
                "phases": {p.phase: p.to_json() for p in self.phases}, "total": self.total.to_json()}


def _phase(name: str) -> str:
    # a failure's confirmation start ("speed-confirm") is its phase's time
    return name.split("-")[0]


def planned_actual(plan: TimePlan, plan_path: str, starts_log: str | Path, *, now: float | None = None) -> PlannedActual:
    """``plan`` against the starts ``starts_log`` recorded since it was written, up to ``now`` (epoch s)."""
    t0 = epoch(plan.created_at) or 0.0
    end = time.time() if now is None else now
    starts = [s for s in read_starts(starts_log, plan.audit) if s.started_at >= t0 - 1.0]
    rows, servers = [], 0.0
    for ph in PHASES[:-1]:
        mine = [s for s in starts if _phase(s.phase) == ph]
        took = sum(s.ready_s + (s.served_s or 0.0) for s in mine)
        servers += took
        e, w = plan.phase(ph)
        planned = sum(1 for s in plan.steps if s.phase == ph and "start" in s.what and s.expected_s > 0)
        rows.append(PhaseTime(ph, e, w, took, planned, len(mine)))
    e, w = plan.phase("other")
    wall = max(0.0, end - t0)
    rows.append(PhaseTime("other", e, w, max(0.0, wall - servers), 0, 0))
    total = PhaseTime("total", plan.expected_s, plan.worst_s, wall, sum(r.planned_starts for r in rows),
                      sum(r.actual_starts for r in rows))
    return PlannedActual(plan_path, plan.created_at, tuple(rows), total, plan.assumed)


def for_audit(audit: str, *, now: float | None = None) -> PlannedActual | None:
    """The latest plan of ``audit`` against what its run took so far; None when no plan was written."""
    found = latest_plan(audit, before=now)
    if found is None:
        return None
    path, plan = found
    return planned_actual(plan, path, audit_path(SERVER_START_SCHEMA, audit), now=now)
