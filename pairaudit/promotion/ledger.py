"""The decision ledger: one append-only line per completed decision.


    {"schema": "pairaudit.ledger/v1", "time", "audit", "decision", "calibration", "reasons", "not_evaluated",
     "config_sha256",                       # canonical JSON of the workflow config
     "inputs": {path: sha256},              # = decision provenance.consumed
     "candidate": {"spec_sha256", "env", "switches_sha256", "model", "url"},
     "control_spec_sha256", "decision_path", "decision_sha256", "code_version",
     "timing": None | {"plan", "plan_created_at", "assumed", "phases": {phase: {expected_s, worst_s, actual_s,
                                                                          planned_starts, actual_starts}},
              "total"}}         # the run's planned against actual time (pairaudit/timeplan/actual.py)

Earlier decisions are matched on ``candidate.spec_sha256`` (the launch
receipt's identity hash: command, env switches, model), not on the audit name.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from pairaudit.core.artifacts import sha256_file, sha256_json
from pairaudit.core.contracts import LEDGER_SCHEMA, Decision
from pairaudit.core.jsonlog import append_record
from pairaudit.core.readers import LaunchReceipt


def ledger_entry(decision: Decision, launch: Mapping[str, LaunchReceipt], *, audit: str | None,
                 config: Any, decision_path: str, timing: Mapping[str, Any] | None = None) -> dict:
    """One line of results/ledger.jsonl: what was decided, on which evidence, for which candidate.

    ``decision``: the complete decision (``promotion_stage`` has added its provenance). ``timing``: the run's
    planned against actual time per phase (``pairaudit.timeplan.actual.PlannedActual.to_json``), None when
    the run wrote no plan.
    """
    cand = launch["candidate"]
    prov = decision["provenance"]
    return {
        "schema": LEDGER_SCHEMA,
        "time": prov["created_at"],
        "audit": audit,
        "decision": decision["decision"],
        "calibration": decision["calibration"] is True,   # an A/A run (pairaudit/promotion/calibration.py)
        "reasons": list(decision["reasons"]),
        "not_evaluated": list(decision["not_evaluated"]),
        "config_sha256": None if config is None else sha256_json(config),
        "inputs": dict(prov["consumed"]),
        # The candidate's identity is its launch spec hash (command, env
        # switches, model): the same change audited again matches, whatever
        # the audit name.
        "candidate": {"spec_sha256": cand.spec_sha256, "env": cand.env,
                      "switches_sha256": sha256_json(cand.env or {}), "model": cand.model, "url": cand.url},
        "control_spec_sha256": launch["control"].spec_sha256,
        "decision_path": decision_path,
        "decision_sha256": sha256_file(decision_path),
        "code_version": prov["code_version"],
        "timing": None if timing is None else dict(timing),
    }


def earlier_decisions(ledger: Sequence[Mapping[str, Any]], candidate_spec_sha256: str | None) -> list[dict]:
    return [dict(e) for e in ledger if e.get("schema") == LEDGER_SCHEMA
            and (e.get("candidate") or {}).get("spec_sha256") == candidate_spec_sha256]


def append_ledger(path: str | os.PathLike, entry: Mapping[str, Any]) -> None:
    """Append one line, fsynced; never rewrites what is there (a sweep stays visible)."""
    append_record(path, dict(entry))