# The diagnostics phase: greedy runs on the discordant items (plus a few
# concordant ones as a control), determinism repeats, the first differing
# token, both arms probed on the shared prefix for their top-20, grid-tie-v1.
# One job: the arms' servers take turns (control, candidate, control for its
# probes), each started only if its journals lack something.


rule diagnostics:
    input:
        datasets=expand(DATASET, dataset=DATASETS),
        paired=expand(PAIRED, dataset=DATASETS),
        spec_control=SPEC.format(arm="control"),
        spec_candidate=SPEC.format(arm="candidate"),
        receipt_control=answered(LAUNCH, "control"),
        receipt_candidate=answered(LAUNCH, "candidate"),
        preflight_control=answered(PREFLIGHT, "control"),
        preflight_candidate=answered(PREFLIGHT, "candidate"),
        answers_control=answered(PHASE, "control"),
        answers_candidate=answered(PHASE, "candidate"),
    output:
        phase=DIAGNOSTICS_PHASE,
        greedy=[p for arms in greedy_paths().values() for p in arms.values()],
        divergence=list(divergence_paths().values()),
    log:
        f"{LOGS}/diagnostics.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=BOTH_ARMS_GPUS,
        slurm_partition=BOTH_ARMS_PARTITION,
    params:
        datasets=list(DATASETS),
        greedy=SETTINGS.greedy.to_json(),
        chat_template_kwargs=config["sampling"].get("chat_template_kwargs", {}),
        journal_dir=JOURNAL,
        starts_log=STARTS_LOG,
        # params, not logs: see rule answers
        server_logs={a: server_log(f"diagnostics-{a}") for a in ARMS},
        greedy_paths=greedy_paths(),
        divergence_paths=divergence_paths(),
        max_divergent=SETTINGS.rules.grid_tie.max_divergent,
        code=code("diagnostics"),
    script:
        "../scripts/diagnostics.py"
