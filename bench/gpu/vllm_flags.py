"""Check a vLLM config's flags against the vLLM that will run it; write the config this vLLM can start.

The examples are written for the vLLM releases the project has read (0.26 on
the GPU hosts, 0.32's CPU build here); a flag that a host's vLLM does not
know stops every start at argument parsing.  This reads the server's own
``--help=all`` (plain ``--help``'s usage line where ``=all`` is not
understood) with ``$PAIRAUDIT_VLLM_PYTHON`` and, for every ``--flag`` of
``server.command`` and of the change's switches:

- known: kept;
- ``--kv-cache-memory-bytes`` unknown: replaced by ``--gpu-memory-utilization``
  computed from it (the bytes plus 2 GiB for the weights, activations and
  graphs of a small model, over the card's memory from nvidia-smi, rounded
  up to 0.01), so the KV cache stays near what the audit needs;
- any other unknown flag: dropped with its value, in both arms alike (it is
  the shared command).

The config to run is written to OUT (same audit name: its results are the
example's), and ``OUT.flags.json`` says what was kept, replaced and dropped.
Exit 0 with nothing changed, 0 with changes (printed), 2 when the help text
cannot be read (the original config is copied unchanged, and the run will
fail on its own words if a flag is unknown).

Usage: python3 bench/gpu/vllm_flags.py CONFIG OUT
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

GIB = 1 << 30
OVERHEAD_BYTES = 2 * GIB   # weights 0.26 GiB, peak activations 0.08, non-torch 0.22, graphs 0.12 (H100 log): rounded up


def help_text(python: str) -> str | None:
    base = [python, "-m", "vllm.entrypoints.openai.api_server"]
    env = {**os.environ, "PYTHONPATH": ""}
    for extra in (["--help=all"], ["--help"]):
        try:
            out = subprocess.run(base + extra, capture_output=True, text=True, timeout=300, env=env)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and "--model" in out.stdout:
            return out.stdout
    return None


def known(flag: str, text: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def gpu_total_bytes() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
        return int(float(out.stdout.strip().splitlines()[0])) * (1 << 20)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def adapt(command: list[str], text: str, total: int | None) -> tuple[list[str], list[dict]]:
    out: list[str] = []
    notes: list[dict] = []
    i = 0
    while i < len(command):
        arg = command[i]
        flag = arg.split("=", 1)[0] if arg.startswith("--") else None
        takes_value = "=" not in arg and i + 1 < len(command) and not str(command[i + 1]).startswith("--")
        if flag is None or known(flag, text):
            out.append(arg)
            i += 1
            continue
        value = arg.split("=", 1)[1] if "=" in arg else command[i + 1] if takes_value else None
        i += 2 if takes_value else 1
        if flag == "--kv-cache-memory-bytes" and value is not None and total:
            util = math.ceil(100 * (int(value) + OVERHEAD_BYTES) / total) / 100
            out += ["--gpu-memory-utilization", f"{util:.2f}"]
            notes.append({"flag": flag, "value": value, "action": "replaced",
                          "by": ["--gpu-memory-utilization", f"{util:.2f}"], "gpu_total_bytes": total})
        else:
            notes.append({"flag": flag, "value": value, "action": "dropped"})
    return out, notes


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    cfg = yaml.safe_load(src.read_text())
    python = os.environ.get("PAIRAUDIT_VLLM_PYTHON", ".venv-vllm/bin/python")
    text = help_text(python)
    report: dict = {"config": str(src), "python": python, "help_read": text is not None, "changes": []}
    if text is None:
        dst.write_text(src.read_text())
        Path(f"{dst}.flags.json").write_text(json.dumps(report, indent=1))
        print(f"vllm-flags: could not read {python}'s --help; {src} copied unchanged", file=sys.stderr)
        return 2
    cmd = [str(a) for a in cfg["server"]["command"]]
    new, notes = adapt(cmd, text, gpu_total_bytes())
    for sw in (cfg.get("change") or {}).get("switches") or []:
        if "flag" in sw and not known(sw["flag"], text):
            notes.append({"flag": sw["flag"], "action": "unknown change switch (kept: the change is the audit's)"})
    report["changes"] = notes
    if notes:
        cfg["server"]["command"] = new
        dst.write_text(yaml.safe_dump(cfg, sort_keys=False))
    else:
        dst.write_text(src.read_text())
    Path(f"{dst}.flags.json").write_text(json.dumps(report, indent=1))
    for n in notes:
        print(f"vllm-flags: {n}")
    print(f"vllm-flags: {len(notes)} change(s); config to run: {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
