"""Snakemake entry for rule arm_spec: the arm's resolved server spec and identity hash (pairaudit.plans.stage.arm_spec_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.plans.stage import arm_spec_stage  # noqa: E402

run_job(snakemake.log[0], arm_spec_stage, arm=snakemake.wildcards.arm, arm_cfg=snakemake.params.arm,  # noqa: F821
        out_path=snakemake.output[0])  # noqa: F821
