"""First divergences between the arms' greedy runs, and each arm's forced-prefix top-20 probes (diagnostics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence, cast

from pairaudit import gates
from pairaudit.answers.sampled import Journal
from pairaudit.core import artifacts, lifecycle
from pairaudit.core.contracts import ARMS, DIVERGENCE_SCHEMA, DivergenceRecord, GreedyRecord, ProbeResult
from pairaudit.core.jsonlog import read_log
from pairaudit.diagnostics import greedy
from pairaudit.serving.phase import PhaseServer


def _prefix_key(prompt_ids: list[int], prefix: list[int]) -> str:
    return artifacts.sha256_json({"prompt": prompt_ids, "prefix": prefix})


def probe_arm(ps: PhaseServer, divergences: Sequence[DivergenceRecord], prompt_ids: Mapping[Any, list[int]],
              journal: Path) -> list[ProbeResult]:
    """Top-20 probes of one arm at every divergence, journaled: a rerun probes only what is missing."""
    done: dict[tuple, ProbeResult] = {}

    def read() -> None:
        for r in cast(list[ProbeResult], read_log(journal)):  # the journal holds what this function wrote
            status = r.get("status")
            if status is not None and status < 500:
                done.setdefault((r["index"], r.get("prefix_key")), r)

    read()
    out: list[ProbeResult] = []
    want = [(d, _prefix_key(prompt_ids[d["index"]], d["shared_prefix"] or [])) for d in divergences]
    if any((d["index"], k) not in done for d, k in want):
        srv = ps.get()
        model = ps.spec.served_model_name
        # shared by a sweep's candidates, as the greedy journal is: wait for another writer, then read again
        with Journal(journal, owner=f"probes {ps.spec.arm}", wait=True) as jl:
            read()
            for d, k in want:
                if (d["index"], k) in done:
                    continue
                lifecycle.check_stop()
                res = greedy.run_probe(srv.endpoint, model, prompt_ids[d["index"]], d["shared_prefix"] or [])
                rec: ProbeResult = {"index": d["index"], "first_divergence": d["first_divergence"] or 0,
                                    "prefix_key": k, **res}
                jl.append(rec)
                done[(d["index"], k)] = rec
                srv.assert_alive()
    for d, k in want:
        kept = done[(d["index"], k)].copy()
        kept.pop("prefix_key", None)
        out.append(kept)
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
        "grid_tie": gates.default_rule("grid_tie").apply(grid_inputs, {"max_divergent": max_divergent},
                                                         selected=counts["selected"], compared=counts["compared"]),
        "determinism": gates.default_rule("determinism").apply(
            {arm: headers[arm]["determinism"]["hashes"] for arm in ARMS}),
        "provenance": artifacts.provenance(consumed, {"max_divergent": max_divergent}),
    }


def find_divergences(records: Mapping[str, Sequence[GreedyRecord]]) \
        -> tuple[list, list[DivergenceRecord], dict[Any, list[int]], list[DivergenceRecord]]:
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
