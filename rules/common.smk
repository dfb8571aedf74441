import hashlib
import json
import os
import re
from pathlib import Path

from pairaudit.promotion import calibration
from pairaudit.core import contracts
from pairaudit.plans import change as change_form
from pairaudit.core.codehash import code_hash
from pairaudit.core.lifecycle import relay_interrupts
from pairaudit.serving.launch import keep_logs_for_jobs

# A SIGINT to snakemake alone would let its running jobs carry on; they watch for this.
relay_interrupts()
# How many logs of each phase and arm a job keeps when it moves the last one aside (server_logs.keep).
keep_logs_for_jobs(config["server_logs"]["keep"])

# A sweep (server + candidates, docs/sweeps.md): the arm wildcard takes the control and every
# candidate's name, so each arm's plans and answers phase run once, the control's for all of them;
# what compares the control with one candidate takes a {candidate} wildcard and lands under
# candidates/<name>/. The two-arm form has one candidate, `candidate`, and no such wildcard.
SWEEP = change_form.is_sweep(config)
CANDIDATES = change_form.candidate_names(config)
ARMS = ["control", *CANDIDATES]
# Each config section as the load check resolved it, once (SETTINGS, the Snakefile's;
# pairaudit/core/settings.py): the rules hand each job its section's record as JSON.
DATASETS = {d.name: d for d in SETTINGS.datasets}
BASE = Path(workflow.basedir)


# Where each artifact lands is its contract's (pairaudit.core.contracts.PATHS): under
# results/<audit>/ unless shared by every audit, a pattern in {arm} and {dataset};
# so do the journals, the logs and the promotion's reports.
def artifact(key):
    return contracts.audit_path(key, config["audit"])


def per_candidate(key):
    """A comparison's artifact: in a sweep under candidates/{candidate}/, else where a two-arm audit keeps it."""
    if not SWEEP:
        return artifact(key)
    return contracts.candidate_path(key, config["audit"], "{candidate}")


def per_candidate_log(rel):
    """A per-candidate job's log (its wildcards must be its outputs')."""
    return f"{LOGS}/candidates/{{candidate}}/{rel}" if SWEEP else f"{LOGS}/{rel}"


# A per-candidate output's candidate: the wildcard in a sweep, the one candidate otherwise.
CANDIDATE = "{candidate}" if SWEEP else "candidate"


def cand(wildcards):
    """The candidate a per-candidate job compares with the control (`candidate` in the two-arm form)."""
    return getattr(wildcards, "candidate", "candidate")


SPEC = artifact(contracts.ARM_SPEC_SCHEMA)
DATASET = artifact(contracts.DATASET_SCHEMA)
REQUESTS = artifact(contracts.REQUESTS_SCHEMA)
BOUNDARY_PLAN = artifact(contracts.BOUNDARY_PLAN_SCHEMA)
LAUNCH = artifact(contracts.LAUNCH_SCHEMA)
PREFLIGHT = artifact(contracts.PREFLIGHT_SCHEMA)
PHASE = artifact(contracts.PHASE_SCHEMA)
BOUNDARY = artifact(contracts.BOUNDARY_SCHEMA)
BOUNDARY_GATE = per_candidate(contracts.BOUNDARY_GATE_SCHEMA)
SAMPLED = artifact(contracts.SAMPLED_SCHEMA)
SCORES = artifact(contracts.SCORES_SCHEMA)
PAIRED = per_candidate(contracts.PAIRED_SCHEMA)
GREEDY = per_candidate(contracts.GREEDY_SCHEMA)
DIVERGENCE = per_candidate(contracts.DIVERGENCE_SCHEMA)
SPEED_DECISION = per_candidate(contracts.SPEED_DECISION_SCHEMA)
STARTS_LOG = artifact(contracts.SERVER_START_SCHEMA)
DECISION = per_candidate(contracts.DECISION_SCHEMA)
MANIFEST = per_candidate(contracts.MANIFEST_SCHEMA)
CALIBRATION_SUMMARY = artifact(contracts.CALIBRATION_SCHEMA)
LEDGER = artifact(contracts.LEDGER_SCHEMA)
DIAGNOSTICS_PHASE = per_candidate(contracts.DIAGNOSTICS_PHASE)
JOURNAL = artifact(contracts.JOURNAL)
JOURNAL_SAMPLED = artifact(contracts.JOURNAL_SAMPLED)
LOGS = artifact(contracts.LOGS)

SPEED_STREAMS = artifact(contracts.SPEED_STREAMS_SCHEMA)
SPEED_LOG = f"{LOGS}/speed.log"


def server_log(name):
    """The log of one phase's server: ``name`` is the phase and arm (or bracket start), wildcards allowed."""
    return artifact(contracts.SERVER_LOG).format(name=name)


BISECT = per_candidate(contracts.BISECT_SCHEMA)


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


SERVER_STAGES = {"answers", "speed", "bisect"}


wildcard_constraints:
    arm="|".join(re.escape(a) for a in ARMS),
    candidate="|".join(re.escape(c) for c in CANDIDATES),
    dataset="|".join(re.escape(d) for d in DATASETS),


def arm_config(wildcards):
    return config["arms"][wildcards.arm]


def arm_gpus(wildcards):
    return int(config["arms"][wildcards.arm].get("gpus", 0))


# Jobs that run both arms' servers one after the other (speed bracket,
# bisection) need the larger of the two arms' accelerator counts
# (in a sweep, of any arm's: one rule serves every candidate).
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


def fill(pattern, candidate, **fields):
    """A per-candidate pattern with its candidate (and any other fields) filled, the rest kept as wildcards."""
    keep = {k: f"{{{k}}}" for k in ("dataset", "arm") if k not in fields}
    return pattern.format(candidate=candidate, **fields, **keep)


def greedy_paths(candidate="candidate"):
    """Both arms' greedy runs per dataset, by role; a candidate's are its own, as is the control's selection."""
    return {
        d: {
            "control": fill(GREEDY, candidate, dataset=d, arm="control"),
            "candidate": fill(GREEDY, candidate, dataset=d, arm=candidate),
        }
        for d in DATASETS
    }


def divergence_paths(candidate="candidate"):
    return {d: fill(DIVERGENCE, candidate, dataset=d) for d in DATASETS}


def role_inputs(pattern, candidate, answered_too=False, **fields):
    """``{key}_control`` and ``{key}_candidate`` of a per-arm pattern: the control and this candidate."""
    arms = {"control": "control", "candidate": candidate}
    if answered_too:
        return {role: answered(pattern, arm) for role, arm in arms.items()}
    return {role: pattern.format(arm=arm, **fields) for role, arm in arms.items()}


SWEEP_SUMMARY = contracts.sweep_path(contracts.SWEEP_SUMMARY, config["audit"])
SWEEP_SUMMARY_MD = contracts.sweep_path(contracts.SWEEP_SUMMARY_MD, config["audit"])
SWEEP_SUMMARY_HTML = contracts.sweep_path(contracts.SWEEP_SUMMARY_HTML, config["audit"])


def promotion_later_inputs(wildcards):
    """The optional gates' artifacts: an audit without the stage still decides (INCONCLUSIVE)."""
    c = cand(wildcards)
    later = {}
    if BOUNDARY_ON:
        later["boundary"] = fill(BOUNDARY_GATE, c)
    if SPEED_ON:
        later["speed"] = fill(SPEED_DECISION, c)
    return later


def paired_inputs(wildcards):
    d, c = wildcards.dataset, cand(wildcards)
    return {
        "dataset": DATASET.format(dataset=d),
        **{f"sampled_{r}": p for r, p in role_inputs(SAMPLED, c, dataset=d).items()},
        **{f"scores_{r}": p for r, p in role_inputs(SCORES, c, dataset=d).items()},
    }


# Per-candidate inputs and params (in a sweep, of the {candidate} wildcard's candidate).


def diagnostics_inputs(wildcards):
    c = cand(wildcards)
    # The answers phases made the greedy runs (their journals). Their records are not `ancient` here:
    # Snakemake never looks at the own triggers (params) of a job it reaches only through `ancient` inputs
    # of a job that reruns, so a rerun answers phase (new greedy runs) must rerun this job, which starts no
    # server and takes a second.
    roles = {
        "receipt": role_inputs(LAUNCH, c, answered_too=True),
        "preflight": role_inputs(PREFLIGHT, c, answered_too=True),
        "answers": role_inputs(PHASE, c),
    }
    return {
        "datasets": expand(DATASET, dataset=DATASETS),
        "paired": [fill(PAIRED, c, dataset=d) for d in DATASETS],
        **{f"{k}_{r}": p for k, by_role in roles.items() for r, p in by_role.items()},
    }


# A sweep's speed: shared-control brackets (C, T1, C, T2, ..., C; pairaudit/speed/sweep.py), each
# writing one decision per candidate it measured (docs/sweeps.md). Candidates measured together
# stay together: a candidate whose speed decision is on disk keeps the bracket it was measured in
# (the decision records that bracket's candidates), and the candidates without one share a new
# bracket. So adding a candidate to a finished sweep measures only the new one, against control
# starts of its own, and removing one reruns no bracket: the measured decisions stay as they are.
def recorded_bracket(candidate):
    """The candidates of the bracket the candidate's speed decision on disk was measured in, or None."""
    try:
        doc = json.loads(Path(fill(SPEED_DECISION, candidate)).read_text())
    except (OSError, ValueError):
        return None
    members = (
        (doc.get("sweep") or {}).get("candidates") if isinstance(doc, dict) else None
    )
    if not isinstance(members, list) or candidate not in members:
        return None
    return [str(m) for m in members]


def bracket_name(members):
    """A bracket's name from its candidates in bracket order: the same candidates, the same bracket."""
    return f"bracket-{hashlib.sha256(','.join(members).encode()).hexdigest()[:10]}"


def speed_brackets():
    """Bracket name -> its candidates in bracket order (a sweep's; see above)."""
    brackets, placed = {}, set()
    for c in CANDIDATES:
        members = None if c in placed else recorded_bracket(c)
        if members and not placed.intersection(members):
            brackets[bracket_name(members)] = members
            placed.update(members)
    new = [c for c in CANDIDATES if c not in placed]
    if new:
        brackets[bracket_name(new)] = new
    return brackets


def bracket_inputs(members):
    """Every arm's spec, launch receipt and rehearsal, keyed by its name: the control and each candidate.
    A candidate since removed from the config keeps its files on disk, and its bracket is not rerun.
    """
    return {
        f"{k}_{a}": p
        for a in ["control", *members]
        for k, p in (
            ("spec", SPEC.format(arm=a)),
            ("launch", answered(LAUNCH, a)),
            ("preflight", answered(PREFLIGHT, a)),
        )
    }


def bracket_streams(name):
    """A bracket's streams.jsonl: beside the two-arm audit's, in a folder named after the bracket."""
    folder, file = os.path.split(SPEED_STREAMS)
    return f"{folder}/{name}/{file}"


def speed_inputs(wildcards):
    c = cand(wildcards)
    return {
        **{f"spec_{r}": p for r, p in role_inputs(SPEC, c).items()},
        **{
            f"launch_{r}": p
            for r, p in role_inputs(LAUNCH, c, answered_too=True).items()
        },
        **{
            f"preflight_{r}": p
            for r, p in role_inputs(PREFLIGHT, c, answered_too=True).items()
        },
    }


def speed_server_logs(wildcards):
    """One per start the bracket may grow to: control, candidate, control, ..."""
    return {
        f"s{k + 1}": server_log(
            f"speed-s{k + 1}-{'control' if k % 2 == 0 else 'candidate'}"
        )
        for k in range(SETTINGS.speed.max_starts)
    }


def boundary_gate_inputs(wildcards):
    c = cand(wildcards)
    # the cases are `ancient`: the answers phase rewrites them when it
    # reruns for a dataset; the plan and the specs rerun the gate
    return {
        "plan": BOUNDARY_PLAN,
        **{f"spec_{r}": p for r, p in role_inputs(SPEC, c).items()},
        **role_inputs(BOUNDARY, c, answered_too=True),
        **{
            f"launch_{r}": p
            for r, p in role_inputs(LAUNCH, c, answered_too=True).items()
        },
    }


def decision_inputs(wildcards):
    c = cand(wildcards)
    arms = ["control", c]
    return {
        **promotion_later_inputs(wildcards),
        "paired": [fill(PAIRED, c, dataset=d) for d in DATASETS],
        "scores": expand(SCORES, dataset=DATASETS, arm=arms),
        "launch": expand(LAUNCH, arm=arms),
        "preflight": expand(PREFLIGHT, arm=arms),
        "answers": expand(PHASE, arm=arms),
        "divergence": list(divergence_paths(c).values()),
    }


def bisect_inputs(wildcards):
    c = cand(wildcards)
    return {
        "divergence": list(divergence_paths(c).values()),
        "greedy": [fill(GREEDY, c, dataset=d, arm="control") for d in DATASETS],
    }


def bisect_config(wildcards):
    return change_form.candidate_config(config, cand(wildcards))
