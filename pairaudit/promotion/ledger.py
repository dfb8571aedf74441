"""The decision ledger: one append-only line per completed decision.


    {"schema": "pairaudit.ledger/v1", "time", "audit", "decision", "calibration", "reasons", "not_evaluated",
     "config_sha256",                       # canonical JSON of the workflow config
     "inputs": {path: sha256},              # = decision provenance.consumed
     "candidate": {"spec_sha256", "env", "switches_sha256", "model", "url"},
     "control_spec_sha256", "decision_path", "decision_sha256", "code_version"}

Earlier decisions are matched on ``candidate.spec_sha256`` (the launch
receipt's identity hash: command, env switches, model), not on the audit name.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from pairaudit.core.artifacts import sha256_file, sha256_json
from pairaudit.core.contracts import LEDGER_SCHEMA, Decision
from pairaudit.core.jsonlog import append_record


def ledger_entry(decision: Decision, launch: Mapping[str, Mapping[str, Any]], *, audit: str | None,
                 config: Any, decision_path: str) -> dict:
    """One line of results/ledger.jsonl: what was decided, on which evidence, for which candidate."""
    cand = launch.get("candidate") or {}
    prov = decision.get("provenance") or {}
    return {
        "schema": LEDGER_SCHEMA,
        "time": prov.get("created_at"),
        "audit": audit,
        "decision": decision["decision"],
        "calibration": decision.get("calibration") is True,   # an A/A run (pairaudit/promotion/calibration.py)
        "reasons": list(decision.get("reasons") or []),
        "not_evaluated": list(decision.get("not_evaluated") or []),
        "config_sha256": None if config is None else sha256_json(config),
        "inputs": dict(prov.get("consumed") or {}),
        # The candidate's identity is its launch spec hash (command, env
        # switches, model): the same change audited again matches, whatever
        # the audit name.
        "candidate": {"spec_sha256": cand.get("spec_sha256"), "env": cand.get("env"),
                      "switches_sha256": sha256_json(cand.get("env") or {}), "model": cand.get("model"),
                      "url": cand.get("url")},
        "control_spec_sha256": (launch.get("control") or {}).get("spec_sha256"),
        "decision_path": decision_path,
        "decision_sha256": sha256_file(decision_path),
        "code_version": prov.get("code_version"),
    }


def earlier_decisions(ledger: Sequence[Mapping[str, Any]], candidate_spec_sha256: str | None) -> list[dict]:
    return [dict(e) for e in ledger if e.get("schema") == LEDGER_SCHEMA
            and (e.get("candidate") or {}).get("spec_sha256") == candidate_spec_sha256]


def append_ledger(path: str | os.PathLike, entry: Mapping[str, Any]) -> None:
    """Append one line, fsynced; never rewrites what is there (a sweep stays visible)."""
    append_record(path, dict(entry))