"""The shared-control speed bracket: several candidates against one control, one decision per candidate.

The starts run C, T1, C, T2, ..., Tn, C, then T, C for each candidate still
undecided, up to each candidate's own budget (``gates.sweep_next``), each a
fresh server on one host; after each round every candidate that got a window
is looked at by the sequential rule over its own windows
(``gates.sweep_layout``; docs/speed.md). A candidate decided at a look gets
no more starts, and its decision is written over the bracket as it stood at
that look. A candidate whose server fails is evidence for that candidate
alone (its failure, confirmed on a fresh start, as in the two-arm bracket)
and the other candidates' brackets go on; a control server that fails ends
the bracket for every candidate still undecided. One streams.jsonl holds
every start's streams.
"""

from __future__ import annotations

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
from pairaudit.gates.speed import CONTROL, looks_for, sweep_layout, sweep_next
from pairaudit.serving import armspec, gpupool
from pairaudit.serving.client import ServerError
from pairaudit.speed.archive import append_archive, archive_line, archive_spread, config_hash, read_archive
from pairaudit.speed.bracket import BracketFailure, WindowStop, fits_window, log, window_deadline, window_outcome
from pairaudit.speed.clock import clock_check, clock_facts, host_facts
from pairaudit.speed.decision import decide
from pairaudit.speed.evidence import host_evidence
from pairaudit.speed.gpu import server_visible_devices
from pairaudit.speed.starts import decided_doc, failed_doc, measure_start, server_log_for


def _not_run(why: str, *, speed: SpeedSettings, audit: str, inputs: Sequence[str], out_path: str,
             record: Mapping[str, Any], gate: Mapping[str, Any] | None = None) -> SpeedDecision:
    params = speed.to_json()   # the section as the config had it: what the artifacts record
    prov = artifacts.provenance(inputs, {"speed": params})
    doc: SpeedDecision = {"schema": SPEED_DECISION_SCHEMA, "audit": audit, "not_run": why, "params": params,
                          "provenance": prov, "sweep": dict(record),
                          "gate": dict(gate) if gate is not None else
                          {"rule": speed.rule, "verdict": "INCONCLUSIVE", "reasons": [f"not run: {why}"]}}
    artifacts.write_json(out_path, doc)
    return doc


def _record(candidate: str, candidates: Sequence[str], arms: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
    """What a candidate's decision records of the bracket: the arm and name of every start that ran to its end,
    and the candidate's windows among them."""
    names = list(names)
    rec: dict[str, Any] = {"candidate": candidate, "candidates": list(candidates), "arms": list(arms),
                           "starts": names, "windows": [], "control_starts": [], "pooled_control_starts": []}
    if candidate in arms and len(arms) >= 3 and arms[-1] == CONTROL:
        lay = sweep_layout(arms, candidate)
        rec.update(windows=[[names[k] for k in w] for w in lay.windows],
                   control_starts=[names[k] for k in lay.controls],
                   pooled_control_starts=[names[k] for k in lay.others])
    return rec


def _clock(starts: Sequence[Mapping[str, Any]], arms: Sequence[str], candidate: str,
           speed: SpeedSettings) -> dict:
    """The clock check over the starts a candidate's decision uses: its own and every control start."""
    used = [s for s, a in zip(starts, arms) if a in (CONTROL, candidate)]
    return clock_check([s["clock"] for s in used], speed.expected_clock_cap,
                       after=[s["clock_after"] for s in used], starts=[s["start"] for s in used])


def sweep_stage(*, launch_paths: Mapping[str, str], preflight_paths: Mapping[str, str],
                spec_paths: Mapping[str, str], speed: SpeedSettings, audit: str, candidates: Sequence[str],
                out_paths: Mapping[str, str], streams_path: str, archive_path: str, server_logs: Mapping[str, str],
                starts_log: str | None = None, deadline: float | None = None,
                wall_clock: Callable[[], float] = time.time) -> dict[str, SpeedDecision]:
    """Run the shared-control bracket of ``candidates`` (bracket order) and write one decision per candidate
    (``out_paths``) and the bracket's streams.jsonl.

    The path mappings are keyed by arm: ``control`` and every candidate's name. Each decision has the
    two-arm bracket's schema plus ``sweep`` (``_record``) and the gate's ``sweep`` (its windows, the control
    starts it was compared to and those pooled into its variance).

    ``deadline`` (as in the two-arm bracket, ``speed.stage.speed_stage``): no start begins that would end after
    it; every candidate still undecided then ends INCONCLUSIVE for the window, over the windows it had.
    """
    cands = list(candidates)
    if speed.rule not in SEQUENTIAL_RULES:
        raise ValueError(f"a shared-control bracket is decided by {' or '.join(SEQUENTIAL_RULES)}, "
                         f"not speed.rule {speed.rule}")
    if len(set(cands)) != len(cands) or CONTROL in cands or not cands:
        raise ValueError(f"candidates must be distinct names other than {CONTROL!r}, got {cands}")
    arms_all = [CONTROL, *cands]
    for what, paths in (("spec", spec_paths), ("launch", launch_paths), ("preflight", preflight_paths)):
        missing = [a for a in arms_all if a not in paths]
        if missing:
            raise ValueError(f"speed: no {what} input for arm(s) {missing}")
    if set(out_paths) != set(cands):
        raise ValueError(f"speed: one decision per candidate, got outputs for {sorted(out_paths)} and candidates "
                         f"{cands}")
    inputs = [*spec_paths.values(), *launch_paths.values(), *preflight_paths.values()]
    prov = artifacts.provenance(inputs, {"speed": speed.to_json()})
    docs: dict[str, SpeedDecision] = {}
    pre = {arm: artifacts.read_json(preflight_paths[arm]) for arm in arms_all}
    bad = {arm: pf for arm, pf in pre.items() if pf.get("verdict") != "PASS"}

    def why_pf(arm: str) -> str:
        return f"the {arm} preflight is {bad[arm].get('verdict')} at probe {bad[arm].get('failed_probe')!r}"

    for c in cands:
        # a server that failed its rehearsal is evidence of the servers gate; its bracket is not measured
        gone = [a for a in (CONTROL, c) if a in bad]
        if gone:
            docs[c] = _not_run("; ".join(why_pf(a) for a in gone), speed=speed, audit=audit, inputs=inputs,
                               out_path=out_paths[c], record=_record(c, cands, [], []))
    running = [c for c in cands if c not in docs]
    if not running:
        artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov}, [])
        return docs
    receipts = {arm: artifacts.check_schema(artifacts.read_json(launch_paths[arm]), contracts.LAUNCH_SCHEMA,
                                            launch_paths[arm]) for arm in [CONTROL, *running]}
    specs = {arm: armspec.read_spec(spec_paths[arm], arm=arm) for arm in [CONTROL, *running]}
    model = specs[CONTROL].served_model_name
    other = {c: specs[c].served_model_name for c in running if specs[c].served_model_name != model}
    if other:
        raise RuntimeError(f"speed: the arms serve different model names (control {model!r}, {other}); one prompt "
                           "set cannot fit them all")
    hashes = {c.name: config_hash(c, speed, specs[CONTROL]) for c in speed.cells}
    prior = read_archive(archive_path)
    prior_spread = {c.name: archive_spread(prior, c.name, hashes[c.name], speed.primary) for c in speed.cells}
    window = uuid.uuid4().hex
    evidence = host_evidence(prior, host=host_facts()["host"], hashes=hashes, deciding=speed.deciding,
                             metrics=[speed.primary, *speed.guards], exclude_window=window)
    budget = looks_for(speed.max_starts)
    progress = Progress((1 + 2 * len(running)) * speed.repeats * speed.waves * len(speed.cells), "speed waves")
    arms: list[str] = []                       # the arm of every start that ran to its end, in order
    starts: list[dict] = []
    failed_starts: list[dict] = []
    results: dict[str, Any] = {}
    records: list[dict] = []
    prompts: Mapping[str, Any] | None = None
    plan: dict[str, int] | None = None
    looks: dict[str, list[dict]] = {c: [] for c in running}
    upto: dict[str, int] = {}                  # a decided candidate: the bracket's starts at its deciding look
    undecided = set(running)
    appended, k = 0, 0
    deadline = window_deadline() if deadline is None else deadline
    costs: list[float] = []                    # each measured start's wall seconds, launch to stop
    stopped: WindowStop | None = None
    with gpupool.reserve([specs[a] for a in [CONTROL, *running]], {"arm": "speed bracket"}) as gpus:
        while undecided and stopped is None:
            todo = sweep_next(arms, running, undecided, budget)
            if not todo:
                break
            progress.total = (len(starts) + len(todo)) * speed.repeats * (sum(plan.values()) if plan else
                                                                          speed.waves * len(speed.cells))
            looked: list[str] = []
            for i, arm in enumerate(todo):
                if arm == CONTROL and arms and arms[-1] == CONTROL:
                    continue   # the candidate start it was to close failed: the last control closes the window
                if arm != CONTROL and arm not in undecided:
                    continue
                cost = max(costs, default=None)
                # a candidate start needs the control start that closes its window too
                if not fits_window(deadline, cost, wall_clock(), starts=1 if arm == CONTROL else 2):
                    stopped = WindowStop(deadline=float(deadline or 0.0), starts_had=len(starts),
                                         starts_needed=len(starts) + len(todo) - i, start_cost_s=cost, at=wall_clock())
                    log.warning("speed: %s", stopped.reason())
                    break
                began = time.monotonic()
                k += 1
                start = f"s{k}"
                visible = server_visible_devices(specs[arm], gpus.server_environ(specs[arm]))
                rec = {"start": start, "role": CONTROL if arm == CONTROL else "candidate", "arm": arm,
                       **host_facts(), "clock": clock_facts(visible), "started_at": utc_now("milliseconds"),
                       "stopped_at": None}
                log.info("speed %s: %s arm, fresh server", start, arm)
                slog = server_log_for(server_logs, start, arm)
                try:
                    facts, recs = measure_start(start, arm, specs[arm], receipts[arm], rec, speed=speed, model=model,
                                                prompts=prompts, plan=plan, results=results, progress=progress,
                                                server_log=slog, starts_log=starts_log, gpus=gpus)
                except (BracketFailure, ServerError) as exc:
                    hit = sorted(undecided) if arm == CONTROL else [arm]
                    for c in hit:
                        # a failing control ends every undecided candidate's bracket; a failing candidate only its own
                        docs[c] = failed_doc(exc, start=start, arm=CONTROL if arm == CONTROL else "candidate",
                                             rec=dict(rec), starts=starts, records=records, specs=specs,
                                             receipts=receipts, speed=speed, audit=audit, out_path=out_paths[c],
                                             streams_path=streams_path, server_log=slog, starts_log=starts_log,
                                             inputs=inputs, gpus=gpus,
                                             sweep={"spec": arm, "record": _record(c, cands, arms,
                                                                                   [s["start"] for s in starts])})
                        undecided.discard(c)
                    failed_starts.append(docs[hit[0]]["starts"][-1] if hit else rec)
                    if arm == CONTROL:
                        break
                    continue
                if plan is None:
                    plan = facts.pop("plan")
                prompts = prompts or facts.pop("prompts")
                records += recs
                starts.append(rec)
                arms.append(arm)
                costs.append(time.monotonic() - began)
                # a candidate that is the control server itself (an A/A): its starts are control starts too
                if arm == CONTROL or specs[arm].identity() == specs[CONTROL].identity():
                    appended += append_archive(archive_path, [
                        archive_line(audit=audit, start=start, cell=c, chash=hashes[c.name],
                                     pooled=results[start][c.name]["pooled"], clock=rec["clock"],
                                     host=rec["host"], window=window)
                        for c in speed.cells])
                if arm != CONTROL:
                    looked.append(arm)
            if stopped is not None or (arms and arms[-1] != CONTROL):
                break   # the window ended, or the control that was to close a window failed
            names = [st["start"] for st in starts]
            for c in [c for c in looked if c in undecided]:
                _, _, gate = decide(results, speed, _clock(starts, arms, c, speed), starts=names, evidence=evidence,
                                    arms=arms, candidate=c)
                looks[c].append({"starts": len(names), "windows": sum(1 for a in arms if a == c),
                                 "verdict": gate["verdict"], "half_width_pct": gate.get("half_width_pct"),
                                 "pooled_gain_pct": gate.get("pooled_gain_pct"),
                                 "more_starts": gate.get("more_starts")})
                if not gate.get("more_starts"):
                    undecided.discard(c)
                    upto[c] = len(arms)
                else:
                    log.info("speed: %s undecided after %d window(s) (half-width %.2f %% > bar): another window",
                             c, looks[c][-1]["windows"], gate.get("half_width_pct") or float("nan"))
    # the window may stop the bracket between a candidate's start and the control that closes its window
    closed = max((i + 1 for i, a in enumerate(arms) if a == CONTROL), default=0)
    for c in running:
        if c in docs:
            continue
        n = upto.get(c, closed if stopped is not None else len(arms))
        hook = None if stopped is None or c in upto else functools.partial(window_outcome, stop=stopped,
                                                                             rule=speed.rule)
        if hook is not None and c not in arms[:n]:
            # no window of this candidate closed before the window ended: nothing to decide it on
            docs[c] = _not_run(stopped.reason() if stopped else "", speed=speed, audit=audit, inputs=inputs,
                               out_path=out_paths[c], record=_record(c, cands, arms[:n],
                                                                     [s["start"] for s in starts[:n]]),
                               gate=window_outcome(None, stopped, rule=speed.rule) if stopped else None)
            continue
        if prompts is None or plan is None:
            raise AssertionError("the bracket ran without prompts")
        lay = sweep_layout(arms[:n], c)
        first = lay.windows[0]
        names = [s["start"] for s in starts[:n]]
        docs[c] = decided_doc(speed=speed, audit=audit, starts=starts[:n], results=results, records=records,
                              prompts=prompts, hashes=hashes, prior_spread=prior_spread, archive_path=archive_path,
                              appended=appended, inputs=inputs, out_path=out_paths[c], streams_path=streams_path,
                              evidence=evidence, window=window, plan=plan, looks=looks[c], gate_hook=hook,
                              sweep={"name": c, "arms": arms[:n],
                                     "first_window": (names[first[0]], names[first[2]]),
                                     "record": {**_record(c, cands, arms[:n], names), "failed_starts": failed_starts}})
    artifacts.write_jsonl(streams_path, {"schema": SPEED_STREAMS_SCHEMA, "audit": audit, "provenance": prov}, records)
    return docs
