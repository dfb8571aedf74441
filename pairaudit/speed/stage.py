"""The speed phase: the OFF/ON/OFF bracket (control, candidate, control, each a fresh server) under its rule."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from pairaudit.core import artifacts, contracts
from pairaudit.core.artifacts import utc_now
from pairaudit.core.contracts import SPEED_DECISION_SCHEMA, SPEED_STREAMS_SCHEMA, SpeedDecision
from pairaudit.core.progress import Progress
from pairaudit.core.settings import SpeedSettings
from pairaudit.gates import server_failure
from pairaudit.gates.speed import SEQUENTIAL_RULES
from pairaudit.serving import armspec, failures, gpupool, launch
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import ServerError, tail_lines
from pairaudit.speed.archive import append_archive, archive_line, archive_spread, config_hash, read_archive
from pairaudit.speed.bracket import (
    BracketFailure,
    failed_streams,
    log,
    run_start,
    send_together,
    warm_up,
    wave_plan,
)
from pairaudit.speed.clock import clock_check, clock_facts, host_facts
from pairaudit.speed.decision import decide
from pairaudit.speed.evidence import host_evidence
from pairaudit.speed.gpu import server_visible_devices
from pairaudit.speed.metrics import LOWER_IS_BETTER, finite_json, start_roles
from pairaudit.speed.workload import build_prompts


def speed_stage(*, launch_paths: Mapping[str, str], preflight_paths: Mapping[str, str], spec_paths: Mapping[str, str],
                speed: SpeedSettings, audit: str, out_path: str, streams_path: str,
                archive_path: str, server_logs: Mapping[str, str], starts_log: str | None = None) -> SpeedDecision:
    """Run the OFF/ON/OFF bracket and write decision.json + streams.jsonl (``pairaudit.speed.bracket``).

    Each start's server is the one its arm's ``specs/<arm>.json`` (``spec_paths``) describes; ``speed`` is
    the section as the workflow resolved it at load (``pairaudit.speed.bracket.resolve``), used as it is.
    """
    # the record's JSON: what the artifacts record as ``params`` and what the bracket's helpers read
    cfg = speed.to_json()
    receipts, specs = {}, {}
    failed = {arm: artifacts.read_json(preflight_paths[arm]) for arm in ("control", "candidate")}
    failed = {arm: pf for arm, pf in failed.items() if pf.get("verdict") != "PASS"}
    if failed:
        # a server that failed its rehearsal is evidence of the servers gate; no bracket is measured
        why = "; ".join(f"the {arm} preflight is {pf.get('verdict')} at probe {pf.get('failed_probe')!r}"
                        for arm, pf in failed.items())
        prov = artifacts.provenance([*launch_paths.values(), *preflight_paths.values()], {"speed": cfg})
        artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov}, [])
        doc: SpeedDecision = {"schema": SPEED_DECISION_SCHEMA, "audit": audit, "not_run": why, "params": cfg,
                              "provenance": prov,
                              "gate": {"rule": cfg["rule"], "verdict": "INCONCLUSIVE", "reasons": [f"not run: {why}"]}}
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
    hashes = {c["name"]: config_hash(c, cfg, specs["control"]) for c in cfg["cells"]}
    prior = read_archive(archive_path)
    prior_spread = {c["name"]: archive_spread(prior, c["name"], hashes[c["name"]], cfg["primary"])
                    for c in cfg["cells"]}
    # One window = one bracket run: its control starts are archived under this id, and the host's
    # evidence on its start-to-start noise is every earlier window of the same control (speed.evidence).
    window = uuid.uuid4().hex
    deciding = [c["name"] for c in cfg["cells"] if c["decide"]]
    evidence = (host_evidence(prior, host=host_facts()["host"], hashes=hashes, deciding=deciding,
                              metrics=[cfg["primary"], *cfg["guards"]], exclude_window=window)
                if cfg["rule"] in SEQUENTIAL_RULES else None)
    roles = start_roles(cfg["max_starts"])
    progress = Progress(3 * cfg["repeats"] * cfg["waves"] * len(cfg["cells"]), "speed waves")
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
    with gpupool.reserve([specs["control"], specs["candidate"]], {"arm": "speed bracket"}) as gpus:
        target = 3
        while True:
            for start, role, arm in roles[len(starts):target]:
                # the clock facts read exactly the GPUs the server is started with
                visible = server_visible_devices(specs[arm], gpus.server_environ(specs[arm]))
                rec = {"start": start, "role": role, "arm": arm, **host_facts(), "clock": clock_facts(visible),
                       "started_at": utc_now("milliseconds"), "stopped_at": None}
                log.info("speed %s: %s arm, fresh server", start, arm)
                try:
                    facts, recs = _measure_start(start, arm, specs[arm], receipts[arm], rec, cfg=cfg, model=model,
                                                 prompts=prompts, plan=plan, results=results, progress=progress,
                                                 server_log=_server_log(server_logs, start, arm),
                                                 starts_log=starts_log, gpus=gpus)
                except (BracketFailure, ServerError) as exc:
                    # A server that fails under the bracket is evidence, and what it measured before stays.
                    return _failed_bracket(exc, start=start, arm=arm, rec=rec, starts=starts, records=records,
                                           specs=specs, receipts=receipts, cfg=cfg, audit=audit, out_path=out_path,
                                           streams_path=streams_path,
                                           server_log=_server_log(server_logs, start, arm),
                                           starts_log=starts_log, inputs=inputs, gpus=gpus)
                if plan is None:
                    plan = facts.pop("plan")
                    progress.total = target * cfg["repeats"] * sum(plan.values())
                prompts = prompts or facts.pop("prompts")
                records += recs
                starts.append(rec)
                # an A/A's candidate is the control server itself: its starts are control starts too
                if arm == "control" or specs["candidate"].identity() == specs["control"].identity():
                    appended += append_archive(archive_path, [
                        archive_line(audit=audit, start=start, cell=c, chash=hashes[c["name"]],
                                     pooled=results[start][c["name"]]["pooled"], clock=rec["clock"],
                                     host=rec["host"], window=window)
                        for c in cfg["cells"]])
            if cfg["rule"] not in SEQUENTIAL_RULES:
                break
            names = [st["start"] for st in starts]
            clock = clock_check([st["clock"] for st in starts], cfg["expected_clock_cap"],
                                after=[st["clock_after"] for st in starts], starts=names)
            _, _, gate = decide(results, cfg, clock, starts=names, evidence=evidence)
            looks.append({"starts": len(names), "verdict": gate["verdict"], "half_width_pct": gate.get("half_width_pct"),
                          "pooled_gain_pct": gate.get("pooled_gain_pct"), "more_starts": gate.get("more_starts")})
            if not gate.get("more_starts") or target + 2 > cfg["max_starts"]:
                break
            log.info("speed: undecided after %d starts (half-width %.2f %% > bar): a candidate and a control start "
                     "more", len(names), gate.get("half_width_pct") or float("nan"))
            target += 2
            progress.total = target * cfg["repeats"] * sum((plan or {}).values())
    if prompts is None or plan is None:  # the first start builds them, and every start ran
        raise AssertionError("the bracket ran without prompts")
    return _decided_bracket(cfg=cfg, audit=audit, starts=starts, results=results, records=records, prompts=prompts,
                            hashes=hashes, prior_spread=prior_spread, archive_path=archive_path, appended=appended,
                            inputs=inputs, out_path=out_path, streams_path=streams_path, evidence=evidence,
                            window=window, plan=plan, looks=looks)


def _server_log(server_logs: Mapping[str, str], start: str, arm: str) -> str:
    """A start's server log: the rule's named logs for s1-s3, beside them for the starts a bracket grows by."""
    if start in server_logs:
        return server_logs[start]
    first = Path(server_logs["s1"])
    name = (first.name.replace("s1-control", f"{start}-{arm}") if "s1-control" in first.name
            else first.name.replace("s1", start, 1) if "s1" in first.name else f"{first.stem}-{start}{first.suffix}")
    return str(first.with_name(name))


def _measure_start(start: str, arm: str, spec: ArmSpec, receipt: dict, rec: dict, *, cfg: Mapping[str, Any], model: str,
                   prompts: Mapping[str, Any] | None, plan: Mapping[str, int] | None, results: dict,
                   progress: Progress, server_log: str, starts_log: str | None,
                   gpus: gpupool.Reservation | None = None) -> tuple[dict, list[dict]]:
    """One fresh start: its measurements into ``results[start]``, its facts into ``rec``.

    Returns the server's facts (with the bracket's ``prompts`` and wave ``plan`` when they were made here,
    on the first start) and the stream records.
    """
    srv = launch.Server(spec, log_path=server_log, receipt=receipt, timeout_s=cfg["request_timeout_s"], gpus=gpus)
    ready = False
    first = prompts is None
    try:
        with srv:
            launch.log_start_event(starts_log, event="ready", phase="speed", spec=spec, receipt=receipt,
                                   facts=srv.facts())
            ready = True
            if prompts is None:
                # built once, on the first start, from that server's own tokenizer
                prompts = build_prompts(srv.endpoint, model, cfg["cells"], cfg["repeats"], cfg["waves"],
                                        cfg["base_seed"])
            durations, warm = warm_up(srv.endpoint, model=model, cfg=cfg, prompts=prompts, start=start, arm=arm,
                                      timed=plan is None and bool(cfg.get("repeat_s")))
            if plan is None:
                # sized once, from the first start's warm-up; every later start runs the same waves and prompts
                plan = wave_plan(cfg, durations)
                if any(w != cfg["waves"] for w in plan.values()):
                    prompts = build_prompts(srv.endpoint, model, cfg["cells"], cfg["repeats"], plan,
                                            cfg["base_seed"])
            rec["warmup_s"] = durations
            results[start], recs = run_start(srv.endpoint, model=model, cfg=cfg, prompts=prompts, start=start,
                                             arm=arm, plan=plan, progress=progress)
            recs = warm + recs
            # Read while the server still holds its GPUs: the active event
            # reasons clear soon after the load stops (the counters do not).
            rec["clock_after"] = clock_facts(server_visible_devices(spec, gpupool.server_environ(srv.facts()["gpus"])))
            srv.assert_alive()
    finally:
        # also when the start failed or the job was told to stop: the start record ends (only a job
        # killed outright leaves it open, for the next start to close as lost)
        if ready:
            stopped = srv.facts()
            launch.log_start_event(starts_log, event="stopped", phase="speed", spec=spec, receipt=receipt,
                                   facts={"stop": stopped.get("stop"), "pid": stopped.get("pid")})
    facts = dict(srv.facts())
    rec["stopped_at"] = utc_now("milliseconds")
    rec["server"] = {k: facts.get(k) for k in ("pid", "url", "ready_s", "identity_check", "stop", "gpus")}
    rec["warmup"] = next({k: r[k] for k in ("error", "ttft_s", "e2el_s")} for r in recs if r["cell"] == "warmup")
    if first:
        facts["prompts"], facts["plan"] = prompts, dict(plan)
    return facts, recs


def _start_failure(exc: BaseException, *, start: str, arm: str, server_log: str) -> failures.FailureRecord:
    if isinstance(exc, BracketFailure):
        return {"arm": arm, "stage": "speed", "what": exc.what, "kind": exc.kind, "status": exc.status,
                "request": {"method": "POST", "path": "/v1/completions", "bodies": exc.requests},
                "error": exc.error, "error_body": exc.error_body, "log_tail": tail_lines(server_log, 40),
                "at": utc_now("milliseconds")}
    # The server did not come up, or died: its own log is the evidence.
    return {"arm": arm, "stage": "speed", "what": f"{start} server start", "kind": server_failure.DEAD, "status": None,
            "request": None, "error": str(exc).split("\n")[0], "error_body": None,
            "log_tail": tail_lines(server_log, 40), "at": utc_now("milliseconds")}


def _confirm_failure(exc: BaseException, spec: ArmSpec, receipt: dict, *, cfg: Mapping[str, Any], server_log: str,
                     starts_log: str | None, gpus: gpupool.Reservation | None = None) -> dict:
    """The failed start's work once more on a fresh start of the same server (stored beside the first failure)."""
    conf: dict = {"at": utc_now("milliseconds"), "kind": None, "status": None, "error": None, "error_body": None}
    try:
        with launch.Server(spec, log_path=server_log, receipt=receipt, timeout_s=cfg["request_timeout_s"],
                           gpus=gpus) as srv:
            launch.log_start_event(starts_log, event="ready", phase="speed-confirm", spec=spec, receipt=receipt,
                                   facts=srv.facts())
            bodies = exc.requests if isinstance(exc, BracketFailure) else []
            bad = failed_streams(send_together(srv.endpoint, bodies, timeout_s=cfg["request_timeout_s"])
                                 if bodies else [])
            alive = srv.proc is None or srv.proc.poll() is None
            if bad or not alive:
                first = bad[0][1] if bad else {}
                conf.update(kind=failures.classify(first.get("status"), server_alive=alive),
                            status=first.get("status"), error=first.get("error") or "the server process exited",
                            error_body=first.get("body"))
            else:
                conf.update(kind="answered", status=200)
            conf["log_tail"] = srv.log_tail(40)
        launch.log_start_event(starts_log, event="stopped", phase="speed-confirm", spec=spec, receipt=receipt,
                               facts={"stop": srv.facts().get("stop"), "pid": srv.facts().get("pid")})
    except ServerError as err:
        conf.update(kind=server_failure.DEAD, error=str(err).split("\n")[0], log_tail=str(err)[-4000:])
    log.warning("speed: confirmation on a fresh start: %s", conf["kind"])
    return conf


def _failed_bracket(exc: BaseException, *, start: str, arm: str, rec: dict, starts: list, records: list,
                    specs: Mapping[str, ArmSpec], receipts: Mapping[str, dict], cfg: Mapping[str, Any], audit: str,
                    out_path: str, streams_path: str, server_log: str, starts_log: str | None,
                    inputs: Sequence[str], gpus: gpupool.Reservation | None = None) -> SpeedDecision:
    """decision.json for a bracket a server broke: the failure (and its confirmation), what was measured before."""
    failure = _start_failure(exc, start=start, arm=arm, server_log=server_log)
    log.warning("speed %s (%s arm) failed: %s", start, arm, server_failure.summary(failure))
    if arm == "candidate" and server_failure.is_server_failure(failure["kind"]):
        failure["confirmation"] = _confirm_failure(exc, specs[arm], receipts[arm], cfg=cfg,
                                                   server_log=f"{server_log}.confirm",
                                                   starts_log=starts_log, gpus=gpus)
    rec.update(stopped_at=utc_now("milliseconds"), failure=failure)
    why = f"the {arm} server failed at {failure['what']}: {server_failure.summary(failure)}"
    prov = artifacts.provenance(inputs, {"speed": cfg})
    artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov}, records)
    doc: SpeedDecision = {
        "schema": SPEED_DECISION_SCHEMA, "audit": audit, "not_run": why, "failure": dict(failure),
        "starts": [*starts, rec], "params": dict(cfg), "provenance": prov, "streams": str(streams_path),
        "gate": {"rule": cfg["rule"], "verdict": "INCONCLUSIVE",
                 "reasons": [f"not measured: {why} (the servers gate decides what the failure means)"]}}
    artifacts.write_json(out_path, doc)
    return doc


def _decided_bracket(*, cfg: Mapping[str, Any], audit: str, starts: list, results: dict, records: list,
                     prompts: Mapping[str, Any], hashes: Mapping[str, str], prior_spread: Mapping[str, Any],
                     archive_path: str, appended: int, inputs: Sequence[str], out_path: str,
                     streams_path: str, evidence: Mapping[str, Any] | None, window: str, plan: Mapping[str, int],
                     looks: Sequence[Mapping[str, Any]]) -> SpeedDecision:
    hosts = sorted({s["host"] for s in starts})
    names = [s["start"] for s in starts]
    clock = clock_check([s["clock"] for s in starts], cfg["expected_clock_cap"],
                        after=[s["clock_after"] for s in starts], starts=names)
    if len(hosts) > 1:  # cannot happen in one process; kept so a future split cannot pass silently
        clock["mismatch"].append("host")
        clock["verdict"] = "DIFFERENT"
    now = read_archive(archive_path)
    spread = {}
    for c in cfg["cells"]:
        name = c["name"]
        pooled = {st: results[st][name]["pooled"] for st in names}
        win_spread = []
        for r in range(cfg["repeats"]):
            a, b = pooled["s1"][r][cfg["primary"]], pooled["s3"][r][cfg["primary"]]
            win_spread.append(100.0 * abs(a - b) / abs((a + b) / 2) if a is not None and b is not None and a + b
                              else None)
        incl = archive_spread(now, name, hashes[name], cfg["primary"])
        spread[name] = {"metric": cfg["primary"], "win_pct": cfg["win_pct"], "window_pct": win_spread,
                        "window_max_pct": max((x for x in win_spread if x is not None), default=None),
                        "archive_pct": prior_spread[name]["range_pct"], "archive_n": prior_spread[name]["n"],
                        "archive_cv_pct": prior_spread[name]["cv_pct"],
                        "archive_with_window_pct": incl["range_pct"], "archive_with_window_n": incl["n"],
                        "config_hash": hashes[name]}
    win2, series, gate = decide(results, cfg, clock, {n: s["archive_with_window_pct"] for n, s in spread.items()},
                                starts=names, evidence=evidence)
    prov = artifacts.provenance(inputs, {"speed": cfg})
    artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov}, records)
    doc: SpeedDecision = finite_json({
        "schema": SPEED_DECISION_SCHEMA, "audit": audit, "gate": gate, "win2": win2,
        "bar": {"win_pct": cfg["win_pct"], "primary": cfg["primary"], "guards": cfg["guards"],
                "reported": cfg["reported"], "lower_is_better": sorted(LOWER_IS_BETTER)},
        "starts": starts, "hosts": hosts, "clock_check": clock,
        "cells": [{**c, "prompt_tokens": len(prompts[c["name"]][(0, 0, 0)])} for c in cfg["cells"]],
        "pooled": {c["name"]: {st: results[st][c["name"]]["pooled"] for st in names} for c in cfg["cells"]},
        "window": window, "waves_plan": dict(plan), "looks": list(looks), "evidence": evidence,
        "series": series,
        "deviations": gate["stage_deviations"],
        "bench_serve": {c["name"]: {st: results[st][c["name"]]["bench_serve"] for st in names}
                        for c in cfg["cells"]},
        "spread": spread,
        "archive": {"path": str(archive_path), "appended": appended},
        "streams": str(streams_path),
        "params": cfg, "provenance": prov,
    })
    artifacts.write_json(out_path, doc)
    log.info("speed verdict %s: %s", gate["verdict"], "; ".join(gate["reasons"][:len(cfg["cells"])]))
    return doc
