"""Snakemake entry for rule promotion in a sweep: every candidate's decision in one table (pairaudit.promotion.sweep.sweep_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.promotion.sweep import sweep_stage  # noqa: E402

inp, out, params = snakemake.input, snakemake.output, snakemake.params  # noqa: F821
run_job(snakemake.log[0], sweep_stage, audit=params.audit, candidates=list(params.candidates),  # noqa: F821
        decision_paths=list(inp.decisions), out_summary=out.summary, out_markdown=out.markdown, out_html=out.html)
