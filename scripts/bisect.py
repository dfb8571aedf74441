"""Snakemake entry for rule bisect: which of the change's switches move the greedy divergences (pairaudit.bisect.stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.bisect.stage import bisect_stage  # noqa: E402
from pairaudit.core.jobs import run_job  # noqa: E402

inp, out, params = snakemake.input, snakemake.output, snakemake.params  # noqa: F821
names = params.datasets
run_job(snakemake.log[0], bisect_stage, divergence_paths=dict(zip(names, inp.divergence)),  # noqa: F821
        greedy_paths=dict(zip(names, inp.greedy)), arms=params.arms, server=params.server, change=params.change,
        journal_dir=params.journal_dir, server_log_dir=params.server_log_dir, starts_log=params.starts_log,
        out_result=out.result, out_report=out.report)
