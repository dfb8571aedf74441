"""Snakemake entry for rule greedy: greedy runs and determinism repeats of one arm (pairaudit.stages)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.stages import greedy_stage  # noqa: E402

inp, params = snakemake.input, snakemake.params  # noqa: F821
run_job(snakemake.log[0], greedy_stage, dataset_path=inp.dataset, paired_path=inp.paired,  # noqa: F821
        launch_path=inp.receipt, preflight_path=inp.preflight, out_path=snakemake.output[0],  # noqa: F821
        journal_path=params.journal, arm=snakemake.wildcards.arm, arm_cfg=params.arm,  # noqa: F821
        greedy_cfg=params.greedy, chat_template_kwargs=params.chat_template_kwargs,
        server_log=snakemake.log.server)  # noqa: F821
