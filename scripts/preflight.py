"""Snakemake entry for rule preflight: the API rehearsal of one arm (pairaudit.stages.preflight_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.stages import preflight_stage  # noqa: E402

run_job(snakemake.log[0], preflight_stage, arm=snakemake.wildcards.arm, arm_cfg=snakemake.params.arm,  # noqa: F821
        launch_path=snakemake.input.receipt, out_path=snakemake.output[0],  # noqa: F821
        server_log=snakemake.log.server, sampling=snakemake.params.sampling)  # noqa: F821
