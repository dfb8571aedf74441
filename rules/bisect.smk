# Switch bisection (docs/bisect.md): for the audit's divergent greedy items,
# the smallest set of the change's switches that gives the candidate's token
# at the first divergence.  One fresh server per subset of switches, every
# item teacher-forced on it; kept per subset, so a rerun starts nothing.  A
# diagnostic: the promotion never reads it, and it is never part of the
# `promotion` target; `snakemake --cores N bisect` asks for it.


# In a sweep it is per candidate: `snakemake --cores N bisect` bisects every
# candidate, `snakemake --cores N results/<audit>/candidates/<name>/bisect/result.json`
# one; each against the shared control, as if its candidate were audited on its own.


rule:
    name:
        "bisect_candidate" if SWEEP else "bisect"
    input:
        unpack(bisect_inputs),
    output:
        result=BISECT,
        report=per_candidate(contracts.BISECT_REPORT),
    log:
        per_candidate_log("bisect.log"),
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=BOTH_ARMS_GPUS,
        slurm_partition=BOTH_ARMS_PARTITION,
    params:
        datasets=list(DATASETS),
        arms=lambda w: bisect_config(w)["arms"],
        server=lambda w: bisect_config(w).get("server"),
        change=lambda w: bisect_config(w).get("change"),
        journal_dir=JOURNAL,
        server_log_dir=str(Path(server_log("bisect")).parent),
        starts_log=STARTS_LOG,
        code=code("bisect"),
    script:
        "../scripts/bisect.py"


if SWEEP:

    rule bisect:
        input:
            expand(BISECT, candidate=CANDIDATES),
