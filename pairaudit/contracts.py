"""Every artifact's contract in one place: its schema id, where it lands, the fields of the main records.

A schema id is written into each artifact's ``"schema"`` field by its stage and
checked by every reader (``artifacts.check_schema``); the constants below are
the only spelling of those ids. ``PATHS`` gives where each artifact lands,
relative to ``results/<audit>/`` unless it starts with ``results/`` (logs shared
by every audit); the rules (``rules/*.smk``) spell the same paths for Snakemake.

This module imports nothing from the package, so every module can import it.
"""

from __future__ import annotations

ARMS = ("control", "candidate")
# The finish reason of an answer the model ended itself; anything else (a
# length cut, an abort) cannot count as a fair comparison of the two arms.
NATURAL_FINISH = "stop"

# ------------------------------------------------------------- schema ids

ARM_SPEC_SCHEMA = "pairaudit.arm-spec/v1"
BOUNDARY_PLAN_SCHEMA = "pairaudit.boundary-plan/v1"
BOUNDARY_SCHEMA = "pairaudit.boundary/v1"
BOUNDARY_GATE_SCHEMA = "pairaudit.boundary_gate/v1"
CALIBRATION_SCHEMA = "pairaudit.calibration/v1"
CALIBRATION_LOG_SCHEMA = "pairaudit.calibration_log/v1"
CONTROL_ARCHIVE_SCHEMA = "pairaudit.control_archive/v1"
DATASET_SCHEMA = "pairaudit.dataset/v1"
DECISION_SCHEMA = "pairaudit.decision/v1"
DIVERGENCE_SCHEMA = "pairaudit.divergence/v1"
GREEDY_SCHEMA = "pairaudit.greedy/v1"
LAUNCH_SCHEMA = "pairaudit.launch/v1"
LEDGER_SCHEMA = "pairaudit.ledger/v1"
MANIFEST_SCHEMA = "pairaudit.manifest/v1"
PAIRED_SCHEMA = "pairaudit.paired/v1"
PHASE_SCHEMA = "pairaudit.phase/v1"
PREFLIGHT_SCHEMA = "pairaudit.preflight/v1"
REQUESTS_SCHEMA = "pairaudit.requests/v1"
SAMPLED_SCHEMA = "pairaudit.sampled/v1"
SCORES_SCHEMA = "pairaudit.scores/v1"
SERVER_START_SCHEMA = "pairaudit.server-start/v1"
SPEED_DECISION_SCHEMA = "pairaudit.speed_decision/v1"
SPEED_STREAMS_SCHEMA = "pairaudit.speed_streams/v1"

# ------------------------------------------------------------------ paths

PATHS = {
    ARM_SPEC_SCHEMA: "specs/{arm}.json",
    REQUESTS_SCHEMA: "requests/{dataset}/{arm}.json",
    BOUNDARY_PLAN_SCHEMA: "boundary/plan.json",
    LAUNCH_SCHEMA: "launch/{arm}.json",
    PREFLIGHT_SCHEMA: "preflight/{arm}.json",
    PHASE_SCHEMA: "answers/{arm}.json",   # and diagnostics/phase.json
    BOUNDARY_SCHEMA: "boundary/{arm}.json",
    BOUNDARY_GATE_SCHEMA: "boundary/gate.json",
    DATASET_SCHEMA: "datasets/{dataset}.json",
    SAMPLED_SCHEMA: "sampled/{dataset}/{arm}.jsonl",
    SCORES_SCHEMA: "scores/{dataset}/{arm}.jsonl",
    PAIRED_SCHEMA: "paired/{dataset}.json",
    GREEDY_SCHEMA: "greedy/{dataset}/{arm}.jsonl",
    DIVERGENCE_SCHEMA: "divergence/{dataset}.json",
    SPEED_DECISION_SCHEMA: "speed/decision.json",
    SPEED_STREAMS_SCHEMA: "speed/streams.jsonl",
    SERVER_START_SCHEMA: "servers/starts.jsonl",
    DECISION_SCHEMA: "promotion/decision.json",
    MANIFEST_SCHEMA: "promotion/manifest.json",
    CALIBRATION_SCHEMA: "promotion/calibration.json",
    LEDGER_SCHEMA: "results/ledger.jsonl",
    CONTROL_ARCHIVE_SCHEMA: "results/control-archive.jsonl",
    CALIBRATION_LOG_SCHEMA: "results/calibrations.jsonl",
}
