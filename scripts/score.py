"""Snakemake entry for rule score: score one dataset on one arm (pairaudit.quality.stage.score_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import SandboxSettings  # noqa: E402
from pairaudit.quality.stage import score_stage  # noqa: E402

run_job(snakemake.log[0], score_stage, dataset_path=snakemake.input.dataset,  # noqa: F821
        sampled_path=snakemake.input.sampled, out_path=snakemake.output[0],  # noqa: F821
        sandbox_limits=SandboxSettings.from_json(snakemake.params.sandbox),  # noqa: F821
        workers=snakemake.threads)  # noqa: F821
