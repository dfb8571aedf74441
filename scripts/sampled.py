"""Snakemake entry for rule sampled: one dataset's answers on one arm, assembled from the journal (pairaudit.answers.stage.assemble)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.answers.stage import assemble  # noqa: E402
from pairaudit.core.jobs import run_job  # noqa: E402

inp = snakemake.input  # noqa: F821
run_job(snakemake.log[0], assemble, dataset_path=inp.dataset, requests_path=inp.requests,  # noqa: F821
        journal_path=snakemake.params.journal, out_path=snakemake.output[0], receipt_path=inp.receipt,  # noqa: F821
        preflight_path=inp.preflight, phase_path=inp.phase)
