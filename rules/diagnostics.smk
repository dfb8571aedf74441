# Greedy diagnostics (seed 000): greedy runs on the discordant items (plus a
# few concordant ones as a control), the first differing token, both arms
# probed on the shared prefix for their top-20, grid-tie-v1, and determinism.


rule greedy:
    input:
        dataset=f"{R}/datasets/{{dataset}}.json",
        paired=f"{R}/paired/{{dataset}}.json",
        receipt=f"{R}/launch/{{arm}}.json",
        preflight=f"{R}/preflight/{{arm}}.json",
    output:
        f"{R}/greedy/{{dataset}}/{{arm}}.jsonl",
    log:
        f"{R}/logs/greedy/{{dataset}}-{{arm}}.log",
        server=f"{R}/logs/servers/greedy-{{dataset}}-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=arm_gpus,
        slurm_partition=arm_partition,
    params:
        arm=arm_config,
        greedy=config.get("greedy", {}),
        chat_template_kwargs=config["sampling"].get("chat_template_kwargs", {}),
        journal=f"{R}/journal/greedy/{{dataset}}/{{arm}}.jsonl",
        code=CODE["greedy"],
    script:
        "../scripts/greedy.py"


# Probing needs both servers: they run one after the other inside this job.
rule divergence:
    input:
        dataset=f"{R}/datasets/{{dataset}}.json",
        greedy_control=f"{R}/greedy/{{dataset}}/control.jsonl",
        greedy_candidate=f"{R}/greedy/{{dataset}}/candidate.jsonl",
        launch_control=f"{R}/launch/control.json",
        launch_candidate=f"{R}/launch/candidate.json",
    output:
        f"{R}/divergence/{{dataset}}.json",
    log:
        f"{R}/logs/divergence/{{dataset}}.log",
        server_control=f"{R}/logs/servers/divergence-{{dataset}}-control.log",
        server_candidate=f"{R}/logs/servers/divergence-{{dataset}}-candidate.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=BOTH_ARMS_GPUS,
        slurm_partition=BOTH_ARMS_PARTITION,
    params:
        arms=config["arms"],
        max_divergent=config.get("rules", {})
        .get("grid_tie", {})
        .get("max_divergent", 3),
        code=CODE["divergence"],
    script:
        "../scripts/divergence.py"
