"""Snakemake entry for rule speed: the bracket under its rule (pairaudit.speed.stage.speed_stage).

Two arms (inputs spec_control/spec_candidate, output decision): the control/candidate bracket. Several
candidates (params.candidates in bracket order, inputs spec_/launch_/preflight_<arm> for control and every
candidate, outputs decision_<candidate>): the shared-control bracket, one decision per candidate."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import SpeedSettings  # noqa: E402
from pairaudit.speed.stage import speed_stage  # noqa: E402

inp, out, params, log = snakemake.input, snakemake.output, snakemake.params, snakemake.log  # noqa: F821
if "decision" in out.keys():
    run_job(log[0], speed_stage,
            launch_paths={"control": inp.launch_control, "candidate": inp.launch_candidate},
            preflight_paths={"control": inp.preflight_control, "candidate": inp.preflight_candidate},
            spec_paths={"control": inp.spec_control, "candidate": inp.spec_candidate},
            speed=SpeedSettings.from_json(params.speed), audit=params.audit,
            out_path=out.decision, streams_path=out.streams, archive_path=params.archive,
            server_logs=dict(params.server_logs),
            starts_log=params.starts_log)
else:
    arms = ["control", *params.candidates]
    run_job(log[0], speed_stage,
            launch_paths={a: inp[f"launch_{a}"] for a in arms},
            preflight_paths={a: inp[f"preflight_{a}"] for a in arms},
            spec_paths={a: inp[f"spec_{a}"] for a in arms},
            speed=SpeedSettings.from_json(params.speed), audit=params.audit,
            candidates=list(params.candidates), out_paths={c: out[f"decision_{c}"] for c in params.candidates},
            streams_path=out.streams, archive_path=params.archive,
            server_logs=dict(params.server_logs),
            starts_log=params.starts_log)
