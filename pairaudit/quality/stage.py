"""The quality stages: score one dataset on one arm (no server), then pair the arms item by item under
the configured quality rule (rules.quality.rule: quality-v2 by default, or quality-v1)."""

from __future__ import annotations

from typing import Any, Mapping, cast

from pairaudit import gates
from pairaudit.core import artifacts, contracts, stats
from pairaudit.core.contracts import (
    ARMS,
    PAIRED_SCHEMA,
    SAMPLED_SCHEMA,
    SCORES_SCHEMA,
    SampledRecord,
    ScoreRecord,
    arm_role,
)
from pairaudit.core.settings import QualitySettings, SandboxSettings
from pairaudit.quality import scoring


def score_stage(*, dataset_path: str, sampled_path: str, out_path: str,
                sandbox_limits: SandboxSettings | Mapping[str, Any], workers: int = 2) -> dict:
    """Score one dataset's sampled answers of one arm.

    ``sandbox_limits``: ``scoring.sandbox`` as the workflow resolved it at load, used as it is (a mapping,
    e.g. an earlier scores file's provenance, is read with the schema's defaults for what it leaves out).
    """
    sandbox = scoring.sandbox_settings(sandbox_limits)
    dataset = artifacts.check_schema(artifacts.read_json(dataset_path), contracts.DATASET_SCHEMA, dataset_path)
    header, rows = artifacts.read_jsonl(sampled_path)
    artifacts.check_schema(header, SAMPLED_SCHEMA, sampled_path)
    records = cast(list[SampledRecord], rows)  # the schema checked: the sampled stage's records
    artifacts.check_consumed(header, [dataset_path], where=sampled_path)
    scored = scoring.score_records(dataset, records, sandbox_limits=sandbox, workers=workers,
                                   max_model_len=header.get("max_model_len"))
    out_header = {
        "schema": SCORES_SCHEMA,
        "dataset": dataset["name"],
        "arm": header["arm"],
        "format": dataset["format"],
        "n": len(scored),
        "correct": sum(1 for r in scored if r["correct"]),
        "arm_failed": header.get("arm_failed"),
        "provenance": artifacts.provenance([dataset_path, sampled_path], {"sandbox": sandbox.to_json()}),
    }
    artifacts.write_jsonl(out_path, out_header, scored)
    return out_header


def paired_stage(*, dataset_path: str, sampled_paths: dict, score_paths: dict, out_path: str,
                 quality: QualitySettings, datasets: int = 1) -> dict:
    """Pair the arms item by item and apply the quality rule; nothing is adjusted.

    ``quality``: ``rules.quality`` as the workflow resolved it at load (the rule and its parameters), used
    as it is. ``datasets``: how many datasets the audit judges (quality-v2's Bonferroni family).
    """
    dataset = artifacts.read_json(dataset_path)
    sampled: dict[str, list[SampledRecord]] = {}
    scores: dict[str, list[ScoreRecord]] = {}
    headers: dict[str, dict] = {}
    for arm in ARMS:
        s_header, s_rows = artifacts.read_jsonl(sampled_paths[arm])
        c_header, c_rows = artifacts.read_jsonl(score_paths[arm])
        # as written by the sampled and score stages (their schemas are checked here)
        sampled[arm], scores[arm] = cast(list[SampledRecord], s_rows), cast(list[ScoreRecord], c_rows)
        artifacts.check_schema(s_header, SAMPLED_SCHEMA, sampled_paths[arm])
        headers[arm] = c_header
        artifacts.check_schema(c_header, SCORES_SCHEMA, score_paths[arm])
        artifacts.check_consumed(c_header, [dataset_path, sampled_paths[arm]], where=score_paths[arm])
        artifacts.check_consumed(s_header, [dataset_path], where=sampled_paths[arm])
        # by role: a sweep's candidate arm is named by its change (contracts.arm_role)
        if any(not isinstance(h.get("arm"), str) or arm_role(h["arm"]) != arm for h in (s_header, c_header)):
            raise artifacts.ArtifactError(f"{sampled_paths[arm]}: holds arm {s_header.get('arm')!r}, expected {arm}")
    failed = {arm: headers[arm]["arm_failed"] for arm in ARMS if headers[arm].get("arm_failed")}
    if failed:
        # pair what both arms answered before a server failed; the quality rule cannot judge a part
        common = set.intersection(*({r["index"] for r in scores[arm]} for arm in ARMS))
        for arm in ARMS:
            scores[arm] = [r for r in scores[arm] if r["index"] in common]
            sampled[arm] = [r for r in sampled[arm] if r["index"] in common]
    table = stats.paired_table(scores["control"], scores["candidate"], sampled["control"], sampled["candidate"])
    by_index = {arm: {r["index"]: bool(r["correct"]) for r in scores[arm]} for arm in ARMS}
    order = table["indices"]
    # each rule reads its own parameters; the paired record keeps the section as the config had it
    result = gates.rule(quality.rule, "quality").apply(table, quality.rule_params, datasets=datasets)
    if failed:
        result = {**result, "verdict": "INCONCLUSIVE", "stage_verdict": result["verdict"],
                   "reasons": [f"not comparable: the {arm} server failed ({why})" for arm, why in failed.items()]
                   + [f"only the {len(order)} items both arms answered are paired"]}
    doc = {
        "schema": PAIRED_SCHEMA,
        "dataset": dataset["name"],
        "format": dataset["format"],
        "arm_failed": failed or None,
        "table": table,
        "quality": result,
        # no items (an arm's server failed before answering any): nothing to resample
        "bootstrap": stats.paired_bootstrap_ci([by_index["control"][i] for i in order],
                                               [by_index["candidate"][i] for i in order]) if order else None,
        "provenance": artifacts.provenance(
            [dataset_path, *sampled_paths.values(), *score_paths.values()],
            {"quality": quality.to_json(), "datasets": datasets}),
    }
    artifacts.write_json(out_path, doc)
    return doc
