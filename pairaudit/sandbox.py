"""Run model-written Python under resource limits: a guard, NOT a security boundary.

This module keeps honest-but-buggy generated code (infinite loops, memory
blow-ups, runaway output, stray forks, accidental network use) from disturbing
the audit or the host. It does not stop a program written to escape: the
program can still read every file its uid may read, shares the host kernel,
and (without a network namespace) the network. A later issue hardens it (e.g.
bubblewrap with a private mount namespace and seccomp).

Layers, each recorded in the result's ``isolation`` list only when it was
actually applied:

- ``rlimits``       RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0
- ``tmpdir``        a private, fresh working directory (also HOME and TMPDIR), deleted after
- ``scrubbed-env``  only PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED (+ ``env_extra``)
- ``netns``         a new, empty network namespace (``unshare --net``): no route anywhere
- ``pidns``         a new PID namespace: every process the program leaves behind dies with it
- ``uid``           when we are root, the program runs as a fresh unprivileged uid, so
                    RLIMIT_NPROC is enforced (root is exempt) and leftovers can be swept

Why no ``preexec_fn``: the scorer runs sandboxes from a thread pool, and
Python documents ``preexec_fn`` as unsafe with threads (the child may deadlock
before exec). Instead a tiny launcher (``python -I -S -c``) sets the limits,
drops the uid, forks the program and waits for it; it is PID 1 of the new PID
namespace when that is available, so its exit tears the namespace down.

Result record (plain dict)::

    {"status": "passed" | "failed" | "timeout" | "error",
     "returncode": int | None,      # the program's exit code; 128+N = it died of signal N;
                                    # negative = the sandbox itself was killed (wall timeout)
     "signal": str | None,          # e.g. "SIGXCPU", "SIGKILL" when the program died of a signal
     "timeout_kind": "wall" | "cpu" | None,
     "wall_s": float,
     "stdout_tail": str, "stderr_tail": str,   # last ``tail_chars`` characters
     "stdout_bytes": int, "stderr_bytes": int, # how much was written in total (capped by RLIMIT_FSIZE)
     "isolation": [str, ...],
     "limits": {"timeout_s", "cpu_s", "memory_mb", "fsize_mb", "nproc"},
     "python": str,                 # the interpreter that ran the program
     "error": str | None}           # only for status "error" (could not start)
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TAIL_CHARS = 4000

# Marker the launcher writes to stderr when the program died of a signal: PID 1
# of a PID namespace cannot re-raise a default-action signal on itself, so the
# signal has to be reported in band.
_SIGNAL_MARK = "pairaudit-sandbox: program killed by signal "

_LAUNCHER = r"""
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value[0], value[1]))
if cfg.get("uid") is not None:
    os.setgroups([])
    os.setgid(cfg["gid"])
    os.setuid(cfg["uid"])
pid = os.fork()
if pid == 0:
    try:
        os.execv(cfg["python"], [cfg["python"], "-I", cfg["program"]])
    except BaseException as exc:
        os.write(2, ("pairaudit-sandbox: cannot start program: %r\n" % (exc,)).encode())
    os._exit(127)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except ChildProcessError:
        os._exit(126)
    except InterruptedError:
        continue
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = str(sig)
    os.write(2, ("\n%s%s\n" % (cfg["mark"], name)).encode())
    os._exit(128 + sig)
os._exit(os.WEXITSTATUS(status))
"""

# Fresh uids for dropped-privilege runs are drawn from a range no real account
# uses, so RLIMIT_NPROC counts only this run's processes and the sweep after
# the run cannot touch anyone else's.
_UID_BASE = 3_100_000
_UID_SPAN = 800_000
_uid_lock = threading.Lock()
_uid_counter = [secrets.randbelow(_UID_SPAN)]


def _next_uid() -> int:
    with _uid_lock:
        _uid_counter[0] = (_uid_counter[0] + 1) % _UID_SPAN
        return _UID_BASE + _uid_counter[0]


def _unshare_prefix(layers: tuple[str, ...]) -> list[str]:
    cmd = ["unshare"]
    if "netns" in layers:
        cmd.append("--net")
    if "pidns" in layers:
        cmd += ["--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        # Unprivileged: namespaces need a user namespace of our own.
        cmd.append("--map-root-user")
    return cmd if len(cmd) > 1 else []


def _candidate_pythons(requested: str | None) -> list[str]:
    if requested:
        return [requested]
    found = [sys.executable]
    # When we are root and this interpreter lives where an unprivileged uid
    # cannot read it (e.g. under /root), a system python3 of the same
    # major.minor keeps the "uid" layer; the result records which ran.
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and os.path.realpath(cand) != os.path.realpath(sys.executable):
            found.append(cand)
    return found


def _same_minor(python: str) -> bool:
    try:
        out = subprocess.run([python, "-I", "-S", "-c",
                              "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return out == "%d.%d" % sys.version_info[:2]


@functools.lru_cache(maxsize=None)
def probe_isolation(python: str | None = None) -> tuple[str, tuple[str, ...]]:
    """Pick the interpreter and the optional layers (netns, pidns, uid) that work here; probed once.

    Each combination is tried with the real launcher and a trivial program,
    strongest first, so a layer is only claimed when a program actually ran
    under it. Returns ``(python, layers)``.
    """
    root = os.geteuid() == 0
    combos = [("netns", "pidns", "uid"), ("netns", "uid"), ("netns", "pidns"), ("netns",),
              ("pidns",), ("uid",), ()]
    if not root:
        combos = [c for c in combos if "uid" not in c]
    if shutil.which("unshare") is None:
        combos = [c for c in combos if "netns" not in c and "pidns" not in c]
    pythons = _candidate_pythons(python)
    pythons = [pythons[0]] + [p for p in pythons[1:] if _same_minor(p)]
    best: tuple[str, tuple[str, ...]] | None = None
    for py in pythons:
        for layers in combos:
            res = _run("print('ok')", layers=layers, python=py, timeout_s=20, cpu_s=10,
                       memory_mb=512, fsize_mb=1, nproc=16, env_extra=None)
            if res["status"] == "passed" and res["stdout_tail"].strip() == "ok":
                if best is None or len(layers) > len(best[1]):
                    best = (py, layers)
                break
        if best is not None and len(best[1]) == len(combos[0]):
            break
    return best if best is not None else (pythons[0], ())


def _tail(path: Path, chars: int) -> tuple[str, int]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        # 4 bytes per char covers any UTF-8 sequence so the tail is never short.
        fh.seek(max(0, size - 4 * chars))
        text = fh.read().decode("utf-8", errors="replace")
    return text[-chars:], size


def _sweep_uid(uid: int, python: str) -> None:
    """Kill every process still owned by the run's private uid.

    ``kill(-1, SIGKILL)`` from a process with that uid reaches exactly the
    processes of that uid (the sender itself excepted): programs that called
    setsid() to leave the process group are caught here when no PID namespace
    is available.
    """
    try:
        subprocess.run(
            [python, "-I", "-S", "-c",
             "import os\ntry:\n os.kill(-1, 9)\nexcept OSError:\n pass"],
            user=uid, group=uid, extra_groups=[], env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=30, cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        pass


def _run(program: str, *, layers: tuple[str, ...], python: str, timeout_s: float, cpu_s: int,
         memory_mb: int, fsize_mb: int, nproc: int, env_extra: dict | None,
         tail_chars: int = TAIL_CHARS) -> dict:
    limits = {"timeout_s": timeout_s, "cpu_s": cpu_s, "memory_mb": memory_mb,
              "fsize_mb": fsize_mb, "nproc": nproc}
    isolation = ["rlimits", "tmpdir", "scrubbed-env"] + list(layers)
    uid = _next_uid() if "uid" in layers else None
    io_dir = Path(tempfile.mkdtemp(prefix="pairaudit-sbio-"))   # ours only: 0700
    work = Path(tempfile.mkdtemp(prefix="pairaudit-sb-"))
    t0 = time.monotonic()
    proc = None
    try:
        prog_path = work / "program.py"
        prog_path.write_text(program, encoding="utf-8")
        if uid is not None:
            for p in (work, prog_path):
                os.chown(p, uid, uid)
        mb = 1024 * 1024
        cfg = {
            "rlimits": {
                # Hard CPU limit one second above soft: SIGXCPU first, then SIGKILL.
                "RLIMIT_CPU": [int(cpu_s), int(cpu_s) + 1],
                "RLIMIT_AS": [int(memory_mb) * mb, int(memory_mb) * mb],
                "RLIMIT_FSIZE": [int(fsize_mb) * mb, int(fsize_mb) * mb],
                "RLIMIT_NPROC": [int(nproc), int(nproc)],
                "RLIMIT_CORE": [0, 0],
            },
            "uid": uid, "gid": uid, "python": python,
            "program": str(prog_path), "mark": _SIGNAL_MARK,
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "HOME": str(work), "TMPDIR": str(work), "PYTHONHASHSEED": "0"}
        env.update({str(k): str(v) for k, v in (env_extra or {}).items()})
        cmd = _unshare_prefix(layers) + [python, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg)]
        out_path, err_path = io_dir / "stdout", io_dir / "stderr"
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True,
                                        close_fds=True)
            except OSError as exc:
                return {"status": "error", "returncode": None, "signal": None, "timeout_kind": None,
                        "wall_s": round(time.monotonic() - t0, 4), "stdout_tail": "",
                        "stderr_tail": "", "stdout_bytes": 0, "stderr_bytes": 0,
                        "isolation": isolation, "limits": limits, "python": python,
                        "error": f"could not start sandbox: {exc}"}
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
        wall = time.monotonic() - t0
        stdout_tail, out_bytes = _tail(out_path, tail_chars)
        stderr_tail, err_bytes = _tail(err_path, tail_chars)
        sig = None
        if _SIGNAL_MARK in stderr_tail:
            sig = stderr_tail.rsplit(_SIGNAL_MARK, 1)[1].strip().split()[0]
        elif rc is not None and rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        timeout_kind = "wall" if timed_out else ("cpu" if sig == "SIGXCPU" else None)
        if timeout_kind:
            status = "timeout"
        elif rc == 0:
            status = "passed"
        else:
            status = "failed"
        return {"status": status, "returncode": rc, "signal": sig, "timeout_kind": timeout_kind,
                "wall_s": round(wall, 4), "stdout_tail": stdout_tail, "stderr_tail": stderr_tail,
                "stdout_bytes": out_bytes, "stderr_bytes": err_bytes,
                "isolation": isolation, "limits": limits, "python": python, "error": None}
    finally:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if uid is not None:
            _sweep_uid(uid, python)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def run_python(program: str, *, timeout_s: float = 10, cpu_s: int = 10, memory_mb: int = 512,
               fsize_mb: int = 16, nproc: int = 64, env_extra: dict | None = None,
               isolate_network: bool = True, python: str | None = None,
               tail_chars: int = TAIL_CHARS) -> dict:
    """Run ``program`` (Python source) in a child process under the guard described above.

    ``isolate_network=False`` skips the network namespace (used by tests to
    show that their network probe really detects a connection). ``python``
    defaults to this interpreter, or to a system ``python3`` of the same
    major.minor when only that one can run under an unprivileged uid; the
    programs need only the standard library (MBPP/HumanEval tests need no
    more). The result's ``python`` names the interpreter that ran.
    """
    python, layers = probe_isolation(python)
    if not isolate_network:
        layers = tuple(layer for layer in layers if layer != "netns")
    return _run(program, layers=layers, python=python, timeout_s=timeout_s, cpu_s=cpu_s,
                memory_mb=memory_mb, fsize_mb=fsize_mb, nproc=nproc, env_extra=env_extra,
                tail_chars=tail_chars)
