# The quality path per dataset: items -> (answers phase) -> sampled per arm -> scores -> paired table
# (in a sweep one per candidate, each against the control's shared scores).


rule dataset:
    output:
        DATASET,
    log:
        f"{LOGS}/dataset/{{dataset}}.log",
    conda:
        "../envs/scoring.yaml"
    params:
        # no paths: the script finds the project beside itself, so a moved project reruns nothing
        dataset=dataset_settings,
        code=code("dataset"),
    script:
        "../scripts/dataset.py"


rule score:
    input:
        dataset=DATASET,
        sampled=SAMPLED,
    output:
        SCORES,
    log:
        f"{LOGS}/score/{{dataset}}-{{arm}}.log",
    conda:
        "../envs/scoring.yaml"
    threads: 2
    params:
        sandbox=SETTINGS.scoring.sandbox.to_json(),
        code=code("score"),
    script:
        "../scripts/score.py"


rule paired:
    input:
        unpack(paired_inputs),
    output:
        PAIRED,
    log:
        per_candidate_log("paired/{dataset}.log"),
    conda:
        "../envs/analysis.yaml"
    params:
        quality=SETTINGS.rules.quality.to_json(),
        # quality-v2 bounds each dataset at 1 - (1 - level) / datasets, so the audit's claim holds over all
        datasets=len(DATASETS),
        code=code("paired"),
    script:
        "../scripts/paired.py"
