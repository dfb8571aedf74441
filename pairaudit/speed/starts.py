"""The speed bracket's fresh starts and what is written from them.

One start measured on a fresh server (``measure_start``), a failed start's
record and its confirmation on another fresh start, and the decision
document of a bracket a server broke (``failed_doc``) or of a measured one
(``decided_doc``). :mod:`pairaudit.speed.stage` runs the two-arm bracket
with them, :mod:`pairaudit.speed.sweep` the shared-control bracket of
several candidates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pairaudit.core import artifacts
from pairaudit.core.artifacts import utc_now
from pairaudit.core.contracts import SPEED_DECISION_SCHEMA, SPEED_STREAMS_SCHEMA, SpeedDecision
from pairaudit.core.progress import Progress
from pairaudit.core.settings import SpeedSettings
from pairaudit.gates import server_failure
from pairaudit.serving import failures, gpupool, launch
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import ServerError, tail_lines
from pairaudit.speed.archive import archive_spread, read_archive
from pairaudit.speed.bracket import BracketFailure, failed_streams, log, run_start, send_together, warm_up, wave_plan
from pairaudit.speed.clock import clock_check, clock_facts
from pairaudit.speed.decision import decide
from pairaudit.speed.gpu import server_visible_devices
from pairaudit.speed.metrics import LOWER_IS_BETTER, finite_json
from pairaudit.speed.workload import build_prompts


def server_log_for(server_logs: Mapping[str, str], start: str, arm: str) -> str:
    """A start's server log: the rule's named logs for s1-s3, beside them for the starts a bracket grows by."""
    if start in server_logs:
        return server_logs[start]
    first = Path(server_logs["s1"])
    name = (first.name.replace("s1-control", f"{start}-{arm}") if "s1-control" in first.name
            else first.name.replace("s1", start, 1) if "s1" in first.name else f"{first.stem}-{start}{first.suffix}")
    return str(first.with_name(name))


def measure_start(start: str, arm: str, spec: ArmSpec, receipt: dict, rec: dict, *, speed: SpeedSettings, model: str,
                   prompts: Mapping[str, Any] | None, plan: Mapping[str, int] | None, results: dict,
                   progress: Progress, server_log: str, starts_log: str | None,
                   gpus: gpupool.Reservation | None = None) -> tuple[dict, list[dict]]:
    """One fresh start: its measurements into ``results[start]``, its facts into ``rec``.

    Returns the server's facts (with the bracket's ``prompts`` and wave ``plan`` when they were made here,
    on the first start) and the stream records.
    """
    srv = launch.Server(spec, log_path=server_log, receipt=receipt, timeout_s=speed.request_timeout_s, gpus=gpus)
    ready = False
    first = prompts is None
    try:
        with srv:
            launch.log_start_event(starts_log, event="ready", phase="speed", spec=spec, receipt=receipt,
                                   facts={**srv.facts(), "why": f"bracket start {start}: fresh by design (a start "
                                          "is the bracket's unit of noise)"})
            ready = True
            if prompts is None:
                # built once, on the first start, from that server's own tokenizer
                prompts = build_prompts(srv.endpoint, model, speed.cells, speed.repeats, speed.waves, speed.base_seed)
            durations, warm = warm_up(srv.endpoint, model=model, speed=speed, prompts=prompts, start=start, arm=arm,
                                      timed=plan is None and bool(speed.repeat_s))
            if plan is None:
                # sized once, from the first start's warm-up; every later start runs the same waves and prompts
                plan = wave_plan(speed, durations)
                if any(w != speed.waves for w in plan.values()):
                    prompts = build_prompts(srv.endpoint, model, speed.cells, speed.repeats, plan, speed.base_seed)
            rec["warmup_s"] = durations
            results[start], recs = run_start(srv.endpoint, model=model, speed=speed, prompts=prompts, start=start,
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
    rec["server"] = {k: facts.get(k) for k in ("pid", "url", "ready_s", "identity_check", "stop", "gpus", "breakdown")}
    rec["warmup"] = next({k: r[k] for k in ("error", "ttft_s", "e2el_s")} for r in recs if r["cell"] == "warmup")
    if first:
        facts["prompts"], facts["plan"] = prompts, dict(plan)
    return facts, recs


def start_failure(exc: BaseException, *, start: str, arm: str, server_log: str) -> failures.FailureRecord:
    if isinstance(exc, BracketFailure):
        return {"arm": arm, "stage": "speed", "what": exc.what, "kind": exc.kind, "status": exc.status,
                "request": {"method": "POST", "path": "/v1/completions", "bodies": exc.requests},
                "error": exc.error, "error_body": exc.error_body, "log_tail": tail_lines(server_log, 40),
                "at": utc_now("milliseconds")}
    # The server did not come up, or died: its own log is the evidence.
    return {"arm": arm, "stage": "speed", "what": f"{start} server start", "kind": server_failure.DEAD, "status": None,
            "request": None, "error": str(exc).split("\n")[0], "error_body": None,
            "log_tail": tail_lines(server_log, 40), "at": utc_now("milliseconds")}


def confirm_failure(exc: BaseException, spec: ArmSpec, receipt: dict, *, speed: SpeedSettings, server_log: str,
                     starts_log: str | None, gpus: gpupool.Reservation | None = None) -> dict:
    """The failed start's work once more on a fresh start of the same server (stored beside the first failure)."""
    conf: dict = {"at": utc_now("milliseconds"), "kind": None, "status": None, "error": None, "error_body": None}
    try:
        with launch.Server(spec, log_path=server_log, receipt=receipt, timeout_s=speed.request_timeout_s,
                           gpus=gpus) as srv:
            launch.log_start_event(starts_log, event="ready", phase="speed-confirm", spec=spec, receipt=receipt,
                                   facts={**srv.facts(), "why": "a fresh start confirms the bracket's server "
                                          "failure (server-failure-v1 asks for one)"})
            bodies = exc.requests if isinstance(exc, BracketFailure) else []
            bad = failed_streams(send_together(srv.endpoint, bodies, timeout_s=speed.request_timeout_s)
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


def failed_doc(exc: BaseException, *, start: str, arm: str, rec: dict, starts: list, records: list,
                    specs: Mapping[str, ArmSpec], receipts: Mapping[str, dict], speed: SpeedSettings, audit: str,
                    out_path: str, streams_path: str, server_log: str, starts_log: str | None,
                    inputs: Sequence[str], gpus: gpupool.Reservation | None = None,
                    sweep: Mapping[str, Any] | None = None) -> SpeedDecision:
    """decision.json for a bracket a server broke: the failure (and its confirmation), what was measured before.

    ``sweep``: a shared-control bracket's candidate (``pairaudit.speed.sweep``): its ``name``, the ``spec``
    key of the arm that failed, what the doc records of the bracket; streams.jsonl is then the bracket's,
    written once by the sweep.
    """
    spec_key = arm if sweep is None else sweep["spec"]
    failure = start_failure(exc, start=start, arm=arm, server_log=server_log)
    log.warning("speed %s (%s arm) failed: %s", start, arm, server_failure.summary(failure))
    if arm == "candidate" and server_failure.is_server_failure(failure["kind"]):
        failure["confirmation"] = confirm_failure(exc, specs[spec_key], receipts[spec_key], speed=speed,
                                                   server_log=f"{server_log}.confirm",
                                                   starts_log=starts_log, gpus=gpus)
    rec.update(stopped_at=utc_now("milliseconds"), failure=failure)
    why = f"the {arm} server failed at {failure['what']}: {server_failure.summary(failure)}"
    params = speed.to_json()   # the section as the config had it: what the artifacts record
    prov = artifacts.provenance(inputs, {"speed": params})
    if sweep is None:
        artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov},
                              records)
    doc: SpeedDecision = {
        "schema": SPEED_DECISION_SCHEMA, "audit": audit, "not_run": why, "failure": dict(failure),
        "starts": [*starts, rec], "params": params, "provenance": prov, "streams": str(streams_path),
        "gate": {"rule": speed.rule, "verdict": "INCONCLUSIVE",
                 "reasons": [f"not measured: {why} (the servers gate decides what the failure means)"]}}
    if sweep is not None:
        doc["sweep"] = dict(sweep["record"])
    artifacts.write_json(out_path, doc)
    return doc


def start_cost_s(starts: Sequence[Mapping[str, Any]]) -> float | None:
    """The bracket's mean wall seconds a start (server start, warm-up and repeats), from the starts' records."""
    import datetime as dt

    spans = []
    for st in starts:
        try:
            spans.append((dt.datetime.fromisoformat(st["stopped_at"])
                          - dt.datetime.fromisoformat(st["started_at"])).total_seconds())
        except (KeyError, TypeError, ValueError):
            continue
    return sum(spans) / len(spans) if spans else None


def decided_doc(*, speed: SpeedSettings, audit: str, starts: list, results: dict, records: list,
                prompts: Mapping[str, Any], hashes: Mapping[str, str], prior_spread: Mapping[str, Any],
                archive_path: str, appended: int, inputs: Sequence[str], out_path: str,
                streams_path: str, evidence: Mapping[str, Any] | None, window: str, plan: Mapping[str, int],
                looks: Sequence[Mapping[str, Any]], sweep: Mapping[str, Any] | None = None,
                gate_hook: Callable[[dict], dict] | None = None) -> SpeedDecision:
    """decision.json of a measured bracket (and its streams.jsonl).

    ``gate_hook``: the stage's own outcome, built over the rule's gate before it is written (a bracket the
    booked window stopped: ``bracket.window_outcome``).

    ``sweep``: one candidate of a shared-control bracket (``pairaudit.speed.sweep``): its ``name``, the
    bracket's ``arms`` (one per start), the control starts of its first window (``first_window``) and
    what the doc records of the bracket (``record``). The gate decides the candidate over the whole
    bracket's series; the clocks checked are those of the starts it uses (its own and every control
    start); streams.jsonl is the bracket's, written once by the sweep.
    """
    hosts = sorted({s["host"] for s in starts})
    names = [s["start"] for s in starts]
    used = starts if sweep is None else [s for s, a in zip(starts, sweep["arms"]) if a in ("control", sweep["name"])]
    clock = clock_check([s["clock"] for s in used], speed.expected_clock_cap,
                        after=[s["clock_after"] for s in used], starts=[s["start"] for s in used])
    before, after = ("s1", "s3") if sweep is None else sweep["first_window"]
    if len(hosts) > 1:  # cannot happen in one process; kept so a future split cannot pass silently
        clock["mismatch"].append("host")
        clock["verdict"] = "DIFFERENT"
    now = read_archive(archive_path)
    spread = {}
    for c in speed.cells:
        name = c.name
        pooled = {st: results[st][name]["pooled"] for st in names}
        win_spread = []
        for r in range(speed.repeats):
            a, b = pooled[before][r][speed.primary], pooled[after][r][speed.primary]
            win_spread.append(100.0 * abs(a - b) / abs((a + b) / 2) if a is not None and b is not None and a + b
                              else None)
        incl = archive_spread(now, name, hashes[name], speed.primary)
        spread[name] = {"metric": speed.primary, "win_pct": speed.win_pct, "window_pct": win_spread,
                        "window_max_pct": max((x for x in win_spread if x is not None), default=None),
                        "archive_pct": prior_spread[name]["range_pct"], "archive_n": prior_spread[name]["n"],
                        "archive_cv_pct": prior_spread[name]["cv_pct"],
                        "archive_with_window_pct": incl["range_pct"], "archive_with_window_n": incl["n"],
                        "config_hash": hashes[name]}
    win2, series, gate = decide(results, speed, clock, {n: s["archive_with_window_pct"] for n, s in spread.items()},
                                starts=names, evidence=evidence, start_cost_s=start_cost_s(starts),
                                **({} if sweep is None else {"arms": sweep["arms"], "candidate": sweep["name"]}))
    if gate_hook is not None:
        # the stage's own outcome over the rule's (a bracket the window stopped: bracket.window_outcome)
        gate = gate_hook(gate)
    params = speed.to_json()   # the section as the config had it: what the artifacts record
    prov = artifacts.provenance(inputs, {"speed": params})
    if sweep is None:
        artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov},
                              records)
    doc: SpeedDecision = finite_json({
        "schema": SPEED_DECISION_SCHEMA, "audit": audit, "gate": gate, "win2": win2,
        "bar": {"win_pct": speed.win_pct, "primary": speed.primary, "guards": list(speed.guards),
                "reported": list(speed.reported), "lower_is_better": sorted(LOWER_IS_BETTER)},
        "starts": starts, "hosts": hosts, "clock_check": clock,
        "cells": [{**c.to_json(), "prompt_tokens": len(prompts[c.name][(0, 0, 0)])} for c in speed.cells],
        "pooled": {c.name: {st: results[st][c.name]["pooled"] for st in names} for c in speed.cells},
        "window": window, "waves_plan": dict(plan), "looks": list(looks), "evidence": evidence,
        "series": series,
        "deviations": gate["stage_deviations"],
        "bench_serve": {c.name: {st: results[st][c.name]["bench_serve"] for st in names} for c in speed.cells},
        "spread": spread,
        "archive": {"path": str(archive_path), "appended": appended},
        "streams": str(streams_path),
        "params": params, "provenance": prov,
        **({} if sweep is None else {"sweep": dict(sweep["record"])}),
    })
    artifacts.write_json(out_path, doc)
    log.info("speed verdict %s: %s", gate["verdict"], "; ".join(gate["reasons"][:len(speed.cells)]))
    return doc
