"""Snakemake entry for rule requests: every item's request body for one dataset on one arm (pairaudit.plans.stage.requests_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.plans.stage import requests_stage  # noqa: E402

inp, params = snakemake.input, snakemake.params  # noqa: F821
run_job(snakemake.log[0], requests_stage, dataset_path=inp.dataset, spec_path=inp.spec,  # noqa: F821
        sampling=params.sampling, audit=params.audit, out_path=snakemake.output[0])  # noqa: F821
