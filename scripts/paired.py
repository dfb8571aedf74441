"""Snakemake entry for rule paired: the paired table and the quality rule of one dataset (pairaudit.quality.stage.paired_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import QualitySettings  # noqa: E402
from pairaudit.quality.stage import paired_stage  # noqa: E402

inp = snakemake.input  # noqa: F821
run_job(snakemake.log[0], paired_stage, dataset_path=inp.dataset,  # noqa: F821
        sampled_paths={"control": inp.sampled_control, "candidate": inp.sampled_candidate},
        score_paths={"control": inp.scores_control, "candidate": inp.scores_candidate},
        out_path=snakemake.output[0], quality=QualitySettings.from_json(snakemake.params.quality),  # noqa: F821
        datasets=snakemake.params.datasets)  # noqa: F821
