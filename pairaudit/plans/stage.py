"""The plans: each arm's resolved spec, every request body per dataset and arm, the boundary settings (no server)."""

from __future__ import annotations

from pairaudit.core import artifacts
from pairaudit.core.contracts import BOUNDARY_PLAN_SCHEMA, DATASET_SCHEMA, REQUESTS_SCHEMA
from pairaudit.core.settings import BoundarySettings
from pairaudit.plans.requests import body_sha256, request_body
from pairaudit.serving import armspec


def arm_spec_stage(*, arm: str, arm_cfg: dict, out_path: str) -> dict:
    """The arm's spec, resolved from its config once for every phase (``armspec.read_spec`` reads it back)."""
    spec = armspec.resolve_spec(arm, arm_cfg)
    doc = armspec.spec_doc(spec, provenance=artifacts.provenance([], {"arm_config": arm_cfg}))
    artifacts.write_json(out_path, doc)
    return doc


def requests_stage(*, dataset_path: str, spec_path: str, sampling: dict, audit: str, out_path: str) -> dict:
    dataset = artifacts.check_schema(artifacts.read_json(dataset_path), DATASET_SCHEMA, dataset_path)
    spec = armspec.read_spec(spec_path)
    model = spec.served_model_name
    items = []
    for it in dataset["items"]:
        body = request_body(it, sampling, model=model, audit=audit, dataset=dataset["name"])
        items.append({"index": it["index"], "body": body, "body_sha256": body_sha256(body)})
    doc = {"schema": REQUESTS_SCHEMA, "dataset": dataset["name"], "arm": spec.arm, "model": model,
           "n": len(items), "items": items,
           "provenance": artifacts.provenance([dataset_path, spec_path], {"sampling": sampling, "audit": audit})}
    artifacts.write_json(out_path, doc)
    return doc


def boundary_plan_stage(*, boundary: BoundarySettings, out_path: str) -> dict:
    """The boundary section as the workflow resolved it at load (``boundary.cases.settings``), for both arms."""
    params = boundary.to_json()
    doc = {"schema": BOUNDARY_PLAN_SCHEMA, "params": params, "provenance": artifacts.provenance([], {"boundary": params})}
    artifacts.write_json(out_path, doc)
    return doc
