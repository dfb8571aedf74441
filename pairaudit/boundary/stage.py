"""The boundary gate: both arms' boundary cases side by side, judged by boundary-v1.

The `boundary_gate` rule calls this; the cases themselves are asked in the answers phase (``boundary.cases``).
"""

from __future__ import annotations

from typing import Any, Mapping

from pairaudit import gates
from pairaudit.core import artifacts
from pairaudit.core.contracts import ARMS, BOUNDARY_GATE_SCHEMA, BOUNDARY_SCHEMA

SIDE_KEYS = ("text", "finish_reason", "correct", "extracted", "prompt_tokens", "max_tokens", "usage_prompt_tokens",
             "ttft_s", "input_tokens_per_s", "status", "error", "error_body", "clamped", "config_error")


def rule_cases(docs: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    return [{"arm": arm, "case": c["case"], "correct": c["correct"], "finish_reason": c["finish_reason"],
             "expected": c["expected"], "text": c["text"], "config_error": c.get("config_error")}
            for arm in ARMS for c in docs[arm]["cases"]]


def side_by_side(docs: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    by = {arm: {c["case"]: c for c in docs[arm]["cases"]} for arm in ARMS}
    order = list(by["control"]) + [k for k in by["candidate"] if k not in by["control"]]
    rows = []
    for name in order:
        c, k = by["control"].get(name), by["candidate"].get(name)
        ref = c or k
        rows.append({"case": name, "kind": ref["kind"], "planted": ref["planted"], "expected": ref["expected"],
                     "identical_text": bool(c and k and c["text"] == k["text"]),
                     "control": {x: c.get(x) for x in SIDE_KEYS} if c else None,
                     "candidate": {x: k.get(x) for x in SIDE_KEYS} if k else None})
    return rows


def boundary_gate_stage(*, arm_paths: Mapping[str, str], launch_paths: Mapping[str, str], out_path: str) -> dict:
    """boundary-v1 over both arms' cases, with every case side by side."""
    docs = {}
    for arm in ARMS:
        docs[arm] = artifacts.check_schema(artifacts.read_json(arm_paths[arm]), BOUNDARY_SCHEMA, arm_paths[arm])
        artifacts.check_consumed(docs[arm], [launch_paths[arm]], where=arm_paths[arm])
    doc = {"schema": BOUNDARY_GATE_SCHEMA, "gate": gates.boundary_v1(rule_cases(docs)),
           "max_model_len": {arm: docs[arm]["max_model_len"] for arm in ARMS},
           "cases": side_by_side(docs), "first_long": {arm: docs[arm]["first_long"] for arm in ARMS},
           "provenance": artifacts.provenance([*arm_paths.values()], {})}
    artifacts.write_json(out_path, doc)
    return doc
