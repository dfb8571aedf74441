"""Snakemake entry for rule answers: one arm's server for receipt, preflight, sampled and greedy runs and boundary (pairaudit.answers.stage.answers_phase)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the library, also inside a conda env  # noqa: F821
from pairaudit.answers.stage import answers_phase  # noqa: E402
from pairaudit.core.jobs import run_job  # noqa: E402
from pairaudit.core.settings import SamplingSettings  # noqa: E402

inp, out, params, log = snakemake.input, snakemake.output, snakemake.params, snakemake.log  # noqa: F821
run_job(log[0], answers_phase, arm=snakemake.wildcards.arm, spec_path=inp.spec,  # noqa: F821
        requests_paths=dict(zip(params.datasets, inp.requests)), sampling=SamplingSettings.from_json(params.sampling),
        audit=params.audit,
        boundary_plan_path=inp.get("boundary_plan"), journal_dir=params.journal_dir, receipt_path=out.receipt,
        preflight_path=out.preflight, phase_path=out.phase, boundary_path=out.get("boundary"),
        server_log=params.server_log, starts_log=params.starts_log,
        greedy_max_tokens=params.greedy_max_tokens, determinism_repeats=params.determinism_repeats)
