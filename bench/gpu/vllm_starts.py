"""Start a config's control server a few times, each under a variant of its environment, and print where each
start's seconds went (``pairaudit.serving.startlog``): the experiment behind a setting that cuts a start.

Variants (``--variant NAME``, repeatable, in the order given; default ``as-is debug``):

- ``as-is``: the config's own command and environment;
- ``debug``: ``VLLM_LOGGING_LEVEL=DEBUG``, which stamps the steps vLLM logs only at debug level (where the
  banner-to-engine and the kernel warm-up seconds go);
- ``spawn`` / ``fork``: ``VLLM_WORKER_MULTIPROC_METHOD`` set, to see whether the engine process re-imports vLLM;
- ``ENV=VALUE``: any other variable.

A variant's variables go into this process's environment, which the server inherits (an arm's own ``env``
still wins): the arm's spec, and so its identity, is the config's.  Every start is stopped before the next.
One JSON line per start goes to ``--out`` (default stdout only).

Usage: python3 bench/gpu/vllm_starts.py CONFIG [--variant V ...] [--repeat N] [--out FILE] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from pairaudit.plans import change  # noqa: E402
from pairaudit.plans import stage as plans  # noqa: E402
from pairaudit.serving import armspec, launch, startlog  # noqa: E402

VARIANTS = {"as-is": {}, "debug": {"VLLM_LOGGING_LEVEL": "DEBUG"},
            "spawn": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, "fork": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}}


def variant_env(name: str) -> dict[str, str]:
    if name in VARIANTS:
        return dict(VARIANTS[name])
    if "=" in name:
        k, v = name.split("=", 1)
        return {k: v}
    raise SystemExit(f"unknown variant {name!r}: one of {', '.join(VARIANTS)} or ENV=VALUE")


def control_spec(config: str, logs: str | None, prefix: str) -> tuple[dict, armspec.ArmSpec, Path]:
    """The config's control arm as a launch spec (written beside its servers' logs), and that folder."""
    cfg = yaml.safe_load(Path(config).read_text())
    problems = change.derive_arms(cfg)
    if problems:
        raise SystemExit("\n".join(problems))
    folder = Path(logs or tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec-control.json"
    plans.arm_spec_stage(arm="control", arm_cfg=cfg["arms"]["control"], out_path=str(spec_path))
    return cfg, armspec.read_spec(spec_path, arm="control"), folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--variant", action="append", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="starts per variant")
    ap.add_argument("--out", default=None, help="append one JSON line per start here")
    ap.add_argument("--logs", default=None, help="server logs here (default: a temp dir)")
    args = ap.parse_args(argv)
    _, spec, logs = control_spec(args.config, args.logs, "vllm-starts-")
    rows = []
    for name in args.variant or ["as-is", "debug"]:
        env = variant_env(name)
        for k in range(args.repeat):
            saved = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            log_path = logs / f"{name.replace('=', '-').replace('/', '_')}-{k}.log"
            t0 = time.monotonic()
            try:
                with launch.Server(spec, log_path=log_path, timeout_s=spec.health_timeout_s or 900) as srv:
                    facts = srv.facts()
                error = None
            except Exception as exc:   # a variant that does not start is a result too
                facts, error = {}, str(exc).split("\n")[0]
            finally:
                for key, v in saved.items():
                    if v is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = v
            line = {"variant": name, "env": env, "start": k, "ready_s": facts.get("ready_s"),
                    "wall_s": round(time.monotonic() - t0, 1), "error": error, "log": str(log_path),
                    "breakdown": facts.get("breakdown")}
            rows.append({"phase": "bench", "arm": "control", "why": name, "event": "ready",
                         "ready_s": facts.get("ready_s"), "breakdown": facts.get("breakdown")})
            print(json.dumps(line), flush=True)
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(line) + "\n")
    print("\n".join(startlog.starts_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
