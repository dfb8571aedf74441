# The diagnostics phase: greedy runs on the discordant items (plus a few
# concordant ones as a control), determinism repeats, the first differing
# token, both arms probed on the shared prefix for their top-20, grid-tie-v1.
# One job (in a sweep one per candidate): the arms' servers take turns
# (control, candidate, control for its probes), each started only if its
# journals lack something.  The journals are kept by arm name, so a sweep's
# control journal is shared: each candidate's job asks the control only for
# the items no earlier candidate's job selected (docs/sweeps.md).


rule diagnostics:
    input:
        unpack(diagnostics_inputs),
    output:
        phase=DIAGNOSTICS_PHASE,
        greedy=[p for arms in greedy_paths(CANDIDATE).values() for p in arms.values()],
        divergence=list(divergence_paths(CANDIDATE).values()),
    log:
        per_candidate_log("diagnostics.log"),
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
        chat_template_kwargs=SETTINGS.sampling.to_json()["chat_template_kwargs"],
        journal_dir=JOURNAL,
        starts_log=STARTS_LOG,
        # params, not logs: see rule answers
        server_logs=lambda w: {
            "control": server_log(
                f"diagnostics-{cand(w)}-control" if SWEEP else "diagnostics-control"
            ),
            "candidate": server_log(f"diagnostics-{cand(w)}"),
        },
        greedy_paths=lambda w: greedy_paths(cand(w)),
        divergence_paths=lambda w: divergence_paths(cand(w)),
        max_divergent=SETTINGS.rules.grid_tie.max_divergent,
        code=code("diagnostics"),
    script:
        "../scripts/diagnostics.py"
