"""Phases of the audit: one server start serves a whole phase, not one job.

Real inference servers take minutes to start, and on a cluster every start
is an allocation that loads the model again, so the audit starts each arm's
server once per phase:

- **answers** (one job per arm): the launch receipt, the preflight rehearsal,
  the sampled runs of every dataset and the boundary cases, all on one start;
- **diagnostics** (one job): greedy runs and determinism repeats of every
  dataset on both arms, then the divergence probes; with one server slot the
  arms take turns: control (greedy), candidate (greedy, then its probes),
  control again only if some divergence still needs its probe;
- **speed** (``pairaudit.speed``): the three fresh starts of the bracket.

Every request of a phase is journaled as it is answered, and a phase asks only
what its journals do not already hold, so a rerun after a change to one
dataset asks only that dataset's items, and a phase with nothing to ask does
not start its server at all.  A phase checks its server's identity at start
and again before it writes each output: a server that died or restarted
mid-phase stops the phase with its log tail; the journal keeps what was
answered.  Every start and stop is appended to the audit's server log of
starts (``results/<audit>/servers/starts.jsonl``).

The per-dataset artifacts are assembled from the journals by their own cheap
jobs (``sampled.assemble``), so one dataset's change reruns only that
dataset's downstream jobs.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Mapping

from . import artifacts, boundary, failures, greedy, launch, lifecycle, plans, preflight, rules, schema
from .client import Endpoint, ServerError
from .contracts import ARMS, DIVERGENCE_SCHEMA, GREEDY_SCHEMA, PAIRED_SCHEMA, PHASE_SCHEMA
from .jsonlog import AppendLog, append_record, read_log
from .launch import Server
from .progress import Progress
from .sampled import Journal, answer_dataset, is_final

log = logging.getLogger("pairaudit")

STARTS_SCHEMA = launch.STARTS_SCHEMA


class PhaseError(RuntimeError):
    pass


# --------------------------------------------------------------- server session

def _start_time(ep: Endpoint) -> float | None:
    """The server process's start time from /metrics, where it publishes one (vLLM does)."""
    _, parsed = ep.scrape_metrics(timeout_s=30)
    return (parsed or {}).get("process_start_time_seconds")


class PhaseServer:
    """One arm's server for one phase: started on first use, checked before every output, stopped once."""

    def __init__(self, spec: dict, *, phase: str, log_path: str, receipt: dict | None, starts_log: str,
                 timeout_s: float = 900):
        self.spec, self.phase, self.log_path = spec, phase, log_path
        self.receipt, self.starts_log, self.timeout_s = receipt, starts_log, timeout_s
        self.server: Server | None = None
        self.starts = 0
        self._start_time: float | None = None

    def get(self) -> Server:
        if self.server is None:
            self.server = Server(self.spec, log_path=self.log_path, receipt=self.receipt,
                                 timeout_s=self.timeout_s).start()
            self.starts += 1
            facts = self.server.facts()
            self._start_time = _start_time(self.server.endpoint)
            self._event("ready", facts)
            log.info("%s phase: %s server ready in %.1f s (%s)", self.phase, self.spec["arm"],
                     facts.get("ready_s") or 0.0, facts.get("url"))
        return self.server

    def verify(self) -> None:
        """The same server as at start, alive: else a ``ServerError`` with its log tail."""
        if self.server is None:
            return
        srv = self.server
        srv.assert_alive()
        models = srv.endpoint.get_json("/v1/models", timeout_s=60)
        version = srv.endpoint.get_json("/version", timeout_s=60)
        chk = launch.check_identity(self.spec, models, version, self.receipt)
        problems = list(chk["problems"])
        if models.get("status") != 200:
            problems.append(f"/v1/models answered {models.get('status')} ({models.get('error')})")
        start_time = _start_time(srv.endpoint)
        if self._start_time is not None and start_time != self._start_time:
            problems.append(f"the server restarted mid-phase (process start {self._start_time} -> {start_time})")
        if problems:
            raise srv._fail("server changed mid-phase: " + "; ".join(problems) + "\n--- last lines of "
                            f"{srv.log_path} ---\n" + srv.log_tail(30))

    def close(self) -> None:
        if self.server is not None and self.server.facts().get("stop") is None:
            stop = self.server.stop()
            self._event("stopped", {"stop": stop, "pid": self.server.facts().get("pid")})

    def _event(self, event: str, facts: Mapping[str, Any]) -> None:
        launch.log_start_event(self.starts_log, event=event, phase=self.phase, spec=self.spec,
                               receipt=self.receipt, facts=facts)

    def __enter__(self) -> "PhaseServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------- answers

def _journal_path(journal_dir: str, kind: str, *parts: str) -> Path:
    return Path(journal_dir, kind, *parts[:-1], f"{parts[-1]}.jsonl")


def boundary_key(params: Mapping[str, Any], max_model_len: int, model: str, salt_prefix: str) -> str:
    return artifacts.sha256_json({"params": params, "max_model_len": max_model_len, "model": model,
                                 "salt_prefix": salt_prefix})


def _probe_failure(arm: str, result: dict, srv: Server) -> failures.FailureRecord:
    name = result.get("failed_probe")
    probe = next((p for p in result.get("probes", []) if p["name"] == name), {})
    last = (probe.get("calls") or [{}])[-1]
    status = probe.get("status")
    alive = srv.proc is None or srv.proc.poll() is None
    if status is not None and status < 400 and alive:
        kind = failures.FAILED_CHECK
    else:
        kind = failures.classify(status, server_alive=alive)
    return {"arm": arm, "stage": "preflight", "what": f"probe {name}", "kind": kind, "status": status,
            "request": {"method": last.get("method"), "path": last.get("path"), "body": last.get("request")},
            "error": probe.get("error") or probe.get("reason"), "error_body": probe.get("body"),
            "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}


def _item_failure(arm: str, dataset: str, journal_path: Path, srv: Server, exc: Exception | None) -> \
        failures.FailureRecord | None:
    """The first item of ``dataset`` whose last attempt got no answer or a server error, if any."""
    last: dict[int, dict] = {}
    for a in read_log(journal_path):
        last[a["index"]] = a
    open_ = [a for a in last.values() if not is_final(a)]
    if not open_ and exc is None:
        return None
    alive = srv.proc is None or srv.proc.poll() is None
    a = min(open_, key=lambda x: x["index"]) if open_ else {}
    return {"arm": arm, "stage": "sampled", "what": f"{dataset} item {a.get('index')}",
            "kind": failures.classify(a.get("status"), server_alive=alive and exc is None),
            "status": a.get("status"), "request": {"method": "POST", "path": "/v1/chat/completions",
                                                   "body": a.get("body")},
            "error": a.get("error") or (str(exc).split("\n")[0] if exc else None), "error_body": a.get("error_body"),
            "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}


def _confirm(spec: dict, failure: failures.FailureRecord, *, primary: dict, server_log: str, starts_log: str,
             receipt: dict) -> dict:
    """The failed request once more on a fresh start of the same server (stored beside the first failure)."""
    conf: dict = {"at": artifacts.utc_now(), "kind": None, "status": None, "error": None, "error_body": None}
    with PhaseServer(spec, phase="answers-confirm", log_path=server_log, receipt=receipt,
                     starts_log=starts_log) as ps:
        try:
            srv = ps.get()
            if failure["stage"] == "preflight":
                res = preflight.run_preflight(srv.endpoint, spec, primary=primary)
                conf["preflight"] = res
                again = _probe_failure(spec["arm"], res, srv) if res["verdict"] != "PASS" else None
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
            conf.update(kind=failures.DEAD, error=str(exc).split("\n")[0], log_tail=str(exc)[-4000:])
    log.warning("%s: confirmation on a fresh start: %s", failure["what"], conf["kind"])
    return conf


def answers_phase(*, arm: str, arm_cfg: dict, requests_paths: Mapping[str, str], sampling: dict, audit: str,
                  boundary_plan_path: str | None, journal_dir: str, receipt_path: str, preflight_path: str,
                  phase_path: str, boundary_path: str | None, server_log: str, starts_log: str) -> dict:
    """Receipt, preflight, every dataset's sampled runs and the boundary cases of one arm on one start.

    A server that fails under the phase (a failed probe, an item answered
    with a 5xx or not at all, a process that exits) ends the phase with a
    failure record instead of an error: the outputs are written, the work not
    done is marked so, and a server failure is confirmed once on a fresh
    start (``pairaudit.failures``).
    """
    spec = launch.resolve_spec(arm, arm_cfg)
    rec = launch.receipt(spec)
    requests = {name: plans.bodies(plans.read_requests(p)) for name, p in requests_paths.items()}
    boundary_cfg = artifacts.read_json(boundary_plan_path)["params"] if boundary_plan_path else None
    primary = {k: sampling[k] for k in ("temperature", "top_p", "top_k", "min_p")}
    counts: dict[str, dict] = {}
    boundary_doc = None
    failure: failures.FailureRecord | None = None
    with PhaseServer(spec, phase="answers", log_path=server_log, receipt=rec, starts_log=starts_log,
                     timeout_s=float(sampling.get("request_timeout_s", 900))) as ps:
        srv = ps.get()
        launch.record_start(rec, spec, srv.facts())
        rec["provenance"] = artifacts.provenance([], {"arm_config": arm_cfg})
        artifacts.write_json(receipt_path, rec)

        result = preflight.run_preflight(srv.endpoint, spec, primary=primary)
        result["provenance"] = artifacts.provenance([receipt_path], {"primary": primary})
        # every start's rehearsal is kept; the artifact is the one that rehearsed this start
        append_record(_journal_path(journal_dir, "preflight", arm), result)
        if result.get("verdict") != "PASS":
            failure = _probe_failure(arm, result, srv)
            log.error("preflight of arm %s failed: %s", arm, failures.summary(failure))
        else:
            ps.verify()
        artifacts.write_json(preflight_path, result)

        for name, bodies in requests.items():
            if failure is not None:
                break
            jpath = _journal_path(journal_dir, "sampled", name, arm)
            try:
                with Journal(jpath, owner=f"answers {arm}") as journal:
                    counts[name] = answer_dataset(srv, name, bodies, journal, sampling=sampling)
                failure = _item_failure(arm, name, jpath, srv, None)
                if failure is None:
                    ps.verify()
            except ServerError as exc:
                failure = _item_failure(arm, name, jpath, srv, exc)

        if boundary_path is not None and failure is None:
            try:
                boundary_doc = boundary_cases(ps, arm=arm, cfg=boundary_cfg, audit=audit,
                                              journal=_journal_path(journal_dir, "boundary", arm),
                                              receipt_path=receipt_path)
                ps.verify()
            except ServerError as exc:
                failure = {"arm": arm, "stage": "boundary", "what": "cases", "kind": failures.DEAD, "status": None,
                           "request": None, "error": str(exc).split("\n")[0], "error_body": None,
                           "log_tail": srv.log_tail(40), "at": artifacts.utc_now()}
        facts = srv.facts()
    if failure is not None:
        if failures.is_server_failure(failure["kind"]):
            failure["confirmation"] = _confirm(spec, failure, primary=primary, server_log=server_log,
                                               starts_log=starts_log, receipt=rec)
        append_record(_journal_path(journal_dir, "failures", arm), dict(failure))
    if boundary_path is not None and boundary_doc is None:
        boundary_doc = {"schema": boundary.SCHEMA, "arm": arm, "served_model_name": spec["served_model_name"],
                        "max_model_len": None, "params": boundary.settings(boundary_cfg), "cases": [],
                        "first_long": None, "not_run": failures.summary(failure or {}),
                        "provenance": artifacts.provenance([receipt_path], {})}
    if boundary_path is not None:
        artifacts.write_json(boundary_path, boundary_doc)
    doc = {"schema": PHASE_SCHEMA, "phase": "answers", "arm": arm, "spec_sha256": rec["spec_sha256"],
           "starts": ps.starts, "server": facts, "preflight": result["verdict"], "datasets": counts,
           "boundary_cases": len(boundary_doc["cases"]) if boundary_doc else None, "failure": failure,
           "provenance": artifacts.provenance(
               [*requests_paths.values(), *([boundary_plan_path] if boundary_plan_path else []), receipt_path,
                preflight_path], {"sampling": sampling, "audit": audit})}
    artifacts.write_json(phase_path, doc)
    return doc


def boundary_cases(ps: PhaseServer, *, arm: str, cfg: dict | None, audit: str, journal: Path,
                   receipt_path: str) -> dict:
    """The boundary cases of one arm, journaled per case: a rerun asks only the cases not yet answered."""
    params = boundary.settings(cfg)
    srv = ps.get()
    spec = ps.spec
    model = spec["served_model_name"]
    mml = boundary.server_max_model_len(srv.endpoint, spec)
    key = boundary_key(params, mml, model, audit)
    done = {}
    for r in read_log(journal):
        if r.get("key") == key and r.get("status") is not None and r["status"] < 500:
            done.setdefault(r["case"], r)
    with AppendLog(journal, owner=f"boundary {arm}") as jl:
        res = boundary.run_boundary(srv.endpoint, model, mml, params, arm=arm, salt_prefix=audit, done=done,
                                    record=lambda case: jl.append({**case, "key": key}))
    return {"schema": boundary.SCHEMA, "arm": arm, "served_model_name": model, "max_model_len": mml,
            "params": params, "cases": res["cases"], "first_long": res["first_long"],
            "server": {k: srv.facts().get(k) for k in ("url", "pid", "identity_check")},
            "provenance": artifacts.provenance([receipt_path], {"boundary": params, "salt_prefix": audit})}


# ----------------------------------------------------------------- diagnostics

def greedy_selection(paired: dict, cfg: dict) -> dict:
    """Which items get greedy runs: every discordant item plus a few concordant ones as a control (or all)."""
    table = paired["table"]
    indices = list(table["indices"])
    discordant = sorted(table["control_only"] + table["candidate_only"])
    if cfg["items"] == "all":
        return {"mode": "all", "discordant": discordant, "concordant": [], "indices": sorted(indices)}
    rest = sorted(set(indices) - set(discordant))
    concordant = sorted(random.Random(cfg["seed"]).sample(rest, min(cfg["concordant"], len(rest))))
    return {"mode": "discordant", "discordant": discordant, "concordant": concordant,
            "indices": sorted(discordant + concordant)}


class GreedyPlan:
    """One dataset's greedy work on one arm: the wanted runs, and which the journal already holds."""

    def __init__(self, dataset: dict, paired: dict, cfg: dict, chat_template_kwargs: dict, journal: Path):
        self.dataset, self.cfg, self.journal = dataset, cfg, journal
        self.selection = greedy_selection(paired, cfg)
        self.items = {it["index"]: it for it in dataset["items"]}
        self.det_index = self.selection["indices"][0] if self.selection["indices"] else dataset["items"][0]["index"]
        self.want = [("greedy", i) for i in self.selection["indices"]] + [
            ("determinism", r) for r in range(cfg["determinism_repeats"])]
        self.key = {"max_tokens": cfg["max_tokens"], "determinism_index": self.det_index,
                    "chat_template_kwargs": chat_template_kwargs}
        self.chat_template_kwargs = chat_template_kwargs
        self.done: dict = {}
        for rec in read_log(journal):
            if rec.get("key") == self.key and is_final(rec):
                self.done.setdefault((rec["run"], rec["slot"]), rec)

    @property
    def todo(self) -> list:
        return [w for w in self.want if w not in self.done]

    def run(self, srv: Server, arm: str) -> None:
        todo = self.todo
        if not todo:
            return
        model = srv.spec["served_model_name"]
        prompts: dict = {}
        progress = Progress(len(self.want), f"greedy {self.dataset['name']}/{arm}", done=len(self.want) - len(todo))
        with Journal(self.journal, owner=f"greedy {arm}") as journal:
            for kind, slot in todo:
                lifecycle.check_stop()
                index = slot if kind == "greedy" else self.det_index
                if index not in prompts:
                    prompts[index] = greedy.prompt_ids(srv.endpoint, model, self.items[index]["messages"],
                                                       self.chat_template_kwargs)
                rec = greedy.greedy_one(srv.endpoint, model, prompts[index], max_tokens=self.cfg["max_tokens"],
                                        index=index)
                rec.update(run=kind, slot=slot, key=self.key, prompt_ids=prompts[index])
                journal.append(rec)
                if is_final(rec):
                    self.done.setdefault((kind, slot), rec)
                srv.assert_alive()
                progress.step()

    def header_and_records(self, arm: str, consumed: list[str]) -> tuple[dict, list[dict]]:
        missing = [w for w in self.want if w not in self.done]
        if missing:
            raise PhaseError(f"{self.dataset['name']}/{arm}: greedy runs without an answer: {missing}; "
                             "rerun to resume")
        records = [self.done[w] for w in self.want if w[0] == "greedy"]
        repeats = [self.done[w] for w in self.want if w[0] == "determinism"]
        header = {
            "schema": GREEDY_SCHEMA, "dataset": self.dataset["name"], "arm": arm,
            "selection": self.selection, "max_tokens": self.cfg["max_tokens"],
            "determinism": {"index": self.det_index,
                            "hashes": [r["output_sha256"] or f"error:{r['error']}" for r in repeats],
                            "records": repeats},
            "provenance": artifacts.provenance(consumed, {"greedy": self.cfg, "journal": str(self.journal)}),
        }
        return header, records


def _prefix_key(prompt_ids: list[int], prefix: list[int]) -> str:
    return artifacts.sha256_json({"prompt": prompt_ids, "prefix": prefix})


def probe_arm(ps: PhaseServer, divergences: list[dict], prompt_ids: Mapping[int, list[int]],
              journal: Path) -> list[dict]:
    """Top-20 probes of one arm at every divergence, journaled: a rerun probes only what is missing."""
    done = {}
    for r in read_log(journal):
        if r.get("status") is not None and r["status"] < 500:
            done.setdefault((r["index"], r.get("prefix_key")), r)
    out = []
    want = [(d, _prefix_key(prompt_ids[d["index"]], d["shared_prefix"])) for d in divergences]
    if any((d["index"], k) not in done for d, k in want):
        srv = ps.get()
        model = ps.spec["served_model_name"]
        with Journal(journal, owner=f"probes {ps.spec['arm']}") as jl:
            for d, k in want:
                if (d["index"], k) in done:
                    continue
                lifecycle.check_stop()
                res = greedy.run_probe(srv.endpoint, model, prompt_ids[d["index"]], d["shared_prefix"])
                rec = {"index": d["index"], "first_divergence": d["first_divergence"], "prefix_key": k, **res}
                jl.append(rec)
                done[(d["index"], k)] = rec
                srv.assert_alive()
    for d, k in want:
        rec = dict(done[(d["index"], k)])
        rec.pop("prefix_key", None)
        out.append(rec)
    return out


def divergence_doc(name: str, headers: dict, probes: dict, probed: list, divergences: list,
                   order: list, consumed: list[str], max_divergent: int) -> dict:
    # an item whose divergence could not be established stays in the rule with no evidence, so it STOPs
    unresolved = [{"index": d["index"], "control_token_id": None, "candidate_token_id": None, "candidate_top": None,
                   "control_top": None, "control_prefix_len": None, "candidate_prefix_len": None}
                  for d in divergences if d["diverged"] is None]
    grid_inputs = greedy.grid_tie_inputs(probed, probes["control"], probes["candidate"]) + unresolved
    counts = greedy.comparison_counts(order, divergences)
    return {
        "schema": DIVERGENCE_SCHEMA, "dataset": name, "items": order, "divergences": divergences,
        "probes": probes, "grid_tie_inputs": grid_inputs, "counts": counts,
        "grid_tie": rules.grid_tie_v1(grid_inputs, max_divergent=max_divergent, selected=counts["selected"],
                                      compared=counts["compared"]),
        "determinism": rules.determinism_v1({arm: headers[arm]["determinism"]["hashes"] for arm in ARMS}),
        "provenance": artifacts.provenance(consumed, {"max_divergent": max_divergent}),
    }


def find_divergences(records: Mapping[str, list[dict]]) -> tuple[list, list, dict, list]:
    """(item order, divergences, prompt ids by item, the divergences to probe)."""
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
    return order, divergences, prompt_ids, [d for d in divergences if d["diverged"]]


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
            "grid_tie": {"rule": "grid-tie-v1", **not_run}, "determinism": {"rule": "determinism-v1", **not_run},
            "provenance": prov})
    doc = {"schema": PHASE_SCHEMA, "phase": "diagnostics", "starts": [], "not_run": why, "provenance": prov}
    artifacts.write_json(phase_path, doc)
    return doc


def diagnostics_phase(*, dataset_paths: Mapping[str, str], paired_paths: Mapping[str, str],
                      receipt_paths: Mapping[str, str], preflight_paths: Mapping[str, str],
                      arm_cfgs: Mapping[str, dict], greedy_cfg: dict, chat_template_kwargs: dict,
                      journal_dir: str, greedy_paths: Mapping[str, Mapping[str, str]],
                      divergence_paths: Mapping[str, str], server_logs: Mapping[str, str], starts_log: str,
                      phase_path: str, max_divergent: int = 3,
                      answers_paths: Mapping[str, str] | None = None) -> dict:
    """Greedy runs, determinism repeats and divergence probes of every dataset, both arms, in few starts."""
    greedy_cfg = {**schema.defaults("greedy"), **(greedy_cfg or {})}
    names = list(dataset_paths)
    failed = {arm: (artifacts.read_json(answers_paths[arm]).get("failure") if answers_paths else None)
              for arm in ARMS}
    failed = {arm: failures.summary(f) for arm, f in failed.items() if f}
    if failed:
        return _diagnostics_not_run(names, failed, greedy_paths, divergence_paths, phase_path,
                                    [*answers_paths.values()])
    specs, receipts = {}, {}
    for arm in ARMS:
        receipts[arm] = artifacts.check_schema(artifacts.read_json(receipt_paths[arm]), launch.RECEIPT_SCHEMA,
                                               receipt_paths[arm])
        pf = artifacts.read_json(preflight_paths[arm])
        if pf.get("verdict") != "PASS":
            raise PhaseError(f"{preflight_paths[arm]}: preflight of arm {arm} did not pass; no greedy runs")
        specs[arm] = launch.resolve_spec(arm, arm_cfgs[arm])
    plans: dict[str, dict[str, GreedyPlan]] = {}
    for name in names:
        ds = artifacts.read_json(dataset_paths[name])
        paired = artifacts.check_schema(artifacts.read_json(paired_paths[name]), PAIRED_SCHEMA,
                                        paired_paths[name])
        plans[name] = {arm: GreedyPlan(ds, paired, greedy_cfg, chat_template_kwargs,
                                       _journal_path(journal_dir, "greedy", name, arm)) for arm in ARMS}

    def session(arm: str) -> PhaseServer:
        return PhaseServer(specs[arm], phase="diagnostics", log_path=server_logs[arm], receipt=receipts[arm],
                           starts_log=starts_log)

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
    control = session("control")
    try:
        greedy_turn(control, "control")
    finally:
        control.close()
        starts.append(("control", control.starts))

    candidate = session("candidate")
    probes: dict[str, dict[str, list]] = {name: {} for name in names}
    found: dict[str, tuple] = {}
    try:
        greedy_turn(candidate, "candidate")
        for name in names:
            found[name] = find_divergences({arm: greedy_out[name][arm][1] for arm in ARMS})
            _, _, prompt_ids, probed = found[name]
            probes[name]["candidate"] = probe_arm(candidate, probed, prompt_ids,
                                                  _journal_path(journal_dir, "probes", name, "candidate"))
        candidate.verify()
    finally:
        candidate.close()
        starts.append(("candidate", candidate.starts))

    control2 = session("control")
    try:
        for name in names:
            _, _, prompt_ids, probed = found[name]
            probes[name]["control"] = probe_arm(control2, probed, prompt_ids,
                                                _journal_path(journal_dir, "probes", name, "control"))
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
             "provenance": artifacts.provenance([*paired_paths.values()], {"greedy": greedy_cfg})}
    artifacts.write_json(phase_path, phase)
    return phase
