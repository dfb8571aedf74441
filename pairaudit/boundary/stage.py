"""The boundary gate: boundary-v1 over both arms' cases (run in each arm's answers phase), side by side."""

from __future__ import annotations

from typing import Any, Mapping

from pairaudit import gates
from pairaudit.core import artifacts
from pairaudit.core.contracts import ARMS, BOUNDARY_GATE_SCHEMA, BOUNDARY_SCHEMA, LAUNCH_SCHEMA
from pairaudit.serving import armspec

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
        if ref is None:  # a name comes from one of the arms' cases, so never
            raise AssertionError(f"boundary case {name!r} in neither arm")
        rows.append({"case": name, "kind": ref["kind"], "planted": ref["planted"], "expected": ref["expected"],
                     "identical_text": bool(c and k and c["text"] == k["text"]),
                     "control": {x: c.get(x) for x in SIDE_KEYS} if c else None,
                     "candidate": {x: k.get(x) for x in SIDE_KEYS} if k else None})
    return rows


def boundary_gate_stage(*, arm_paths: Mapping[str, str], launch_paths: Mapping[str, str],
                        spec_paths: Mapping[str, str], out_path: str) -> dict:
    """boundary-v1 over both arms' cases, with every case side by side.

    Each arm's cases must come from the server its spec describes: the launch
    receipt of the phase that ran them carries the spec's identity hash (the
    cases and receipts are read as they stand, the spec is the arm now).
    """
    docs = {}
    for arm in ARMS:
        docs[arm] = artifacts.check_schema(artifacts.read_json(arm_paths[arm]), BOUNDARY_SCHEMA, arm_paths[arm])
        receipt = artifacts.check_schema(artifacts.read_json(launch_paths[arm]), LAUNCH_SCHEMA, launch_paths[arm])
        artifacts.check_consumed(docs[arm], [launch_paths[arm]], where=arm_paths[arm])
        spec = armspec.read_spec(spec_paths[arm], arm=arm)
        if receipt.get("spec_sha256") != spec.spec_sha256:
            raise artifacts.ArtifactError(
                f"{arm_paths[arm]}: the {arm} cases were answered by the server of spec {receipt.get('spec_sha256')} "
                f"({launch_paths[arm]}), but {spec_paths[arm]} now describes {spec.spec_sha256}; rerun the {arm} "
                "answers phase")
    doc = {"schema": BOUNDARY_GATE_SCHEMA, "gate": gates.default_rule("boundary").apply(rule_cases(docs)),
           "max_model_len": {arm: docs[arm]["max_model_len"] for arm in ARMS},
           "cases": side_by_side(docs), "first_long": {arm: docs[arm]["first_long"] for arm in ARMS},
           "provenance": artifacts.provenance([*arm_paths.values(), *spec_paths.values()], {})}
    artifacts.write_json(out_path, doc)
    return doc
