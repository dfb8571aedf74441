"""The workflow's stage entry points: read inputs, call the library, write one artifact.

Each function here is what one ``scripts/<stage>.py`` of a stage without a
server calls; it can be run and tested without Snakemake.  The stages that
talk to servers are phases (:mod:`pairaudit.serving.phase`).  Artifact schemas:
launch receipt (:mod:`pairaudit.serving.launch`), preflight (:mod:`pairaudit.serving.preflight`),
dataset (:mod:`pairaudit.datasets.formats`), sampled (:mod:`pairaudit.answers.sampled`), and
(greedy and divergence are written by ``pairaudit.diagnostics.stage``)::

    scores  results/<audit>/scores/<dataset>/<arm>.jsonl   header {"schema": "pairaudit.scores/v1",
            "dataset", "arm", "format", "n", "correct", "provenance"}; records as
            scoring.score_records returns them (index, correct, extracted, reason, finish_reason, answered, text, ...)
    paired  results/<audit>/paired/<dataset>.json  {"schema": "pairaudit.paired/v1", "dataset", "format",
            "table": stats.paired_table, "quality": gates.quality_v2 (or _v1), "bootstrap": stats.paired_bootstrap_ci,
            "provenance"}
    greedy  results/<audit>/greedy/<dataset>/<arm>.jsonl  header {"schema": "pairaudit.greedy/v1", "dataset",
            "arm", "selection": {mode, discordant, concordant, indices}, "max_tokens", "determinism": {"index",
            "hashes", "records"}, "provenance"}; records: greedy.greedy_one's record + prompt_ids, run, slot, key
    divergence  results/<audit>/divergence/<dataset>.json  {"schema": "pairaudit.divergence/v1", "dataset",
            "items", "divergences", "probes": {arm: [each arm's top-20 at each divergence, from its greedy run]},
            "top_lists", "grid_tie_inputs", "grid_tie": gates.grid_tie_v1,
            "determinism": gates.determinism_v1, "provenance"}
"""

from __future__ import annotations

from pathlib import Path

from pairaudit.core import artifacts
from pairaudit.core.settings import DatasetSettings, thaw
from pairaudit.datasets import formats as datasets


def dataset_stage(*, dataset: DatasetSettings, out_path: str, cache_dir: str, base_dir: str) -> dict:
    """The dataset document of one entry as the workflow resolved it at load (its selection included)."""
    doc = datasets.dataset_document(dataset, cache_dir=Path(cache_dir), base_dir=Path(base_dir))
    doc["provenance"] = artifacts.provenance([], {"config": thaw(dataset.entry)})
    artifacts.write_json(out_path, doc)
    return doc


