# Switch bisection (docs/bisect.md): for the audit's divergent greedy items,
# the smallest set of the change's switches that gives the candidate's token
# at the first divergence.  One fresh server per subset of switches, every
# item teacher-forced on it; kept per subset, so a rerun starts nothing.  A
# diagnostic: the promotion never reads it, and it is never part of the
# `promotion` target; `snakemake --cores N bisect` asks for it.


rule bisect:
    input:
        divergence=list(divergence_paths().values()),
        greedy=[GREEDY.format(dataset=d, arm="control") for d in DATASETS],
    output:
        result=BISECT,
        report=artifact(contracts.BISECT_REPORT),
    log:
        f"{LOGS}/bisect.log",
    conda:
        "../envs/serving.yaml"
    threads: 2
    resources:
        server_slots=1,
        gpu=BOTH_ARMS_GPUS,
        slurm_partition=BOTH_ARMS_PARTITION,
    params:
        datasets=list(DATASETS),
        arms=config["arms"],
        server=config.get("server"),
        change=config.get("change"),
        journal_dir=JOURNAL,
        server_log_dir=str(Path(server_log("bisect")).parent),
        starts_log=STARTS_LOG,
        code=code("bisect"),
    script:
        "../scripts/bisect.py"
