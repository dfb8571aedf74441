"""Snakemake entry for rule dataset: load, select and prompt one dataset (pairaudit.datasets.stage.dataset_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.datasets.stage import dataset_stage  # noqa: E402

run_job(snakemake.log[0], dataset_stage, cfg=snakemake.params.cfg, where=snakemake.params.where,  # noqa: F821
        out_path=snakemake.output[0], cache_dir=snakemake.params.cache_dir,  # noqa: F821
        base_dir=snakemake.params.base_dir)  # noqa: F821
