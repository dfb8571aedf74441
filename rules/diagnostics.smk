# The diagnostics: no server. Each arm's answers phase already ran greedy on
# every item of every dataset and the determinism repeats, on its one start
# (their journals, by arm name: a sweep's control is run once for every
# candidate). Here the paired tables select the items compared (every
# discordant one plus a few concordant ones as a control), the first
# differing token is found, and grid-tie-v1 reads each arm's own top-20 at it
# from its greedy run; determinism-v1 reads the repeats. One job (in a sweep
# one per candidate). It reruns whenever an arm's answers phase does (its
# record is an input, not `ancient`: see rules/common.smk) or a paired table
# changes.


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
    params:
        datasets=list(DATASETS),
        greedy=SETTINGS.greedy.to_json(),
        chat_template_kwargs=SETTINGS.sampling.to_json()["chat_template_kwargs"],
        journal_dir=JOURNAL,
        greedy_paths=lambda w: greedy_paths(cand(w)),
        divergence_paths=lambda w: divergence_paths(cand(w)),
        max_divergent=SETTINGS.rules.grid_tie.max_divergent,
        code=code("diagnostics"),
    script:
        "../scripts/diagnostics.py"
