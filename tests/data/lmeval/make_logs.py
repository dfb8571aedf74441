"""Make the lm-eval sample logs in this folder: real lm-eval against the embedded reference server, both arms.

Run from the repository root (lm-eval in a venv of its own; see README.md here)::

    python tests/data/lmeval/make_logs.py [--task arith_tiny] [control] [candidate]

(``python``: one with lm-eval 0.4.13 and the project importable.) For each
arm of config/config.yaml (the control's and the candidate's reference-server
switches) it starts the reference server on a free loopback port, runs
``python -m lm_eval --model local-completions`` on one local task of
``task/`` (``arith_tiny``: twelve items of the project's generated arith
suite; a benchmark's own items are never committed here), and copies lm-eval's own output
(``samples_<task>_<timestamp>.jsonl``, ``results_<timestamp>.json``) into
``<task>/<arm>/``, with the exact command in ``<task>/<arm>/command.txt``.
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

from refserver_fixture import RefServer  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def arm_env(arm: str) -> dict[str, str]:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    return {k: str(v) for k, v in cfg["arms"][arm]["env"].items()}


def run_arm(task: str, arm: str) -> None:
    env = arm_env(arm)
    server = RefServer(env, max_model_len=2048)
    try:
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
                   "--model_args", f"model={MODEL},base_url={server.url}/v1/completions,num_concurrent=2,"
                                   "max_retries=1,timeout=3600,tokenized_requests=False,tokenizer_backend=None,seed=1234",
                   "--tasks", task, "--include_path", str(HERE / "task"),
                   "--output_path", out, "--log_samples", "--seed", "1234"]
            subprocess.run(cmd, cwd=REPO, check=True, env={**_clean_env(), "HF_DATASETS_OFFLINE": "1",
                                                          "HF_HUB_OFFLINE": "1"})
            dest = HERE / task / arm
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
    name = "arith_tiny"
    if args[:1] == ["--task"]:
        name, args = args[1], args[2:]
    for a in args or ["control", "candidate"]:
        run_arm(name, a)
