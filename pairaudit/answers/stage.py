"""The answers phase (one start of an arm's server: receipt, preflight, sampled and greedy runs, boundary cases) and the
assembly of each dataset's sampled artifact from the phase's journal (``pairaudit.serving.phase``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, cast

from pairaudit.answers.greedy import GreedyError, GreedyPlan
from pairaudit.answers.sampled import Journal, answer_dataset, assemble_records, is_final, read_journal
from pairaudit.boundary import cases as boundary
from pairaudit.core import artifacts, contracts
from pairaudit.core.contracts import PHASE_SCHEMA, BoundaryCase, JournalAttempt, journal_path
from pairaudit.core.jsonlog import AppendLog, append_record, read_log
from pairaudit.core.readers import AnswersPhase, LaunchReceipt, Preflight
from pairaudit.core.settings import BoundarySettings, SamplingSettings, thaw
from pairaudit.gates import server_failure
from pairaudit.plans import requests as plans
from pairaudit.plans.requests import bodies, read_requests
from pairaudit.serving import armspec, failures, launch, preflight
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import ServerError
from pairaudit.serving.launch import Server
from pairaudit.serving.phase import PhaseServer, log


def boundary_key(params: Mapping[str, Any], max_model_len: int, model: str, salt_prefix: str) -> str:
    return artifacts.sha256_json({"params": params, "max_model_len": max_model_len, "model": model,
                                 "salt_prefix": salt_prefix})


def _probe_failure(arm: str, result: dict, srv: Server) -> failures.FailureRecord:
    name = result.get("failed_probe")
    probe: dict = next((p for p in result.get("probes", []) if p["name"] == name), {})
    last = (probe.get("calls") or [{}])[-1]
    status = probe.get("status")
    alive = srv.proc is None or srv.proc.poll() is None
    if status is not None and status < 400 and alive:
        kind = server_failure.FAILED_CHECK
    else:
        kind = failures.classify(status, server_alive=alive)
    return {"arm": arm, "stage": "preflight", "what": f"probe {name}", "kind": kind, "status": status,
            "request": {"method": last.get("method"), "path": last.get("path"), "body": last.get("request")},
            "error": probe.get("error") or probe.get("reason"), "error_body": probe.get("body"),
            "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}


def _item_failure(arm: str, dataset: str, journal_path: Path, srv: Server, exc: Exception | None) -> \
        failures.FailureRecord | None:
    """The first item of ``dataset`` whose last attempt got no answer or a server error, if any."""
    last: dict[int, JournalAttempt] = {}
    for att in read_journal(journal_path):
        last[att["index"]] = att
    open_ = [a for a in last.values() if not is_final(a)]
    if not open_ and exc is None:
        return None
    alive = srv.proc is None or srv.proc.poll() is None
    a: Mapping[str, Any] = min(open_, key=lambda x: x["index"]) if open_ else {}
    return {"arm": arm, "stage": "sampled", "what": f"{dataset} item {a.get('index')}",
            "kind": failures.classify(a.get("status"), server_alive=alive and exc is None),
            "status": a.get("status"), "request": {"method": "POST", "path": "/v1/chat/completions",
                                                   "body": a.get("body")},
            "error": a.get("error") or (str(exc).split("\n")[0] if exc else None), "error_body": a.get("error_body"),
            "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}


def _greedy_failure(arm: str, plan: GreedyPlan, srv: Server, exc: Exception | None) -> \
        failures.FailureRecord | None:
    """The first greedy run of ``plan`` left without an answer (or the error that stopped the runs), if any."""
    open_ = plan.todo
    if not open_ and exc is None:
        return None
    alive = srv.proc is None or srv.proc.poll() is None
    run, slot = open_[0] if open_ else (None, None)
    last: Mapping[str, Any] = plan.last.get((run, slot), {}) if run is not None else {}
    status = last.get("status") if last else getattr(exc, "status", None)
    if last:
        request = {"method": "POST", "path": "/v1/completions", "body": last.get("body")}
    else:  # nothing was sent for it: the call that failed first is the prompt's rendering
        index = plan.index_of(run, slot) if run is not None else plan.det_index
        request = {"method": "POST", "path": "/tokenize",
                   "body": {"model": srv.spec.served_model_name, "messages": plan.messages[index],
                            "add_generation_prompt": True,
                            **({"chat_template_kwargs": plan.chat_template_kwargs} if plan.chat_template_kwargs
                               else {})}}
    return {"arm": arm, "stage": "greedy",
            "what": f"{plan.name} greedy {run} {slot}" if run is not None else f"{plan.name} greedy runs",
            "kind": failures.classify(status, server_alive=alive and not isinstance(exc, ServerError)),
            "status": status, "request": request,
            "error": last.get("error") or (str(exc).split("\n")[0] if exc else None),
            "error_body": last.get("response_body"), "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}


def _confirm(spec: ArmSpec, failure: failures.FailureRecord, *, primary: dict, server_log: str, starts_log: str,
             receipt: dict) -> dict:
    """The failed request once more on a fresh start of the same server (stored beside the first failure)."""
    conf: dict = {"at": artifacts.utc_now(), "kind": None, "status": None, "error": None, "error_body": None}
    with PhaseServer(spec, phase="answers-confirm", log_path=server_log, receipt=receipt,
                     starts_log=starts_log, why=f"a fresh start confirms the {failure['stage']} failure "
                     "(server-failure-v1 asks for one)") as ps:
        try:
            srv = ps.get()
            if failure["stage"] == "preflight":
                res = preflight.run_preflight(srv.endpoint, spec, primary=primary)
                conf["preflight"] = res
                again = _probe_failure(spec.arm, res, srv) if res["verdict"] != "PASS" else None
                conf.update(kind=again["kind"] if again else "answered", status=again["status"] if again else 200,
                            error=again["error"] if again else None,
                            error_body=again["error_body"] if again else None)
            else:
                req = failure["request"]
                res = srv.endpoint.post_json(req["path"], req["body"])
                alive = srv.proc is None or srv.proc.poll() is None
                ok = res["status"] is not None and res["status"] < 400
                conf.update(kind="answered" if ok and alive else failures.classify(res["status"], server_alive=alive),
                            status=res["status"], error=res["error"],
                            error_body=None if res["status"] == 200 else res["body"])
            conf["log_tail"] = srv.log_tail(40)
        except ServerError as exc:
            conf.update(kind=server_failure.DEAD, error=str(exc).split("\n")[0], log_tail=str(exc)[-4000:])
    log.warning("%s: confirmation on a fresh start: %s", failure["what"], conf["kind"])
    return conf


def answers_phase(*, arm: str, spec_path: str, requests_paths: Mapping[str, str], sampling: SamplingSettings,
                  audit: str,
                  boundary_plan_path: str | None, journal_dir: str, receipt_path: str, preflight_path: str,
                  phase_path: str, boundary_path: str | None, server_log: str, starts_log: str,
                  greedy_max_tokens: int | None = None, determinism_repeats: int = 0) -> dict:
    """Receipt, preflight, every dataset's sampled and greedy runs and the boundary cases of one arm on one start.

    The greedy runs (``greedy_max_tokens`` tokens each; None: none) cover every
    item of every dataset, plus ``determinism_repeats`` repeats of each
    dataset's first item (``pairaudit.answers.greedy``): the diagnostics
    select from them and start no server of their own.

    A server that fails under the phase (a failed probe, an item answered
    with a 5xx or not at all, a process that exits) ends the phase with a
    failure record instead of an error: the outputs are written, the work not
    done is marked so, and a server failure is confirmed once on a fresh
    start (``pairaudit.serving.failures``).  The arm's server is the one
    ``spec_path`` (``specs/<arm>.json``) describes; ``sampling`` is the section as the workflow resolved it at
    load, used as it is.
    """
    spec = armspec.read_spec(spec_path, arm=arm)
    rec = launch.receipt(spec)
    requests = {name: plans.bodies(plans.read_requests(p)) for name, p in requests_paths.items()}
    # the boundary section as the workflow resolved it at load (the plan keeps the record's JSON), used as it is
    boundary_cfg = (BoundarySettings.from_json(artifacts.read_json(boundary_plan_path)["params"],
                                               where=f"{boundary_plan_path} params")
                    if boundary_plan_path else None)
    primary = sampling.primary
    counts: dict[str, dict] = {}
    greedy_counts: dict[str, dict] = {}
    boundary_doc = None
    failure: failures.FailureRecord | None = None
    with PhaseServer(spec, phase="answers", log_path=server_log, receipt=rec, starts_log=starts_log,
                     timeout_s=float(sampling.request_timeout_s),
                     why="the arm's answers phase: receipt, preflight, sampled and greedy runs, boundary "
                         "cases") as ps:
        srv = ps.get()
        launch.record_start(rec, spec, srv.facts())
        rec["provenance"] = artifacts.provenance([spec_path], {})
        artifacts.write_json(receipt_path, rec)

        result = preflight.run_preflight(srv.endpoint, spec, primary=primary)
        result["provenance"] = artifacts.provenance([receipt_path], {"primary": primary})
        # every start's rehearsal is kept; the artifact is the one that rehearsed this start
        append_record(journal_path(journal_dir, contracts.JOURNAL_PREFLIGHT, arm=arm), result)
        if result.get("verdict") != "PASS":
            failure = _probe_failure(arm, result, srv)
            log.error("preflight of arm %s failed: %s", arm, server_failure.summary(failure))
        else:
            ps.verify()
        artifacts.write_json(preflight_path, result)

        for name, bodies in requests.items():
            if failure is not None:
                break
            jpath = Path(journal_path(journal_dir, contracts.JOURNAL_SAMPLED, dataset=name, arm=arm))
            try:
                with Journal(jpath, owner=f"answers {arm}") as journal:
                    counts[name] = answer_dataset(srv, name, bodies, journal, sampling=sampling)
                failure = _item_failure(arm, name, jpath, srv, None)
                if failure is None:
                    ps.verify()
            except ServerError as exc:
                failure = _item_failure(arm, name, jpath, srv, exc)

        for name, bodies in requests.items():
            if failure is not None or greedy_max_tokens is None:
                break
            gpath = Path(journal_path(journal_dir, contracts.JOURNAL_GREEDY, dataset=name, arm=arm))
            plan = GreedyPlan(name, {i: b["messages"] for i, b in bodies.items()}, max_tokens=greedy_max_tokens,
                              determinism_repeats=determinism_repeats,
                              chat_template_kwargs=thaw(sampling.chat_template_kwargs), journal=gpath)
            try:
                with Journal(gpath, owner=f"greedy {arm}") as journal:
                    greedy_counts[name] = plan.run(srv, journal, arm=arm, concurrency=sampling.concurrency)
                failure = _greedy_failure(arm, plan, srv, None)
                if failure is None:
                    ps.verify()
            except (ServerError, GreedyError) as exc:
                failure = _greedy_failure(arm, plan, srv, exc)
            greedy_counts.setdefault(name, {}).update(plan.summary())

        if boundary_path is not None and failure is None:
            try:
                boundary_doc = boundary_cases(ps, arm=arm, cfg=boundary_cfg, audit=audit,
                                              journal=Path(journal_path(journal_dir, contracts.JOURNAL_BOUNDARY,
                                                                        arm=arm)),
                                              receipt_path=receipt_path)
                ps.verify()
            except ServerError as exc:
                failure = {"arm": arm, "stage": "boundary", "what": "cases", "kind": server_failure.DEAD, "status": None,
                           "request": None, "error": str(exc).split("\n")[0], "error_body": None,
                           "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}
        facts = srv.facts()
    if failure is not None:
        if server_failure.is_server_failure(failure["kind"]):
            failure["confirmation"] = _confirm(spec, failure, primary=primary, server_log=server_log,
                                               starts_log=starts_log, receipt=rec)
        append_record(journal_path(journal_dir, contracts.JOURNAL_FAILURES, arm=arm), dict(failure))
    if boundary_path is not None and boundary_doc is None:
        boundary_doc = {"schema": contracts.BOUNDARY_SCHEMA, "arm": arm, "served_model_name": spec.served_model_name,
                        "max_model_len": None, "params": boundary_cfg.to_json() if boundary_cfg else None,
                        "cases": [],
                        "first_long": None, "not_run": server_failure.summary(failure or {}),
                        "provenance": artifacts.provenance([receipt_path], {})}
    if boundary_path is not None and boundary_doc is not None:
        artifacts.write_json(boundary_path, boundary_doc)
    doc = {"schema": PHASE_SCHEMA, "phase": "answers", "arm": arm, "spec_sha256": rec["spec_sha256"],
           "starts": ps.starts, "server": facts, "preflight": result["verdict"], "datasets": counts,
           "greedy": greedy_counts if greedy_max_tokens is not None else None,
           "boundary_cases": len(boundary_doc["cases"]) if boundary_doc else None, "failure": failure,
           "provenance": artifacts.provenance(
               [spec_path, *requests_paths.values(), *([boundary_plan_path] if boundary_plan_path else []),
                receipt_path, preflight_path], {"sampling": sampling.to_json(), "audit": audit,
                                                     "greedy": {"max_tokens": greedy_max_tokens,
                                                                "determinism_repeats": determinism_repeats}})}
    artifacts.write_json(phase_path, doc)
    return doc


def boundary_cases(ps: PhaseServer, *, arm: str, cfg: BoundarySettings | None, audit: str, journal: Path,
                   receipt_path: str) -> dict:
    """The boundary cases of one arm, journaled per case: a rerun asks only the cases not yet answered."""
    if cfg is None:
        raise ValueError("boundary cases without the boundary plan's settings")
    params = cfg.to_json()   # what the cases read, and the key of their journal
    srv = ps.get()
    spec = ps.spec
    model = spec.served_model_name
    mml = boundary.server_max_model_len(srv.endpoint, spec)
    key = boundary_key(params, mml, model, audit)
    done: dict[str, BoundaryCase] = {}
    for r in cast(list[BoundaryCase], read_log(journal)):  # the journal holds the cases run_boundary recorded
        status = r.get("status")
        if r.get("key") == key and status is not None and status < 500:
            done.setdefault(r["case"], r)
    with AppendLog(journal, owner=f"boundary {arm}") as jl:
        res = boundary.run_boundary(srv.endpoint, model, mml, params, arm=arm, salt_prefix=audit, done=done,
                                    record=lambda case: jl.append({**case, "key": key}))
    return {"schema": contracts.BOUNDARY_SCHEMA, "arm": arm, "served_model_name": model, "max_model_len": mml,
            "params": params, "cases": res["cases"], "first_long": res["first_long"],
            "server": {k: srv.facts().get(k) for k in ("url", "pid", "identity_check")},
            "provenance": artifacts.provenance([receipt_path], {"boundary": params, "salt_prefix": audit})}


def assemble(*, dataset_path: str, requests_path: str, journal_path: str, out_path: str, receipt_path: str,
             preflight_path: str, phase_path: str) -> dict:
    """The workflow's sampled job: the answers phase's journal for the planned requests of one dataset."""

    req = read_requests(requests_path)
    preflight = Preflight.read(preflight_path)
    receipt = LaunchReceipt.read(receipt_path)
    phase = AnswersPhase.read(phase_path)
    # Recorded as consumed, so checked like every input read: an edited dataset is refused here too.
    artifacts.verify_file(dataset_path)
    mml = preflight.max_model_len or receipt.max_model_len
    return assemble_records(name=req["dataset"], arm=req["arm"], bodies=bodies(req), journal_path=journal_path,
                            out_path=out_path,
                            consumed=[dataset_path, requests_path, receipt_path, preflight_path],
                            params={}, failure=phase.failure, max_model_len=mml)
