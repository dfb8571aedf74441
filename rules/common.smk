import json
import os
from pathlib import Path

from pairaudit.promotion import calibration
from pairaudit.core import contracts
from pairaudit.core.codehash import code_hash
from pairaudit.core.lifecycle import relay_interrupts

# A SIGINT to snakemake alone would let its running jobs carry on; they watch for this.
relay_interrupts()

ARMS = ["control", "candidate"]
# Each config section as the load check resolved it, once (SETTINGS, the Snakefile's;
# pairaudit/core/settings.py): the rules hand each job its section's record as JSON.
DATASETS = {d.name: d for d in SETTINGS.datasets}
BASE = Path(workflow.basedir)
CACHE = str(Path(workflow.basedir) / ".cache")


# Where each artifact lands is its contract's (pairaudit.core.contracts.PATHS): under
# results/<audit>/ unless shared by every audit, a pattern in {arm} and {dataset};
# so do the journals, the logs and the promotion's reports.
def artifact(key):
    return contracts.audit_path(key, config["audit"])


SPEC = artifact(contracts.ARM_SPEC_SCHEMA)
DATASET = artifact(contracts.DATASET_SCHEMA)
REQUESTS = artifact(contracts.REQUESTS_SCHEMA)
BOUNDARY_PLAN = artifact(contracts.BOUNDARY_PLAN_SCHEMA)
LAUNCH = artifact(contracts.LAUNCH_SCHEMA)
PREFLIGHT = artifact(contracts.PREFLIGHT_SCHEMA)
PHASE = artifact(contracts.PHASE_SCHEMA)
BOUNDARY = artifact(contracts.BOUNDARY_SCHEMA)
BOUNDARY_GATE = artifact(contracts.BOUNDARY_GATE_SCHEMA)
SAMPLED = artifact(contracts.SAMPLED_SCHEMA)
SCORES = artifact(contracts.SCORES_SCHEMA)
PAIRED = artifact(contracts.PAIRED_SCHEMA)
GREEDY = artifact(contracts.GREEDY_SCHEMA)
DIVERGENCE = artifact(contracts.DIVERGENCE_SCHEMA)
SPEED_DECISION = artifact(contracts.SPEED_DECISION_SCHEMA)
SPEED_STREAMS = artifact(contracts.SPEED_STREAMS_SCHEMA)
STARTS_LOG = artifact(contracts.SERVER_START_SCHEMA)
DECISION = artifact(contracts.DECISION_SCHEMA)
MANIFEST = artifact(contracts.MANIFEST_SCHEMA)
CALIBRATION_SUMMARY = artifact(contracts.CALIBRATION_SCHEMA)
LEDGER = artifact(contracts.LEDGER_SCHEMA)
DIAGNOSTICS_PHASE = artifact(contracts.DIAGNOSTICS_PHASE)
JOURNAL = artifact(contracts.JOURNAL)
JOURNAL_SAMPLED = artifact(contracts.JOURNAL_SAMPLED)
LOGS = artifact(contracts.LOGS)


def server_log(name):
    """The log of one phase's server: ``name`` is the phase and arm (or bracket start), wildcards allowed."""
    return artifact(contracts.SERVER_LOG).format(name=name)


BISECT = artifact(contracts.BISECT_SCHEMA)


BOUNDARY_ON = SETTINGS.boundary is not None
SPEED_ON = SETTINGS.speed is not None
# An A/A calibration (the Snakefile's calibration module): decided by its gates, summarized, logged.
CALIBRATION = calibration.is_calibration(config)
CALIBRATIONS = calibration.log_path(config)


# What each stage runs: its script and every pairaudit module the script
# imports, directly or not (pairaudit.core.codehash).  The hash is a parameter, so
# editing a file reruns exactly the stages that import it (and what consumes
# their outputs), while a `touch` reruns nothing (the profile turns the mtime
# and code triggers off: see profiles/default/config.yaml).
def code(stage):
    roots = [f"scripts/{stage}.py"]
    if stage in SERVER_STAGES:
        # the embedded reference server runs as a subprocess: its code is what answers
        roots.append("pairaudit/refserver/__main__.py")
    return code_hash(BASE, roots, cache=CODEHASH_CACHE)


CODEHASH_CACHE = ".snakemake/pairaudit/code-imports.json"


SERVER_STAGES = {"answers", "diagnostics", "speed", "bisect"}


wildcard_constraints:
    arm="control|candidate",
    dataset="|".join(DATASETS),


def arm_config(wildcards):
    return config["arms"][wildcards.arm]


def arm_gpus(wildcards):
    return int(config["arms"][wildcards.arm].get("gpus", 0))


# Jobs that run both arms' servers one after the other (divergence, boundary
# gate, speed bracket) need the larger of the two arms' accelerator counts.
BOTH_ARMS_GPUS = max(int(a.get("gpus", 0)) for a in config["arms"].values())


# Slurm partitions (profiles/slurm): a job whose server needs GPUs goes to
# PAIRAUDIT_SLURM_GPU_PARTITION when set; every other job to
# PAIRAUDIT_SLURM_PARTITION, empty meaning the cluster's default.  From the
# environment, not the config: where a job runs must not rerun it.
def slurm_partition(gpus):
    gpu_partition = os.environ.get("PAIRAUDIT_SLURM_GPU_PARTITION", "")
    if gpus and gpu_partition:
        return gpu_partition
    return os.environ.get("PAIRAUDIT_SLURM_PARTITION", "")


def arm_partition(wildcards):
    return slurm_partition(arm_gpus(wildcards))


BOTH_ARMS_PARTITION = slurm_partition(BOTH_ARMS_GPUS)


def dataset_settings(wildcards):
    """The dataset's record (its entry, selected indices and source fingerprint) as JSON."""
    return DATASETS[wildcards.dataset].to_json()


def answers_inputs(wildcards):
    inputs = {
        "spec": SPEC.format(arm=wildcards.arm),
        "requests": expand(REQUESTS, dataset=DATASETS, arm=wildcards.arm),
    }
    if BOUNDARY_ON:
        inputs["boundary_plan"] = BOUNDARY_PLAN
    return inputs


def phase_failed(arm):
    """Did the arm's last answers phase end with a server failure (its record says so)?"""
    try:
        return (
            json.loads(Path(PHASE.format(arm=arm)).read_text()).get("failure")
            is not None
        )
    except (OSError, ValueError):
        return False


def answered(pattern, arm):
    """An output of the arm's answers phase, read as `ancient` so that the phase
    answering one dataset does not rerun another's chain -- unless the phase last
    ended with a server failure: then everything made from it is partial, and a
    rerun of the phase must rebuild all of it."""
    path = pattern.format(arm=arm)
    return path if phase_failed(arm) else ancient(path)


def answered_by_arm(pattern):
    return lambda wildcards: answered(pattern, wildcards.arm)


def greedy_paths():
    return {d: {a: GREEDY.format(dataset=d, arm=a) for a in ARMS} for d in DATASETS}


def divergence_paths():
    return {d: DIVERGENCE.format(dataset=d) for d in DATASETS}


def promotion_later_inputs(wildcards):
    """The optional gates' artifacts: an audit without the stage still decides (INCONCLUSIVE)."""
    later = {}
    if BOUNDARY_ON:
        later["boundary"] = BOUNDARY_GATE
    if SPEED_ON:
        later["speed"] = SPEED_DECISION
    return later


def paired_inputs(wildcards):
    d = wildcards.dataset
    return {
        "dataset": DATASET.format(dataset=d),
        **{f"sampled_{a}": SAMPLED.format(dataset=d, arm=a) for a in ARMS},
        **{f"scores_{a}": SCORES.format(dataset=d, arm=a) for a in ARMS},
    }
