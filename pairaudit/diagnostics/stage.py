"""The diagnostics phase: greedy runs, determinism repeats and divergence probes of both arms, in few starts."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from pairaudit import gates
from pairaudit.core import artifacts, contracts
from pairaudit.core.settings import GreedySettings
from pairaudit.core.contracts import ARMS, DIVERGENCE_SCHEMA, GREEDY_SCHEMA, PAIRED_SCHEMA, PHASE_SCHEMA, journal_path
from pairaudit.diagnostics.divergence import divergence_doc, find_divergences, probe_arm
from pairaudit.diagnostics.plan import GreedyPlan
from pairaudit.gates import server_failure
from pairaudit.serving import armspec
from pairaudit.serving.phase import PhaseError, PhaseServer


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
            "probes": {arm: [] for arm in ARMS}, "grid_tie_inputs": [],
            "grid_tie": {"rule": gates.default_rule("grid_tie").name, **not_run},
            "determinism": {"rule": gates.default_rule("determinism").name, **not_run},
            "provenance": prov})
    doc = {"schema": PHASE_SCHEMA, "phase": "diagnostics", "starts": [], "not_run": why, "provenance": prov}
    artifacts.write_json(phase_path, doc)
    return doc


def diagnostics_phase(*, dataset_paths: Mapping[str, str], paired_paths: Mapping[str, str],
                      receipt_paths: Mapping[str, str], preflight_paths: Mapping[str, str],
                      spec_paths: Mapping[str, str], greedy: GreedySettings, chat_template_kwargs: dict,
                      journal_dir: str, greedy_paths: Mapping[str, Mapping[str, str]],
                      divergence_paths: Mapping[str, str], server_logs: Mapping[str, str], starts_log: str,
                      phase_path: str, max_divergent: int,
                      answers_paths: Mapping[str, str] | None = None) -> dict:
    """Greedy runs, determinism repeats and divergence probes of every dataset, both arms, in few starts.

    Each arm's server is the one its ``specs/<arm>.json`` (``spec_paths``) describes; ``greedy`` and
    ``max_divergent`` (``rules.grid_tie``) are the config as the workflow resolved it at load.
    """
    names = list(dataset_paths)
    answers = {arm: artifacts.read_json(answers_paths[arm]) for arm in ARMS} if answers_paths else {}
    failed = {arm: server_failure.summary(doc["failure"]) for arm, doc in answers.items() if doc.get("failure")}
    if answers_paths and failed:
        return _diagnostics_not_run(names, failed, greedy_paths, divergence_paths, phase_path,
                                    [*answers_paths.values()])
    specs, receipts = {}, {}
    for arm in ARMS:
        receipts[arm] = artifacts.check_schema(artifacts.read_json(receipt_paths[arm]), contracts.LAUNCH_SCHEMA,
                                               receipt_paths[arm])
        pf = artifacts.read_json(preflight_paths[arm])
        if pf.get("verdict") != "PASS":
            raise PhaseError(f"{preflight_paths[arm]}: preflight of arm {arm} did not pass; no greedy runs")
        specs[arm] = armspec.read_spec(spec_paths[arm], arm=arm)

    def journal(key: str, name: str, arm: str) -> Path:
        # by the arm's own name: a sweep's control journal is shared by every candidate's diagnostics, so the
        # control's greedy runs and probes are made once and each candidate asks only for what it lacks
        return Path(journal_path(journal_dir, key, dataset=name, arm=specs[arm].arm))

    plans: dict[str, dict[str, GreedyPlan]] = {}
    for name in names:
        ds = artifacts.read_json(dataset_paths[name])
        paired = artifacts.check_schema(artifacts.read_json(paired_paths[name]), PAIRED_SCHEMA,
                                        paired_paths[name])
        plans[name] = {arm: GreedyPlan(ds, paired, greedy, chat_template_kwargs,
                                       journal(contracts.JOURNAL_GREEDY, name, arm)) for arm in ARMS}

    def session(arm: str, why: str) -> PhaseServer:
        return PhaseServer(specs[arm], phase="diagnostics", log_path=server_logs[arm], receipt=receipts[arm],
                           starts_log=starts_log, why=why)

    greedy_out: dict[str, dict[str, tuple]] = {name: {} for name in names}
    starts = []

    def greedy_turn(ps: PhaseServer, arm: str) -> None:
        for name in names:
            if plans[name][arm].todo:
                plans[name][arm].run(ps.get(), arm)
            ps.verify()
        for name in names:
            greedy_out[name][arm] = plans[name][arm].header_and_records(
                arm, [dataset_paths[name], paired_paths[name], receipt_paths[arm], preflight_paths[arm]])

    # Control first, so the candidate's server, started second, can also answer its probes.
    control = session("control", "greedy runs and determinism repeats of the items the paired tables select")
    try:
        greedy_turn(control, "control")
    finally:
        control.close()
        starts.append(("control", control.starts))

    candidate = session("candidate", "greedy runs and determinism repeats, then its probes on the control's "
                                      "prefixes")
    probes: dict[str, dict[str, list]] = {name: {} for name in names}
    found: dict[str, tuple] = {}
    try:
        greedy_turn(candidate, "candidate")
        for name in names:
            found[name] = find_divergences({arm: greedy_out[name][arm][1] for arm in ARMS})
            _, _, prompt_ids, probed = found[name]
            probes[name]["candidate"] = probe_arm(candidate, probed, prompt_ids,
                                                  journal(contracts.JOURNAL_PROBES, name, "candidate"))
        candidate.verify()
    finally:
        candidate.close()
        starts.append(("candidate", candidate.starts))

    # Started only when a divergence needs the control's probe (PhaseServer starts on first use): the probe's
    # forced prefix is the candidate's greedy output, which did not exist during the control's first start.
    control2 = session("control", "probes of the control on the candidate's divergent prefixes, which exist "
                                  "only after the candidate's greedy runs")
    try:
        for name in names:
            _, _, prompt_ids, probed = found[name]
            probes[name]["control"] = probe_arm(control2, probed, prompt_ids,
                                                journal(contracts.JOURNAL_PROBES, name, "control"))
        control2.verify()
    finally:
        control2.close()
        starts.append(("control", control2.starts))

    for name in names:
        for arm in ARMS:
            header, records = greedy_out[name][arm]
            artifacts.write_jsonl(greedy_paths[name][arm], header, records)
        order, divergences, _, probed = found[name]
        headers = {arm: greedy_out[name][arm][0] for arm in ARMS}
        doc = divergence_doc(name, headers, probes[name], probed, divergences, order,
                             [dataset_paths[name], *greedy_paths[name].values(), *receipt_paths.values()],
                             max_divergent)
        artifacts.write_json(divergence_paths[name], doc)
    phase = {"schema": PHASE_SCHEMA, "phase": "diagnostics",
             "starts": [{"arm": a, "starts": n} for a, n in starts],
             "datasets": {name: {arm: {"greedy": len(greedy_out[name][arm][1])} for arm in ARMS} for name in names},
             "provenance": artifacts.provenance([*paired_paths.values(), *spec_paths.values()], {"greedy": greedy.to_json()})}
    artifacts.write_json(phase_path, phase)
    return phase
