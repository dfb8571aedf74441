"""First divergences between the arms' greedy runs and the divergence artifact (diagnostics; no server)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pairaudit import gates
from pairaudit.core import artifacts
from pairaudit.core.contracts import ARMS, DIVERGENCE_SCHEMA, DivergenceRecord, GreedyRecord
from pairaudit.diagnostics import greedy

TOP_LISTS = {
    "source": greedy.TOPS_SOURCE,
    "what": "each arm's own top-20 at the first divergence of its greedy run: both arms had generated the same "
            "tokens after the same prompt, so it is the arm's distribution on the shared prefix; the prefix "
            "length is the run's usage.prompt_tokens plus the position",
}


def divergence_doc(name: str, headers: Mapping[str, Mapping], records: Mapping[str, Mapping[Any, GreedyRecord]],
                   divergences: list, order: list, consumed: list[str], max_divergent: int) -> dict:
    """``divergence/<dataset>.json``: the divergences, each arm's top lists at them, grid-tie-v1 and determinism-v1.

    ``records``: arm -> that arm's greedy records by item index.
    """
    # an item whose divergence could not be established stays in the rule with no evidence, so it STOPs
    unresolved = [{"index": d["index"], "control_token_id": None, "candidate_token_id": None, "candidate_top": None,
                   "control_top": None, "control_prefix_len": None, "candidate_prefix_len": None}
                  for d in divergences if d["diverged"] is None]
    tops = {arm: greedy.greedy_tops(divergences, records.get(arm) or {}, arm) for arm in ARMS}
    grid_inputs = greedy.grid_tie_inputs(divergences, tops["control"], tops["candidate"]) + unresolved
    counts = greedy.comparison_counts(order, divergences)
    return {
        "schema": DIVERGENCE_SCHEMA, "dataset": name, "items": order, "divergences": divergences,
        # the evidence at each divergence, per arm (GreedyTop); top_lists says where it comes from
        "top_lists": TOP_LISTS, "probes": tops, "grid_tie_inputs": grid_inputs, "counts": counts,
        "grid_tie": gates.default_rule("grid_tie").apply(grid_inputs, {"max_divergent": max_divergent},
                                                         selected=counts["selected"], compared=counts["compared"]),
        "determinism": gates.default_rule("determinism").apply(
            {arm: headers[arm]["determinism"]["hashes"] for arm in ARMS}),
        "provenance": artifacts.provenance(consumed, {"max_divergent": max_divergent}),
    }


def find_divergences(records: Mapping[str, Sequence[GreedyRecord]]) \
        -> tuple[list, list[DivergenceRecord], dict[str, dict[Any, GreedyRecord]]]:
    """(item order, divergences, each arm's records by item index) of the selected items' greedy runs."""
    by_arm = {arm: {r["index"]: r for r in records[arm]} for arm in ARMS}
    if sorted(by_arm["control"]) != sorted(by_arm["candidate"]):
        raise artifacts.ArtifactError(f"greedy item sets differ between arms: {sorted(by_arm['control'])} vs "
                                      f"{sorted(by_arm['candidate'])}")
    order = sorted(by_arm["control"])
    divergences = greedy.divergence_records([by_arm["control"][i] for i in order],
                                            [by_arm["candidate"][i] for i in order])
    for d in divergences:
        a, b = by_arm["control"][d["index"]]["prompt_ids"], by_arm["candidate"][d["index"]]["prompt_ids"]
        d["prompt_ids_equal"] = a == b
        if a != b:  # two templates rendered differently: the flip may come from the prompt, not the change
            d["diverged"], d["error"] = None, "the arms tokenized the chat prompt differently"
    return order, divergences, by_arm
