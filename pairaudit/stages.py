"""The workflow's stage entry points: read inputs, call the library, write one artifact.

Each function here is what one ``scripts/<stage>.py`` calls; it can be run and
tested without Snakemake.  Artifact schemas: launch receipt
(:mod:`pairaudit.launch`), preflight (:mod:`pairaudit.preflight`), dataset
(:mod:`pairaudit.datasets`), sampled (:mod:`pairaudit.sampled`), and::

    scores  results/<audit>/scores/<dataset>/<arm>.jsonl   header {"schema": "pairaudit.scores/v1",
            "dataset", "arm", "format", "n", "correct", "provenance"}; records as
            scoring.score_records returns them (index, correct, extracted, reason, finish_reason, answered, text, ...)
    paired  results/<audit>/paired/<dataset>.json  {"schema": "pairaudit.paired/v1", "dataset", "format",
            "table": stats.paired_table, "quality": rules.quality_v1, "bootstrap": stats.paired_bootstrap_ci,
            "provenance"}
"""

from __future__ import annotations

from pathlib import Path

from . import artifacts, datasets, launch, preflight, rules, scoring, stats
from .sampled import sampled_stage  # noqa: F401  (re-exported: the sampled script's entry point)

ARMS = ("control", "candidate")


def launch_stage(*, arm: str, arm_cfg: dict, out_path: str, server_log: str) -> dict:
    """Start the arm's server once, prove it healthy and the right one, stop it; write the receipt."""
    spec = launch.resolve_spec(arm, arm_cfg)
    record = launch.launch_record(spec, log_path=server_log)
    record["provenance"] = artifacts.provenance([], {"arm_config": arm_cfg})
    artifacts.write_json(out_path, record)
    return record


def preflight_stage(*, arm: str, arm_cfg: dict, launch_path: str, out_path: str, server_log: str,
                    sampling: dict) -> dict:
    """Seed 004's API rehearsal on a fresh server; the artifact is written even when a probe fails."""
    receipt = artifacts.read_json(launch_path)
    spec = launch.resolve_spec(arm, arm_cfg)
    primary = {k: sampling[k] for k in ("temperature", "top_p", "top_k", "min_p")}
    with launch.Server(spec, log_path=server_log, receipt=receipt) as srv:
        result = preflight.run_preflight(srv.endpoint, spec, primary=primary)
    result["provenance"] = artifacts.provenance([launch_path], {"primary": primary})
    artifacts.write_json(out_path, result)
    preflight.require_pass(result)
    return result


def dataset_stage(*, cfg: dict, where: str, out_path: str, cache_dir: str, base_dir: str) -> dict:
    doc = datasets.prepare_dataset(cfg, cache_dir=Path(cache_dir), base_dir=Path(base_dir), where=where)
    doc["provenance"] = artifacts.provenance([], {"config": cfg})
    artifacts.write_json(out_path, doc)
    return doc


def score_stage(*, dataset_path: str, sampled_path: str, out_path: str, sandbox_limits: dict) -> dict:
    dataset = artifacts.check_schema(artifacts.read_json(dataset_path), datasets.SCHEMA, dataset_path)
    header, records = artifacts.read_jsonl(sampled_path)
    artifacts.check_schema(header, "pairaudit.sampled/v1", sampled_path)
    artifacts.check_consumed(header, [dataset_path], where=sampled_path)
    scored = scoring.score_records(dataset, records, sandbox_limits=sandbox_limits)
    out_header = {
        "schema": "pairaudit.scores/v1",
        "dataset": dataset["name"],
        "arm": header["arm"],
        "format": dataset["format"],
        "n": len(scored),
        "correct": sum(1 for r in scored if r["correct"]),
        "provenance": artifacts.provenance([dataset_path, sampled_path], {"sandbox": sandbox_limits}),
    }
    artifacts.write_jsonl(out_path, out_header, scored)
    return out_header


def paired_stage(*, dataset_path: str, sampled_paths: dict, score_paths: dict, out_path: str,
                 quality_params: dict) -> dict:
    """Pair the arms item by item and apply quality-v1; nothing is adjusted."""
    dataset = artifacts.read_json(dataset_path)
    sampled, scores = {}, {}
    for arm in ARMS:
        s_header, sampled[arm] = artifacts.read_jsonl(sampled_paths[arm])
        c_header, scores[arm] = artifacts.read_jsonl(score_paths[arm])
        artifacts.check_schema(c_header, "pairaudit.scores/v1", score_paths[arm])
        artifacts.check_consumed(c_header, [dataset_path, sampled_paths[arm]], where=score_paths[arm])
        artifacts.check_consumed(s_header, [dataset_path], where=sampled_paths[arm])
        if s_header.get("arm") != arm or c_header.get("arm") != arm:
            raise artifacts.ArtifactError(f"{sampled_paths[arm]}: holds arm {s_header.get('arm')!r}, expected {arm}")
    table = stats.paired_table(scores["control"], scores["candidate"], sampled["control"], sampled["candidate"])
    by_index = {arm: {r["index"]: bool(r["correct"]) for r in scores[arm]} for arm in ARMS}
    order = table["indices"]
    doc = {
        "schema": "pairaudit.paired/v1",
        "dataset": dataset["name"],
        "format": dataset["format"],
        "table": table,
        "quality": rules.quality_v1(table, **quality_params),
        "bootstrap": stats.paired_bootstrap_ci([by_index["control"][i] for i in order],
                                               [by_index["candidate"][i] for i in order]),
        "provenance": artifacts.provenance(
            [dataset_path, *sampled_paths.values(), *score_paths.values()], {"quality": quality_params}),
    }
    artifacts.write_json(out_path, doc)
    return doc
