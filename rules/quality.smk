# The quality path per dataset: items -> sampled runs per arm -> scores -> paired table.


rule dataset:
    output:
        f"{R}/datasets/{{dataset}}.json",
    log:
        f"{R}/logs/dataset/{{dataset}}.log",
    conda:
        "../envs/scoring.yaml"
    params:
        cfg=dataset_config,
        where=dataset_where,
        source_sha256=dataset_source_sha256,
        cache_dir=CACHE,
        base_dir=str(BASE),
        code=CODE["dataset"],
    script:
        "../scripts/dataset.py"


rule sampled:
    input:
        dataset=f"{R}/datasets/{{dataset}}.json",
        receipt=f"{R}/launch/{{arm}}.json",
        preflight=f"{R}/preflight/{{arm}}.json",
    output:
        f"{R}/sampled/{{dataset}}/{{arm}}.jsonl",
    log:
        f"{R}/logs/sampled/{{dataset}}-{{arm}}.log",
        server=f"{R}/logs/servers/sampled-{{dataset}}-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=arm_gpus,
        slurm_partition=arm_partition,
    params:
        arm=arm_config,
        sampling=config["sampling"],
        audit=config["audit"],
        # outside the outputs: a failed job's outputs are deleted, answered items must not be
        journal=f"{R}/journal/sampled/{{dataset}}/{{arm}}.jsonl",
        code=CODE["sampled"],
    script:
        "../scripts/sampled.py"


rule score:
    input:
        dataset=f"{R}/datasets/{{dataset}}.json",
        sampled=f"{R}/sampled/{{dataset}}/{{arm}}.jsonl",
    output:
        f"{R}/scores/{{dataset}}/{{arm}}.jsonl",
    log:
        f"{R}/logs/score/{{dataset}}-{{arm}}.log",
    conda:
        "../envs/scoring.yaml"
    threads: 2
    params:
        sandbox=config.get("scoring", {}).get("sandbox", {}),
        code=CODE["score"],
    script:
        "../scripts/score.py"


rule paired:
    input:
        unpack(paired_inputs),
    output:
        f"{R}/paired/{{dataset}}.json",
    log:
        f"{R}/logs/paired/{{dataset}}.log",
    conda:
        "../envs/analysis.yaml"
    params:
        quality=config.get("rules", {}).get("quality", {}),
        code=CODE["paired"],
    script:
        "../scripts/paired.py"
