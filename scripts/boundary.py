"""Snakemake entry for rule boundary: retrieval and capacity-tail cases on one arm (pairaudit.boundary)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.boundary import boundary_stage  # noqa: E402
from pairaudit.jobs import run_job  # noqa: E402

inp, params, log = snakemake.input, snakemake.params, snakemake.log  # noqa: F821
run_job(log[0], boundary_stage, arm=snakemake.wildcards.arm, arm_cfg=params.arm,  # noqa: F821
        launch_path=inp.receipt, out_path=snakemake.output[0], server_log=log.server,  # noqa: F821
        cfg=params.boundary, salt_prefix=params.audit)
