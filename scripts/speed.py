"""Snakemake entry for rule speed: the OFF/ON/OFF bracket under win2-v2 or win2-v1 (pairaudit.speed.stage.speed_stage)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # noqa: F821
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import SpeedSettings  # noqa: E402
from pairaudit.speed.stage import speed_stage  # noqa: E402

inp, out, params, log = snakemake.input, snakemake.output, snakemake.params, snakemake.log  # noqa: F821
run_job(log[0], speed_stage,
        launch_paths={"control": inp.launch_control, "candidate": inp.launch_candidate},
        preflight_paths={"control": inp.preflight_control, "candidate": inp.preflight_candidate},
        spec_paths={"control": inp.spec_control, "candidate": inp.spec_candidate},
        speed=SpeedSettings.from_json(params.speed), audit=params.audit,
        out_path=out.decision, streams_path=out.streams, archive_path=params.archive,
        server_logs=dict(params.server_logs),
        starts_log=params.starts_log)
