"""Snakemake entry for rule promotion: decision, report and manifest (pairaudit.report.promotion_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.jobs import run_job  # noqa: E402
from pairaudit.report import promotion_stage  # noqa: E402

inp, out = snakemake.input, snakemake.output  # noqa: F821
run_job(snakemake.log[0], promotion_stage, paired_paths=list(inp.paired), launch_paths=list(inp.launch),  # noqa: F821
        preflight_paths=list(inp.preflight), out_decision=out.decision, out_report=out.report,
        out_manifest=out.manifest, out_plot=out.plot, later={"divergence": list(inp.divergence)})
