"""Snakemake entry for rule promotion: decision, reports, figures, manifest, ledger line (pairaudit.promotion.stage.promotion_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.plans.change import candidate_config  # noqa: E402
from pairaudit.promotion.stage import promotion_stage  # noqa: E402

inp, out, params = snakemake.input, snakemake.output, snakemake.params  # noqa: F821
later = {"divergence": list(inp.divergence), "answers": list(inp.answers)}
for stage in ("boundary", "speed"):
    if stage in inp.keys():
        later[stage] = inp[stage]
# The config is hashed into the ledger line only (not a param: an unrelated
# config edit must not rerun the decision); a sweep's candidate as if audited on its own.
config = dict(snakemake.config)  # noqa: F821
if "candidate" in params.keys():
    config = candidate_config(config, params.candidate)
run_job(snakemake.log[0], promotion_stage, paired_paths=list(inp.paired), launch_paths=list(inp.launch),  # noqa: F821
        preflight_paths=list(inp.preflight), score_paths=list(inp.scores), out_decision=out.decision,
        out_report=out.report, out_manifest=out.manifest, out_plot=out.plot, out_html=out.html,
        out_summary=out.summary, out_divergence_plot=out.divergence, out_boundary=out.boundary,
        out_speed_plot=out.speed, out_archive_plot=out.archive, later=later, ledger_path=params.ledger,
        audit=params.audit, config=config, calibration=params.calibration,  # noqa: F821
        calibrations_path=params.calibrations,
        out_calibration=out.calibration if "calibration" in out.keys() else None)
