"""Run model-written Python in a sandbox meant to hold against deliberately hostile code.

Two mechanisms; every result says which one ran (``mechanism``) and, when the
stronger one could not, why (``fallback_reason``).

**bubblewrap** (primary; ``/usr/bin/bwrap``, no setuid bit needed): the program
runs in new PID, network, IPC, UTS and mount namespaces (plus a user namespace
when we are not root). Its file system is a fresh root holding only read-only
binds of what the interpreter needs (the Python prefix, ``/usr/lib``,
``/usr/lib64`` and the ``/lib*`` links), a new ``/proc`` showing only its own
processes, a minimal ``/dev``, and a size-capped tmpfs at ``/tmp`` -- the only
writable place, also HOME, TMPDIR and the working directory. No home
directory, no project tree, no ``results/``, no ``/etc``, no network but a
loopback of its own. ``--die-with-parent`` plus the PID namespace mean that
killing the outer ``bwrap`` kills every process the program made; ``_run``
returns only once that namespace is empty (the kernel empties it after bwrap
has already exited).
When we are root, the harness starts with only CAP_SETUID/CAP_SETGID, sets the
rlimits and drops to a fresh unprivileged uid before any model code runs
(``no_new_privs`` is set by bwrap), so RLIMIT_NPROC is enforced (root is
exempt from it).

**fallback** (``unshare``; when bwrap is absent or cannot run here): rlimits, a
private temp dir, a scrubbed environment, ``unshare --net`` / ``--pid`` where
they work, and the uid drop when root. It does NOT hide the file system: the
program can read whatever its uid may read.

Layers, recorded in the result's ``isolation`` list only when applied:

- ``rlimits``       RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_CORE=0

Memory is capped per process (RLIMIT_AS) and for the whole process tree: a
cgroup v2 ``memory.max`` where the host delegates one, else a watchdog that
sums the tree's memory every 50 ms (``memory`` in the result says which).
- ``tmpdir``        a private working directory (also HOME and TMPDIR), gone after the run
- ``scrubbed-env``  only PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED (+ ``env_extra``; bwrap adds PWD)
- ``netns``         a new network namespace: no route anywhere, host loopback unreachable
- ``pidns``         a new PID namespace: every process the program leaves behind dies with it
- ``uid``           when we are root, a fresh unprivileged uid
- ``mountns``       (bwrap) a private root file system as above; ``ipcns``, ``utsns`` likewise
- ``no-new-privs``  (bwrap) PR_SET_NO_NEW_PRIVS: no setuid binary can raise privileges
- ``seccomp``       (bwrap, x86_64) a filter refusing ptrace, mount, namespace creation
                    (unshare/setns/clone flags), bpf, keyctl, io_uring, perf, kexec,
                    module loading, process_vm_* and the x32 ABI (``seccomp_filter``)

The verdict of a test run (``run_tests``) cannot be faked by the exit code or
by printing: the harness reads a random per-run nonce from an inherited
descriptor that it closes before any model code runs, and reports the test
outcome, prefixed by the nonce, on a separate pipe only after every test ran.
Before any model code it installs an audit hook that refuses every later
audit hook, compiles the tests (so nothing sees their text being compiled),
and saves the collector's callbacks and thresholds. After the model's code it
turns automatic collection off, puts the callbacks and thresholds back (so no
gc callback or finalizer of the program's cyclic garbage runs again), fails
the run when the program left a thread running (it could re-patch), restores
the state of every imported module (``builtins``, ``sys``, the test
imports...), clears trace/profile hooks, and runs the tests with a clean copy
of the builtins, so patching ``assert``/``AssertionError``, builtins,
``sys.exit`` or modules the tests use, or re-patching them from a hook, does
not help. What remains possible for a program written against this harness
(docs/sandbox.md): reading the nonce out of the harness's own memory
(frame/gc introspection, ctypes), returning objects whose ``__eq__`` is always
true, patching state while a test calls it (from the tested function, or a
finalizer that a test's own objects trigger), or rewriting
interpreter memory with ctypes. Such a program is still contained; its score
is what cannot be trusted.

``run_calls`` (the split path, ``pairaudit/quality/split.py``) closes those:
the same harness runs the program, then evaluates call expressions the host
sends one at a time and answers each with its result as plain data (or
"not_plain" / "raised"); no test, expectation or nonce is in the sandbox, and
the host compares. Its result adds ``"calls": [CallResult, ...]``.

Result record (plain dict)::

    {"status": "passed" | "failed" | "timeout" | "error",
     "returncode": int | None,      # the program's exit code; 128+N = it died of signal N;
                                    # negative = the sandbox itself was killed (wall timeout)
     "signal": str | None,          # e.g. "SIGXCPU", "SIGKILL" when the program died of a signal
     "timeout_kind": "wall" | "cpu" | None,
     "wall_s": float,
     "stdout_tail": str, "stderr_tail": str,   # last ``tail_chars`` characters
     "stdout_bytes": int, "stderr_bytes": int, # how much was written in total (capped by RLIMIT_FSIZE)
     "mechanism": "bwrap" | "fallback",
     "fallback_reason": str | None, # why bwrap did not run (None when it did)
     "isolation": [str, ...],
     "limits": {"timeout_s", "cpu_s", "memory_mb", "fsize_mb", "nproc", "nofile"},
     "python": str,                 # the interpreter that ran the program
     "uid": int | None,             # the fresh uid it ran as ("uid" layer), else None
     "memory": {"bound": "cgroup-v2" | "watchdog",  # what held memory_mb for the whole process tree
                "limit_mb": int, "peak_mb": float | None,  # the tree's peak (watchdog: sampled PSS)
                "exceeded": bool,           # killed for memory: status "failed", whatever else happened
                "cgroup_reason": str | None},  # why no cgroup held it (None when one did)
     "error": str | None}           # only for status "error" (could not start)

``run_tests`` adds ``"harness": {"verified": bool, "total": int | None,
"failed": [{"test", "error"}] | None, "stage": "tests" | "solution" | None,
"error": str | None}``; its ``status`` is "passed" only when the verified
report says every test passed AND the process exited 0.
"""

from __future__ import annotations

import ast
import functools
import json
import marshal
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypedDict

from pairaudit.quality import harness

TAIL_CHARS = 4000
MECHANISMS = ("auto", "bwrap", "fallback")
# PAIRAUDIT_SANDBOX=fallback forces the fallback (for measurements, or hosts
# where bwrap misbehaves); "bwrap" makes its absence an error instead.
MECHANISM_ENV = "PAIRAUDIT_SANDBOX"

# Marker the fallback launcher writes to stderr when the program died of a
# signal: PID 1 of a PID namespace cannot re-raise a default-action signal on
# itself, so the signal has to be reported in band.
_SIGNAL_MARK = "pairaudit-sandbox: program killed by signal "

# The harness (pairaudit/quality/harness.py) runs as this text, by ``python -c``:
# the sandbox shows the child no project tree to run it from by path or -m.
_HARNESS = Path(harness.__file__).read_text(encoding="utf-8")

_LAUNCHER = r"""
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value[0], value[1]))
pid = os.fork()
if pid == 0:
    try:
        # Only the program drops its uid: the launcher (PID 1 of the namespace
        # when there is one) stays out of its reach for signals and ptrace.
        if cfg.get("uid") is not None:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
        os.execv(cfg["python"], cfg["argv"])
    except BaseException as exc:
        os.write(2, ("pairaudit-sandbox: cannot start program: %r\n" % (exc,)).encode())
    os._exit(127)
# The job and result descriptors belong to the program's harness alone.
for fd in cfg["close"]:
    try:
        os.close(fd)
    except OSError:
        pass
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


# ---------------------------------------------------------------- bubblewrap

# seccomp (x86_64 only): syscalls hostile code could use to attack the shared
# kernel or its neighbours, none of which a test program needs. EPERM, except
# clone3 -> ENOSYS so that libc falls back to clone, whose flags are checked.
_SECCOMP_DENY = {
    101: "ptrace", 103: "syslog", 134: "uselib", 135: "personality", 153: "vhangup", 155: "pivot_root",
    163: "acct", 165: "mount", 166: "umount2", 167: "swapon", 168: "swapoff", 169: "reboot",
    172: "iopl", 173: "ioperm", 175: "init_module", 176: "delete_module", 179: "quotactl",
    212: "lookup_dcookie", 246: "kexec_load", 248: "add_key", 249: "request_key", 250: "keyctl",
    272: "unshare", 298: "perf_event_open", 303: "name_to_handle_at", 304: "open_by_handle_at",
    308: "setns", 310: "process_vm_readv", 311: "process_vm_writev", 312: "kcmp", 313: "finit_module",
    320: "kexec_file_load", 321: "bpf", 323: "userfaultfd", 425: "io_uring_setup", 426: "io_uring_enter",
    427: "io_uring_register", 428: "open_tree", 429: "move_mount", 430: "fsopen", 431: "fsconfig",
    432: "fsmount", 433: "fspick", 442: "mount_setattr",
}
_NR_CLONE, _NR_CLONE3 = 56, 435
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NS_FLAGS = 0x7E020000


def seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program (``struct sock_filter[]``) for bwrap ``--seccomp``; None off x86_64."""
    import platform
    import struct
    if sys.byteorder != "little" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    deny = sorted(_SECCOMP_DENY)
    prog: list[tuple[int, int, int, int]] = []
    # Layout: 0 ld arch; 1 jeq x86_64; 2 ld nr; 3 jge x32; 4..: one jeq per denied nr;
    # then clone3, clone checks, and the return blocks at the end.
    n = len(deny)
    i_allow = 4 + n + 4
    i_eperm, i_enosys = i_allow + 1, i_allow + 2
    prog.append((ld, 0, 0, 4))                                   # arch
    prog.append((jeq, 0, i_eperm - 2, 0xC000003E))               # AUDIT_ARCH_X86_64, else EPERM
    prog.append((ld, 0, 0, 0))                                   # syscall nr
    prog.append((jge, i_eperm - 4, 0, 0x40000000))               # x32 ABI: refuse outright
    for k, nr in enumerate(deny):
        at = 4 + k
        prog.append((jeq, i_eperm - at - 1, 0, nr))
    at = 4 + n
    prog.append((jeq, i_enosys - at - 1, 0, _NR_CLONE3))         # clone3 -> ENOSYS
    prog.append((jeq, 0, i_allow - at - 2, _NR_CLONE))           # not clone -> allow
    prog.append((ld, 0, 0, 16))                                  # clone flags (args[0], low word)
    prog.append((jset, i_eperm - at - 4, 0, _CLONE_NS_FLAGS))    # new namespaces -> EPERM
    prog.append((ret, 0, 0, allow))
    prog.append((ret, 0, 0, eperm))
    prog.append((ret, 0, 0, enosys))
    assert len(prog) == i_enosys + 1
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def _bwrap_binds(python: str) -> list[str]:
    """Read-only binds of exactly what ``python`` needs, with world-traversable parents."""
    args: list[str] = []
    for top in ("/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    roots = [p for p in ("/usr/lib", "/usr/lib64") if os.path.isdir(p)]
    prefix = os.path.realpath(sys.base_prefix)
    if prefix not in ("/", "/usr"):
        roots.append(prefix)
    exe = os.path.realpath(python)
    if not any(exe.startswith(r + "/") for r in roots):
        roots.append(exe)
    made: set[str] = set()
    for root in roots:
        # bwrap creates missing parents 0700 (e.g. /root): the dropped uid
        # could not traverse them.
        parts = Path(root).parts[1:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if d not in made:
                made.add(d)
                args += ["--perms", "0755", "--dir", d]
        args += ["--ro-bind", root, root]
    return args


def _bwrap_cmd(python: str, env: dict, tmpfs_bytes: int) -> list[str]:
    root = os.geteuid() == 0
    if root:
        # As root, --unshare-all would add a user namespace mapping only uid 0,
        # where the harness could not drop to a fresh uid; the host user
        # namespace plus a real uid drop is stronger (RLIMIT_NPROC applies).
        cmd = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", "--cap-drop", "ALL",
               "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd = ["bwrap", "--unshare-all"]
    cmd += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    cmd += _bwrap_binds(python)
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(int(tmpfs_bytes)), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    return cmd


# ---------------------------------------------------------------- fallback

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


class _Limits(TypedDict):
    """The resource keywords of ``_run``."""
    timeout_s: float
    cpu_s: int
    memory_mb: int
    fsize_mb: int
    nproc: int
    nofile: int


_PROBE_LIMITS: _Limits = {"timeout_s": 20, "cpu_s": 10, "memory_mb": 512, "fsize_mb": 1, "nproc": 16, "nofile": 64}


@functools.lru_cache(maxsize=None)
def probe_isolation(python: str | None = None) -> tuple[str, tuple[str, ...]]:
    """The fallback's interpreter and optional layers (netns, pidns, uid) that work here; probed once.

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
            res = _run({"mode": "program", "code": "print('ok')"}, mechanism="fallback", layers=layers,
                       python=py, env_extra=None, fallback_reason=None, **_PROBE_LIMITS)
            if res["status"] == "passed" and res["stdout_tail"].strip() == "ok":
                if best is None or len(layers) > len(best[1]):
                    best = (py, layers)
                break
        if best is not None and len(best[1]) == len(combos[0]):
            break
    return best if best is not None else (pythons[0], ())


@functools.lru_cache(maxsize=None)
def probe_bwrap(python: str | None = None) -> tuple[str, str | None, bool]:
    """``(python, None, seccomp)`` when bwrap runs a trivial program here, else ``(python, reason, False)``.

    ``seccomp`` says whether it ran with the seccomp filter (tried first).
    """
    py = os.path.realpath(python or sys.executable)
    if shutil.which("bwrap") is None:
        return py, "bwrap not found on PATH", False
    why = "no attempt"
    for layers in ((("seccomp",),) if seccomp_filter() else ()) + ((),):
        res = _run({"mode": "program", "code": "print('ok')"}, mechanism="bwrap", layers=layers, python=py,
                   env_extra=None, fallback_reason=None, **_PROBE_LIMITS)
        if res["status"] == "passed" and res["stdout_tail"].strip() == "ok":
            return py, None, "seccomp" in layers
        last = res["stderr_tail"].strip().splitlines()[-1:]
        why = res.get("error") or (last[0] if last else f"exit {res['returncode']}")
    return py, f"bwrap could not run a trivial program: {why}"[:300], False


def choose(mechanism: str | None = None, python: str | None = None) -> dict:
    """Which mechanism runs: ``{"mechanism", "python", "layers", "fallback_reason"}``."""
    want = mechanism or os.environ.get(MECHANISM_ENV) or "auto"
    if want not in MECHANISMS:
        raise ValueError(f"sandbox mechanism ({MECHANISM_ENV} or mechanism=) {want!r} is not one of "
                         f"{', '.join(MECHANISMS)}")
    reason = None
    if want in ("auto", "bwrap"):
        py, reason, with_seccomp = probe_bwrap(python)
        if reason is None:
            layers: tuple[str, ...] = ("netns", "pidns", "mountns", "ipcns", "utsns", "no-new-privs")
            if with_seccomp:
                layers += ("seccomp",)
            if os.geteuid() == 0:
                layers += ("uid",)
            return {"mechanism": "bwrap", "python": py, "layers": layers, "fallback_reason": None}
        if want == "bwrap":
            return {"mechanism": "bwrap", "python": py, "layers": (), "fallback_reason": reason,
                    "unavailable": True}
    else:
        reason = f"{MECHANISM_ENV}/mechanism asked for the fallback"
    py, layers = probe_isolation(python)
    return {"mechanism": "fallback", "python": py, "layers": layers, "fallback_reason": reason}


# ---------------------------------------------------------------- memory of the whole program

# RLIMIT_AS caps each process; a program that forks can hold nproc times that.
# ``memory_mb`` is meant for the program as a whole, so every run also bounds
# the sum over its process tree, by one of two means (the result's
# ``memory.bound`` says which ran):
#
# - ``cgroup-v2``: a cgroup of the run's own with ``memory.max`` = the cap, no
#   swap and ``memory.oom.group`` (the kernel kills the whole group), where
#   this host delegates the memory controller to us (a writable cgroup v2
#   directory whose ``cgroup.subtree_control`` holds ``memory``);
# - ``watchdog`` (everywhere else): a thread that sums the proportional set
#   size (PSS; RSS where smaps_rollup is missing) of every process of the run
#   every WATCH_INTERVAL_S and kills them all once the sum is over the cap.
#   The run's processes are the launcher's descendants (a PID namespace keeps
#   the orphans of double forks among them) plus, under the ``uid`` layer,
#   every process of the run's private uid. It samples: an excursion shorter
#   than one interval can pass unseen, which the cgroup cannot.
MEMORY_BOUNDS = ("auto", "cgroup", "watchdog")
# PAIRAUDIT_SANDBOX_MEMORY=watchdog forces the watchdog (for tests and hosts whose cgroups misbehave);
# "cgroup" makes a host without a delegated cgroup an error instead; default "auto".
MEMORY_BOUND_ENV = "PAIRAUDIT_SANDBOX_MEMORY"
# A delegated cgroup v2 directory to make the runs' cgroups in, where it is not this process's own (or its parent).
CGROUP_PARENT_ENV = "PAIRAUDIT_SANDBOX_CGROUP"
WATCH_INTERVAL_S = 0.05


def _cgroup2_here() -> tuple[Path | None, str]:
    """This process's cgroup v2 directory, or (None, why not)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return None, f"cannot read this process's cgroups: {exc}"
    mount = None
    for line in mounts:
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            fields = left.split()
            mount = (fields[3], fields[4])   # the mount's root within the hierarchy, its mount point
            break
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    rel = next((g[3:] for g in groups if g.startswith("0::")), None)
    if rel is None:
        return None, "this process is in no cgroup v2 group"
    root, point = mount
    if root != "/" and (rel == root or rel.startswith(root + "/")):
        rel = rel[len(root):]
    return Path(point, rel.lstrip("/")), ""


@functools.lru_cache(maxsize=None)
def cgroup_parent() -> tuple[str | None, str | None]:
    """``(directory, None)`` where a run's own memory-limited cgroup can be made, else ``(None, why not)``.

    Tried: ``PAIRAUDIT_SANDBOX_CGROUP``, this process's cgroup, its parent. One
    qualifies when the memory controller is delegated to its children and a
    child with a ``memory.max`` can be made and removed there.
    """
    here, why = _cgroup2_here()
    cands = [Path(p) for p in (os.environ.get(CGROUP_PARENT_ENV),) if p]
    if here is not None:
        cands.append(here)
        if (here.parent / "cgroup.controllers").exists():   # still inside the hierarchy
            cands.append(here.parent)
    if not cands:
        return None, why
    reasons = []
    for cand in cands:
        try:
            ctl = (cand / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            reasons.append(f"{cand}: {exc.strerror or exc}")
            continue
        if "memory" not in ctl:
            reasons.append(f"{cand} does not delegate the memory controller to its children")
            continue
        probe = cand / f"pairaudit-probe-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
            (probe / "memory.max").write_text("max\n")
            return str(cand), None
        except OSError as exc:
            reasons.append(f"{cand}: cannot make a cgroup with a memory limit there ({exc.strerror or exc})")
        finally:
            try:
                probe.rmdir()
            except OSError:
                pass
    return None, ("no delegated cgroup v2 memory controller: " + "; ".join(reasons))[:400]


def choose_memory_bound(bound: str | None = None) -> tuple[str, str | None, str | None]:
    """``(bound, cgroup parent or None, why the cgroup did not run or None)``; bound "cgroup-v2" or "watchdog"."""
    want = bound or os.environ.get(MEMORY_BOUND_ENV) or "auto"
    if want not in MEMORY_BOUNDS:
        raise ValueError(f"sandbox memory bound ({MEMORY_BOUND_ENV}) {want!r} is not one of {', '.join(MEMORY_BOUNDS)}")
    if want == "watchdog":
        return "watchdog", None, f"{MEMORY_BOUND_ENV} asked for the watchdog"
    parent, why = cgroup_parent()
    if parent is not None:
        return "cgroup-v2", parent, None
    if want == "cgroup":
        raise RuntimeError(f"{MEMORY_BOUND_ENV}=cgroup, but {why}")
    return "watchdog", None, why


class _RunCgroup:
    """One run's cgroup: its processes together hold at most ``limit`` bytes; the kernel kills them all beyond."""

    def __init__(self, parent: str, limit: int):
        self.path = Path(parent, f"pairaudit-sb-{os.getpid()}-{secrets.token_hex(6)}")
        self.path.mkdir()
        (self.path / "memory.max").write_text(f"{int(limit)}\n")
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            try:
                (self.path / name).write_text(value + "\n")
            except OSError:
                pass

    def wrap(self, cmd: list[str]) -> list[str]:
        """Join the cgroup before anything of the run starts (so nothing forks outside it), then exec ``cmd``."""
        return ["/bin/sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", str(self.path / "cgroup.procs"), *cmd]

    def facts(self) -> tuple[bool, float | None]:
        """(the kernel killed for memory, the peak in MB where the kernel keeps one)."""
        killed = False
        try:
            for line in (self.path / "memory.events").read_text().splitlines():
                key, _, val = line.partition(" ")
                if key in ("oom_kill", "oom_group_kill") and int(val) > 0:
                    killed = True
        except (OSError, ValueError):
            pass
        try:
            peak = round(int((self.path / "memory.peak").read_text()) / (1024 * 1024), 1)
        except (OSError, ValueError):
            peak = None
        return killed, peak

    def remove(self) -> None:
        try:
            (self.path / "cgroup.kill").write_text("1\n")
        except OSError:
            pass
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, uid) of every process on the host."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            uid = os.stat(f"/proc/{name}").st_uid
        except (OSError, IndexError, ValueError):
            continue
        table[int(name)] = (ppid, uid)
    return table


def _tree(root: int, uid: int | None) -> set[int]:
    """``root`` and its descendants, plus every process of ``uid`` (the run's private uid) when given."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo += children.get(pid, [])
    if uid is not None:
        found |= {pid for pid, (_, u) in table.items() if u == uid}
    return found & set(table)


def _resident_bytes(pid: int) -> int:
    """Proportional set size (shared pages split between their users), or RSS where that is unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _MemoryWatch(threading.Thread):
    """Sums the run's memory every interval; over ``limit`` bytes, kills every process of the run, repeatedly."""

    def __init__(self, root: int, uid: int | None, limit: int, interval_s: float = WATCH_INTERVAL_S):
        super().__init__(daemon=True, name="sandbox-memory-watch")
        self.root, self.uid, self.limit, self.interval_s = root, uid, limit, interval_s
        self.peak = 0
        self.exceeded = False
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            pids = _tree(self.root, self.uid)
            pids.discard(os.getpid())
            total = sum(_resident_bytes(p) for p in pids)
            self.peak = max(self.peak, total)
            if total > self.limit or self.exceeded:
                self.exceeded = True
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


# ---------------------------------------------------------------- running

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


def _await_ns_gone(pid: int | None, deadline_s: float = 10.0) -> None:
    """Wait until the sandbox's PID-namespace init ``pid`` has become a zombie or vanished.

    The kernel lets a namespace's init finish exiting only after every other
    process of the namespace is gone, so this is the moment nothing the
    program started is left. Killing the outer bwrap returns before that.
    """
    if not pid:
        return
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in (b"Z", b"X"):
            return
        time.sleep(0.01)


def _await_uid_gone(uid: int, deadline_s: float = 10.0) -> None:
    """Wait until no process of the run's private uid is left (a torn-down namespace dies asynchronously)."""
    needle = f"Uid:\t{uid}\t".encode()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        alive = False
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/status", "rb") as fh:
                        if needle in fh.read():
                            alive = True
                            break
                except OSError:
                    continue
        if not alive:
            return
        time.sleep(0.02)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """``proc.wait(timeout)`` without its sleep-polling (up to 50 ms late per program): a pidfd wakes us."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return proc.wait(timeout=timeout_s)
    try:
        if not select.select([pidfd], [], [], timeout_s)[0]:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    finally:
        os.close(pidfd)
    return proc.wait()


def _ns_init_pid(info_fd: int) -> int | None:
    """The host pid of the sandbox's PID-namespace init, from bwrap's ``--info-fd`` document."""
    try:
        # bwrap's own document comes first; anything after it the program wrote.
        info, _ = json.JSONDecoder().raw_decode(_read_all(info_fd).decode("utf-8", "replace"))
        return int(info["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    parts = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        parts.append(chunk)
        if sum(map(len, parts)) > 1 << 20:
            break
    return b"".join(parts)


def _verified_report(raw: bytes, nonce: str) -> dict | None:
    """The harness's report: the last line that starts with this run's nonce."""
    tag = nonce + " "
    for line in reversed(raw.decode("utf-8", errors="replace").splitlines()):
        if line.startswith(tag):
            try:
                doc = ast.literal_eval(line[len(tag):])
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return None
            return doc if isinstance(doc, dict) else None
    return None


def _run(job: dict, *, mechanism: str, layers: tuple[str, ...], python: str, timeout_s: float,
         cpu_s: int, memory_mb: int, fsize_mb: int, nproc: int, nofile: int, env_extra: dict | None,
         fallback_reason: str | None, tail_chars: int = TAIL_CHARS,
         converse: Callable[[int, int, float], Any] | None = None) -> dict:
    limits = {"timeout_s": timeout_s, "cpu_s": cpu_s, "memory_mb": memory_mb,
              "fsize_mb": fsize_mb, "nproc": nproc, "nofile": nofile}
    isolation = ["rlimits", "tmpdir", "scrubbed-env"] + list(layers)
    uid = _next_uid() if "uid" in layers else None
    io_dir = Path(tempfile.mkdtemp(prefix="pairaudit-sbio-"))   # ours only: 0700
    work: Path | None = None
    mb = 1024 * 1024
    rlimits = {
        # Hard CPU limit one second above soft: SIGXCPU first, then SIGKILL.
        "RLIMIT_CPU": [int(cpu_s), int(cpu_s) + 1],
        "RLIMIT_AS": [int(memory_mb) * mb, int(memory_mb) * mb],
        "RLIMIT_FSIZE": [int(fsize_mb) * mb, int(fsize_mb) * mb],
        "RLIMIT_NPROC": [int(nproc), int(nproc)],
        "RLIMIT_NOFILE": [int(nofile), int(nofile)],
        "RLIMIT_CORE": [0, 0],
    }
    nonce = secrets.token_hex(16)
    job_fd = os.memfd_create("pairaudit-job", os.MFD_CLOEXEC)   # pass_fds opens it to the child alone
    res_r, res_w = os.pipe()
    info_r, info_w = os.pipe()
    # calls mode: the host's requests travel on a pipe of their own (read end to the harness)
    cmd_r, cmd_w = os.pipe() if job["mode"] == "calls" else (-1, -1)
    seccomp_fd = -1
    extra_fds: tuple[int, ...] = ()
    if mechanism == "bwrap":
        extra_fds = (info_w,)
        if "seccomp" in layers:
            seccomp_fd = os.memfd_create("pairaudit-seccomp", os.MFD_CLOEXEC)
            os.write(seccomp_fd, seccomp_filter() or b"")
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
            extra_fds += (seccomp_fd,)
    t0 = time.monotonic()
    proc = None
    timed_out = False
    cap = int(memory_mb) * mb
    cgroup: _RunCgroup | None = None
    watch: _MemoryWatch | None = None
    memory: dict[str, Any] = {"bound": None, "limit_mb": int(memory_mb), "peak_mb": None, "exceeded": False,
                              "cgroup_reason": None}
    base = {"mechanism": mechanism, "fallback_reason": fallback_reason, "isolation": isolation,
            "limits": limits, "python": python, "uid": uid, "memory": memory}
    try:
        try:
            bound, cg_parent, memory["cgroup_reason"] = choose_memory_bound()
            if cg_parent is not None:
                cgroup = _RunCgroup(cg_parent, cap)
        except (OSError, RuntimeError) as exc:
            return {**base, "status": "error", "returncode": None, "signal": None, "timeout_kind": None,
                    "wall_s": 0.0, "stdout_tail": "", "stderr_tail": "", "stdout_bytes": 0, "stderr_bytes": 0,
                    "error": f"cannot bound the program's memory: {exc}"}
        memory["bound"] = bound
        if mechanism == "bwrap":
            workdir = "/tmp"
            harness_limits, harness_uid = rlimits, uid
        else:
            work = Path(tempfile.mkdtemp(prefix="pairaudit-sb-"))
            if uid is not None:
                os.chown(work, uid, uid)
            workdir = str(work)
            harness_limits, harness_uid = {}, None   # the launcher applies them
        full_job = {"mode": job["mode"], "code": job["code"], "tests": job.get("tests", []),
                    "imports": job.get("imports", []), "keep": job.get("keep", []),
                    "nonce": nonce, "result_fd": res_w, "rlimits": harness_limits, "uid": harness_uid}
        if job["mode"] == "calls":
            # no nonce: nothing in the sandbox decides a verdict on this path
            full_job.update(nonce="", cmd_fd=cmd_r, call_imports=job.get("call_imports", []),
                            alias=job.get("alias", {}), plain_caps=job["plain_caps"])
        # marshal, not json: the harness starts faster without importing json
        # (the interpreter is this one, or one of the same major.minor).
        os.write(job_fd, marshal.dumps(full_job))
        os.lseek(job_fd, 0, os.SEEK_SET)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "HOME": workdir, "TMPDIR": workdir, "PYTHONHASHSEED": "0"}
        env.update({str(k): str(v) for k, v in (env_extra or {}).items()})
        argv = [python, "-I", "-S", "-c", _HARNESS, str(job_fd)]
        if mechanism == "bwrap":
            tmpfs = max(4 * int(fsize_mb), 16) * mb
            cmd = _bwrap_cmd(python, env, tmpfs) + ["--info-fd", str(info_w)]
            if seccomp_fd >= 0:
                cmd += ["--seccomp", str(seccomp_fd)]
            cmd += ["--"] + argv
            popen_env, cwd = {}, "/"
        else:
            cfg = {"rlimits": rlimits, "uid": uid, "gid": uid, "python": python, "argv": argv,
                   "close": [fd for fd in (job_fd, res_w, cmd_r) if fd >= 0], "mark": _SIGNAL_MARK}
            cmd = _unshare_prefix(layers) + [python, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg)]
            popen_env, cwd = env, str(work)
        if cgroup is not None:
            cmd = cgroup.wrap(cmd)
        out_path, err_path = io_dir / "stdout", io_dir / "stderr"
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd, cwd=cwd, env=popen_env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True,
                                        close_fds=True,
                                        pass_fds=(job_fd, res_w) + extra_fds
                                        + ((cmd_r,) if cmd_r >= 0 else ()))
            except OSError as exc:
                return {**base, "status": "error", "returncode": None, "signal": None,
                        "timeout_kind": None, "wall_s": round(time.monotonic() - t0, 4),
                        "stdout_tail": "", "stderr_tail": "", "stdout_bytes": 0, "stderr_bytes": 0,
                        "error": f"could not start sandbox: {exc}"}
            if cgroup is None:
                watch = _MemoryWatch(proc.pid, uid, cap)
                watch.start()
            os.close(res_w)
            os.close(info_w)
            res_w = info_w = -1
            conversation = None
            wait_s = timeout_s
            if cmd_r >= 0:
                os.close(cmd_r)
                cmd_r = -1
                conversation = converse(res_r, cmd_w, t0 + timeout_s) if converse else None
                os.close(cmd_w)   # EOF: the harness exits after the last reply
                cmd_w = -1
                # What is left of the wall limit (a moment at least, for a harness
                # whose last reply came just before it; the verdict does not
                # depend on how the process ends once every call was answered).
                wait_s = max(0.05, t0 + timeout_s - time.monotonic())
            try:
                rc = _wait(proc, wait_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                rc = None
            ns_init = _ns_init_pid(info_r) if mechanism == "bwrap" else None
            if timed_out:
                for pid in ([ns_init] if ns_init else []):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
            # Also after a normal exit: bwrap returns before its namespace is
            # empty, and processes the program left behind die only then.
            _await_ns_gone(ns_init)
        wall = time.monotonic() - t0
        if watch is not None:
            watch.stop()
            memory.update(exceeded=watch.exceeded, peak_mb=round(watch.peak / mb, 1))
        elif cgroup is not None:
            killed, peak = cgroup.facts()
            memory.update(exceeded=killed, peak_mb=peak)
        report = _verified_report(_read_all(res_r), nonce) if job["mode"] == "tests" else None
        stdout_tail, out_bytes = _tail(out_path, tail_chars)
        stderr_tail, err_bytes = _tail(err_path, tail_chars)
        sig = None
        if _SIGNAL_MARK in stderr_tail:
            sig = stderr_tail.rsplit(_SIGNAL_MARK, 1)[1].strip().split()[0]
        elif rc is not None and rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        elif mechanism == "bwrap" and rc is not None and rc > 128 and (rc - 128) in signal.valid_signals():
            # bwrap's PID 1 reports a child killed by signal N as exit 128+N.
            sig = signal.Signals(rc - 128).name
        timeout_kind = "wall" if timed_out else ("cpu" if sig == "SIGXCPU" else None)
        if memory["exceeded"]:
            # killed for memory, whatever the exit code or the report says (a sampled excursion may even
            # have ended before the kill landed): over the cap is a failure
            status = "failed"
        elif timeout_kind:
            status = "timeout"
        elif rc == 0:
            status = "passed"
        else:
            status = "failed"
        # named apart from the stdout file handle above
        result: dict[str, Any] = {
            **base, "status": status, "returncode": rc, "signal": sig, "timeout_kind": timeout_kind,
            "wall_s": round(wall, 4), "stdout_tail": stdout_tail, "stderr_tail": stderr_tail,
            "stdout_bytes": out_bytes, "stderr_bytes": err_bytes, "error": None}
        if job["mode"] == "calls":
            result["calls"] = conversation
        if job["mode"] == "tests":
            verified = (report is not None and report.get("stage") == "tests"
                        and report.get("total") == len(job["tests"])
                        and isinstance(report.get("failed"), list))
            result["harness"] = {"verified": report is not None,
                                 "stage": report.get("stage") if report else None,
                                 "total": report.get("total") if report else None,
                                 "failed": report.get("failed") if report else None,
                                 "error": report.get("error") if report else None}
            if result["status"] == "passed" and not (verified and report is not None and report["failed"] == []):
                result["status"] = "failed"
        return result
    finally:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if watch is not None:
            watch.stop()
        if cgroup is not None:
            cgroup.remove()
        for fd in (job_fd, res_r, res_w, info_r, info_w, seccomp_fd, cmd_r, cmd_w):
            if fd >= 0:
                os.close(fd)
        if uid is not None and "pidns" not in layers:
            _sweep_uid(uid, python)
            _await_uid_gone(uid)
        elif uid is not None and mechanism == "fallback" and timed_out:
            _await_uid_gone(uid)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def _dispatch(job: dict, *, timeout_s, cpu_s, memory_mb, fsize_mb, nproc, nofile, env_extra,
              isolate_network, python, tail_chars, mechanism, converse=None) -> dict:
    chosen = choose(mechanism, python)
    limits = {"timeout_s": timeout_s, "cpu_s": cpu_s, "memory_mb": memory_mb, "fsize_mb": fsize_mb,
              "nproc": nproc, "nofile": nofile}
    if chosen.get("unavailable"):
        return {"status": "error", "returncode": None, "signal": None, "timeout_kind": None, "wall_s": 0.0,
                "stdout_tail": "", "stderr_tail": "", "stdout_bytes": 0, "stderr_bytes": 0,
                "mechanism": "bwrap", "fallback_reason": chosen["fallback_reason"], "isolation": [],
                "limits": limits, "python": chosen["python"], "uid": None, "memory": None,
                "error": f"bwrap was required but is unusable: {chosen['fallback_reason']}"}
    mech, layers, reason = chosen["mechanism"], chosen["layers"], chosen["fallback_reason"]
    if not isolate_network:
        # Only the fallback can run without a network namespace (tests use it
        # to show that their network probe really detects a connection).
        if mech == "bwrap":
            mech, reason = "fallback", "isolate_network=False asked for the fallback"
            layers = probe_isolation(python)[1]
        layers = tuple(layer for layer in layers if layer != "netns")
        chosen = {**chosen, "python": probe_isolation(python)[0]}
    return _run(job, mechanism=mech, layers=layers, python=chosen["python"], env_extra=env_extra,
                fallback_reason=reason, tail_chars=tail_chars, converse=converse, **limits)


def run_python(program: str, *, timeout_s: float = 10, cpu_s: int = 10, memory_mb: int = 512,
               fsize_mb: int = 16, nproc: int = 64, nofile: int = 64, env_extra: dict | None = None,
               isolate_network: bool = True, python: str | None = None,
               tail_chars: int = TAIL_CHARS, mechanism: str | None = None) -> dict:
    """Run ``program`` (Python source, as ``__main__``) in the sandbox; ``status`` follows its exit code.

    ``mechanism`` is "auto" (bwrap, else the fallback), "bwrap" (an error
    result when unusable) or "fallback"; None reads ``PAIRAUDIT_SANDBOX``.
    ``isolate_network=False`` runs the fallback without a network namespace.
    Programs need only the standard library (MBPP/HumanEval tests need no more).
    """
    return _dispatch({"mode": "program", "code": program}, timeout_s=timeout_s, cpu_s=cpu_s,
                     memory_mb=memory_mb, fsize_mb=fsize_mb, nproc=nproc, nofile=nofile,
                     env_extra=env_extra, isolate_network=isolate_network, python=python,
                     tail_chars=tail_chars, mechanism=mechanism)


def run_tests(code: str, tests: list[str], *, imports: list[str] | None = None,
              keep: list[str] | None = None, timeout_s: float = 10, cpu_s: int = 10,
              memory_mb: int = 512, fsize_mb: int = 16, nproc: int = 64, nofile: int = 64,
              env_extra: dict | None = None, python: str | None = None,
              tail_chars: int = TAIL_CHARS, mechanism: str | None = None) -> dict:
    """Run ``code`` then each test snippet in the sandbox; pass only on the harness's verified report.

    ``imports`` (trusted import lines) run before the code and again before
    the tests; ``keep`` names the code's definitions the tests call even when
    they shadow a builtin (other shadowing names are hidden from the tests).
    """
    job = {"mode": "tests", "code": code, "tests": list(tests), "imports": list(imports or []),
           "keep": list(keep or [])}
    return _dispatch(job, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, fsize_mb=fsize_mb,
                     nproc=nproc, nofile=nofile, env_extra=env_extra, isolate_network=True,
                     python=python, tail_chars=tail_chars, mechanism=mechanism)


# ---------------------------------------------------------------- calls (the split path)

# Caps on one call's result as plain data: nesting depth, number of values,
# characters of its repr (and of its strings and bytes, counted before the
# repr is made). A result past them is "not plain" (a test's expectation is
# never that large). The host refuses any reply frame longer than the
# character cap plus a header.
PLAIN_CAPS = {"depth": 64, "nodes": 20_000, "chars": 200_000}
_FRAME_OVERHEAD = 256


class CallResult(TypedDict):
    """What the sandbox answered for one call expression (``run_calls``); judged by ``quality.split``.

    ``kind``: "value" (``text`` is the repr of the result as plain data),
    "not_plain" (``text`` names its type and why), "raised" (``text`` is the
    exception's type name), or, decided here on the host, "not_run" (the
    program died, timed out, its code raised, or the channel broke first;
    ``text`` says which) and "protocol" (a reply that does not answer this
    call: something other than the harness wrote to the results channel).
    """
    seq: int
    kind: Literal["value", "not_plain", "raised", "not_run", "protocol"]
    text: str


class _Frames:
    """Length-prefixed frames (``<length>\\n<body>``) read from the results pipe before a deadline."""

    def __init__(self, fd: int, max_body: int):
        self.fd, self.max_body, self.buf = fd, max_body, b""
        os.set_blocking(fd, False)

    def _fill(self, deadline: float) -> str | None:
        """Read more bytes; None, or why nothing more can come ("eof", "timeout")."""
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            return "timeout"
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return None
        if not chunk:
            return "eof"
        self.buf += chunk
        return None

    def next(self, deadline: float) -> tuple[str, bytes]:
        """("frame", body), or ("eof" | "timeout" | "bad", why as bytes)."""
        while b"\n" not in self.buf:
            if len(self.buf) > 12:
                return "bad", b"a frame header that is not a length"
            why = self._fill(deadline)
            if why:
                return why, b""
        head, _, rest = self.buf.partition(b"\n")
        if not head.isdigit() or len(head) > 12 or int(head) > self.max_body:
            return "bad", b"a frame header that is not a length within the cap"
        n = int(head)
        while len(rest) < n:
            self.buf = head + b"\n" + rest
            why = self._fill(deadline)
            if why:
                return why, b""
            head, _, rest = self.buf.partition(b"\n")
        self.buf = rest[n:]
        return "frame", rest[:n]


def _send_all(fd: int, data: bytes, deadline: float) -> None:
    """Write all of ``data`` to a non-blocking pipe before ``deadline``; raises TimeoutError or OSError."""
    while data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fd], [], left)[1]:
            raise TimeoutError("the program did not take the request in time")
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            continue


def _solution_error(text: str) -> str:
    try:
        doc = ast.literal_eval(text)
        return str(doc.get("error"))[:300]
    except (ValueError, SyntaxError, TypeError, AttributeError, MemoryError, RecursionError):
        return "(unreadable)"


def _converse_calls(calls: list[str], res_r: int, cmd_w: int, deadline: float) -> list[CallResult]:
    """Send each call expression alone, read exactly its reply, and stop at the first that does not come.

    Call ``i`` goes out only after reply ``i-1`` came back, with a fresh random
    token the reply must echo, so no reply for a call can be written before
    that call was sent: records written ahead (to a guessed descriptor, or by
    the program's top-level code) fail the check, and so does a second reply
    to the same call. After a failed check nothing more is read or sent: the
    rest of the calls are "not_run". The program's stdout and stderr are
    files of their own and never read here.
    """
    os.set_blocking(cmd_w, False)
    frames = _Frames(res_r, PLAIN_CAPS["chars"] + _FRAME_OVERHEAD)
    out: list[CallResult] = []
    stop: str | None = None
    for seq, src in enumerate(calls):
        if stop is not None:
            out.append({"seq": seq, "kind": "not_run", "text": stop})
            continue
        token = secrets.token_hex(8)
        body = f"{seq} {token}\n{src}".encode("utf-8")
        try:
            _send_all(cmd_w, str(len(body)).encode("ascii") + b"\n" + body, deadline)
        except (OSError, TimeoutError) as exc:
            stop = f"the sandbox stopped taking calls ({type(exc).__name__})"
            out.append({"seq": seq, "kind": "not_run", "text": stop})
            continue
        what, raw = frames.next(deadline)
        if what != "frame":
            stop = {"eof": "the program ended before it answered", "timeout": "the wall-time limit ran out",
                    "bad": "the results channel broke: " + raw.decode()}[what]
            out.append({"seq": seq, "kind": "not_run" if what != "bad" else "protocol", "text": stop})
            continue
        head, _, text_b = raw.partition(b"\n")
        parts = head.split(b" ")
        try:
            text = text_b.decode("utf-8")
        except UnicodeDecodeError:
            parts = []
        if len(parts) == 3 and parts[:2] == [b"-1", b"-"] and parts[2] == b"solution":
            stop = f"the code raised {_solution_error(text)}"
            out.append({"seq": seq, "kind": "not_run", "text": stop})
            continue
        if (len(parts) != 3 or parts[0] != str(seq).encode() or parts[1] != token.encode()
                or parts[2] not in (b"value", b"not_plain", b"raised")):
            stop = f"a reply that does not answer call {seq} came on the results channel"
            out.append({"seq": seq, "kind": "protocol", "text": stop})
            continue
        out.append({"seq": seq, "kind": parts[2].decode(), "text": text})  # type: ignore[typeddict-item]
    return out


def run_calls(code: str, calls: list[str], *, imports: list[str] | None = None,
              call_imports: list[str] | None = None, keep: list[str] | None = None,
              alias: dict[str, str] | None = None, timeout_s: float = 10, cpu_s: int = 10,
              memory_mb: int = 512, fsize_mb: int = 16, nproc: int = 64, nofile: int = 64,
              env_extra: dict | None = None, python: str | None = None,
              tail_chars: int = TAIL_CHARS, mechanism: str | None = None) -> dict:
    """Run ``code``, then evaluate each call expression in turn; the result's ``calls`` says what each returned.

    The split path (``pairaudit/quality/split.py``): no test, expectation or
    nonce enters the sandbox, only the program and the calls; the verdict is
    the host's comparison of each ``CallResult``. ``imports`` run before the
    code and again before the calls (as in ``run_tests``), ``call_imports``
    only before the calls; ``keep`` as in ``run_tests``; ``alias`` binds
    names for the calls (e.g. HumanEval's ``candidate`` -> the entry point).
    The result's ``status`` is the process's; it decides nothing here.
    """
    job = {"mode": "calls", "code": code, "imports": list(imports or []), "keep": list(keep or []),
           "call_imports": list(call_imports or []), "alias": dict(alias or {}), "plain_caps": dict(PLAIN_CAPS)}
    return _dispatch(job, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, fsize_mb=fsize_mb,
                     nproc=nproc, nofile=nofile, env_extra=env_extra, isolate_network=True,
                     python=python, tail_chars=tail_chars, mechanism=mechanism,
                     converse=functools.partial(_converse_calls, list(calls)))
