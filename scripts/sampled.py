"""Snakemake entry for rule sampled: one dataset on one arm, resumable (pairaudit.sampled)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.stages import sampled_stage  # noqa: E402

run_job(snakemake.log[0], sampled_stage, dataset_path=snakemake.input.dataset,  # noqa: F821
        launch_path=snakemake.input.receipt, preflight_path=snakemake.input.preflight,  # noqa: F821
        out_path=snakemake.output[0], journal_path=snakemake.params.journal,  # noqa: F821
        arm=snakemake.wildcards.arm, arm_cfg=snakemake.params.arm, sampling=snakemake.params.sampling,  # noqa: F821
        audit=snakemake.params.audit, server_log=snakemake.log.server)  # noqa: F821
