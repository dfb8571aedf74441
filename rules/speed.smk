# Speed: one job runs control, candidate, control (s1, s2, s3), and under
# the sequential rules (win2-v5, the default) more starts while the gate cannot decide, as the rule
# sizes the bracket, up to `speed.max_starts`, on the same host, each a fresh server, and decides
# under `speed.rule`. Every finished control start is appended to the control archive
# outside the audit directory, so a rerun adds to the day-to-day spread.  The
# receipts and rehearsals are `ancient`: the answers phase rewrites them when it
# reruns for a dataset, and the bracket depends only on the arms (a parameter)
# and its own settings (the speed record, resolved at load).


# `speed: {enabled: false}` leaves the rule out: the decision then lists the
# speed gate as not evaluated (INCONCLUSIVE), never as passed.
#
# In a sweep, shared-control brackets (C, T1, C, T2, ..., C), their decisions
# under candidates/<name>/speed/.


if SPEED_ON and not SWEEP:

    rule speed:
        input:
            unpack(speed_inputs),
        output:
            decision=SPEED_DECISION,
            streams=SPEED_STREAMS,
        log:
            SPEED_LOG,
        conda:
            "../envs/serving.yaml"
        threads: 2
        resources:
            server_slots=1,
            gpu=BOTH_ARMS_GPUS,
            slurm_partition=BOTH_ARMS_PARTITION,
        params:
            speed=SETTINGS.speed.to_json(),
            audit=config["audit"],
            starts_log=STARTS_LOG,
            # params, not logs: see rule answers
            server_logs=speed_server_logs,
            archive=SETTINGS.speed.archive,
            code=code("speed"),
        script:
            "../scripts/speed.py"


# A sweep: one rule per bracket (speed_brackets, rules/common.smk), named after it, since the
# decisions a bracket writes are its candidates'.
if SPEED_ON and SWEEP:
    for _bracket, _members in speed_brackets().items():

        rule:
            name:
                f"speed_{_bracket.replace('-', '_')}"
            input:
                **bracket_inputs(_members),
            output:
                **{f"decision_{c}": fill(SPEED_DECISION, c) for c in _members},
                streams=bracket_streams(_bracket),
            log:
                f"{LOGS}/speed-{_bracket}.log",
            conda:
                "../envs/serving.yaml"
            threads: 2
            resources:
                server_slots=1,
                gpu=BOTH_ARMS_GPUS,
                slurm_partition=BOTH_ARMS_PARTITION,
            params:
                candidates=_members,
                speed=SETTINGS.speed.to_json(),
                audit=config["audit"],
                starts_log=STARTS_LOG,
                # the stage names every later start's log after the first's, with its start and arm
                server_logs={"s1": server_log(f"speed-{_bracket}-s1-control")},
                archive=SETTINGS.speed.archive,
                code=code("speed"),
            script:
                "../scripts/speed.py"
