"""Snakemake entry for rule dataset: one dataset's selected items, prompted (pairaudit.datasets.stage.dataset_stage)."""

import sys
from pathlib import Path

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import DatasetSettings  # noqa: E402
from pairaudit.datasets.stage import dataset_stage  # noqa: E402

# The project is this script's parent: local dataset paths are relative to it and downloads are cached
# under its .cache/. Not params: Snakemake reruns a job whose params change, so an absolute path there
# would rerun every dataset (and everything after) when the project moves.
base = Path(snakemake.scriptdir).parent  # noqa: F821
run_job(snakemake.log[0], dataset_stage, dataset=DatasetSettings.from_json(snakemake.params.dataset),  # noqa: F821
        out_path=snakemake.output[0], cache_dir=str(base / ".cache"), base_dir=str(base))  # noqa: F821
