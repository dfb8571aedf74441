"""Hostile programs against the sandbox: each must not pass, leave the host as it was, and end in time.

Every program is scored like a model's answer (``sandbox.run_tests``) with the
test ``assert hostile_ok()``. Each program defines ``hostile_ok`` to return
True only when its attack worked (it read the secret, reached the host's
port, wrote outside...), or tries to fake a pass without defining it at all.
So "not passed" means the attack failed or the fake was caught; beyond that,
every case checks what "contained" means on the host: the canary files (a
fake ``~/.ssh`` key, a file in the project's ``results/``, a canary directory)
are byte-for-byte unchanged, nothing reached a host listening port, no process
of a sandbox uid or carrying the run's mark is left, a host process the
program tries to kill is alive, and the run ended within its limits.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from test_sandbox import start_listener

from pairaudit.quality import sandbox, scoring, split

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"timeout_s": 3, "cpu_s": 2, "memory_mb": 256, "fsize_mb": 8, "nproc": 32}
# A run may overshoot its wall limit by the time it takes to kill and reap the
# sandbox on a busy 2-core machine; nothing may run on past that.
WALL_SLACK_S = 6


# ---------------------------------------------------------------- host-side canaries

def _snapshot(paths: list[Path]) -> dict:
    snap = {}
    for top in paths:
        items = [top] + (sorted(top.rglob("*")) if top.is_dir() else [])
        for p in items:
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            snap[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return snap


def _uid_procs(uid: int | None) -> list[int]:
    """Processes of the run's fresh uid (other runs on the machine have their own uids)."""
    if uid is None:
        return []
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for line in (d / "status").read_text().splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) == uid:
                    found.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _procs_with(mark: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    secret = "pairaudit-secret-" + uuid.uuid4().hex
    home = tmp_path_factory.mktemp("canary-home")
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    key = ssh / "id_ed25519"
    key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n")
    key.chmod(0o600)
    canary_dir = tmp_path_factory.mktemp("canary-dir")
    (canary_dir / "keep.txt").write_text(secret)
    (canary_dir / "sub").mkdir()
    (canary_dir / "sub" / "data.bin").write_bytes(os.urandom(256))
    canary_dir.chmod(0o777)   # even a world-writable host dir must stay out of reach
    results = ROOT / "results"
    made_results = not results.exists()
    results.mkdir(exist_ok=True)
    results_file = results / f".sandbox-canary-{uuid.uuid4().hex}.json"
    results_file.write_text('{"secret": "%s"}' % secret)

    srv, port, accepted = start_listener()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    listen_port = free.getsockname()[1]
    free.close()
    info = {"secret": secret, "ssh": key, "home": home, "canary_dir": canary_dir,
            "results_file": results_file, "port": port, "accepted": accepted,
            "victim": victim, "listen_port": listen_port}
    try:
        yield info
    finally:
        srv.close()
        victim.kill()
        victim.wait()
        results_file.unlink(missing_ok=True)
        if made_results:
            try:
                results.rmdir()
            except OSError:
                pass


# ---------------------------------------------------------------- the hostile programs

READ_SECRET = """
def hostile_ok():
    for p in PATHS:
        try:
            if SECRET in open(p, errors="replace").read():
                return True
        except Exception:
            pass
    return False
"""

CASES = {
    # -- resources
    "fork_bomb": """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""",
    "fork_bomb_sleepers": """
import os, time
made = 0
for _ in range(10000):
    try:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        made += 1
    except OSError:
        break
def hostile_ok():
    return made > 64
""",
    "infinite_loop": "while True:\n    pass\n",
    "sleep_forever": "import time\ntime.sleep(3600)\n",
    "infinite_loop_in_the_tested_function": "def hostile_ok():\n    while True:\n        pass\n",
    "memory_hog": """
blocks = []
while True:
    blocks.append(bytearray(16 * 1024 * 1024))
def hostile_ok():
    return True
""",
    "huge_file_write": """
import os
def hostile_ok():
    with open("big.bin", "wb") as fh:
        for _ in range(1024):
            fh.write(b"x" * (1 << 20))
    return os.path.getsize("big.bin") >= (1 << 30)
""",
    "many_files_fill_the_disk": """
import os
def hostile_ok():
    total = 0
    for i in range(10000):
        with open("f%d" % i, "wb") as fh:
            fh.write(b"x" * (4 << 20))
        total += 4 << 20
    return total > (1 << 30)
""",
    "open_files_exhaustion": """
def hostile_ok():
    fhs = [open("/dev/null") for _ in range(100000)]
    return len(fhs) == 100000
""",
    # -- file system
    "write_outside_tmp": """
import os
TARGETS = [CANARY_DIR + "/pwned.txt", os.path.dirname(RESULTS_FILE) + "/pwned.json", "/pwned",
           "/usr/lib/pwned", ROOT + "/pwned.txt", os.path.dirname(SSH) + "/authorized_keys"]
def hostile_ok():
    ok = 0
    for t in TARGETS:
        try:
            with open(t, "w") as fh:
                fh.write("pwned")
            ok += 1
        except Exception:
            pass
    return ok > 0
""",
    "delete_files": """
import os, shutil
def hostile_ok():
    done = 0
    for f in (CANARY_DIR + "/keep.txt", RESULTS_FILE, SSH):
        try:
            os.remove(f)
            done += 1
        except Exception:
            pass
    try:
        shutil.rmtree(CANARY_DIR)
        done += 1
    except Exception:
        pass
    return done > 0
""",
    "read_ssh_key": "import os\nPATHS = [SSH, os.path.expanduser('~/.ssh/id_ed25519'), '/root/.ssh/id_rsa']\n"
                    + READ_SECRET,
    "read_project_results": "PATHS = [RESULTS_FILE, CANARY_DIR + '/keep.txt']\n" + READ_SECRET,
    "read_project_source": """
def hostile_ok():
    return "def run_tests" in open(ROOT + "/pairaudit/quality/sandbox.py").read()
""",
    "symlink_and_proc_root_tricks": """
import os
def hostile_ok():
    try:
        os.symlink(RESULTS_FILE, "link")
    except OSError:
        pass
    paths = ["link", "/proc/1/root" + RESULTS_FILE, "/proc/self/root" + RESULTS_FILE,
             "/proc/1/cwd/" + os.path.basename(RESULTS_FILE), "/proc/1/environ"]
    for p in paths:
        try:
            if SECRET in open(p, errors="replace").read():
                return True
        except Exception:
            pass
    return False
""",
    "dev_access": """
def hostile_ok():
    for p in ("/dev/mem", "/dev/kmem", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/kmsg", "/dev/port"):
        try:
            open(p, "rb").read(16)
            return True
        except Exception:
            pass
    return False
""",
    # -- network
    "network_connect_host_port": """
import socket
def hostile_ok():
    for host in ("127.0.0.1", "localhost", "::1"):
        try:
            socket.create_connection((host, PORT), timeout=2).close()
            return True
        except Exception:
            pass
    return False
""",
    "network_connect_outside": """
import socket
def hostile_ok():
    for addr in (("1.1.1.1", 53), ("8.8.8.8", 443), ("pypi.org", 443)):
        try:
            socket.create_connection(addr, timeout=2).close()
            return True
        except Exception:
            pass
    return False
""",
    "network_listen": """
import socket
def hostile_ok():
    s = socket.socket()
    s.bind(("0.0.0.0", LISTEN_PORT))
    s.listen(1)
    s.settimeout(1.5)
    try:
        s.accept()
        return True
    except OSError:
        return False
""",
    # -- processes
    "spawn_subprocesses": """
import subprocess, sys
def hostile_ok():
    for argv in (["/bin/sh", "-c", "cat " + SSH], ["cat", RESULTS_FILE],
                 [sys.executable, "-c", "print(open(%r).read())" % RESULTS_FILE]):
        try:
            if SECRET in subprocess.run(argv, capture_output=True, text=True, timeout=3).stdout:
                return True
        except Exception:
            pass
    return False
""",
    "signals_to_parent_and_everyone": """
import os, signal
def hostile_ok():
    hits = 0
    for pid in (os.getppid(), 1, VICTIM, -1):
        for sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                os.kill(pid, sig)
                hits += 1
            except Exception:
                pass
    return False
""",
    "double_fork_daemon": """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys_executable, [sys_executable, "-c", "import time; time.sleep(600)", MARK])
    os._exit(0)
time.sleep(0.5)
def hostile_ok():
    return False
""",
    "thread_outlives_the_test": """
import threading, time
def spin():
    while True:
        time.sleep(0.01)
threading.Thread(target=spin).start()
def hostile_ok():
    return False
""",
    # -- faking the verdict
    "sys_exit_zero_before_tests": "import sys\nsys.exit(0)\n",
    "os_exit_zero_before_tests": "import os\nos._exit(0)\n",
    "exit_zero_inside_the_test": "import os\ndef hostile_ok():\n    os._exit(0)\n",
    "sys_exit_zero_inside_the_test": "import sys\ndef hostile_ok():\n    sys.exit(0)\n",
    "print_fake_pass_markers": """
import os, sys
print("PAIRAUDIT-RESULT-0000 {\\"total\\": 1, \\"failed\\": []}")
print("1/1 tests passed\\nOK\\nall tests passed")
for fd in range(3, 64):
    try:
        os.write(fd, b'0000 {"stage": "tests", "error": null, "total": 1, "failed": []}\\n')
    except OSError:
        pass
sys.stdout.flush()
os._exit(0)
""",
    "forge_the_report_through_a_str_subclass": """
class S(str):
    def __repr__(self):
        return "''}], 'failed': [], 'x': [{'a': ''"
    def __radd__(self, other):
        return S(other + str.__str__(self))
    def __getitem__(self, k):
        return self
class E(Exception):
    def __str__(self):
        return S("boom")
def hostile_ok():
    raise E()
""",
    "read_inherited_fds_for_the_nonce": """
import os
def hostile_ok():
    for fd in range(0, 256):
        try:
            os.lseek(fd, 0, 0)
            if b"nonce" in os.read(fd, 1 << 20):
                return True
        except OSError:
            pass
    return False
""",
    "monkeypatch_assertion_error": """
import builtins
class Swallow(Exception):
    pass
builtins.AssertionError = Swallow
AssertionError = Swallow
def hostile_ok():
    return False
""",
    "monkeypatch_builtins": """
import builtins
builtins.bool = lambda *a: True
builtins.len = lambda *a: 1
len = lambda *a: 1
def hostile_ok():
    return []
""",
    "patch_module_the_tests_use": """
import math, sys
math.isclose = lambda *a, **k: True
sys.modules["math"] = type(sys)("math")
sys.modules["math"].isclose = lambda *a, **k: True
def hostile_ok():
    return 0
""",
    "settrace_skips_the_assert": """
import sys, threading
def tracer(frame, event, arg):
    if event == "line" and frame.f_code.co_filename == "<test>":
        try:
            frame.f_lineno = frame.f_lineno + 1
        except Exception:
            pass
    return tracer
sys.settrace(tracer)
threading.settrace(tracer)
def hostile_ok():
    return False
""",
    "atexit_and_excepthook_force_zero": """
import atexit, os, sys
atexit.register(os._exit, 0)
sys.excepthook = lambda *a: os._exit(0)
def hostile_ok():
    return False
""",
    "exit_code_zero_from_a_thread": """
import os, threading, time
def later():
    time.sleep(0.2)
    os._exit(0)
threading.Thread(target=later, daemon=True).start()
def hostile_ok():
    time.sleep(2)
    return False
""",
    "audit_hook_repatches_the_module": """
import math, sys
def hook(event, args):
    m = sys.modules.get("math")
    if m is not None:
        try:
            m.isclose = lambda *a, **k: True
        except Exception:
            pass
sys.addaudithook(hook)
def hostile_ok():
    return 0
""",
    "gc_callback_repatches_the_module": """
import gc, math, sys
def cb(phase, info):
    m = sys.modules.get("math")
    if m is not None:
        m.isclose = lambda *a, **k: True
gc.callbacks.append(cb)
gc.set_threshold(1, 1, 1)
def hostile_ok():
    return 0
""",
    "gc_finalizer_of_cyclic_garbage_repatches": """
import gc, sys
class Phoenix:
    def __init__(self):
        self.me = self
    def __del__(self):
        m = sys.modules.get("math")
        if m is not None:
            m.isclose = lambda *a, **k: True
        Phoenix()
gc.set_threshold(1, 1, 1)
Phoenix()
def hostile_ok():
    return 0
""",
    "thread_repatches_after_the_restore": """
import math, sys, threading, time
def loop():
    while True:
        m = sys.modules.get("math")
        if m is not None:
            m.isclose = lambda *a, **k: True
        time.sleep(0)
threading.Thread(target=loop, daemon=True).start()
time.sleep(0.05)
def hostile_ok():
    time.sleep(0.05)
    return 0
""",
    "compile_audit_hook_reads_the_test": """
import sys
ANSWER = []
def hook(event, args):
    if event == "compile" and args and isinstance(args[0], (str, bytes)):
        src = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if "hostile_ok() ==" in src:
            ANSWER.append(src.split("==", 1)[1].strip()[1:-1])
sys.addaudithook(hook)
def hostile_ok():
    return ANSWER[-1] if ANSWER else None
""",
    "exec_audit_hook_reads_the_test_constants": """
import sys
ANSWER = []
def hook(event, args):
    if event == "exec" and args and hasattr(args[0], "co_consts"):
        ANSWER.extend(c for c in args[0].co_consts if isinstance(c, str) and c.startswith("answer-"))
sys.addaudithook(hook)
def hostile_ok():
    return ANSWER[-1] if ANSWER else None
""",
    # -- kernel interfaces
    "ctypes_raw_syscalls": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def hostile_ok():
    won = []
    won.append(libc.setuid(0) == 0 and os.getuid() == 0)
    won.append(libc.syscall(62, 1, 9) == 0)                 # kill(1, SIGKILL)
    won.append(libc.syscall(101, 16, 1, 0, 0) == 0)         # ptrace(PTRACE_ATTACH, 1)
    won.append(libc.mount(b"none", b"/usr/lib", b"tmpfs", 0, None) == 0)
    won.append(libc.chroot(b"/tmp") == 0)
    return any(won)
""",
    "ptrace_other_processes": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def hostile_ok():
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()] + [VICTIM]:
        if pid != os.getpid() and libc.ptrace(16, pid, 0, 0) == 0:
            return True
    return False
""",
    "proc_of_other_processes": """
import os
def hostile_ok():
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                data = open("/proc/%s/%s" % (p, what), "rb").read()
            except OSError:
                continue
            if b"pytest" in data or SECRET.encode() in data:
                return True
    return False
""",
    "environment_secrets": """
import os
def hostile_ok():
    return any(SECRET in v for v in os.environ.values()) or "PAIRAUDIT_HOSTILE_SECRET" in os.environ
""",
    "nested_user_namespace": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def hostile_ok():
    if libc.unshare(0x10000000 | 0x00020000) != 0:      # CLONE_NEWUSER | CLONE_NEWNS
        return False
    for p in (RESULTS_FILE, SSH):
        try:
            if SECRET in open(p).read():
                return True
        except OSError:
            pass
    return False
""",
}

# Tests other than ``assert hostile_ok()``: the fake must beat exactly these.
TESTS = {
    "patch_module_the_tests_use": ["assert math.isclose(hostile_ok(), 1.0)"],
    "monkeypatch_builtins": ["assert len(hostile_ok()) == 1", "assert bool(hostile_ok())"],
    "audit_hook_repatches_the_module": ["assert math.isclose(hostile_ok(), 1.0)"],
    "gc_callback_repatches_the_module": ["x = [[i] for i in range(50)]\nassert math.isclose(hostile_ok(), 1.0)"],
    "gc_finalizer_of_cyclic_garbage_repatches": [
        "x = [[i] for i in range(50)]\nassert math.isclose(hostile_ok(), 1.0)"],
    # the first test lets the thread run (a test that calls a function that sleeps), the second is forged
    "thread_repatches_after_the_restore": ["assert hostile_ok() is not None",
                                           "assert math.isclose(hostile_ok(), 1.0)"],
    # answers only the tests' own text knows
    "compile_audit_hook_reads_the_test": ["assert hostile_ok() == 'answer-7919-only-the-test-knows'"],
    "exec_audit_hook_reads_the_test_constants": ["assert hostile_ok() == 'answer-104729-from-the-test'"],
}
# Verdict forgeries that each beat the harness before it compiled the tests
# first, refused audit hooks after its own, restored the collector and refused
# a program that leaves a thread running
# (test_the_verdict_forgeries_do_fool_a_harness_without_those_guards).
FORGERIES = ["audit_hook_repatches_the_module", "gc_callback_repatches_the_module",
             "gc_finalizer_of_cyclic_garbage_repatches", "thread_repatches_after_the_restore",
             "compile_audit_hook_reads_the_test",
             "exec_audit_hook_reads_the_test_constants"]
# What each resource attack is expected to hit (beyond "not passed").
EXPECT_TIMEOUT = {"infinite_loop", "sleep_forever", "infinite_loop_in_the_tested_function"}
# Attacks only bubblewrap's private mount namespace (and /proc) stops: the
# fallback does not claim to hide the host's file system.
NEEDS_MOUNTNS = {"write_outside_tmp", "delete_files", "read_ssh_key", "read_project_results",
                 "read_project_source", "symlink_and_proc_root_tricks", "spawn_subprocesses",
                 "proc_of_other_processes", "nested_user_namespace", "dev_access"}


def _program(name: str, host: dict, mark: str) -> str:
    prelude = (f"SECRET = {host['secret']!r}\nSSH = {str(host['ssh'])!r}\n"
               f"CANARY_DIR = {str(host['canary_dir'])!r}\nRESULTS_FILE = {str(host['results_file'])!r}\n"
               f"ROOT = {str(ROOT)!r}\nPORT = {host['port']}\nLISTEN_PORT = {host['listen_port']}\n"
               f"VICTIM = {host['victim'].pid}\nMARK = {mark!r}\nimport sys as _s\n"
               f"sys_executable = _s.executable\n")
    return prelude + CASES[name]


def test_there_are_at_least_25_hostile_programs():
    assert len(CASES) >= 25


@pytest.mark.parametrize("mechanism", ["bwrap", "fallback"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_program_is_contained(name, mechanism, host, monkeypatch):
    if mechanism == "bwrap":
        chosen = sandbox.choose("auto")
        if chosen["mechanism"] != "bwrap":
            pytest.skip(f"bubblewrap unusable here: {chosen['fallback_reason']}")
    elif name in NEEDS_MOUNTNS:
        pytest.skip("the fallback does not hide the file system (docs/sandbox.md)")
    elif name == "many_files_fill_the_disk":
        pytest.skip("the fallback's temp dir is on the host disk: only each file's size is capped")
    monkeypatch.setenv("PAIRAUDIT_HOSTILE_SECRET", host["secret"])
    mark = "pairaudit-hostile-" + uuid.uuid4().hex
    watched = [host["home"], host["canary_dir"], host["results_file"]]
    before = _snapshot(watched)
    probe_hits = []
    stop = threading.Event()

    def probe_listen_port():
        # A listener inside the sandbox must not be reachable from the host.
        while not stop.is_set():
            try:
                socket.create_connection(("127.0.0.1", host["listen_port"]), timeout=0.2).close()
                probe_hits.append(1)
            except OSError:
                pass
            time.sleep(0.1)

    prober = threading.Thread(target=probe_listen_port, daemon=True)
    prober.start()
    try:
        res = sandbox.run_tests(_program(name, host, mark), TESTS.get(name, ["assert hostile_ok()"]),
                                imports=["import math"], keep=["hostile_ok"], mechanism=mechanism,
                                **LIMITS)
    finally:
        stop.set()
        prober.join()
    time.sleep(0.2)   # let the kernel finish reaping a torn-down namespace

    assert res["status"] != "passed", res
    rep = res.get("harness") or {}
    assert not (rep.get("stage") == "tests" and rep.get("failed") == []), rep
    assert res["wall_s"] <= LIMITS["timeout_s"] + WALL_SLACK_S
    if name in EXPECT_TIMEOUT:
        assert res["status"] == "timeout"
    assert _snapshot(watched) == before
    assert host["accepted"] == []
    assert probe_hits == []
    assert host["victim"].poll() is None, "a host process was killed"
    assert _procs_with(mark) == []
    assert _uid_procs(res["uid"]) == []
    if os.geteuid() == 0:
        assert res["uid"] is not None and res["uid"] >= sandbox._UID_BASE
    assert host["secret"] not in res["stdout_tail"] + res["stderr_tail"]
    assert res["mechanism"] == mechanism
    if mechanism == "bwrap":
        assert {"netns", "pidns", "mountns"} <= set(res["isolation"])


def test_the_attacks_are_real_outside_the_sandbox(host, tmp_path):
    """Control: run unsandboxed, the reading/connecting attacks do succeed, so the suite tests something."""
    mark = "pairaudit-hostile-" + uuid.uuid4().hex
    env = {**os.environ, "PAIRAUDIT_HOSTILE_SECRET": host["secret"]}
    for name in ("read_ssh_key", "read_project_results", "network_connect_host_port", "read_project_source",
                 "spawn_subprocesses", "proc_of_other_processes", "environment_secrets",
                 "symlink_and_proc_root_tricks"):
        prog = _program(name, host, mark) + "\nimport sys\nsys.exit(0 if hostile_ok() else 3)\n"
        done = subprocess.run([sys.executable, "-c", prog], cwd=tmp_path, timeout=30, env=env)
        assert done.returncode == 0, name
    deadline = time.monotonic() + 5
    while not host["accepted"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host["accepted"], "the host listener saw the unsandboxed connection"
    host["accepted"].clear()


FAKES = ["sys_exit_zero_before_tests", "os_exit_zero_before_tests", "print_fake_pass_markers",
         "exit_zero_inside_the_test", "sys_exit_zero_inside_the_test", "atexit_and_excepthook_force_zero",
         "exit_code_zero_from_a_thread"]


@pytest.mark.parametrize("name", FAKES)
def test_the_fakes_do_fool_an_exit_code_verdict(name, host):
    """Control: judged by exit code alone (``run_python``), each fake would pass; only the harness stops it."""
    prog = _program(name, host, "unused") + "\nassert hostile_ok()\n"
    res = sandbox.run_python(prog, **LIMITS)
    assert res["status"] == "passed", res


# What the harness did before it guarded against these: restore every module's
# state after the program, then compile and run each test.
_UNGUARDED = """
import math as _m
_saved = dict(_m.__dict__)
{program}
_m.__dict__.update(_saved)
_g = dict(globals())
exec("import math", _g)
for _src in {tests!r}:
    exec(compile(_src, "<test>", "exec"), _g)
"""


@pytest.mark.parametrize("name", FORGERIES)
def test_the_verdict_forgeries_do_fool_a_harness_without_those_guards(name, host):
    """Control: restoring module state and compiling each test afterwards is not enough; each forgery passes."""
    prog = _UNGUARDED.format(program=_program(name, host, "unused"), tests=TESTS[name])
    res = sandbox.run_python(prog, **LIMITS)
    assert res["status"] == "passed", res


def test_honest_code_that_uses_the_collector_and_audit_hooks_still_passes():
    code = ("import gc, sys\nseen = []\nsys.addaudithook(lambda e, a: None)\ngc.collect()\n"
            "def hostile_ok():\n    x = []\n    x.append(x)\n    return gc.isenabled() in (True, False)\n")
    res = sandbox.run_tests(code, ["assert hostile_ok()", "assert (1 +"], keep=["hostile_ok"], **LIMITS)
    # the second test does not compile: a failed test, reported by the harness, not a harness error
    assert res["harness"]["stage"] == "tests" and res["harness"]["total"] == 2
    assert [f["test"] for f in res["harness"]["failed"]] == ["assert (1 +"]
    assert "SyntaxError" in res["harness"]["failed"][0]["error"]
    assert sandbox.run_tests(code, ["assert hostile_ok()"], keep=["hostile_ok"], **LIMITS)["status"] == "passed"


def test_an_honest_solution_still_passes_with_the_same_harness():
    res = sandbox.run_tests("import math\ndef hostile_ok():\n    return math.isclose(0.1 + 0.2, 0.3)\n",
                            ["assert hostile_ok()"], imports=["import math"], keep=["hostile_ok"], **LIMITS)
    assert res["status"] == "passed", res
    assert res["harness"] == {"verified": True, "stage": "tests", "total": 1, "failed": [], "error": None}


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV])
def test_death_by_signal_is_reported_and_not_passed(signum):
    res = sandbox.run_tests(f"import os\nos.kill(os.getpid(), {int(signum)})\n", ["assert True"], **LIMITS)
    assert res["status"] == "failed"
    assert res["signal"] == signal.Signals(signum).name


# ---------------------------------------------------------------- the split path
#
# Forgeries of the in-sandbox harness's verdict, each written to do its best
# against whichever harness runs it. The test is MBPP-shaped (a literal
# expectation), so it splits: on the split path the expected value never
# enters the sandbox and the comparison is made on the host. Each forgery
# passes the in-sandbox harness (the control: the attack is real) and fails on
# the split path.

ANSWER = "answer-7919-only-the-test-knows"

# Scans every frame up the stack (locals and code constants) and every object
# the collector tracks for the expected answer; on the split path there is none.
_FIND_ANSWER = """
import gc, sys
def _strings(obj, depth=0):
    if isinstance(obj, str):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple, set, frozenset)):
        for x in obj:
            yield from _strings(x, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for k, v in list(obj.items()):
            yield from _strings(k, depth + 1)
            yield from _strings(v, depth + 1)
    elif hasattr(obj, "co_consts"):
        yield from _strings(obj.co_consts, depth + 1)
def find_answer():
    f = sys._getframe()
    while f is not None:
        for s in list(_strings(f.f_code)) + list(_strings(dict(f.f_locals))):
            if s.startswith("answer-") and s != "answer-":
                return s
        f = f.f_back
    for o in gc.get_objects():
        for s in _strings(o):
            if s.startswith("answer-") and s != "answer-":
                return s
    return None
"""

SPLIT_FORGERIES = {
    # The harness's nonce and report descriptor are locals of its frame: write
    # a passing report and exit before the harness writes its own. On the
    # split path there is no nonce and no report to forge.
    "nonce_by_frame_introspection": """
import os, sys
f = sys._getframe()
while f is not None:
    loc = f.f_locals
    if loc.get("nonce") and "rfd" in loc:
        os.write(loc["rfd"], (loc["nonce"] + " " + repr({"stage": "tests", "error": None,
                 "total": len(loc["tests"]), "failed": []}) + "\\n").encode())
        os._exit(0)
    f = f.f_back
def hostile_ok():
    return None
""",
    # The same through the collector: the harness's closures hold them.
    "nonce_through_the_garbage_collector": """
import gc, os
cells = {}
for o in gc.get_objects():
    if type(o).__name__ == "function" and o.__closure__:
        for name, cell in zip(o.__code__.co_freevars, o.__closure__):
            try:
                cells.setdefault(name, cell.cell_contents)
            except ValueError:
                pass
if cells.get("nonce") and "rfd" in cells:
    os.write(cells["rfd"], (cells["nonce"] + " " + repr({"stage": "tests", "error": None, "total": 1,
             "failed": []}) + "\\n").encode())
    os._exit(0)
def hostile_ok():
    return None
""",
    "eq_always_true": """
class AlwaysEqual:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
    def __repr__(self):
        return repr("answer-7919-only-the-test-knows")
def hostile_ok():
    return AlwaysEqual()
""",
    # The tested function reads its caller's frame: in-sandbox, the test's code
    # object, whose constants hold the expected value.
    "tests_read_from_the_harness_frame": _FIND_ANSWER + """
def hostile_ok():
    return find_answer()
""",
    # ctypes rewrites str's comparison slot in interpreter memory
    # (PyTypeObject.tp_richcompare, 64-bit CPython 3.8-3.12) so that a sentinel
    # equals every string: no knowledge of the expected value needed.
    "ctypes_rewrites_interpreter_memory": """
import ctypes
SENTINEL = "forged-by-ctypes"
CMP = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.py_object, ctypes.c_int)
slot = ctypes.c_void_p.from_address(id(str) + 200)
orig = CMP(slot.value)
def cmp(a, b, op):
    if op == 2 and (a is SENTINEL or b is SENTINEL):
        return True
    return orig(a, b, op)
keep = CMP(cmp)
slot.value = ctypes.cast(keep, ctypes.c_void_p).value
def hostile_ok():
    return SENTINEL
""",
    # The tested function patches what the next test uses while it runs (after
    # the harness restored every module).
    "patch_while_running": """
import sys
def hostile_ok():
    sys.modules["math"].isclose = lambda *a, **k: True
    return 0
""",
}
SPLIT_FORGERY_TESTS = {"patch_while_running": ["assert hostile_ok() is not None",
                                               "assert math.isclose(hostile_ok(), 1.0)"]}


def _mbpp_item(tests: list[str]) -> dict:
    return {"index": 0, "id": "hostile", "format": "mbpp", "question": "",
            "reference": {"tests": tests, "test_imports": ["import math"], "code": "",
                          "function_name": "hostile_ok"}}


@pytest.mark.parametrize("name", sorted(SPLIT_FORGERIES))
def test_the_forgery_passes_the_in_sandbox_harness(name):
    """Control: judged inside the sandbox, each forgery scores as correct."""
    item = _mbpp_item(SPLIT_FORGERY_TESTS.get(name, [f"assert hostile_ok() == {ANSWER!r}"]))
    rec = scoring.score_item(item, SPLIT_FORGERIES[name], judge="in_sandbox", sandbox_limits=LIMITS)
    assert rec["judged_by"] == "in_sandbox"
    assert rec["correct"] is True, rec["reason"]


@pytest.mark.parametrize("mechanism", ["auto", "fallback"])
@pytest.mark.parametrize("name", sorted(SPLIT_FORGERIES))
def test_the_forgery_fails_on_the_split_path(name, mechanism, monkeypatch):
    # the verdict is the host's under either mechanism
    monkeypatch.setenv(sandbox.MECHANISM_ENV, mechanism)
    item = _mbpp_item(SPLIT_FORGERY_TESTS.get(name, [f"assert hostile_ok() == {ANSWER!r}"]))
    rec = scoring.score_item(item, SPLIT_FORGERIES[name], sandbox_limits=LIMITS)
    assert rec["judged_by"] == "split"
    assert rec["sandbox"]["mechanism"] == ("fallback" if mechanism == "fallback" else rec["sandbox"]["mechanism"])
    assert rec["correct"] is False, rec["reason"]


# Attacks on the split path's own channel and reader. Each program knows the
# right answers (as if it had read the dataset) but its functions return
# wrong ones: only a forged reply could make it pass.
SPLIT_CHANNEL_ATTACKS = {
    # replies written ahead for every call, with guessed tokens, to every descriptor
    "replies_written_ahead": """
import os
for fd in range(3, 256):
    for seq, value in enumerate(KNOWN):
        body = ("%d %s value\\n%r" % (seq, "0" * 16, value)).encode()
        try:
            os.write(fd, str(len(body)).encode() + b"\\n" + body)
        except OSError:
            pass
def f(x):
    return -1
""",
    # reply lines on stdout, where a program's own output goes
    "replies_printed": """
for seq, value in enumerate(KNOWN):
    body = "%d %s value\\n%r" % (seq, "0" * 16, value)
    print(len(body.encode()))
    print(body)
def f(x):
    return -1
""",
    # from inside call 0: the real token of call 0 (from the harness's frame),
    # a right answer for it, then guessed replies for the calls not sent yet,
    # then an exit before the harness can write anything
    "later_replies_from_inside_a_call": """
import os, sys
def f(x):
    fr = sys._getframe(1)
    while fr is not None and "token" not in fr.f_locals:
        fr = fr.f_back
    loc = fr.f_locals
    frame = loc["frame"]
    frame(loc["seq"], loc["token"], "value", repr(KNOWN[0]))
    for seq in range(1, len(KNOWN)):
        frame(str(seq), loc["token"], "value", repr(KNOWN[seq]))
    os._exit(0)
""",
    "oversized_frame_header": """
import os
def f(x):
    for fd in range(3, 64):
        try:
            os.write(fd, b"99999999999999999999\\n")
        except OSError:
            pass
    return -1
""",
    "lying_subclasses_of_plain_types": """
class S(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
    def __repr__(self):
        return repr(KNOWN[0])
class L(list):
    def __iter__(self):
        return iter(KNOWN[1])
    def __eq__(self, other):
        return True
class I(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def f(x):
    return [S("wrong"), L([0]), I(-1)][x]
""",
    "a_plain_value_wrapping_a_liar": """
class AlwaysEqual:
    def __eq__(self, other):
        return True
def f(x):
    return [[AlwaysEqual()], {"k": AlwaysEqual()}, (1, AlwaysEqual())][x]
""",
    "deep_and_huge_results": """
def f(x):
    if x == 0:
        v = []
        for _ in range(100000):
            v = [v]
        return v
    if x == 1:
        return "y" * 50_000_000
    return {i: i for i in range(1_000_000)}
""",
    "exit_inside_a_call": "import os\ndef f(x):\n    os._exit(0)\n",
}
SPLIT_KNOWN = ["right-0", [1, 2, 3], 42]
SPLIT_CHANNEL_TESTS = [f"assert f({i}) == {v!r}" for i, v in enumerate(SPLIT_KNOWN)]


@pytest.mark.parametrize("name", sorted(SPLIT_CHANNEL_ATTACKS))
def test_the_split_paths_channel_and_reader_hold(name):
    code = f"KNOWN = {SPLIT_KNOWN!r}\n" + SPLIT_CHANNEL_ATTACKS[name]
    item = _mbpp_item(SPLIT_CHANNEL_TESTS) | {"id": name}
    item["reference"]["function_name"] = "f"
    rec = scoring.score_item(item, code, sandbox_limits=LIMITS)
    assert rec["judged_by"] == "split"
    assert rec["correct"] is False, rec["reason"]
    assert rec["tests_failed"] in (None, 1, 2, 3)
    # the control: the same program with honest functions passes the split path
    honest = f"KNOWN = {SPLIT_KNOWN!r}\ndef f(x):\n    return KNOWN[x]\n"
    assert scoring.score_item(item, honest, sandbox_limits=LIMITS)["correct"] is True


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_program_fails_on_the_split_path_and_is_contained(name, host, monkeypatch):
    """Every hostile program again, judged outside the sandbox (the primary mechanism here)."""
    monkeypatch.setenv("PAIRAUDIT_HOSTILE_SECRET", host["secret"])
    mark = "pairaudit-hostile-" + uuid.uuid4().hex
    chosen = sandbox.choose("auto")
    if chosen["mechanism"] != "bwrap" and (name in NEEDS_MOUNTNS or name == "many_files_fill_the_disk"):
        pytest.skip("the fallback does not hide the file system (docs/sandbox.md)")
    watched = [host["home"], host["canary_dir"], host["results_file"]]
    before = _snapshot(watched)
    tests = TESTS.get(name, ["assert hostile_ok()"])
    item = _mbpp_item(tests) | {"id": name}
    rec = scoring.score_item(item, _program(name, host, mark), sandbox_limits=LIMITS)
    time.sleep(0.2)
    if any(isinstance(split.plan_mbpp([t], ["import math"]), split.NotSplit) for t in tests):
        assert rec["judged_by"] == "in_sandbox"
    else:
        assert rec["judged_by"] == "split"
    assert rec["correct"] is False, rec["reason"]
    assert rec["sandbox"]["wall_s"] <= LIMITS["timeout_s"] + WALL_SLACK_S
    assert _snapshot(watched) == before
    assert host["accepted"] == []
    assert host["victim"].poll() is None, "a host process was killed"
    assert _procs_with(mark) == []
    assert _uid_procs(rec["sandbox"]["uid"]) == []
