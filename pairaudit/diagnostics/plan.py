"""Which items the diagnostics compare, and each arm's greedy runs of them from its answers phase's journal."""

from __future__ import annotations

import random
from pathlib import Path

from pairaudit.answers.greedy import GreedyError, GreedyPlan
from pairaudit.core import artifacts
from pairaudit.core.contracts import GREEDY_SCHEMA, GreedyRecord
from pairaudit.core.settings import GreedySettings


def greedy_selection(paired: dict, cfg: GreedySettings) -> dict:
    """Which items get compared: every discordant item plus a few concordant ones as a control (or all)."""
    table = paired["table"]
    indices = list(table["indices"])
    discordant = sorted(table["control_only"] + table["candidate_only"])
    if cfg.items == "all":
        return {"mode": "all", "discordant": discordant, "concordant": [], "indices": sorted(indices)}
    rest = sorted(set(indices) - set(discordant))
    concordant = sorted(random.Random(cfg.seed).sample(rest, min(cfg.concordant, len(rest))))
    return {"mode": "discordant", "discordant": discordant, "concordant": concordant,
            "indices": sorted(discordant + concordant)}


def answered_plan(dataset: dict, cfg: GreedySettings, chat_template_kwargs: dict, journal: Path) -> GreedyPlan:
    """The arm's greedy plan exactly as its answers phase made it (every item, the same repeats), read back."""
    return GreedyPlan(dataset["name"], {it["index"]: it["messages"] for it in dataset["items"]},
                      max_tokens=cfg.max_tokens, determinism_repeats=cfg.determinism_repeats,
                      chat_template_kwargs=chat_template_kwargs, journal=journal)


def greedy_artifact(plan: GreedyPlan, selection: dict, *, arm: str, cfg: GreedySettings, consumed: list[str],
                    answers: dict | None = None) -> tuple[dict, list[GreedyRecord]]:
    """(header, records) of ``greedy/<dataset>/<arm>.jsonl``: the selected items' greedy runs and the repeats.

    Raises ``ArtifactError`` when the arm's answers phase left a run without
    an answer (its journal lacks it): that phase is what asks it again.
    """
    try:
        runs, determinism = plan.records()
    except GreedyError as exc:
        raise artifacts.ArtifactError(f"{arm}: {exc}") from None
    by_index = {r["index"]: r for r in runs}
    missing = [i for i in selection["indices"] if i not in by_index]
    if missing:
        raise artifacts.ArtifactError(f"{plan.name}/{arm}: selected items {missing[:20]} are not items of the "
                                      "dataset the answers phase ran")
    header = {
        "schema": GREEDY_SCHEMA, "dataset": plan.name, "arm": arm,
        "selection": selection, "max_tokens": cfg.max_tokens,
        "determinism": determinism,
        # the runs were made on the arm's answers-phase server; this job started none
        "run_in": {"phase": "answers", "server": (answers or {}).get("server"), "journal": str(plan.journal)},
        "provenance": artifacts.provenance(consumed, {"greedy": cfg.to_json(), "journal": str(plan.journal)}),
    }
    return header, [by_index[i] for i in selection["indices"]]
