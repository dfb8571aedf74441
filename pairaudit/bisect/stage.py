"""Switch bisection: which of the change's switches move the candidate's greedy divergences.

``snakemake --cores N bisect`` (rules/bisect.smk) runs :func:`bisect_stage`
after the diagnostics phase.  Its items are the divergent greedy items of
the audit (``divergence/<dataset>.json``: both arms got the same token
prompt, and their greedy outputs first differ at ``first_divergence``), its
probe: the top-20 of one greedy step after the prompt and the shared
prefix (``answers.greedy.run_probe``).

Each *subset* of the change's switches (those on, every other at its
rollback value; ``plans.change.arm_config``) is ONE fresh server start
(``serving.phase.PhaseServer``: a machine-wide server slot, logged in
``servers/starts.jsonl`` as phase ``bisect``) on which every divergent item
is probed.  A subset *moves* an item when the probed token is the
candidate's, not the control's.  Per item, ``bisect.search`` asks subsets
until it has the smallest set that moves it, after confirming that every
switch on moves it and every switch at rollback does not; a subset asked for
one item answers for every item, so items moved by the same switches share
their starts.

Every subset's probes are kept in ``journal/bisect/<key>.json``, ``key`` the
sha256 of the subset, the server's identity (command, env, model) and the
items (prompt and forced prefix), so a rerun with the same evidence starts
nothing.  A subset whose server fails is recorded with the error and not
kept (a rerun tries it again); the items whose search needed it are
``undecided``.

``bisect/result.json`` (``pairaudit.bisect/v1``)::

    {"schema", "status": "done" | "no_switches" | "needs_launch_mode" | "no_divergence",
     "message": str,                         # one line: what was done, or why not
     "change": None | {"name", "description", "switches": [...]},
     "switches": [name, ...], "n": int,
     "items": [contracts.BisectItemResult], "skipped": [{"dataset", "index", "reason"}],
     "subsets": [{"on", "key", "source": "started" | "kept" | "failed", "error", "server": {...}}],
     "starts": {"started": int, "kept": int, "failed": int, "asked": int, "bound": int},
     "summary": [str, ...],                  # the sentences of bisect/report.md
     "provenance": {...}}

``bisect/report.md`` is the section the promotion report would carry; the
promotion never reads it (bisection is a diagnostic: it changes no verdict).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pairaudit.answers import greedy
from pairaudit.bisect import search
from pairaudit.core import artifacts, lifecycle
from pairaudit.core.artifacts import sha256_json
from pairaudit.core.contracts import (
    BISECT_PROBES_SCHEMA,
    BISECT_SCHEMA,
    GREEDY_SCHEMA,
    BisectItemResult,
    BisectProbe,
    ProbeResult,
)
from pairaudit.core.readers import DivergenceDoc
from pairaudit.plans import change as changes
from pairaudit.serving import armspec
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import ServerError
from pairaudit.serving.phase import PhaseServer

log = logging.getLogger("pairaudit")

BISECT_ARM = "bisect"   # the arm name of every bisection start (messages, starts log, server slot)
PHASE = "bisect"


@dataclass(frozen=True)
class BisectItem:
    """One divergent greedy item: what is forced, and the two arms' tokens at the divergence."""

    dataset: str
    index: int
    first_divergence: int
    control_token_id: int
    candidate_token_id: int
    prompt_ids: tuple[int, ...]
    shared_prefix: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"{self.dataset}:{self.index}"

    def identity(self) -> dict:
        return {"dataset": self.dataset, "index": self.index, "prompt_ids": list(self.prompt_ids),
                "shared_prefix": list(self.shared_prefix)}


@dataclass
class SubsetResult:
    """One subset's server start (or its kept probes): the probe of every item, or the failure."""

    on: tuple[str, ...]
    key: str
    source: str                          # "started" | "kept" | "failed"
    probes: dict[str, ProbeResult]       # item key -> greedy.run_probe record
    error: str | None = None
    server: dict | None = None

    def summary(self) -> dict:
        return {"on": list(self.on), "key": self.key, "source": self.source, "error": self.error,
                "server": self.server}


# ------------------------------------------------------------------ items

def divergent_items(divergence_paths: Mapping[str, str], greedy_paths: Mapping[str, str]
                    ) -> tuple[list[BisectItem], list[dict], list[str]]:
    """(items to bisect, items skipped with the reason, notes) from the diagnostics' artifacts.

    ``greedy_paths``: dataset -> the control's greedy artifact, which holds
    each item's prompt ids (the same in both arms: an item whose arms got
    different prompts is not a divergence, ``diverged`` is None for it).
    """
    items, skipped, notes = [], [], []
    for name, path in divergence_paths.items():
        doc = DivergenceDoc.read(path)
        if doc.not_run:
            notes.append(f"{name}: no greedy runs ({doc.not_run})")
            continue
        header, records = artifacts.read_jsonl(greedy_paths[name])
        artifacts.check_schema(header, GREEDY_SCHEMA, greedy_paths[name])
        artifacts.check_consumed(doc.raw, [greedy_paths[name]], where=str(path))
        prompts = {r["index"]: r.get("prompt_ids") for r in records}
        for d in doc.divergences:
            if d.diverged is not True:
                continue
            prompt = prompts.get(d.index)
            ctl, cand, first = d.control_token_id, d.candidate_token_id, d.first_divergence
            if ctl is None or cand is None:
                why = "one arm's output ends at the divergence: there is no token of that arm to reproduce"
            elif first is None:
                why = f"{path} records no first divergence for the item"
            elif not prompt:
                why = f"no prompt ids for the item in {greedy_paths[name]}"
            else:
                items.append(BisectItem(dataset=name, index=d.index, first_divergence=first, control_token_id=ctl,
                                        candidate_token_id=cand, prompt_ids=tuple(prompt),
                                        shared_prefix=tuple(d.shared_prefix or ())))
                continue
            skipped.append({"dataset": name, "index": d.index, "reason": why})
    return items, skipped, notes


def classify(item: BisectItem, probe: Mapping[str, Any] | None) -> tuple[str, bool | None, int | None]:
    """(outcome, moved, token): whose token a probe gave at the item's divergence."""
    if not probe or probe.get("error"):
        return "error", None, None
    token = probe.get("token_id")
    if token is None and probe.get("top20"):
        token = probe["top20"][0][0]
    if token is None:
        return "error", None, None
    if token == item.candidate_token_id:
        return "candidate", True, token
    if token == item.control_token_id:
        return "control", False, token
    return "other", False, token


# ----------------------------------------------------------------- probing

class Prober:
    """Answers subsets: from the kept probes, or by one fresh server start probing every item."""

    def __init__(self, *, server: Mapping[str, Any], change: changes.Change, items: Sequence[BisectItem],
                 journal_dir: str | os.PathLike, server_log_dir: str | os.PathLike, starts_log: str | None):
        self.server, self.change, self.items = server, change, list(items)
        self.dir = Path(journal_dir) / "bisect"
        self.server_log_dir, self.starts_log = Path(server_log_dir), starts_log
        self.results: dict[frozenset[str], SubsetResult] = {}
        self.order = {s: i for i, s in enumerate(change.names)}

    def ordered(self, on) -> tuple[str, ...]:
        return tuple(sorted(on, key=self.order.__getitem__))

    def spec(self, on) -> ArmSpec:
        return armspec.resolve_spec(BISECT_ARM, changes.arm_config(self.server, self.change, on))

    def key(self, on) -> str:
        # what the probes depend on: the server as started (its identity: command, env, model),
        # which switches are on, and what is forced
        return sha256_json({"identity": self.spec(on).identity(), "on": list(self.ordered(on)),
                            "items": [it.identity() for it in self.items]})

    def get(self, on: frozenset[str]) -> SubsetResult:
        if on not in self.results:
            self.results[on] = self._kept(on) or self._start(on)
        return self.results[on]

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def _kept(self, on) -> SubsetResult | None:
        key = self.key(on)
        path = self._path(key)
        if not path.is_file():
            return None
        doc = artifacts.check_schema(artifacts.read_json(path), BISECT_PROBES_SCHEMA, path)
        if doc.get("key") != key or set(doc.get("probes") or {}) != {it.key for it in self.items}:
            return None  # not this subset's evidence: probe again (the new file replaces it)
        return SubsetResult(on=self.ordered(on), key=key, source="kept", probes=doc["probes"],
                            server=doc.get("server"))

    def _start(self, on) -> SubsetResult:
        spec = self.spec(on)
        key = self.key(on)
        on_t = self.ordered(on)
        receipt = {"spec_sha256": spec.spec_sha256}
        ps = PhaseServer(spec, phase=PHASE, log_path=str(self.server_log_dir / f"bisect-{key[:16]}.log"),
                         receipt=receipt, starts_log=self.starts_log,
                         why="a bisection subset of the change's switches: a server of its own by design")
        probes: dict[str, ProbeResult] = {}
        log.info("bisect: starting a server with %s on", ", ".join(on_t) or "no switch")
        try:
            srv = ps.get()
            for it in self.items:
                lifecycle.check_stop()
                probes[it.key] = greedy.run_probe(srv.endpoint, spec.served_model_name, list(it.prompt_ids),
                                                  list(it.shared_prefix))
                srv.assert_alive()
            ps.verify()
        except ServerError as exc:
            # evidence, not a traceback: the items that needed this subset are undecided
            log.error("bisect: the server with %s on failed: %s", ", ".join(on_t) or "no switch", exc)
            return SubsetResult(on=on_t, key=key, source="failed", probes=probes, error=str(exc),
                                server=_server_facts(ps))
        finally:
            ps.close()
        server = _server_facts(ps)
        if not any(p.get("error") for p in probes.values()):  # a failed probe is asked again on a rerun
            artifacts.write_json(self._path(key), {
                "schema": BISECT_PROBES_SCHEMA, "key": key, "on": list(on_t), "spec": spec.to_json(), "probes": probes,
                "items": [it.identity() for it in self.items], "server": server,
                "provenance": artifacts.provenance([], {"on": list(on_t)})})
        return SubsetResult(on=on_t, key=key, source="started", probes=probes, server=server)

    def moves(self, item: BisectItem):
        """The search's oracle for one item."""
        def oracle(on: frozenset[str]) -> bool | None:
            res = self.get(on)
            return classify(item, res.probes.get(item.key) if res.error is None else None)[1]
        return oracle


def _server_facts(ps: PhaseServer) -> dict | None:
    if ps.server is None:
        return None
    f = ps.server.facts()
    return {k: f.get(k) for k in ("url", "pid", "started_at", "ready_s", "stop")}


# ------------------------------------------------------------------ text

def _items_text(keys: Sequence[str]) -> str:
    by_ds: dict[str, list[str]] = {}
    for k in keys:
        ds, idx = k.split(":", 1)
        by_ds.setdefault(ds, []).append(idx)
    parts = [f"{', '.join(ix)} ({ds})" for ds, ix in by_ds.items()]
    return ("item " if len(keys) == 1 else "items ") + " and ".join(parts)


def summary_lines(switches: Sequence[str], items: Sequence[BisectItemResult]) -> list[str]:
    """One sentence per responsible set, per switch that moves nothing, per kind of item left unexplained."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for it in items:
        if it["status"] == "found":
            groups.setdefault(tuple(it["responsible"] or ()), []).append(f"{it['dataset']}:{it['index']}")
    lines = []
    for sws, keys in groups.items():
        if len(sws) == 1:
            lines.append(f"{sws[0]} alone moves {_items_text(keys)} at their first divergence")
        else:
            lines.append(f"{' + '.join(sws)} move {_items_text(keys)} at their first divergence only together "
                         "(no smaller set of switches does)")
    used = {s for sws in groups for s in sws}
    lines += [f"{s} moves none" for s in switches if s not in used]
    for status, what in (("not_reproduced", "every switch on does not give the candidate's token at the "
                                            "divergence: not reproduced by one teacher-forced step"),
                         ("moves_without_switches", "the server with every switch at rollback already gives "
                                                    "the candidate's token: not the change's doing"),
                         ("undecided", "a probe failed: undecided")):
        keys = [f"{it['dataset']}:{it['index']}" for it in items if it["status"] == status]
        if keys:
            lines.append(f"{_items_text(keys)}: {what}")
    return lines


def _code(v: Any) -> str:
    return f"`{v}`"


def report_markdown(doc: Mapping[str, Any]) -> str:
    """bisect/report.md: the section a promotion report carries when bisection ran."""
    ch = doc.get("change") or {}
    title = f"## Switch bisection{': ' + _code(ch['name']) if ch.get('name') else ''}"
    out = [title, ""]
    if doc["status"] != "done":
        out += [doc["message"], ""]
        return "\n".join(out)
    st = doc["starts"]
    out += [doc["message"], "", *[f"- {line}." for line in doc["summary"]], "",
            f"Server starts: {st['started']} started, {st['kept']} answered from kept probes, {st['failed']} failed; "
            f"{st['asked']} subsets asked, bound {st['bound']} (the 2 confirmations, plus 2 k ceil(log2 n) per "
            f"item with k responsible switches of n = {doc['n']}).", "",
            "| item | divergence at | control token | candidate token | responsible | asked / bound |",
            "|---|---|---|---|---|---|"]
    for it in doc["items"]:
        resp = " + ".join(_code(s) for s in it["responsible"]) if it["responsible"] else it["status"]
        out.append(f"| {it['dataset']} {it['index']} | {it['first_divergence']} | {it['control_token_id']} | "
                   f"{it['candidate_token_id']} | {resp} | {it['asked']} / {it['bound']} |")
    out += ["", "Each subset's token at the divergence (C = the candidate's, c = the control's, ? = another "
                "token, ! = a failed probe):", "",
            "| switches on | " + " | ".join(f"{it['dataset']} {it['index']}" for it in doc["items"]) + " |",
            "|---|" + "---|" * len(doc["items"])]
    mark = {"candidate": "C", "control": "c", "other": "?", "error": "!"}
    for sub in doc["subsets"]:
        cells = []
        for it in doc["items"]:
            pr = next((p for p in it["probes"] if p["on"] == sub["on"]), None)
            cells.append("" if pr is None else f"{mark[pr['outcome']]} {pr['token_id']}")
        label = ", ".join(_code(s) for s in sub["on"]) or "none (control)"
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    if doc.get("skipped"):
        out += ["", "Not bisected: " + "; ".join(f"{s['dataset']} {s['index']} ({s['reason']})"
                                                for s in doc["skipped"])]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ stage

def _write(out_result: str | os.PathLike, out_report: str | os.PathLike, doc: dict) -> dict:
    artifacts.write_json(out_result, doc)
    with artifacts.atomic_file(Path(out_report)) as fh:
        fh.write(report_markdown(doc))
    return doc


def bisect_stage(*, divergence_paths: Mapping[str, str], greedy_paths: Mapping[str, str],
                 arms: Mapping[str, Mapping[str, Any]], server: Mapping[str, Any] | None,
                 change: Mapping[str, Any] | None, journal_dir: str, server_log_dir: str,
                 starts_log: str | None, out_result: str, out_report: str) -> dict:
    """Bisect the change's switches over the audit's divergent greedy items; write result.json and report.md."""
    consumed = [*divergence_paths.values(), *greedy_paths.values()]
    base: dict[str, Any] = {"schema": BISECT_SCHEMA, "change": None, "switches": [], "n": 0, "items": [], "skipped": [],
            "subsets": [], "starts": {"started": 0, "kept": 0, "failed": 0, "asked": 0, "bound": 0}, "summary": [],
            "provenance": artifacts.provenance(consumed, {"server": server, "change": change})}
    attach = [a for a, cfg in arms.items() if (cfg or {}).get("mode", "launch") != "launch"]
    if attach:
        return _write(out_result, out_report, {**base, "status": "needs_launch_mode", "message": (
            f"Bisection needs launch mode: arms {', '.join(attach)} attach to running servers, whose switches "
            "pairaudit cannot set; nothing was started.")})
    chg = changes.from_config({"server": server, "change": change}) if change is not None else None
    if chg is None or server is None:
        return _write(out_result, out_report, {**base, "status": "no_switches", "message": (
            "No switches to bisect: this config states two arms (arms:), not a server and a change; nothing was "
            "started. Write it as server + change (docs/configuration.md) to bisect its switches.")})
    base.update(change=chg.to_json(), switches=chg.names, n=len(chg.names))
    items, skipped, notes = divergent_items(divergence_paths, greedy_paths)
    base["skipped"] = skipped
    if not items:
        why = "; ".join(notes) if notes else "no greedy item diverged between the arms"
        return _write(out_result, out_report, {**base, "status": "no_divergence", "message": (
            f"Nothing to bisect: {why}; nothing was started.")})

    prober = Prober(server=server, change=chg, items=items, journal_dir=journal_dir,
                    server_log_dir=server_log_dir, starts_log=starts_log)
    results: list[BisectItemResult] = []
    for it in items:
        res = search.find_responsible(chg.names, prober.moves(it))
        probes: list[BisectProbe] = []
        for q in res.queries:
            sub = prober.results[frozenset(q.on)]
            p = sub.probes.get(it.key) if sub.error is None else None
            outcome, moved, token = classify(it, p)
            probes.append(BisectProbe(on=list(q.on), token_id=token, outcome=outcome, moved=moved,
                                      top20=(p or {}).get("top20"),
                                      error=sub.error if sub.error else (p or {}).get("error")))
        results.append(BisectItemResult(
            dataset=it.dataset, index=it.index, first_divergence=it.first_divergence,
            control_token_id=it.control_token_id, candidate_token_id=it.candidate_token_id, status=res.status,
            responsible=list(res.responsible) if res.responsible else None, asked=res.asked, bound=res.bound,
            probes=probes))
    subsets = list(prober.results.values())
    count = {s: sum(1 for r in subsets if r.source == s) for s in ("started", "kept", "failed")}
    starts = {**count, "asked": len(subsets), "bound": 2 + sum(r["bound"] - 2 for r in results)}
    summary = summary_lines(chg.names, results)
    found = sum(1 for r in results if r["status"] == "found")
    message = (f"Change {chg.name!r}: {len(chg.names)} switch(es) bisected over {len(items)} divergent greedy "
               f"item(s); responsible switches found for {found}. {len(subsets)} subset(s) asked, "
               f"{count['started']} server start(s) now ({count['kept']} answered from kept probes).")
    doc = {**base, "status": "done", "message": message, "items": results,
           "subsets": [r.summary() for r in subsets], "starts": starts, "summary": summary}
    return _write(out_result, out_report, doc)
