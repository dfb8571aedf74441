"""pairaudit.serving.gpupool: each launched server holds GPUs of its own, across every process of the host.

No GPU is needed: a pool of fake device ids is declared ($PAIRAUDIT_GPU_POOL),
and the servers are tests/fake_server.py started with ``--record-env``, so
what each one was really started with (its CUDA_VISIBLE_DEVICES) is read
back from the process, not from the launcher's own records.  Concurrent
takers are separate processes sharing nothing but the lock directory; order
is asserted through event files they append to (one line per write), never
through timings.  Where nvidia-smi matters (auto pools, the speed gate's
clock facts) the fake nvidia-smi of tests/test_speedgpu.py answers for four
planted GPUs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from test_slots import events as lines  # the same helpers as the server slots' tests
from test_slots import wait_for
from test_speedgpu import FakeSmi

from pairaudit import configcheck
from pairaudit.core import artifacts
from pairaudit.serving import armspec, gpupool, launch, slots
from pairaudit.serving.armspec import ConfigError, resolve_spec
from pairaudit.serving.launch import Server, ServerError
from pairaudit.serving.phase import PhaseServer

ROOT = str(Path(__file__).resolve().parents[1])
FAKE = str(Path(__file__).with_name("fake_server.py"))
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in lines(path)]


def fake_arm(record: Path, **extra) -> dict:
    """A launch arm whose server is the fake, recording the environment it was started with."""
    return {"mode": "launch", "model": "fake-model", "max_model_len": 256, "health_timeout_s": 30,
            "command": ["{python}", FAKE, "--port", "{port}", "--model", "{model}", "--max-model-len",
                        "{max_model_len}", "--record-env", str(record)], **extra}


@pytest.fixture
def pool(monkeypatch, tmp_path):
    """A declared pool of fake ids 0..3 with locks under tmp_path; no slots, no inherited GPU variables."""
    monkeypatch.setenv(slots.SLOTS_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setenv(gpupool.POOL_ENV, "0,1,2,3")
    for var in (slots.SLOTS_ENV, gpupool.WAIT_ENV, gpupool.VISIBLE, "SLURM_JOB_ID", *gpupool.SLURM_GPU_VARS):
        monkeypatch.delenv(var, raising=False)
    # no nvidia-smi: the ids are locked as written (a GPU host resolves them to UUIDs)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return tmp_path / "locks"


def free(directory: Path, ids) -> dict[str, bool]:
    """Whether each id's lock is free right now (tried with a fresh descriptor, never kept)."""
    out = {}
    for i in ids:
        fd = gpupool._try_lock(gpupool._Device(str(i), None, directory / gpupool._lock_name(str(i))))
        out[str(i)] = fd is not None
        if fd is not None:
            os.close(fd)
    return out


# --------------------------------------------------------------------- declaring the pool

def test_the_pool_is_declared_in_the_environment_or_the_config_and_bad_values_name_the_key(monkeypatch, tmp_path):
    env = {slots.SLOTS_DIR_ENV: str(tmp_path)}
    assert gpupool.current_pool(env) is None
    assert gpupool.current_pool({**env, gpupool.POOL_ENV: "none"}) is None
    p = gpupool.current_pool({**env, gpupool.POOL_ENV: " 0, 1,GPU-abc "})
    assert p.ids == ("0", "1", "GPU-abc") and p.source == "declared" and p.directory == tmp_path
    with pytest.raises(gpupool.GpuPoolError, match=r"PAIRAUDIT_GPU_POOL: 'x1' is not a device id \(allowed: a device"):
        gpupool.current_pool({**env, gpupool.POOL_ENV: "0,x1"})
    with pytest.raises(gpupool.GpuPoolError, match="1 listed more than once"):
        gpupool.current_pool({**env, gpupool.POOL_ENV: "0,1,1"})
    # the config's spellings: a YAML list (a profile's --config gives strings), a string, auto, none
    assert gpupool.pool_value([0, 1, 2]) == "0,1,2"
    assert gpupool.pool_value(["0", "1"]) == "0,1"
    assert gpupool.pool_value("auto") == "auto" and gpupool.pool_value(None) is None
    with pytest.raises(gpupool.GpuPoolError, match=r"gpus.pool: .* is not 'auto', 'none' or a list"):
        gpupool.pool_value({"a": 1})
    specs = {"control": resolve_spec("control", fake_arm(tmp_path / "r", gpus=1))}
    problems, _ = gpupool.load_check({"gpus": {"pool": ["0", "zero"], "wait_timeout_s": 0}}, specs, environ={})
    assert any(p.startswith("gpus.pool: 'zero' is not a device id") for p in problems)
    assert any(p.startswith("gpus.wait_timeout_s: 0 is not a positive number") for p in problems)
    # an arm asking GPUs on a host without a pool is told what it gets instead
    problems, notes = gpupool.load_check({"gpus": {"pool": None}}, specs, environ={})
    assert problems == [] and "arms.control.gpus: 1, but no GPU pool is declared" in notes[0]
    # the config hands the pool to the jobs, unless the environment already says
    target: dict[str, str] = {}
    gpupool.export_config({"gpus": {"pool": [0, 1], "wait_timeout_s": 30}}, target)
    assert target == {gpupool.POOL_ENV: "0,1", gpupool.WAIT_ENV: "30"}
    target = {gpupool.POOL_ENV: "2,3"}
    gpupool.export_config({"gpus": {"pool": [0, 1]}}, target)
    assert target == {gpupool.POOL_ENV: "2,3"}


def test_an_arms_gpus_is_checked_and_kept_out_of_its_identity(tmp_path):
    base = fake_arm(tmp_path / "r")
    assert resolve_spec("control", base).gpus == 0  # absent: no GPU asked
    two = resolve_spec("control", {**base, "gpus": 2})
    assert two.gpus == 2
    assert two.identity() == resolve_spec("control", base).identity()
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match=r"arms.control.gpus: .* is not a non-negative integer"):
            resolve_spec("control", {**base, "gpus": bad})
    pinned = resolve_spec("candidate", {**base, "gpus": 1, "env": {"CUDA_VISIBLE_DEVICES": "2,3"}})
    assert gpupool.request_problems(gpupool.request_of(pinned)) == [
        "arms.candidate.gpus: 1, but env.CUDA_VISIBLE_DEVICES pins 2 device(s) (2,3); allowed: gpus equal to the "
        "number pinned, or 0"]
    res = configcheck.CheckResult()
    res.problems += gpupool.load_check({}, {"candidate": pinned}, environ={})[0]
    assert res.problems and res.problems[0].startswith("arms.candidate.gpus: 1")
    assert gpupool.request_of(resolve_spec("control", {"mode": "attach", "url": "http://h:1", "model": "m"})) is None


def test_slurm_allocation_is_the_pool_and_a_declared_pool_is_ignored_there(tmp_path):
    env = {slots.SLOTS_DIR_ENV: str(tmp_path), gpupool.POOL_ENV: "0,1,2,3", "SLURM_JOB_ID": "4242"}
    p = gpupool.current_pool({**env, "CUDA_VISIBLE_DEVICES": "2,3"})
    assert p.ids == ("2", "3") and p.source == "slurm" and p.directory == tmp_path / "slurm-4242"
    assert "Slurm job 4242 (CUDA_VISIBLE_DEVICES=2,3)" == p.origin
    p = gpupool.current_pool({**env, "SLURM_STEP_GPUS": "5"})
    assert p.ids == ("5",) and "SLURM_STEP_GPUS=5" in p.origin
    assert gpupool.current_pool(env) is None  # a Slurm job without GPUs: no pool, nothing changes


def test_auto_is_what_this_job_sees(tmp_path, monkeypatch):
    env = {slots.SLOTS_DIR_ENV: str(tmp_path), gpupool.POOL_ENV: "auto"}
    p = gpupool.current_pool({**env, "CUDA_VISIBLE_DEVICES": "1,3"})
    assert p.ids == ("1", "3") and p.source == "auto"
    smi = FakeSmi(tmp_path / "smi", gpus=[{"index": str(i), "uuid": u} for i, u in enumerate(UUIDS)])
    monkeypatch.setenv("PATH", f"{smi.exe.parent}:/usr/bin:/bin")
    p = gpupool.current_pool(env)
    assert p.ids == ("0", "1", "2", "3") and "nvidia-smi" in p.origin
    assert ["--query-gpu=index,uuid", "--format=csv,noheader"] in smi.calls()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    p = gpupool.current_pool(env)
    assert p.ids == () and "no nvidia-smi" in p.origin


# --------------------------------------------------------------------- taking and giving back

TAKER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pairaudit.serving import gpupool
    from pairaudit.serving.armspec import ArmSpec
    name, count, events, hold_s = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
    spec = ArmSpec(arm=name, mode="launch", model="m", served_model_name="m", max_model_len=None, speculative=False, model_sha256=None, health_timeout_s=30.0, command_identity=("x",), gpus=count)
    lease = gpupool.acquire_for(spec)
    with open(events, "a") as f:
        f.write(json.dumps({{"who": name, "event": "got", "ids": lease.ids}}) + "\\n")
    time.sleep(hold_s)
    with open(events, "a") as f:
        f.write(json.dumps({{"who": name, "event": "release", "ids": lease.ids}}) + "\\n")
    lease.release()
""")


def test_concurrent_takers_in_separate_processes_hold_disjoint_ids(pool, tmp_path):
    script = tmp_path / "taker.py"
    script.write_text(TAKER.format(root=ROOT))
    ev = tmp_path / "events"
    procs = [subprocess.Popen([sys.executable, str(script), f"t{i}", "2", str(ev), "0.4"], stderr=subprocess.PIPE,
                              text=True) for i in range(5)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    held: dict[str, set] = {}
    most = 0
    for e in records(ev):  # replayed in the order written: got after locking, release before unlocking
        ids = set(e["ids"])
        if e["event"] == "got":
            assert len(ids) == 2 and ids <= {"0", "1", "2", "3"}
            for who, theirs in held.items():
                assert not ids & theirs, f"{e['who']} got {ids} while {who} held {theirs}"
            held[e["who"]] = ids
            most = max(most, len(held))
        else:
            del held[e["who"]]
    assert len(records(ev)) == 10 and most <= 2  # five takers of 2 from 4: at most two at once
    assert all(free(pool, range(4)).values())


HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pairaudit.serving import gpupool
    from pairaudit.serving.armspec import ArmSpec
    spec = ArmSpec(arm="control", mode="launch", model="m", served_model_name="m", max_model_len=None, speculative=False, model_sha256=None, health_timeout_s=30.0, command_identity=("x",), gpus=int(sys.argv[1]))
    lease = gpupool.acquire_for(spec)
    print(",".join(lease.ids), flush=True)
    sys.stdin.readline()
    lease.release()
    print("released", flush=True)
    sys.stdin.readline()
""")


def _holder(tmp_path: Path, count: int, env: dict | None = None) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(root=ROOT))
    return subprocess.Popen([sys.executable, str(script), str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, slots.AUDIT_ENV: "other-audit", **(env or {})})


def test_a_taker_waits_while_the_pool_is_empty_then_gets_what_is_given_back(pool, tmp_path, monkeypatch):
    monkeypatch.setenv(gpupool.POOL_ENV, "0,1")
    holder = _holder(tmp_path, 2)
    try:
        assert holder.stdout.readline().strip() == "0,1"
        waited: list[str] = []

        def give_back(line: str) -> None:
            waited.append(line)
            holder.stdin.write("go\n")
            holder.stdin.flush()

        spec = resolve_spec("candidate", fake_arm(tmp_path / "r", gpus=1))
        with gpupool.reserve([spec], {"arm": "candidate"}, poll_s=0.05, on_wait=give_back) as res:
            assert holder.stdout.readline().strip() == "released"
            assert res.lease_for(spec).ids == ["0"]
        assert len(waited) == 1
        assert waited[0].startswith("waiting for GPU(s) for arm candidate: 1 from the pool 0,1 "
                                    "(PAIRAUDIT_GPU_POOL=0,1); ")
        assert f"gpu 0 held by pid {holder.pid} (audit other-audit, arm control" in waited[0]
    finally:
        holder.kill()
        holder.wait()


def test_a_wait_that_times_out_says_who_holds_the_gpus(pool, tmp_path, monkeypatch):
    monkeypatch.setenv(gpupool.POOL_ENV, "0,1")
    monkeypatch.setenv(gpupool.WAIT_ENV, "0.5")
    holder = _holder(tmp_path, 2)
    try:
        assert holder.stdout.readline().strip() == "0,1"
        spec = resolve_spec("candidate", fake_arm(tmp_path / "r", gpus=1))
        # through the Server: it fails before starting anything, and not as a server failure (no ServerError):
        # a host without free GPUs says nothing about the arm
        with pytest.raises(gpupool.GpuPoolError) as err:
            Server(spec, log_path=tmp_path / "s.log").start()
        msg = str(err.value)
        assert re.match(r"timed out after \d+\.\d s waiting for GPU\(s\) for arm candidate: 1 from the pool 0,1 "
                        r"\(PAIRAUDIT_GPU_POOL=0,1\); ", msg), msg
        assert f"gpu 0 held by pid {holder.pid} (audit other-audit" in msg and f"gpu 1 held by pid {holder.pid}" in msg
        assert "raise gpus.wait_timeout_s (PAIRAUDIT_GPU_WAIT_S)" in msg
        assert not (tmp_path / "r").exists()  # no server was started
    finally:
        holder.kill()
        holder.wait()


def test_asking_more_than_the_pool_has_or_what_this_process_holds_fails_at_once(pool, tmp_path):
    big = resolve_spec("control", fake_arm(tmp_path / "r", gpus=5))
    t0 = time.monotonic()
    with pytest.raises(gpupool.GpuPoolError, match=r"arm control: asks 5 GPU\(s\) but the pool has 4 "
                                                   r"\(PAIRAUDIT_GPU_POOL=0,1,2,3: 0,1,2,3\)"):
        gpupool.acquire_for(big)
    three = resolve_spec("control", fake_arm(tmp_path / "r", gpus=3))
    with gpupool.reserve([three]):
        with pytest.raises(gpupool.GpuPoolError, match="this process already holds GPU"):
            gpupool.acquire_for(resolve_spec("candidate", fake_arm(tmp_path / "r", gpus=2)))
    assert time.monotonic() - t0 < 30  # refused, not waited out
    assert all(free(pool, range(4)).values())


def test_nothing_stays_held_after_a_failed_start_or_an_exception(pool, tmp_path):
    spec = resolve_spec("control", {**fake_arm(tmp_path / "r", gpus=2), "command": [
        "{python}", FAKE, "--port", "{port}", "--fault", "die"]})
    with pytest.raises(ServerError, match="planted failure"):
        Server(spec, log_path=tmp_path / "s.log").start()
    assert all(free(pool, range(4)).values()) and not gpupool._HELD
    with pytest.raises(RuntimeError, match="boom"):
        with gpupool.reserve([resolve_spec("control", fake_arm(tmp_path / "r", gpus=4))]):
            assert not any(free(pool, range(4)).values())
            raise RuntimeError("boom")
    assert all(free(pool, range(4)).values()) and not gpupool._HELD


SERVING = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pairaudit.serving.armspec import resolve_spec
    from pairaudit.serving.launch import Server
    arm, cfg, events, go = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    with Server(resolve_spec(arm, cfg), log_path=events.with_name(arm + ".log")) as srv:
        with open(events, "a") as f:
            f.write(json.dumps({{"arm": arm, "event": "ready", "server_pid": srv.pid,
                                "gpus": srv.facts()["gpus"]}}) + "\\n")
        while not go.exists():
            time.sleep(0.05)
    with open(events, "a") as f:
        f.write(json.dumps({{"arm": arm, "event": "stopped"}}) + "\\n")
""")


def _serving(tmp_path: Path, arm: str, cfg: dict, ev: Path, go: Path) -> subprocess.Popen:
    script = tmp_path / "serving.py"
    script.write_text(SERVING.format(root=ROOT))
    return subprocess.Popen([sys.executable, str(script), arm, json.dumps(cfg), str(ev), str(go)],
                            stderr=subprocess.PIPE, text=True)


def test_a_killed_holder_leaks_no_gpu(pool, tmp_path):
    rec, ev = tmp_path / "env.jsonl", tmp_path / "events"
    proc = _serving(tmp_path, "control", fake_arm(rec, gpus=2), ev, tmp_path / "never")
    ready = None
    try:
        ready = wait_for(lambda: [e for e in records(ev) if e["event"] == "ready"], "the server")[0]
        assert ready["gpus"]["cuda_visible_devices"] == "0,1"
        assert free(pool, range(4)) == {"0": False, "1": False, "2": True, "3": True}
        proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: the kernel drops the flocks
        proc.wait()
        # the server it started never had the lock descriptors (close-on-exec), so they are free at once
        assert all(free(pool, range(4)).values())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if ready is not None:
            try:
                os.kill(ready["server_pid"], signal.SIGKILL)  # its parent-death signal already did, normally
            except ProcessLookupError:
                pass


# --------------------------------------------------------------------- what the server is started with

def test_both_arms_serve_at_once_on_disjoint_gpus_and_the_server_sees_them(pool, tmp_path, monkeypatch):
    monkeypatch.setenv(gpupool.POOL_ENV, "0,1")
    rec, ev, go = tmp_path / "env.jsonl", tmp_path / "events", tmp_path / "go"
    procs = [_serving(tmp_path, arm, fake_arm(rec, gpus=1), ev, go) for arm in ("control", "candidate")]
    try:
        ready = wait_for(lambda: len([e for e in records(ev) if e["event"] == "ready"]) == 2 and
                         [e for e in records(ev) if e["event"] == "ready"], "both servers")
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    given = {e["arm"]: e["gpus"]["cuda_visible_devices"] for e in ready}
    assert sorted(given.values()) == ["0", "1"]  # both ran at once, one GPU each
    seen = {r["pid"]: r["CUDA_VISIBLE_DEVICES"] for r in records(rec)}
    assert {seen[e["server_pid"]] for e in ready} == {"0", "1"}
    for e in ready:
        assert seen[e["server_pid"]] == e["gpus"]["cuda_visible_devices"]  # what it ran with is what was recorded
        assert e["gpus"]["source"] == "pool" and e["gpus"]["pool"] == ["0", "1"] and e["gpus"]["shared"] is False


CLASH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from pairaudit.serving import gpupool
    from pairaudit.serving.armspec import ArmSpec
    try:
        gpupool.reserve([ArmSpec.from_json(json.loads(sys.argv[1]))], timeout_s=0.3)
        print("got it")
    except gpupool.GpuPoolError as exc:
        print(f"GpuPoolError: {{exc}}")
""")


def test_a_pinned_arm_takes_exactly_its_ids_from_the_same_locks(pool, tmp_path, monkeypatch):
    monkeypatch.setenv(gpupool.WAIT_ENV, "0.5")
    rec = tmp_path / "env.jsonl"
    pinned = resolve_spec("candidate", fake_arm(rec, env={"CUDA_VISIBLE_DEVICES": "0,2"}))
    with Server(pinned, log_path=tmp_path / "p.log") as srv:
        facts = srv.facts()["gpus"]
        assert facts["source"] == "pinned" and [d["id"] for d in facts["devices"]] == ["0", "2"]
        assert records(rec)[-1]["CUDA_VISIBLE_DEVICES"] == "0,2"
        assert free(pool, range(4)) == {"0": False, "1": True, "2": False, "3": True}
        # the pool's next taker gets what the pin left
        with Server(resolve_spec("control", fake_arm(rec, gpus=2)), log_path=tmp_path / "c.log") as other:
            assert other.facts()["gpus"]["cuda_visible_devices"] == "1,3"
            assert records(rec)[-1]["CUDA_VISIBLE_DEVICES"] == "1,3"
        # a second pin on a held GPU waits for it, even without a pool: here another process times out naming it
        monkeypatch.delenv(gpupool.POOL_ENV)
        clash = resolve_spec("control", fake_arm(rec, env={"CUDA_VISIBLE_DEVICES": "2"}))
        res = subprocess.run([sys.executable, "-c", CLASH.format(root=ROOT), json.dumps(clash.to_json())], capture_output=True,
                             text=True, timeout=120)
        assert res.stdout.startswith("GpuPoolError: timed out after"), res.stdout + res.stderr
        assert f"waiting for GPU(s) for arm control: pinned 2; gpu 2 held by pid {os.getpid()} " in res.stdout
        # in this process, the same wait could never end: refused at once
        with pytest.raises(gpupool.GpuPoolError, match="this process already holds GPU"):
            gpupool.reserve([clash], timeout_s=0.3)
    assert all(free(pool, range(4)).values())


def test_gpus_0_sees_no_gpu_under_a_pool_and_the_job_environment_without_one(pool, tmp_path, monkeypatch):
    rec = tmp_path / "env.jsonl"
    spec = resolve_spec("control", fake_arm(rec))
    with Server(spec, log_path=tmp_path / "a.log") as srv:
        assert srv.facts()["gpus"]["source"] == "none" and srv.facts()["gpus"]["cuda_visible_devices"] == ""
    assert records(rec)[-1]["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.delenv(gpupool.POOL_ENV)
    with Server(spec, log_path=tmp_path / "b.log") as srv:
        assert srv.facts()["gpus"]["source"] == "no pool" and srv.facts()["gpus"]["cuda_visible_devices"] is None
    assert records(rec)[-1]["CUDA_VISIBLE_DEVICES"] is None  # left unset, as before the pool existed
    asks = resolve_spec("control", fake_arm(rec, gpus=2))
    with Server(asks, log_path=tmp_path / "c.log") as srv:  # gpus without a pool: the job's environment as is
        assert srv.facts()["gpus"]["source"] == "no pool"
    assert records(rec)[-1]["CUDA_VISIBLE_DEVICES"] is None


def test_the_ids_are_in_the_launch_receipt_and_the_start_log(pool, tmp_path):
    rec, starts = tmp_path / "env.jsonl", tmp_path / "servers" / "starts.jsonl"
    spec = resolve_spec("control", fake_arm(rec, gpus=2))
    receipt = launch.launch_record(spec, log_path=tmp_path / "launch.log")
    assert receipt["run"]["gpus"]["cuda_visible_devices"] == "0,1"
    assert [d["id"] for d in receipt["run"]["gpus"]["devices"]] == ["0", "1"]
    assert records(rec)[-1]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert receipt["spec_sha256"] == spec.spec_sha256  # ids are not identity
    with PhaseServer(spec, phase="answers", log_path=str(tmp_path / "answers.log"), receipt=launch.receipt(spec),
                     starts_log=str(starts)) as ps:
        ps.get()
    ready, stopped = records(starts)
    assert ready["event"] == "ready" and ready["gpus"]["cuda_visible_devices"] == "0,1"
    assert ready["gpus"]["devices"][0]["lock"] == str(pool / "gpu-0.lock")
    assert stopped["event"] == "stopped"
    assert all(free(pool, range(4)).values())


# --------------------------------------------------------------------- the speed bracket

CONTENDER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pairaudit.serving import gpupool
    from pairaudit.serving.armspec import ArmSpec
    events, stop = Path(sys.argv[1]), Path(sys.argv[2])
    with open(events, "a") as f:
        f.write(json.dumps({{"event": "asking", "at": time.time()}}) + "\\n")
    lease = gpupool.acquire_for(ArmSpec(arm="contender", mode="launch", model="m", served_model_name="m", max_model_len=None, speculative=False, model_sha256=None, health_timeout_s=30.0, command_identity=("x",), gpus=3))
    with open(events, "a") as f:
        f.write(json.dumps({{"event": "got", "ids": lease.ids, "at": time.time()}}) + "\\n")
    while not stop.exists():
        time.sleep(0.05)
    lease.release()
""")


def test_the_speed_bracket_runs_its_three_starts_on_the_same_gpus_and_reads_their_clocks(pool, tmp_path,
                                                                                          monkeypatch):
    """A contender asking 3 of the 4 GPUs arrives during s1: it must wait for the whole bracket.

    If the bracket let its GPUs go between starts, the contender would take
    three of them and hold them, and s2 could not have the same two ids.
    """
    from pairaudit.plans import stage as plan_stage
    from pairaudit.speed import bracket as speed_bracket
    from pairaudit.speed import stage as speed_stage

    smi = FakeSmi(tmp_path / "smi", gpus=[{"index": str(i), "uuid": u} for i, u in enumerate(UUIDS)])
    monkeypatch.setenv("PATH", f"{smi.exe.parent}:/usr/bin:/bin")
    monkeypatch.setenv(gpupool.WAIT_ENV, "600")  # bounds a hang only: the contender waits out the whole bracket
    rec, starts_log = tmp_path / "env.jsonl", tmp_path / "starts.jsonl"
    arms = {"control": fake_arm(rec, gpus=2), "candidate": fake_arm(rec, gpus=2)}
    arms["candidate"]["command"] = [*arms["candidate"]["command"], "--spec"]
    lp, pp, sp = {}, {}, {}
    for arm, cfg in arms.items():
        sp[arm] = str(tmp_path / f"specs/{arm}.json")
        plan_stage.arm_spec_stage(arm=arm, arm_cfg=cfg, out_path=sp[arm])
        lp[arm] = str(tmp_path / f"launch-{arm}.json")
        artifacts.write_json(lp[arm], launch.receipt(armspec.resolve_spec(arm, cfg)))
        pp[arm] = str(tmp_path / f"preflight-{arm}.json")
        artifacts.write_json(pp[arm], {"schema": "pairaudit.preflight/v1", "verdict": "PASS"})
    cfg = {"cells": [{"name": "c1", "prompt": "random", "input_len": 16, "concurrency": 1}], "repeats": 2,
           "waves": 1, "output_len": 8, "archive": str(tmp_path / "archive.jsonl"), "accept_unverifiable_clock": True,
           "max_starts": 3, "repeat_s": None}
    out = {}

    def bracket():
        out["doc"] = speed_stage.speed_stage(
            launch_paths=lp, preflight_paths=pp, spec_paths=sp, speed=speed_bracket.resolve(cfg), audit="pool",
            out_path=str(tmp_path / "decision.json"), streams_path=str(tmp_path / "streams.jsonl"),
            archive_path=str(tmp_path / "archive.jsonl"),
            server_logs={s: str(tmp_path / f"{s}.log") for s in ("s1", "s2", "s3")}, starts_log=str(starts_log))

    script = tmp_path / "contender.py"
    script.write_text(CONTENDER.format(root=ROOT))
    ev, stop = tmp_path / "contender.events", tmp_path / "stop"
    t = threading.Thread(target=bracket, daemon=True)
    t.start()
    contender = None
    try:
        wait_for(lambda: any(r["event"] == "ready" for r in records(starts_log)) if starts_log.exists() else False,
                 "the first start")
        contender = subprocess.Popen([sys.executable, str(script), str(ev), str(stop)], stderr=subprocess.PIPE,
                                     text=True)
        # whichever comes first; a contender served mid-bracket is let go at once so the bracket can end
        wait_for(lambda: not t.is_alive() or any(e["event"] == "got" for e in records(ev)), "the bracket",
                 limit_s=300)
        stop.touch()
        t.join(timeout=300)
        assert not t.is_alive()
        wait_for(lambda: any(e["event"] == "got" for e in records(ev)), "the contender")
    finally:
        stop.touch()
        if contender is not None:
            contender.wait(timeout=60)
    doc = out["doc"]
    assert doc.get("not_run") is None and [s["start"] for s in doc["starts"]] == ["s1", "s2", "s3"]
    given = [s["server"]["gpus"] for s in doc["starts"]]
    assert [g["cuda_visible_devices"] for g in given] == ["0,1"] * 3
    assert all(g["shared"] and g["source"] == "pool" for g in given)
    assert [d["uuid"] for d in given[0]["devices"]] == UUIDS[:2]  # locked by UUID where nvidia-smi resolves it
    # what each server process really got
    assert [r["CUDA_VISIBLE_DEVICES"] for r in records(rec)] == ["0,1"] * 3
    # the clock facts, before and after each start, read exactly those GPUs
    for s in doc["starts"]:
        for reading in (s["clock"]["gpu"], s["clock_after"]["gpu"]):
            assert reading["cuda_visible_devices"] == "0,1" and reading["error"] is None
            assert [g["uuid"] for g in reading["gpus"]] == UUIDS[:2]
    # the contender asked during s1 and got its three GPUs only after the bracket's last stop
    asked, got = records(ev)
    last_stop = max(r["at"] for r in records(starts_log) if r["event"] == "stopped")
    assert asked["event"] == "asking" and got["ids"] == ["0", "1", "2"]
    from datetime import datetime
    assert got["at"] >= datetime.fromisoformat(last_stop.replace("Z", "+00:00")).timestamp()
    ready = [r for r in records(starts_log) if r["event"] == "ready"]
    assert [r["gpus"]["cuda_visible_devices"] for r in ready] == ["0,1"] * 3
    assert all(free(pool, UUIDS).values())
