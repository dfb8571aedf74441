# Boundary gate (issue 5): long-context retrieval at fractions of
# max_model_len, the max_model_len-16 capacity tail (seed 003) and its -32
# control, per arm on a fresh server; then boundary-v1 over both arms.

# `boundary: {enabled: false}` leaves both rules out: the decision then lists
# the boundary gate as not evaluated (INCONCLUSIVE), never as passed.
if config.get("boundary", {}).get("enabled", True):

    rule boundary:
        input:
            receipt=f"{R}/launch/{{arm}}.json",
            preflight=f"{R}/preflight/{{arm}}.json",
        output:
            f"{R}/boundary/{{arm}}.json",
        log:
            f"{R}/logs/boundary/{{arm}}.log",
            server=f"{R}/logs/servers/boundary-{{arm}}.log",
        conda:
            "../envs/serving.yaml"
        threads: 2
        resources:
            server_slots=1,
            gpu=arm_gpus,
            slurm_partition=arm_partition,
        params:
            arm=arm_config,
            boundary=config.get("boundary", {}),
            audit=config["audit"],
            code=CODE["boundary"],
        script:
            "../scripts/boundary.py"

    rule boundary_gate:
        input:
            control=f"{R}/boundary/control.json",
            candidate=f"{R}/boundary/candidate.json",
            launch_control=f"{R}/launch/control.json",
            launch_candidate=f"{R}/launch/candidate.json",
        output:
            f"{R}/boundary/gate.json",
        log:
            f"{R}/logs/boundary/gate.log",
        conda:
            "../envs/analysis.yaml"
        params:
            code=CODE["boundary_gate"],
        script:
            "../scripts/boundary_gate.py"
