"""Snakemake entry for rule divergence: first divergences, forced-prefix probes, grid-tie-v1 (pairaudit.stages)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.stages import divergence_stage  # noqa: E402

inp, params, log = snakemake.input, snakemake.params, snakemake.log  # noqa: F821
run_job(log[0], divergence_stage, dataset_path=inp.dataset,
        greedy_paths={"control": inp.greedy_control, "candidate": inp.greedy_candidate},
        launch_paths={"control": inp.launch_control, "candidate": inp.launch_candidate},
        arm_cfgs=params.arms, out_path=snakemake.output[0],  # noqa: F821
        server_logs={"control": log.server_control, "candidate": log.server_candidate},
        max_divergent=params.max_divergent)
