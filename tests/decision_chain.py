"""A decision with its whole chain on disk, for the ``pairaudit verdict`` tests (no server, no workflow).

Every stage artifact the promotion reads is written with the evidence its gate is recomputed from
(``pairaudit.promotion.verify``): the paired tables, the divergence records with their grid-tie
inputs and determinism repeats, the boundary cases side by side, and a measured speed bracket
decided by the stage's own ``speed.decision.decide``; then the real promotion stage decides, so
the decision records what it consumed.
"""

from __future__ import annotations

from pathlib import Path

from test_report import launches, paired_doc, passing_pair, preflights

from pairaudit.core.artifacts import read_json, write_json
from pairaudit.gates import boundary_v1, determinism_v1, grid_tie_v1
from pairaudit.promotion import stage as promotion
from pairaudit.speed import bracket as speed_bracket
from pairaudit.speed import clock as speed_clock
from pairaudit.speed import decision as speed_decision

CELL = "short-c1"
STARTS = ("s1", "s2", "s3")
QUIET = {"governor": "performance", "scaling_max_freq_khz": 3000000, "cpu_mhz": 2990.0, "loadavg": [0.1, 0.1, 0.1],
         "gpu": None}


def _pooled(rate: float) -> dict:
    return {"pooled_rate_tps": rate, "accepted_per_round": 0.0, "decode_tps": rate, "ms_per_round": 1000.0 / rate,
            "ttft_s": 0.1, "streams": 1, "errors": []}


def speed_doc(control=(100.0, 101.0, 100.0), candidate=(110.0, 111.5, 110.2), *, rule: str = "win2-v1") -> dict:
    """A measured OFF/ON/OFF bracket of one deciding cell, its gate decided by the stage's own function.

    win2-v1 (selectable, a deviation) decides one bracket by its repeats, so a clear gain is a WIN here;
    the registered default needs more starts than three to decide.
    """
    cfg = speed_bracket.resolve_config({"cells": [{"name": CELL, "prompt": "short", "decide": True}],
                                        "repeats": 3, "rule": rule})
    after = control
    results = {st: {CELL: {"pooled": [_pooled(x) for x in reps]}}
               for st, reps in zip(STARTS, (control, candidate, after))}
    facts = [dict(QUIET) for _ in STARTS]
    clock = speed_clock.clock_check(facts, after=facts)
    spread = {CELL: {"metric": cfg["primary"], "win_pct": cfg["win_pct"], "window_pct": [0.0, 0.0, 0.0],
                     "window_max_pct": 0.0, "archive_pct": None, "archive_n": 0, "archive_cv_pct": None,
                     "archive_with_window_pct": None, "archive_with_window_n": 0, "config_hash": "c" * 64}}
    win2, series, gate = speed_decision.decide(results, cfg, clock, {CELL: None}, starts=list(STARTS))
    return {"schema": "pairaudit.speed_decision/v1", "audit": "test", "gate": gate, "win2": win2,
            "bar": {"win_pct": cfg["win_pct"], "primary": cfg["primary"], "guards": cfg["guards"],
                    "reported": cfg["reported"], "lower_is_better": []},
            "starts": [{"start": st, "role": role, "arm": arm}
                       for st, role, arm in zip(STARTS, ("control_before", "candidate", "control_after"),
                                                ("control", "candidate", "control"))],
            "hosts": ["node1"], "clock_check": clock, "cells": [{"name": CELL, "prompt": "short"}],
            "pooled": {CELL: {st: results[st][CELL]["pooled"] for st in STARTS}}, "evidence": None,
            "series": series, "spread": spread, "params": cfg}


def boundary_doc(correct: bool = True) -> dict:
    cases = [{"case": case, "expected": "173", "identical_text": True, "planted": None,
              **{arm: {"text": "173" if correct or arm == "control" else "17", "correct": correct or arm == "control",
                       "finish_reason": "stop", "config_error": None} for arm in ("control", "candidate")}}
             for case in ("retrieval-0.5", "tail-16", "tail-32")]
    rule_cases = [{"arm": arm, "case": c["case"], "correct": c[arm]["correct"], "finish_reason": "stop",
                   "expected": "173", "text": c[arm]["text"], "config_error": None}
                  for arm in ("control", "candidate") for c in cases]
    return {"schema": "pairaudit.boundary_gate/v1", "gate": boundary_v1(rule_cases), "cases": cases}


def divergence_doc(dataset: str) -> dict:
    """Greedy compared two items of the dataset; none diverged; each arm repeated alike."""
    return {"schema": "pairaudit.divergence/v1", "dataset": dataset, "items": [3, 7],
            "divergences": [{"index": 3, "diverged": False}, {"index": 7, "diverged": False}],
            "grid_tie_inputs": [], "counts": {"selected": 2, "compared": 2},
            "grid_tie": grid_tie_v1([], selected=2, compared=2),
            "determinism": determinism_v1({"control": ["a", "a", "a"], "candidate": ["b", "b", "b"]})}


def write_chain(root: Path, pair: dict | None = None, *, later: bool = True, speed: dict | None = None) -> dict:
    """Every input of the promotion stage under ``root`` (results/<audit>), then the promotion itself; returns
    the decision. ``later``: the divergence, boundary and speed stages' artifacts too (else not evaluated)."""
    pair = passing_pair() if pair is None else pair
    paths: dict[str, list[str]] = {"paired": [], "launch": [], "preflight": []}
    for ds, doc in pair.items():
        p = root / "paired" / f"{ds}.json"
        write_json(p, doc)
        paths["paired"].append(str(p))
    for kind, docs in (("launch", launches()), ("preflight", preflights())):
        for arm, doc in docs.items():
            p = root / kind / f"{arm}.json"
            write_json(p, doc)
            paths[kind].append(str(p))
    stages: dict = {}
    if later:
        div = []
        for ds in pair:
            p = root / "divergence" / f"{ds}.json"
            write_json(p, divergence_doc(ds))
            div.append(str(p))
        bp, sp = root / "boundary" / "gate.json", root / "speed" / "decision.json"
        write_json(bp, boundary_doc())
        write_json(sp, speed if speed is not None else speed_doc())
        stages = {"divergence": div, "boundary": str(bp), "speed": str(sp)}
    out = root / "promotion"
    promotion.promotion_stage(paths["paired"], paths["launch"], paths["preflight"], out / "decision.json",
                              out / "report.md", out / "manifest.json", out / "paired.png", later=stages)
    return read_json(out / "decision.json")


__all__ = ["boundary_doc", "divergence_doc", "paired_doc", "speed_doc", "write_chain"]
