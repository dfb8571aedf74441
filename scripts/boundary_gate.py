"""Snakemake entry for rule boundary_gate: boundary-v1 over both arms, cases side by side (pairaudit.boundary.stage.boundary_gate_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.boundary.stage import boundary_gate_stage  # noqa: E402
from pairaudit.core.jobs import run_job  # noqa: E402

inp, log = snakemake.input, snakemake.log  # noqa: F821
run_job(log[0], boundary_gate_stage, arm_paths={"control": inp.control, "candidate": inp.candidate},
        launch_paths={"control": inp.launch_control, "candidate": inp.launch_candidate},
        spec_paths={"control": inp.spec_control, "candidate": inp.spec_candidate},
        out_path=snakemake.output[0])  # noqa: F821
