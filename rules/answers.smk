# The answers phase: one start of an arm's server serves its launch receipt,
# the preflight rehearsal, the sampled runs of every dataset and the boundary
# cases.  Every answer goes to a journal as it arrives (outside the outputs:
# Snakemake deletes a failed job's outputs, answered items must survive), and
# a rerun asks only what the journals lack.  server_slots bounds how many
# servers run on one machine at once.


rule answers:
    input:
        datasets=expand(f"{R}/datasets/{{dataset}}.json", dataset=DATASETS),
    output:
        **({"boundary": f"{R}/boundary/{{arm}}.json"} if BOUNDARY_ON else {}),
        receipt=f"{R}/launch/{{arm}}.json",
        preflight=f"{R}/preflight/{{arm}}.json",
        phase=f"{R}/answers/{{arm}}.json",
    log:
        f"{R}/logs/answers/{{arm}}.log",
        server=f"{R}/logs/servers/answers-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=arm_gpus,
        slurm_partition=arm_partition,
    params:
        arm=arm_config,
        datasets=list(DATASETS),
        sampling=config["sampling"],
        audit=config["audit"],
        boundary=config.get("boundary", {}) if BOUNDARY_ON else None,
        journal_dir=JOURNAL,
        starts_log=STARTS_LOG,
        code=code("answers"),
    script:
        "../scripts/answers.py"


# One dataset's answers on one arm, assembled from the journal: no server.
# The phase's outputs are `ancient` here so that the phase answering another
# dataset does not rerun this one; `fingerprint` reruns it whenever its own
# answers could have changed (arm, sampling, audit name, answering code).
rule sampled:
    input:
        dataset=f"{R}/datasets/{{dataset}}.json",
        receipt=ancient(f"{R}/launch/{{arm}}.json"),
        preflight=ancient(f"{R}/preflight/{{arm}}.json"),
        phase=ancient(f"{R}/answers/{{arm}}.json"),
    output:
        f"{R}/sampled/{{dataset}}/{{arm}}.jsonl",
    log:
        f"{R}/logs/sampled/{{dataset}}-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    params:
        sampling=config["sampling"],
        audit=config["audit"],
        journal=f"{JOURNAL}/sampled/{{dataset}}/{{arm}}.jsonl",
        fingerprint=arm_fingerprint,
        code=code("sampled"),
    script:
        "../scripts/sampled.py"
