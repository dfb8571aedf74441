# The plans (no server): each arm's resolved spec, the request body of every
# item per dataset and arm, the boundary settings.  They change only with
# the config they come from, and carry the dependencies the answers phase's
# `ancient` outputs do not (see pairaudit/plans/stage.py).


rule arm_spec:
    output:
        SPEC,
    log:
        f"{LOGS}/specs/{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    params:
        arm=arm_config,
        code=code("arm_spec"),
    script:
        "../scripts/arm_spec.py"


rule requests:
    input:
        dataset=DATASET,
        spec=SPEC,
    output:
        REQUESTS,
    log:
        f"{LOGS}/requests/{{dataset}}-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    params:
        sampling=config["sampling"],
        audit=config["audit"],
        # answering code changes what the answers are: it reruns the assembly
        answers_code=code("answers"),
        code=code("requests"),
    script:
        "../scripts/requests.py"


if BOUNDARY_ON:

    rule boundary_plan:
        output:
            BOUNDARY_PLAN,
        log:
            f"{LOGS}/boundary/plan.log",
        conda:
            "../envs/serving.yaml"
        params:
            boundary=SETTINGS.boundary.to_json(),
            code=code("boundary_plan"),
        script:
            "../scripts/boundary_plan.py"


# The answers phase: one start of an arm's server serves its launch receipt,
# the preflight rehearsal, the sampled runs of every dataset, the greedy runs
# of every item and the determinism repeats (the diagnostics read them and
# start no server) and the boundary cases.  Every answer goes to a journal as it arrives (outside the outputs:
# Snakemake deletes a failed job's outputs, answered items must survive), and
# a rerun asks only what the journals lack.  server_slots bounds how many
# servers run on one machine at once.
rule answers:
    input:
        unpack(answers_inputs),
    output:
        **({"boundary": BOUNDARY} if BOUNDARY_ON else {}),
        receipt=LAUNCH,
        preflight=PREFLIGHT,
        phase=PHASE,
    log:
        f"{LOGS}/answers/{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=arm_gpus,
        slurm_partition=arm_partition,
    params:
        datasets=list(DATASETS),
        sampling=SETTINGS.sampling.to_json(),
        # only what the greedy runs are asked with: the selection's settings (items, concordant, seed) are the
        # diagnostics', so changing them starts no server
        greedy_max_tokens=SETTINGS.greedy.max_tokens,
        determinism_repeats=SETTINGS.greedy.determinism_repeats,
        audit=config["audit"],
        journal_dir=JOURNAL,
        starts_log=STARTS_LOG,
        # not a `log:` of the rule: Snakemake deletes a job's logs before it reruns, and a killed start's
        # server log is evidence (pairaudit.serving.launch keeps it beside the new one)
        server_log=server_log("answers-{arm}"),
        code=code("answers"),
    script:
        "../scripts/answers.py"


# One dataset's answers on one arm, assembled from the journal: no server.
# The phase's outputs are `ancient` here so that the phase answering another
# dataset does not rerun this one; the planned requests rerun it whenever its
# own answers could have changed.
rule sampled:
    input:
        dataset=DATASET,
        requests=REQUESTS,
        receipt=answered_by_arm(LAUNCH),
        preflight=answered_by_arm(PREFLIGHT),
        phase=answered_by_arm(PHASE),
    output:
        SAMPLED,
    log:
        f"{LOGS}/sampled/{{dataset}}-{{arm}}.log",
    conda:
        "../envs/serving.yaml"
    params:
        journal=JOURNAL_SAMPLED,
        code=code("sampled"),
    script:
        "../scripts/sampled.py"
