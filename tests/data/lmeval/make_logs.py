"""Make the lm-eval sample logs in this folder: real lm-eval against the embedded reference server, both arms.

Run from the repository root (lm-eval in a venv of its own; see README.md here)::

    python tests/data/lmeval/make_logs.py [--task arith_tiny] [--seed 1234] [control] [candidate]

(``python``: one with lm-eval 0.4.13 and the project importable.) For each
arm of config/config.yaml (the control's and the candidate's reference-server
switches, derived from its ``server`` + ``change`` as the workflow derives them) it starts the reference server on a free loopback port, runs
``python -m lm_eval --model local-completions`` on one local task of
``task/`` (``arith_tiny``: twelve items of the project's generated arith
suite; a benchmark's own items are never committed here), and copies lm-eval's own output
(``samples_<task>_<timestamp>.jsonl``, ``results_<timestamp>.json``) into
``<task>/<arm>/``, with the exact command in ``<task>/<arm>/command.txt``.
``--seed`` sets lm-eval's API seed (``model_args`` seed) and its own seeds
(default 1234); a run at another seed goes to ``<task>/<arm>-seed<N>/``.
Not a test: the tests read what it wrote, so CI needs no lm-eval.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from refserver_fixture import RefServer  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def arm_env(arm: str) -> dict[str, str]:
    """The arm's environment switches, from the config's change form (or its two stated arms)."""
    from pairaudit.plans import change

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    problems = change.derive_arms(cfg)
    if problems:
        raise SystemExit("config/config.yaml: " + "; ".join(problems))
    return {k: str(v) for k, v in (cfg["arms"][arm].get("env") or {}).items()}


def run_arm(task: str, arm: str, seed: int = 1234) -> None:
    env = arm_env(arm)
    server = RefServer(env, max_model_len=2048)
    try:
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
                   "--model_args", f"model={MODEL},base_url={server.url}/v1/completions,num_concurrent=2,"
                                   f"max_retries=1,timeout=3600,tokenized_requests=False,tokenizer_backend=None,seed={seed}",
                   "--tasks", task, "--include_path", str(HERE / "task"),
                   "--output_path", out, "--log_samples", "--seed", str(seed)]
            subprocess.run(cmd, cwd=REPO, check=True, env={**_clean_env(), "HF_DATASETS_OFFLINE": "1",
                                                          "HF_HUB_OFFLINE": "1"})
            dest = HERE / task / (arm if seed == 1234 else f"{arm}-seed{seed}")
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for f in Path(out).rglob("*.json*"):
                shutil.copy(f, dest / f.name)
            shown = [("python" if a == sys.executable else a) for a in cmd]
            shown[shown.index("--output_path") + 1] = "<tmpdir>"
            shown = [a.replace(server.url, "http://127.0.0.1:<port>") for a in shown]
            shown = [a.replace(str(HERE), "tests/data/lmeval") for a in shown]
            (dest / "command.txt").write_text(
                f"# lm-eval {importlib.metadata.version('lm-eval')}, against the reference server started with "
                f"the {arm} arm's switches {env} (pairaudit.refserver --max-model-len 2048), run from the "
                "repository root with HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1:\n" + " ".join(shown) + "\n")
    finally:
        server.stop()


def _clean_env() -> dict[str, str]:
    import os

    return dict(os.environ)


if __name__ == "__main__":
    args = sys.argv[1:]
    name, seed = "arith_tiny", 1234
    while args[:1] in (["--task"], ["--seed"]):
        if args[0] == "--task":
            name = args[1]
        else:
            seed = int(args[1])
        args = args[2:]
    for a in args or ["control", "candidate"]:
        run_arm(name, a, seed)
