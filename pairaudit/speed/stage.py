"""The speed phase: the OFF/ON/OFF bracket (control, candidate, control, each a fresh server) under its rule.

With several candidates, the shared-control bracket of :mod:`pairaudit.speed.sweep`."""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from pairaudit.core import artifacts, contracts
from pairaudit.core.artifacts import utc_now
from pairaudit.core.contracts import SPEED_DECISION_SCHEMA, SPEED_STREAMS_SCHEMA, SpeedDecision
from pairaudit.core.progress import Progress
from pairaudit.core.settings import SpeedSettings
from pairaudit.gates import SEQUENTIAL_RULES
from pairaudit.serving import armspec, gpupool
from pairaudit.serving.client import ServerError
from pairaudit.speed.archive import (append_archive, archive_line, archive_spread, config_hash, plan_hash,
                                     read_archive)
from pairaudit.speed.bracket import BracketFailure, WindowStop, fits_window, log, window_deadline, window_outcome
from pairaudit.speed.clock import clock_check, clock_facts, host_facts
from pairaudit.speed.decision import decide
from pairaudit.speed.evidence import host_evidence
from pairaudit.speed.gpu import server_visible_devices
from pairaudit.speed.metrics import start_roles
from pairaudit.speed.starts import decided_doc, failed_doc, measure_start, server_log_for
from pairaudit.speed.sweep import sweep_stage


def speed_stage(*, launch_paths: Mapping[str, str], preflight_paths: Mapping[str, str], spec_paths: Mapping[str, str],
                speed: SpeedSettings, audit: str, out_path: str | None = None, streams_path: str,
                archive_path: str, server_logs: Mapping[str, str], starts_log: str | None = None,
                candidates: Sequence[str] | None = None,
                out_paths: Mapping[str, str] | None = None, deadline: float | None = None,
                wall_clock: Callable[[], float] = time.time) -> SpeedDecision | dict[str, SpeedDecision]:
    """Run the OFF/ON/OFF bracket and write decision.json + streams.jsonl (``pairaudit.speed.bracket``).

    Each start's server is the one its arm's ``specs/<arm>.json`` (``spec_paths``) describes; ``speed`` is
    the section as the workflow resolved it at load (``pairaudit.speed.bracket.resolve``), used as it is.
    ``candidates`` (names, bracket order) and ``out_paths`` (candidate -> its decision.json): several
    candidates against one control in one shared-control bracket (``pairaudit.speed.sweep.sweep_stage``),
    the path mappings keyed by ``control`` and each candidate's name; returns candidate -> decision.

    ``deadline`` (epoch seconds on ``wall_clock``; default: the window the workflow set,
    ``bracket.window_deadline``): the bracket starts no start that would end after it, at the slowest start
    it has measured, and a bracket it stops is INCONCLUSIVE for the window (``bracket.window_outcome``), its
    measured starts, streams and archive lines kept.
    """
    if candidates is not None or out_paths is not None:
        return sweep_stage(launch_paths=launch_paths, preflight_paths=preflight_paths, spec_paths=spec_paths,
                           speed=speed, audit=audit, candidates=list(candidates or []), out_paths=out_paths or {},
                           streams_path=streams_path, archive_path=archive_path, server_logs=server_logs,
                           starts_log=starts_log, deadline=deadline, wall_clock=wall_clock)
    if out_path is None:
        raise ValueError("speed: the two-arm bracket writes one decision (out_path)")
    receipts, specs = {}, {}
    failed = {arm: artifacts.read_json(preflight_paths[arm]) for arm in ("control", "candidate")}
    failed = {arm: pf for arm, pf in failed.items() if pf.get("verdict") != "PASS"}
    if failed:
        # a server that failed its rehearsal is evidence of the servers gate; no bracket is measured
        why = "; ".join(f"the {arm} preflight is {pf.get('verdict')} at probe {pf.get('failed_probe')!r}"
                        for arm, pf in failed.items())
        # the section as the config had it: what the artifacts record
        params = speed.to_json()
        prov = artifacts.provenance([*launch_paths.values(), *preflight_paths.values()], {"speed": params})
        artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov}, [])
        doc: SpeedDecision = {"schema": SPEED_DECISION_SCHEMA, "audit": audit, "not_run": why, "params": params,
                              "provenance": prov,
                              "gate": {"rule": speed.rule, "verdict": "INCONCLUSIVE", "reasons": [f"not run: {why}"]}}
        artifacts.write_json(out_path, doc)
        return doc
    for arm in ("control", "candidate"):
        receipts[arm] = artifacts.check_schema(artifacts.read_json(launch_paths[arm]), contracts.LAUNCH_SCHEMA,
                                               launch_paths[arm])
        specs[arm] = armspec.read_spec(spec_paths[arm], arm=arm)
    model = specs["control"].served_model_name
    if specs["candidate"].served_model_name != model:
        raise RuntimeError("speed: the arms serve different model names "
                           f"({model!r} vs {specs['candidate'].served_model_name!r}); one prompt set cannot fit both")
    hashes = {c.name: config_hash(c, speed, specs["control"]) for c in speed.cells}
    prior = read_archive(archive_path)
    prior_spread = {c.name: archive_spread(prior, c.name, hashes[c.name], speed.primary) for c in speed.cells}
    # One window = one bracket run: its control starts are archived under this id, and the host's
    # evidence on its start-to-start noise is every earlier window of the same control (speed.evidence).
    window = uuid.uuid4().hex
    deciding = speed.deciding
    # The host's evidence is read once the first start has fixed the wave plan: only windows that ran the
    # same plan (and repeats, in the config hash) measured the same thing.
    evidence: dict | None = None
    roles = start_roles(speed.max_starts)
    progress = Progress(3 * speed.repeats * speed.waves * len(speed.cells), "speed waves")
    starts: list[dict] = []
    results: dict[str, Any] = {}
    records: list[dict] = []
    prompts: Mapping[str, Any] | None = None
    plan: dict[str, int] | None = None
    looks: list[dict] = []
    appended = 0
    inputs = [*spec_paths.values(), *launch_paths.values(), *preflight_paths.values()]
    # The bracket's GPUs are taken once and held across all its starts, so every start runs on the
    # same devices (each arm on the first `gpus` of them) and no other server takes them in between.
    deadline = window_deadline() if deadline is None else deadline
    costs: list[float] = []                    # each measured start's wall seconds, launch to stop
    stopped: WindowStop | None = None
    with gpupool.reserve([specs["control"], specs["candidate"]], {"arm": "speed bracket"}) as gpus:
        target = 3
        while True:
            for start, role, arm in roles[len(starts):target]:
                cost = max(costs, default=None)
                # a candidate start is worth nothing without the control start that closes its window
                pair = 2 if arm == "candidate" else 1
                if not fits_window(deadline, cost, wall_clock(), starts=pair):
                    stopped = WindowStop(deadline=float(deadline or 0.0), starts_had=len(starts),
                                         starts_needed=target, start_cost_s=cost, at=wall_clock())
                    log.warning("speed: %s", stopped.reason())
                    break
                began = time.monotonic()
                # the clock facts read exactly the GPUs the server is started with
                visible = server_visible_devices(specs[arm], gpus.server_environ(specs[arm]))
                rec = {"start": start, "role": role, "arm": arm, **host_facts(), "clock": clock_facts(visible),
                       "started_at": utc_now("milliseconds"), "stopped_at": None}
                log.info("speed %s: %s arm, fresh server", start, arm)
                try:
                    facts, recs = measure_start(start, arm, specs[arm], receipts[arm], rec, speed=speed, model=model,
                                                 prompts=prompts, plan=plan, results=results, progress=progress,
                                                 server_log=server_log_for(server_logs, start, arm),
                                                 starts_log=starts_log, gpus=gpus)
                except (BracketFailure, ServerError) as exc:
                    # A server that fails under the bracket is evidence, and what it measured before stays.
                    return failed_doc(exc, start=start, arm=arm, rec=rec, starts=starts, records=records,
                                           specs=specs, receipts=receipts, speed=speed, audit=audit,
                                           out_path=out_path,
                                           streams_path=streams_path,
                                           server_log=server_log_for(server_logs, start, arm),
                                           starts_log=starts_log, inputs=inputs, gpus=gpus)
                if plan is None:
                    plan = facts.pop("plan")
                    progress.total = target * speed.repeats * sum(plan.values())
                prompts = prompts or facts.pop("prompts")
                records += recs
                starts.append(rec)
                costs.append(time.monotonic() - began)
                # an A/A's candidate is the control server itself: its starts are control starts too
                if arm == "control" or specs["candidate"].identity() == specs["control"].identity():
                    appended += append_archive(archive_path, [
                        archive_line(audit=audit, start=start, cell=c, chash=hashes[c.name],
                                     pooled=results[start][c.name]["pooled"], clock=rec["clock"],
                                     host=rec["host"], window=window, plan_hash=plan_hash(plan))
                        for c in speed.cells])
            if stopped is not None or speed.rule not in SEQUENTIAL_RULES:
                break
            if evidence is None and plan is not None:
                evidence = host_evidence(prior, host=host_facts()["host"], hashes=hashes, deciding=deciding,
                                         metrics=[speed.primary, *speed.guards], exclude_window=window,
                                         plan=plan_hash(plan), max_age_h=speed.evidence_max_age_h)
            names = [st["start"] for st in starts]
            clock = clock_check([st["clock"] for st in starts], speed.expected_clock_cap,
                                after=[st["clock_after"] for st in starts], starts=names)
            _, _, gate = decide(results, speed, clock, starts=names, evidence=evidence)
            looks.append({"starts": len(names), "verdict": gate["verdict"], "half_width_pct": gate.get("half_width_pct"),
                          "pooled_gain_pct": gate.get("pooled_gain_pct"), "more_starts": gate.get("more_starts")})
            # win2-v5 says where its next look is; the earlier sequential rules look after every pair
            following = gate.get("next_starts") or target + 2
            if not gate.get("more_starts") or following > speed.max_starts:
                break
            log.info("speed: undecided after %d starts (half-width %.2f %%): the bracket grows to %d starts",
                     len(names), gate.get("half_width_pct") or float("nan"), following)
            target = following
            progress.total = target * speed.repeats * sum((plan or {}).values())
    if stopped is not None and len(starts) < 3:
        return window_doc(stopped, speed=speed, audit=audit, starts=starts, results=results, records=records,
                          inputs=inputs, out_path=out_path, streams_path=streams_path, appended=appended,
                          archive_path=archive_path)
    if prompts is None or plan is None:  # the first start builds them, and every start ran
        raise AssertionError("the bracket ran without prompts")
    if stopped is not None and starts[-1]["arm"] != "control":
        # a candidate start slower than the ones before left no time for its control: the comparison stops
        # at the last control start, the candidate's streams stay in streams.jsonl
        stopped = dataclasses.replace(stopped, unclosed=starts[-1]["start"])
        starts = starts[:-1]
    hook = None if stopped is None else functools.partial(window_outcome, stop=stopped, rule=speed.rule)
    return decided_doc(speed=speed, audit=audit, starts=starts, results=results, records=records, prompts=prompts,
                            hashes=hashes, prior_spread=prior_spread, archive_path=archive_path, appended=appended,
                            inputs=inputs, out_path=out_path, streams_path=streams_path, evidence=evidence,
                            window=window, plan=plan, looks=looks, gate_hook=hook)


def window_doc(stop: WindowStop, *, speed: SpeedSettings, audit: str, starts: list, results: Mapping[str, Any],
               records: list, inputs: Sequence[str], out_path: str, streams_path: str, appended: int,
               archive_path: str) -> SpeedDecision:
    """decision.json of a bracket the window stopped before its first look (fewer than 3 starts): no rule can
    decide it; the starts it measured, their pooled counters and streams are kept as they were."""
    params = speed.to_json()   # the section as the config had it: what the artifacts record
    prov = artifacts.provenance(inputs, {"speed": params})
    artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov},
                          records)
    names = [st["start"] for st in starts]
    doc: SpeedDecision = {
        "schema": SPEED_DECISION_SCHEMA, "audit": audit, "not_run": stop.reason(), "starts": starts,
        "pooled": {c.name: {st: results[st][c.name]["pooled"] for st in names} for c in speed.cells},
        "archive": {"path": str(archive_path), "appended": appended},
        "streams": str(streams_path), "params": params, "provenance": prov,
        "gate": window_outcome(None, stop, rule=speed.rule)}
    artifacts.write_json(out_path, doc)
    return doc
