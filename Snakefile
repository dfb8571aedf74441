# pairaudit: decide whether a change to an LLM inference server may be promoted.
#   snakemake --cores 4 promotion          the whole audit (config/config.yaml)
#   snakemake --cores 4 <output path>      one stage or one dataset (see README)
#   snakemake --cores 4 calibrate          the control against itself (results/<audit>-calibration/)
#   snakemake --cores 4 bisect             which of the change's switches move the greedy divergences
import sys
import time

from snakemake.utils import min_version, validate

from pairaudit.promotion.calibration import calibration_config, is_calibration
from pairaudit.cli import export, verdict
from pairaudit.configcheck import check_at_load, check_yaml_files, derive_at_load
from pairaudit.core import resume
from pairaudit.timeplan.plan import runs_audit, write_plan

min_version("9.0")

# A crash of snakemake (kill -9, a node that reboots) leaves its locks in
# .snakemake/locks/. Every snakemake of this workflow records who it is
# before Snakemake takes a lock; here, before Snakemake looks at the locks,
# they are cleared when every snakemake that could hold them is dead -- a
# live one's are never touched (pairaudit/core/resume.py, docs/reruns.md).
# Jobs load this file too (in subprocesses, or on Slurm nodes): only the
# snakemake that schedules them owns locks.
if workflow.is_main_process:
    for line in resume.at_load():
        print(f"pairaudit: {line}", file=sys.stderr, flush=True)

# Snakemake's own message for a YAML error in this file names no line.
check_yaml_files(["config/config.yaml"])


configfile: "config/config.yaml"


# The change form (server + change) becomes the two arms before the schema and
# every check below see them (pairaudit/plans/change.py).
derive_at_load(config)
validate(config, "config/schema.yaml")
# everything else checkable before a job runs; each section resolved once, for the rules.
# It also prints the run's time plan and refuses one that does not fit window_min.
CHECKED = check_at_load(config, workflow)
SETTINGS = CHECKED.settings


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/answers.smk"
include: "rules/quality.smk"
include: "rules/diagnostics.smk"
include: "rules/speed.smk"
include: "rules/boundary.smk"
include: "rules/promotion.smk"
include: "rules/bisect.smk"


rule all:
    default_target: True
    input:
        rules.promotion.output,


# A/A calibration: this workflow once more, as a module whose config runs the
# control against a copy of itself as audit <audit>-calibration
# (pairaudit/promotion/calibration.py).  A module, not a config rewritten when the target
# is asked for: Snakemake parses the Snakefile before it knows the targets, and
# a cluster job parses it again from the config alone.
if not is_calibration(config):
    RUN_STARTED = time.time()

    # A run with jobs to run (never a dry run) keeps the plan it printed at load as an artifact,
    # before its first job: the promotion sets it against what each phase took.
    onstart:
        # only a run with jobs of this audit: `snakemake calibrate` runs the calibration's alone
        if CHECKED.plan is not None and runs_audit(
            workflow.dag.needrun_jobs(), config["audit"]
        ):
            write_plan(CHECKED.plan, config["audit"])

    # The terminal ends on the verdict: the front page of every decision this
    # run wrote (or the audit's standing one), as `pairaudit verdict` prints it.
    onsuccess:
        audits = [
            f"results/{config['audit']}",
            f"results/{config['audit']}-calibration",
        ]
        # the answers and speed starts in lm-eval's and vllm bench serve's formats, beside the evidence
        exported = export.after_run(audits, RUN_STARTED)
        page = verdict.after_run(audits, RUN_STARTED)
        for text in (exported, page):
            if text:
                print(f"\n{text}", flush=True)

    module calibration:
        snakefile:
            "Snakefile"
        config:
            calibration_config(config)
        # its config is this one's, validated above, with the candidate replaced
        skip_validation:
            True

    use rule * from calibration exclude all as calibration_*

    rule calibrate:
        input:
            rules.calibration_promotion.output,
