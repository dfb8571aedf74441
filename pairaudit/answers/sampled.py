"""Sampled runs: the same request bodies in both arms, journaled so nothing answered is redone or lost.

Request body per item (``request_body``): every sampling field explicit (a
server's defaults differ between builds and arms), ``seed = base_seed +
index``, and one ``cache_salt`` per item that is identical in both arms and
derived from the audit name, so a new audit never reuses an old prefix cache.
``body_sha256`` hashes the body without ``model``: the two arms may serve
different model ids; the pairing is about what was asked.

Journal (``results/<audit>/journal/sampled/<dataset>/<arm>.jsonl``, outside the
job's declared outputs so a failed job does not delete it) — an
:class:`~pairaudit.core.jsonlog.AppendLog`: append-only, one writer at a time, one
line per attempt, fsynced (fields: ``contracts.JournalAttempt``).

An attempt with an HTTP status is *final*: the server answered (a 400 is an
answer too). Only a transport error (no status), a 429 or a 5xx leaves the item open;
a rerun asks again and appends the new attempt beside the old one — no retry
ever replaces an answer.  Records whose body hash no longer matches (the
sampling config changed) stay in the journal as evidence and are not used.

Output (``results/<audit>/sampled/<dataset>/<arm>.jsonl``): an
:mod:`~pairaudit.core.artifacts` JSONL with header ``{"schema": "pairaudit.sampled/v1",
"dataset", "arm", "n", "servers": [{"url", "pid"} of every server that answered], "provenance"}``
and one record per selected item, in index order: the first final attempt
plus ``"prior_attempts": [...]`` (``contracts.SampledRecord``).  It is assembled from the journal alone, so
the same journal always gives the same records.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Mapping, cast

from pairaudit.core import artifacts, lifecycle
from pairaudit.core.contracts import SAMPLED_SCHEMA, JournalAttempt, SampledRecord
from pairaudit.core.jsonlog import AppendLog, read_log
from pairaudit.core.progress import Progress
from pairaudit.core.settings import SamplingSettings
from pairaudit.gates import server_failure
from pairaudit.plans.requests import body_sha256
from pairaudit.serving.client import Endpoint
from pairaudit.serving.launch import Server

log = logging.getLogger("pairaudit")



class SampledError(RuntimeError):
    pass


def is_final(attempt: Mapping[str, Any]) -> bool:
    # 429 is "not now", not an answer: like a transport error, the item stays open
    status = attempt.get("status")
    return status is not None and status < 500 and status != 429


def read_journal(path: Path) -> list[JournalAttempt]:
    """Every parseable attempt; a line cut short by a crash is skipped, never repaired in place."""
    return cast(list[JournalAttempt], read_log(path))  # the journal holds what ask() wrote


def Journal(path: Path, *, owner: str = "", wait: bool = False) -> AppendLog:
    """The item journal: one writer at a time (a second one is refused by name, or with ``wait`` waits)."""
    return AppendLog(path, owner=owner, wait=wait)


def ask(endpoint: Endpoint, index: int, body: dict, attempt: int, server: dict, timeout_s: float) -> JournalAttempt:
    res = endpoint.post_json("/v1/chat/completions", body, timeout_s=timeout_s)
    response = res["body"] if res["status"] == 200 and isinstance(res["body"], dict) else None
    choices = (response or {}).get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    return {
        "index": index,
        "attempt": attempt,
        "body_sha256": body_sha256(body),
        "body": body,
        "status": res["status"],
        "response": response,
        "error_body": res["body"] if res["status"] != 200 else None,
        "error": res["error"],
        "finish_reason": choice.get("finish_reason"),
        "usage": (response or {}).get("usage"),
        "timings": {"started_at": res["started_at"], "elapsed_s": res["elapsed_s"]},
        "server": server,
    }


def pending_items(bodies: Mapping[int, dict], attempts: list[JournalAttempt]) \
        -> tuple[dict[int, list[JournalAttempt]], set[int]]:
    """(attempts per index that match the current body, indices already answered)."""
    by_index: dict[int, list[JournalAttempt]] = {i: [] for i in bodies}
    for a in attempts:
        i = a.get("index")
        if i in bodies and a.get("body_sha256") == body_sha256(bodies[i]):
            by_index[i].append(a)
    done = {i for i, atts in by_index.items() if any(is_final(a) for a in atts)}
    return by_index, done


def run_items(endpoint: Endpoint, bodies: dict[int, dict], journal: AppendLog, *, concurrency: int,
              server: dict, timeout_s: float, prior: dict[int, list[JournalAttempt]], alive=None,
              progress: Progress | None = None) -> None:
    """Ask every open item once, ``concurrency`` at a time, journaling each answer as it arrives.

    An interrupt stops the loop at once: queued items are cancelled and no
    worker sends anything after it (only requests already in flight finish).
    """

    def one(index: int) -> None:
        if lifecycle.stopping():
            return
        if alive is not None:
            alive()
        attempt = ask(endpoint, index, bodies[index], len(prior[index]) + 1, server, timeout_s)
        journal.append(attempt)
        prior[index].append(attempt)

    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        # Stepped here, in the calling thread, so Progress needs no lock.
        for fut in as_completed([pool.submit(one, i) for i in sorted(bodies)]):
            fut.result()
            if progress is not None:
                progress.step()
    except BaseException:
        lifecycle.request_stop("a request loop failed or was interrupted")
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    lifecycle.check_stop()


def collect(bodies: Mapping[int, dict], by_index: Mapping[int, list[JournalAttempt]]) \
        -> tuple[list[SampledRecord], list[int]]:
    records: list[SampledRecord] = []
    open_items: list[int] = []
    for i in sorted(bodies):
        atts = by_index[i]
        final = next((a for a in atts if is_final(a)), None)
        if final is None:
            open_items.append(i)
            continue
        # journal order, not attempt numbers: two writers could both have numbered an attempt 1
        rec: SampledRecord = {**final, "prior_attempts": atts[:atts.index(final)]}
        records.append(rec)
    return records, open_items


def answer_dataset(srv: Server, name: str, bodies: dict[int, dict], journal: AppendLog, *,
                   sampling: SamplingSettings) -> dict:
    """Ask the running server every item the journal has no answer for; return counts."""
    by_index, done = pending_items(bodies, read_journal(journal.path))
    todo = {i: b for i, b in bodies.items() if i not in done}
    arm = srv.spec.arm
    if todo:
        facts = srv.facts()
        server = {"url": facts["url"], "pid": facts["pid"]}
        # Items answered by an earlier run count as done (the journal kept them).
        progress = Progress(len(bodies), f"sampled {name}/{arm}", done=len(bodies) - len(todo))
        run_items(srv.endpoint, todo, journal, concurrency=sampling.concurrency,
                  server=server, timeout_s=float(sampling.request_timeout_s),
                  prior=by_index, alive=srv.assert_alive, progress=progress)
        srv.assert_alive()  # a server that died mid-run fails the phase with its log tail
    log.info("sampled %s/%s: %d items, %d from the journal, %d asked now", name, arm, len(bodies),
             len(done), len(todo))
    return {"items": len(bodies), "from_journal": len(done), "asked": len(todo)}


def assemble_records(*, name: str, arm: str, bodies: dict[int, dict], journal_path: str, out_path: str,
                     consumed: list[str], params: dict, failure: dict | None = None,
                     max_model_len: int | None = None) -> dict:
    """The sampled artifact of one dataset and arm, from the journal alone (no server).

    The first final attempt journaled for an item is its primary answer,
    always; later attempts (a retry, a second writer) stay in the journal.
    After a server failure (``failure``, the answers phase's record) the
    artifact holds the items answered before it and says so in
    ``arm_failed``; the failure itself is evidence for the decision.
    """
    jpath = Path(journal_path)
    by_index, _ = pending_items(bodies, read_journal(jpath))
    records, open_items = collect(bodies, by_index)
    if open_items and failure is None:
        last = {i: by_index[i][-1].get("error") for i in open_items if by_index[i]}
        raise SampledError(
            f"{name}/{arm}: {len(open_items)} item(s) have no answer yet {open_items[:20]} (last errors: "
            f"{json.dumps(last)[:500]}); answered items are kept in {jpath} — rerun to ask only the open ones"
        )
    servers = sorted({json.dumps(r.get("server"), sort_keys=True) for r in records})
    header = {
        "schema": SAMPLED_SCHEMA,
        "dataset": name,
        "arm": arm,
        "n": len(records),
        "servers": [json.loads(s) for s in servers],
        "arm_failed": server_failure.summary(failure) if failure else None,
        # the arm's context limit, so scoring can tell a clamped request that did not fit
        "max_model_len": max_model_len,
        "provenance": artifacts.provenance(consumed, {**params, "journal": str(jpath)}),
    }
    artifacts.write_jsonl(out_path, header, records)
    return header
