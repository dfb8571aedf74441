# Launch receipt and API rehearsal per arm.  Every job that needs a server
# starts a fresh one from the arm's spec and stops it on the way out; the
# server_slots resource bounds how many run on one machine at once.


rule launch:
    output:
        f"{R}/launch/{{arm}}.json",
    log:
        f"{R}/logs/launch/{{arm}}.log",
        server=f"{R}/logs/servers/launch-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=arm_gpus,
        slurm_partition=arm_partition,
    params:
        arm=arm_config,
        code=CODE["launch"],
    script:
        "../scripts/launch.py"


rule preflight:
    input:
        receipt=f"{R}/launch/{{arm}}.json",
    output:
        f"{R}/preflight/{{arm}}.json",
    log:
        f"{R}/logs/preflight/{{arm}}.log",
        server=f"{R}/logs/servers/preflight-{{arm}}.log",
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
        code=CODE["preflight"],
    script:
        "../scripts/preflight.py"
