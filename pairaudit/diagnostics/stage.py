"""The diagnostics: greedy divergences, grid-tie and determinism of both arms, from their answers phases (no server).

Each arm's answers phase ran greedy on every item of every dataset and the
determinism repeats, on the same start that answered its sampled runs
(``pairaudit.answers.greedy``). Here the paired tables select which items
are compared (``plan.greedy_selection``), the first divergences are found,
and grid-tie-v1 reads each arm's own top-20 at the divergence from its greedy
run (``greedy.greedy_tops``). This job starts no server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from pairaudit import gates
from pairaudit.core import artifacts, contracts
from pairaudit.core.contracts import ARMS, DIVERGENCE_SCHEMA, GREEDY_SCHEMA, PAIRED_SCHEMA, PHASE_SCHEMA, journal_path
from pairaudit.core.settings import GreedySettings
from pairaudit.diagnostics.divergence import TOP_LISTS, divergence_doc, find_divergences
from pairaudit.diagnostics.plan import answered_plan, greedy_artifact, greedy_selection
from pairaudit.gates import server_failure


def _diagnostics_not_run(names: list[str], failed: Mapping[str, str], greedy_paths, divergence_paths,
                         phase_path: str, consumed: list[str]) -> dict:
    """No greedy runs after an arm's server failed: every artifact says why, and no rule passes on it."""
    why = "; ".join(f"the {arm} server failed in its answers phase ({s})" for arm, s in failed.items())
    prov = artifacts.provenance(consumed, {})
    for name in names:
        for arm in ARMS:
            artifacts.write_jsonl(greedy_paths[name][arm], {
                "schema": GREEDY_SCHEMA, "dataset": name, "arm": arm, "not_run": why,
                "selection": {"mode": None, "discordant": [], "concordant": [], "indices": []},
                "determinism": {"index": None, "hashes": [], "records": []}, "provenance": prov}, [])
        not_run = {"verdict": "INCONCLUSIVE", "reasons": [f"not run: {why}"]}
        artifacts.write_json(divergence_paths[name], {
            "schema": DIVERGENCE_SCHEMA, "dataset": name, "not_run": why, "items": [], "divergences": [],
            "top_lists": TOP_LISTS, "probes": {arm: [] for arm in ARMS}, "grid_tie_inputs": [],
            "grid_tie": {"rule": gates.default_rule("grid_tie").name, **not_run},
            "determinism": {"rule": gates.default_rule("determinism").name, **not_run},
            "provenance": prov})
    doc = {"schema": PHASE_SCHEMA, "phase": "diagnostics", "starts": [], "not_run": why, "provenance": prov}
    artifacts.write_json(phase_path, doc)
    return doc


def diagnostics_phase(*, dataset_paths: Mapping[str, str], paired_paths: Mapping[str, str],
                      receipt_paths: Mapping[str, str], preflight_paths: Mapping[str, str],
                      answers_paths: Mapping[str, str], greedy: GreedySettings, chat_template_kwargs: dict,
                      journal_dir: str, greedy_paths: Mapping[str, Mapping[str, str]],
                      divergence_paths: Mapping[str, str], phase_path: str, max_divergent: int) -> dict:
    """The greedy artifacts and divergences of every dataset, from both arms' answers phases; starts no server.

    ``answers_paths``: role -> that arm's ``answers/<arm>.json``; its greedy
    journal is the arm's (by the arm's own name, so a sweep's candidates all
    read the control's one journal). ``greedy`` and ``max_divergent``
    (``rules.grid_tie``) are the config as the workflow resolved it at load.
    """
    names = list(dataset_paths)
    answers = {arm: artifacts.check_schema(artifacts.read_json(answers_paths[arm]), PHASE_SCHEMA, answers_paths[arm])
               for arm in ARMS}
    failed = {arm: server_failure.summary(doc["failure"]) for arm, doc in answers.items() if doc.get("failure")}
    if failed:
        return _diagnostics_not_run(names, failed, greedy_paths, divergence_paths, phase_path,
                                    [*answers_paths.values()])
    for arm in ARMS:
        artifacts.check_schema(artifacts.read_json(receipt_paths[arm]), contracts.LAUNCH_SCHEMA, receipt_paths[arm])
        if artifacts.read_json(preflight_paths[arm]).get("verdict") != "PASS":
            raise artifacts.ArtifactError(f"{preflight_paths[arm]}: preflight of arm {arm} did not pass; "
                                          "no greedy runs")

    datasets: dict[str, dict] = {}
    for name in names:
        ds = artifacts.read_json(dataset_paths[name])
        paired = artifacts.check_schema(artifacts.read_json(paired_paths[name]), PAIRED_SCHEMA, paired_paths[name])
        selection = greedy_selection(paired, greedy)
        headers, records = {}, {}
        for arm in ARMS:
            journal = Path(journal_path(journal_dir, contracts.JOURNAL_GREEDY, dataset=name,
                                        arm=answers[arm].get("arm") or arm))
            plan = answered_plan(ds, greedy, chat_template_kwargs, journal)
            headers[arm], records[arm] = greedy_artifact(
                plan, selection, arm=arm, cfg=greedy, answers=answers[arm],
                consumed=[dataset_paths[name], paired_paths[name], receipt_paths[arm], preflight_paths[arm],
                          answers_paths[arm]])
        order, divergences, by_index = find_divergences(records)
        for arm in ARMS:
            artifacts.write_jsonl(greedy_paths[name][arm], headers[arm], records[arm])
        doc = divergence_doc(name, headers, by_index, divergences, order,
                             [dataset_paths[name], *greedy_paths[name].values(), *receipt_paths.values()],
                             max_divergent)
        artifacts.write_json(divergence_paths[name], doc)
        datasets[name] = {arm: {"greedy": len(records[arm])} for arm in ARMS}
    phase = {"schema": PHASE_SCHEMA, "phase": "diagnostics",
             # the greedy runs were made in each arm's answers phase, on its one start
             "starts": [], "greedy_from": {arm: answers_paths[arm] for arm in ARMS},
             "datasets": datasets,
             "provenance": artifacts.provenance([*paired_paths.values(), *answers_paths.values()],
                                                {"greedy": greedy.to_json()})}
    artifacts.write_json(phase_path, phase)
    return phase
