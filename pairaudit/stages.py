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
    greedy  results/<audit>/greedy/<dataset>/<arm>.jsonl  header {"schema": "pairaudit.greedy/v1", "dataset",
            "arm", "selection": {mode, discordant, concordant, indices}, "max_tokens", "determinism": {"index",
            "hashes", "records"}, "provenance"}; records: greedy.greedy_one's record + prompt_ids, run, slot, key
    divergence  results/<audit>/divergence/<dataset>.json  {"schema": "pairaudit.divergence/v1", "dataset",
            "items", "divergences", "probes": {arm: [...]}, "grid_tie_inputs", "grid_tie": rules.grid_tie_v1,
            "determinism": rules.determinism_v1, "provenance"}
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from . import artifacts, datasets, greedy, launch, preflight, rules, scoring, stats
from .progress import Progress
from .sampled import Journal, is_final, read_journal
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
    if result.get("verdict") != "PASS":
        # Snakemake deletes a failed job's outputs; the failing probe's evidence is kept beside the server log
        kept = f"{server_log}.preflight.json"
        artifacts.write_json(kept, result)
        logging.getLogger("pairaudit").error("preflight evidence kept in %s", kept)
    preflight.require_pass(result)
    return result


def dataset_stage(*, cfg: dict, where: str, out_path: str, cache_dir: str, base_dir: str) -> dict:
    doc = datasets.prepare_dataset(cfg, cache_dir=Path(cache_dir), base_dir=Path(base_dir), where=where)
    doc["provenance"] = artifacts.provenance([], {"config": cfg})
    artifacts.write_json(out_path, doc)
    return doc


def score_stage(*, dataset_path: str, sampled_path: str, out_path: str, sandbox_limits: dict,
                workers: int = 2) -> dict:
    dataset = artifacts.check_schema(artifacts.read_json(dataset_path), datasets.SCHEMA, dataset_path)
    header, records = artifacts.read_jsonl(sampled_path)
    artifacts.check_schema(header, "pairaudit.sampled/v1", sampled_path)
    artifacts.check_consumed(header, [dataset_path], where=sampled_path)
    scored = scoring.score_records(dataset, records, sandbox_limits=sandbox_limits, workers=workers)
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


# --- greedy diagnostics (seed 000) ---------------------------------------------
GREEDY_DEFAULTS = {"items": "discordant", "concordant": 2, "seed": 0, "max_tokens": 256, "determinism_repeats": 3}


def greedy_selection(paired: dict, cfg: dict) -> dict:
    """Which items get greedy runs: every discordant item plus a few concordant ones as a control (or all)."""
    table = paired["table"]
    indices = list(table["indices"])
    if cfg["items"] == "all":
        return {"mode": "all", "discordant": sorted(table["control_only"] + table["candidate_only"]),
                "concordant": [], "indices": sorted(indices)}
    discordant = sorted(table["control_only"] + table["candidate_only"])
    rest = sorted(set(indices) - set(discordant))
    concordant = sorted(random.Random(cfg["seed"]).sample(rest, min(cfg["concordant"], len(rest))))
    return {"mode": "discordant", "discordant": discordant, "concordant": concordant,
            "indices": sorted(discordant + concordant)}


def greedy_stage(*, dataset_path: str, paired_path: str, launch_path: str, preflight_path: str, out_path: str,
                 journal_path: str, arm: str, arm_cfg: dict, greedy_cfg: dict, chat_template_kwargs: dict,
                 server_log: str) -> dict:
    """Greedy generations (concurrency 1, fresh salt each, top-20) and the determinism repeats of one arm.

    Journaled like the sampled stage: items already generated are kept, not
    generated again, when the job reruns (e.g. the selection grew).
    """
    cfg = {**GREEDY_DEFAULTS, **(greedy_cfg or {})}
    dataset = artifacts.read_json(dataset_path)
    paired = artifacts.check_schema(artifacts.read_json(paired_path), "pairaudit.paired/v1", paired_path)
    if artifacts.read_json(preflight_path).get("verdict") != "PASS":
        raise RuntimeError(f"{preflight_path}: preflight of arm {arm} did not pass; no greedy runs")
    selection = greedy_selection(paired, cfg)
    items = {it["index"]: it for it in dataset["items"]}
    det_index = selection["indices"][0] if selection["indices"] else dataset["items"][0]["index"]
    want = [("greedy", i) for i in selection["indices"]] + [("determinism", r) for r in
                                                           range(cfg["determinism_repeats"])]
    key = {"max_tokens": cfg["max_tokens"], "determinism_index": det_index,
           "chat_template_kwargs": chat_template_kwargs}
    jpath = Path(journal_path)
    done = {}
    for rec in read_journal(jpath):
        if rec.get("key") == key and is_final(rec):
            done.setdefault((rec["run"], rec["slot"]), rec)
    todo = [w for w in want if w not in done]
    spec = launch.resolve_spec(arm, arm_cfg)
    if todo:
        receipt = artifacts.read_json(launch_path)
        journal = Journal(jpath)
        try:
            with launch.Server(spec, log_path=server_log, receipt=receipt) as srv:
                model = spec["served_model_name"]
                prompts = {}
                # Runs journaled by an earlier attempt count as done.
                progress = Progress(len(want), f"greedy {dataset['name']}/{arm}", done=len(want) - len(todo))
                for kind, slot in todo:
                    index = slot if kind == "greedy" else det_index
                    if index not in prompts:
                        prompts[index] = greedy.prompt_ids(srv.endpoint, model, items[index]["messages"],
                                                           chat_template_kwargs)
                    rec = greedy.greedy_one(srv.endpoint, model, prompts[index], max_tokens=cfg["max_tokens"],
                                            index=index)
                    rec.update(run=kind, slot=slot, key=key, prompt_ids=prompts[index])
                    journal.append(rec)
                    done[(kind, slot)] = rec
                    srv.assert_alive()
                    progress.step()
        finally:
            journal.close()
    missing = [w for w in want if w not in done or not is_final(done[w])]
    if missing:
        raise RuntimeError(f"{dataset['name']}/{arm}: greedy runs without an answer: {missing}; rerun to resume")
    records = [done[w] for w in want if w[0] == "greedy"]
    repeats = [done[w] for w in want if w[0] == "determinism"]
    header = {
        "schema": "pairaudit.greedy/v1",
        "dataset": dataset["name"],
        "arm": arm,
        "selection": selection,
        "max_tokens": cfg["max_tokens"],
        "determinism": {"index": det_index, "hashes": [r["output_sha256"] or f"error:{r['error']}" for r in repeats],
                        "records": repeats},
        "provenance": artifacts.provenance([dataset_path, paired_path, launch_path, preflight_path],
                                           {"greedy": cfg, "journal": str(jpath)}),
    }
    artifacts.write_jsonl(out_path, header, records)
    return header


def divergence_stage(*, dataset_path: str, greedy_paths: dict, launch_paths: dict, arm_cfgs: dict, out_path: str,
                     server_logs: dict, max_divergent: int = 3) -> dict:
    """First divergences, then both arms probed on the shared prefix -- one server after the other in this job."""
    headers, records = {}, {}
    for arm in ARMS:
        headers[arm], records[arm] = artifacts.read_jsonl(greedy_paths[arm])
        artifacts.check_schema(headers[arm], "pairaudit.greedy/v1", greedy_paths[arm])
        artifacts.check_consumed(headers[arm], [dataset_path, launch_paths[arm]], where=greedy_paths[arm])
    by_arm = {arm: {r["index"]: r for r in records[arm]} for arm in ARMS}
    if sorted(by_arm["control"]) != sorted(by_arm["candidate"]):
        raise artifacts.ArtifactError(f"greedy item sets differ between arms: {sorted(by_arm['control'])} vs "
                                      f"{sorted(by_arm['candidate'])}")
    order = sorted(by_arm["control"])
    divergences = greedy.divergence_records([by_arm["control"][i] for i in order],
                                            [by_arm["candidate"][i] for i in order])
    prompt_ids = {}
    for d in divergences:
        a, b = by_arm["control"][d["index"]]["prompt_ids"], by_arm["candidate"][d["index"]]["prompt_ids"]
        d["prompt_ids_equal"] = a == b
        if a != b:  # two templates rendered differently: the flip may come from the prompt, not the change
            d["diverged"], d["error"] = None, "the arms tokenized the chat prompt differently"
        prompt_ids[d["index"]] = a
    probed = [d for d in divergences if d["diverged"]]
    probes = {arm: [] for arm in ARMS}
    if probed:
        for arm in ARMS:
            spec = launch.resolve_spec(arm, arm_cfgs[arm])
            receipt = artifacts.read_json(launch_paths[arm])
            with launch.Server(spec, log_path=server_logs[arm], receipt=receipt) as srv:
                probes[arm] = greedy.probes_for_arm(srv.endpoint, spec["served_model_name"], probed, prompt_ids)
    # an item whose divergence could not be established stays in the rule with no evidence, so it STOPs
    unresolved = [{"index": d["index"], "control_token_id": None, "candidate_token_id": None, "candidate_top": None,
                   "control_top": None, "control_prefix_len": None, "candidate_prefix_len": None}
                  for d in divergences if d["diverged"] is None]
    grid_inputs = greedy.grid_tie_inputs(probed, probes["control"], probes["candidate"]) + unresolved
    doc = {
        "schema": "pairaudit.divergence/v1",
        "dataset": headers["control"]["dataset"],
        "items": order,
        "divergences": divergences,
        "probes": probes,
        "grid_tie_inputs": grid_inputs,
        "grid_tie": rules.grid_tie_v1(grid_inputs, max_divergent=max_divergent),
        "determinism": rules.determinism_v1({arm: headers[arm]["determinism"]["hashes"] for arm in ARMS}),
        "provenance": artifacts.provenance([dataset_path, *greedy_paths.values(), *launch_paths.values()],
                                           {"max_divergent": max_divergent}),
    }
    artifacts.write_json(out_path, doc)
    return doc
