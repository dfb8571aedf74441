"""Snakemake entry for rule boundary_plan: the settings both arms' boundary cases are built from (pairaudit.plans.stage.boundary_plan_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import BoundarySettings  # noqa: E402
from pairaudit.plans.stage import boundary_plan_stage  # noqa: E402

run_job(snakemake.log[0], boundary_plan_stage, boundary=BoundarySettings.from_json(snakemake.params.boundary),  # noqa: F821
        out_path=snakemake.output[0])  # noqa: F821
