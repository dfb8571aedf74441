"""Snakemake entry for rule sampled: one dataset's answers on one arm, assembled from the journal (pairaudit.sampled)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.sampled import assemble  # noqa: E402

inp, params = snakemake.input, snakemake.params  # noqa: F821
run_job(snakemake.log[0], assemble, dataset_path=inp.dataset, journal_path=params.journal,  # noqa: F821
        out_path=snakemake.output[0], arm=snakemake.wildcards.arm, receipt_path=inp.receipt,  # noqa: F821
        preflight_path=inp.preflight, sampling=params.sampling, audit=params.audit, phase_path=inp.phase)
