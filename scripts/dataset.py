"""Snakemake entry for rule dataset: one dataset's selected items, prompted (pairaudit.datasets.stage.dataset_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import DatasetSettings  # noqa: E402
from pairaudit.datasets.stage import dataset_stage  # noqa: E402

params = snakemake.params  # noqa: F821
run_job(snakemake.log[0], dataset_stage, dataset=DatasetSettings.from_json(params.dataset),  # noqa: F821
        out_path=snakemake.output[0], cache_dir=params.cache_dir, base_dir=params.base_dir)  # noqa: F821
