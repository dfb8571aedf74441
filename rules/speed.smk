# Speed: one job runs control, candidate, control (s1, s2, s3), and under
# win2-v4 (the default) candidate, control more while the gate cannot decide,
# up to `speed.max_starts`, on the same host, each a fresh server, and decides
# under `speed.rule`. Every finished control start is appended to the control archive
# outside the audit directory, so a rerun adds to the day-to-day spread.  The
# receipts and rehearsals are `ancient`: the answers phase rewrites them when it
# reruns for a dataset, and the bracket depends only on the arms (a parameter)
# and its own settings (the speed record, resolved at load).


# `speed: {enabled: false}` leaves the rule out: the decision then lists the
# speed gate as not evaluated (INCONCLUSIVE), never as passed.
#
# In a sweep, one shared-control bracket for every candidate (C, T1, C, T2, ...,
# C), its decisions under candidates/<name>/speed/; where the speed stage has
# no shared bracket, one bracket per candidate (SHARED_SPEED, rules/common.smk).


if SPEED_ON:

    rule speed:
        input:
            unpack(speed_inputs),
        output:
            **speed_outputs(),
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
            **({"candidates": CANDIDATES} if SHARED_SPEED else {}),
            speed=SETTINGS.speed.to_json(),
            audit=config["audit"],
            starts_log=STARTS_LOG,
            # params, not logs: see rule answers
            server_logs=speed_server_logs,
            archive=SETTINGS.speed.archive,
            code=code("speed"),
        script:
            "../scripts/speed.py"
