"""One dataset's greedy work on one arm (the diagnostics phase): which items, what the journal already holds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, cast

from pairaudit.answers.sampled import Journal, is_final
from pairaudit.core import artifacts, lifecycle
from pairaudit.core.contracts import GREEDY_SCHEMA, GreedyRecord
from pairaudit.core.jsonlog import read_log
from pairaudit.core.progress import Progress
from pairaudit.core.settings import GreedySettings
from pairaudit.diagnostics import greedy
from pairaudit.serving.launch import Server
from pairaudit.serving.phase import PhaseError


def greedy_selection(paired: dict, cfg: GreedySettings) -> dict:
    """Which items get greedy runs: every discordant item plus a few concordant ones as a control (or all)."""
    table = paired["table"]
    indices = list(table["indices"])
    discordant = sorted(table["control_only"] + table["candidate_only"])
    if cfg.items == "all":
        return {"mode": "all", "discordant": discordant, "concordant": [], "indices": sorted(indices)}
    rest = sorted(set(indices) - set(discordant))
    concordant = sorted(random.Random(cfg.seed).sample(rest, min(cfg.concordant, len(rest))))
    return {"mode": "discordant", "discordant": discordant, "concordant": concordant,
            "indices": sorted(discordant + concordant)}


class GreedyPlan:
    """One dataset's greedy work on one arm: the wanted runs, and which the journal already holds."""

    def __init__(self, dataset: dict, paired: dict, cfg: GreedySettings, chat_template_kwargs: dict, journal: Path):
        self.dataset, self.cfg, self.journal = dataset, cfg, journal
        self.selection = greedy_selection(paired, cfg)
        self.items = {it["index"]: it for it in dataset["items"]}
        self.det_index = self.selection["indices"][0] if self.selection["indices"] else dataset["items"][0]["index"]
        self.want = [("greedy", i) for i in self.selection["indices"]] + [
            ("determinism", r) for r in range(cfg.determinism_repeats)]
        self.key = {"max_tokens": cfg.max_tokens, "determinism_index": self.det_index,
                    "chat_template_kwargs": chat_template_kwargs}
        self.chat_template_kwargs = chat_template_kwargs
        self.done: dict[tuple[str, Any], GreedyRecord] = {}
        self._read()

    def _read(self) -> None:
        for rec in cast(list[GreedyRecord], read_log(self.journal)):  # the journal holds what run() wrote
            if rec.get("key") == self.key and is_final(rec):
                self.done.setdefault((rec["run"], rec["slot"]), rec)

    @property
    def todo(self) -> list:
        return [w for w in self.want if w not in self.done]

    def run(self, srv: Server, arm: str) -> None:
        if not self.todo:
            return
        model = srv.spec.served_model_name
        prompts: dict = {}
        # A sweep's candidates share the control's journal: another candidate's job may be writing it. Wait
        # for it, then read what it wrote, so that no run is asked twice.
        with Journal(self.journal, owner=f"greedy {arm}", wait=True) as journal:
            self._read()
            todo = self.todo
            progress = Progress(len(self.want), f"greedy {self.dataset['name']}/{arm}",
                                done=len(self.want) - len(todo))
            for kind, slot in todo:
                lifecycle.check_stop()
                index = slot if kind == "greedy" else self.det_index
                if index not in prompts:
                    prompts[index] = greedy.prompt_ids(srv.endpoint, model, self.items[index]["messages"],
                                                       self.chat_template_kwargs)
                rec = greedy.greedy_one(srv.endpoint, model, prompts[index], max_tokens=self.cfg.max_tokens,
                                        index=index)
                rec.update({"run": kind, "slot": slot, "key": self.key, "prompt_ids": prompts[index]})
                journal.append(rec)
                if is_final(rec):
                    self.done.setdefault((kind, slot), rec)
                srv.assert_alive()
                progress.step()

    def header_and_records(self, arm: str, consumed: list[str]) -> tuple[dict, list[GreedyRecord]]:
        missing = [w for w in self.want if w not in self.done]
        if missing:
            raise PhaseError(f"{self.dataset['name']}/{arm}: greedy runs without an answer: {missing}; "
                             "rerun to resume")
        records = [self.done[w] for w in self.want if w[0] == "greedy"]
        repeats = [self.done[w] for w in self.want if w[0] == "determinism"]
        # A refused repeat gets a pseudo-hash of its own (its slot in it): two
        # repeats refused alike are two failures, never two outputs that matched.
        hashes = [r["output_sha256"] or f"error:{slot}:{r['error']}" for slot, r in enumerate(repeats)]
        header = {
            "schema": GREEDY_SCHEMA, "dataset": self.dataset["name"], "arm": arm,
            "selection": self.selection, "max_tokens": self.cfg.max_tokens,
            "determinism": {"index": self.det_index,
                            "hashes": hashes,
                            "records": repeats},
            "provenance": artifacts.provenance(consumed, {"greedy": self.cfg.to_json(), "journal": str(self.journal)}),
        }
        return header, records
