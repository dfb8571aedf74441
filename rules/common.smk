import hashlib
import os
from pathlib import Path

from pairaudit.datasets import source_fingerprint

R = f"results/{config['audit']}"
ARMS = ["control", "candidate"]
DATASETS = {d["name"]: d for d in config["datasets"]}
BASE = Path(workflow.basedir)
CACHE = str(Path(workflow.basedir) / ".cache")

# What each stage's behaviour depends on.  Their content hash is a parameter,
# so an edit reruns the stage while a `touch` does not (the profile turns the
# mtime and code triggers off: see profiles/default/config.yaml).
STAGE_CODE = {
    "launch": [
        "pairaudit/launch.py",
        "pairaudit/client.py",
        "pairaudit/modelstore.py",
        "pairaudit/refserver",
    ],
    "preflight": ["pairaudit/preflight.py", "pairaudit/client.py"],
    "dataset": ["pairaudit/datasets.py", "pairaudit/suites.py"],
    "sampled": ["pairaudit/sampled.py", "pairaudit/client.py"],
    "score": ["pairaudit/scoring.py", "pairaudit/sandbox.py"],
    "paired": ["pairaudit/stats.py", "pairaudit/rules.py"],
    "greedy": ["pairaudit/greedy.py", "pairaudit/client.py", "pairaudit/sampled.py"],
    "divergence": ["pairaudit/greedy.py", "pairaudit/rules.py", "pairaudit/launch.py"],
    "promotion": ["pairaudit/report.py", "pairaudit/rules.py"],
    "boundary": [
        "pairaudit/boundary.py",
        "pairaudit/client.py",
        "pairaudit/launch.py",
        "pairaudit/progress.py",
    ],
    "boundary_gate": ["pairaudit/boundary.py", "pairaudit/rules.py"],
    "speed": [
        "pairaudit/speed.py",
        "pairaudit/rules.py",
        "pairaudit/stats.py",
        "pairaudit/client.py",
        "pairaudit/launch.py",
    ],
}


def code_hash(stage):
    h = hashlib.sha256()
    files = []
    for rel in STAGE_CODE[stage] + [
        "pairaudit/stages.py",
        "pairaudit/artifacts.py",
        f"scripts/{stage}.py",
    ]:
        p = BASE / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    for f in files:
        h.update(str(f.relative_to(BASE)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


CODE = {stage: code_hash(stage) for stage in STAGE_CODE}


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


def dataset_config(wildcards):
    return DATASETS[wildcards.dataset]


def dataset_where(wildcards):
    return f"datasets[{list(DATASETS).index(wildcards.dataset)}]"


def dataset_source_sha256(wildcards):
    return source_fingerprint(DATASETS[wildcards.dataset]["source"], base_dir=BASE)


def paired_inputs(wildcards):
    d = wildcards.dataset
    return {
        "dataset": f"{R}/datasets/{d}.json",
        "sampled_control": f"{R}/sampled/{d}/control.jsonl",
        "sampled_candidate": f"{R}/sampled/{d}/candidate.jsonl",
        "scores_control": f"{R}/scores/{d}/control.jsonl",
        "scores_candidate": f"{R}/scores/{d}/candidate.jsonl",
    }
