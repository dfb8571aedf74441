# Boundary gate: the long-context retrieval cases, the max_model_len-16
# capacity tail and its -32 control ran in each arm's answers phase; here
# boundary-v1 judges both arms' cases side by side (in a sweep, the control's
# cases against each candidate's, one gate per candidate).  `boundary: {enabled:
# false}` leaves the cases and the gate out: the decision then lists the
# boundary gate as not evaluated (INCONCLUSIVE), never as passed.
if BOUNDARY_ON:

    rule boundary_gate:
        input:
            unpack(boundary_gate_inputs),
        output:
            BOUNDARY_GATE,
        log:
            per_candidate_log("boundary/gate.log"),
        conda:
            "../envs/analysis.yaml"
        params:
            code=code("boundary_gate"),
        script:
            "../scripts/boundary_gate.py"
