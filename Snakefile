# pairaudit: decide whether a change to an LLM inference server may be promoted.
#   snakemake --cores 4 promotion          the whole audit (config/config.yaml)
#   snakemake --cores 4 <output path>      one stage or one dataset (see README)
from snakemake.utils import min_version, validate

from pairaudit.configcheck import check_at_load, check_yaml_files

min_version("9.0")

# Snakemake's own message for a YAML error in this file names no line.
check_yaml_files(["config/config.yaml"])


configfile: "config/config.yaml"


validate(config, "config/schema.yaml")
check_at_load(config, workflow)  # everything else checkable before a job runs


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/answers.smk"
include: "rules/quality.smk"
include: "rules/diagnostics.smk"
include: "rules/speed.smk"
include: "rules/boundary.smk"
include: "rules/promotion.smk"


rule all:
    default_target: True
    input:
        rules.promotion.output,
