"""What the server phases will ask, decided before any server starts.

Three small artifacts, each computed from the config alone, stand between the
config and the phases so that Snakemake reruns exactly what a change touches:

- ``specs/<arm>.json``: the arm's resolved server spec and its identity hash;
  it changes only when the arm does (the speed bracket, the boundary gate and
  the diagnostics depend on it);
- ``requests/<dataset>/<arm>.json``: the exact request body of every item of
  one dataset on one arm; it changes only when that dataset, the sampling
  settings or the arm do (the dataset's answers are assembled from it);
- ``boundary/plan.json``: the boundary settings both arms' cases are built
  from.

The phases read the answers' outputs of other datasets as ``ancient``
(answering one dataset must not rerun another's chain), so these plans carry
the dependency instead: a job reruns when its plan changes, and only then.
"""

from __future__ import annotations

from . import artifacts, boundary, launch
from .artifacts import sha256_json
from .contracts import ARM_SPEC_SCHEMA, BOUNDARY_PLAN_SCHEMA, DATASET_SCHEMA, REQUESTS_SCHEMA
from .sampled import body_sha256, request_body

SPEC_SCHEMA = ARM_SPEC_SCHEMA


def arm_spec_stage(*, arm: str, arm_cfg: dict, out_path: str) -> dict:
    spec = launch.resolve_spec(arm, arm_cfg)
    doc = {"schema": SPEC_SCHEMA, "arm": arm, "spec": spec,
           "spec_sha256": sha256_json(launch.identity_fields(spec)),  # as the launch receipt hashes it
           "provenance": artifacts.provenance([], {"arm_config": arm_cfg})}
    artifacts.write_json(out_path, doc)
    return doc


def requests_stage(*, dataset_path: str, spec_path: str, sampling: dict, audit: str, out_path: str) -> dict:
    dataset = artifacts.check_schema(artifacts.read_json(dataset_path), DATASET_SCHEMA, dataset_path)
    spec = artifacts.check_schema(artifacts.read_json(spec_path), SPEC_SCHEMA, spec_path)
    model = spec["spec"]["served_model_name"]
    items = []
    for it in dataset["items"]:
        body = request_body(it, sampling, model=model, audit=audit, dataset=dataset["name"])
        items.append({"index": it["index"], "body": body, "body_sha256": body_sha256(body)})
    doc = {"schema": REQUESTS_SCHEMA, "dataset": dataset["name"], "arm": spec["arm"], "model": model,
           "n": len(items), "items": items,
           "provenance": artifacts.provenance([dataset_path, spec_path], {"sampling": sampling, "audit": audit})}
    artifacts.write_json(out_path, doc)
    return doc


def read_requests(path: str) -> dict:
    return artifacts.check_schema(artifacts.read_json(path), REQUESTS_SCHEMA, path)


def bodies(requests: dict) -> dict[int, dict]:
    return {it["index"]: it["body"] for it in requests["items"]}


def boundary_plan_stage(*, cfg: dict | None, out_path: str) -> dict:
    doc = {"schema": BOUNDARY_PLAN_SCHEMA, "params": boundary.settings(cfg),
           "provenance": artifacts.provenance([], {"boundary": cfg})}
    artifacts.write_json(out_path, doc)
    return doc
