"""Snakemake entry for rule diagnostics: greedy divergences, grid-tie and determinism of both arms from their answers phases, no server (pairaudit.diagnostics.stage.diagnostics_phase)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import GreedySettings  # noqa: E402
from pairaudit.diagnostics.stage import diagnostics_phase  # noqa: E402

inp, out, params, log = snakemake.input, snakemake.output, snakemake.params, snakemake.log  # noqa: F821
names = params.datasets
run_job(log[0], diagnostics_phase, dataset_paths=dict(zip(names, inp.datasets)),
        paired_paths=dict(zip(names, inp.paired)),
        receipt_paths={"control": inp.receipt_control, "candidate": inp.receipt_candidate},
        preflight_paths={"control": inp.preflight_control, "candidate": inp.preflight_candidate},
        answers_paths={"control": inp.answers_control, "candidate": inp.answers_candidate},
        greedy=GreedySettings.from_json(params.greedy), chat_template_kwargs=params.chat_template_kwargs,
        journal_dir=params.journal_dir, greedy_paths=params.greedy_paths, divergence_paths=params.divergence_paths,
        phase_path=out.phase, max_divergent=params.max_divergent)
