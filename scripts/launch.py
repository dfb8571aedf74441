"""Snakemake entry for rule launch: the arm's launch receipt (pairaudit.stages.launch_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the library, also inside a conda env  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.stages import launch_stage  # noqa: E402

run_job(snakemake.log[0], launch_stage, arm=snakemake.wildcards.arm, arm_cfg=snakemake.params.arm,  # noqa: F821
        out_path=snakemake.output[0], server_log=snakemake.log.server)  # noqa: F821
