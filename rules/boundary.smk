# Boundary gate: the long-context retrieval cases, the max_model_len-16
# capacity tail and its -32 control ran in each arm's answers phase; here
# boundary-v1 judges both arms' cases side by side.  `boundary: {enabled:
# false}` leaves the cases and the gate out: the decision then lists the
# boundary gate as not evaluated (INCONCLUSIVE), never as passed.
if BOUNDARY_ON:

    rule boundary_gate:
        input:
            # the cases are `ancient`: the answers phase rewrites them when it
            # reruns for a dataset; the plan and the specs rerun the gate
            plan=BOUNDARY_PLAN,
            spec_control=SPEC.format(arm="control"),
            spec_candidate=SPEC.format(arm="candidate"),
            control=answered(BOUNDARY, "control"),
            candidate=answered(BOUNDARY, "candidate"),
            launch_control=answered(LAUNCH, "control"),
            launch_candidate=answered(LAUNCH, "candidate"),
        output:
            BOUNDARY_GATE,
        log:
            f"{LOGS}/boundary/gate.log",
        conda:
            "../envs/analysis.yaml"
        params:
            code=code("boundary_gate"),
        script:
            "../scripts/boundary_gate.py"
