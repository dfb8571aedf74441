"""API keys: an arm names the variable that holds its key; the key goes out as a bearer token and nowhere else.

A launched server gets this user's launch key (one key in a file only its owner reads, the same at every
start: vLLM hashes VLLM_API_KEY into its compile cache key), in its environment only; the preflight checks
that a request without the key is refused; an audit of an endpoint behind a key leaves the key in
none of its files.
"""

import json
import os
import secrets
import stat
from pathlib import Path

import pytest
import requests
import yaml

from pairaudit.refserver import api as refapi
from pairaudit.serving import apikey, armspec
from pairaudit.serving.armspec import ArmSpec, ConfigError, resolve_spec
from pairaudit.serving.client import Endpoint
from pairaudit.serving.launch import Server, ServerError
from pairaudit.serving.preflight import probe_names, run_preflight

REF_CMD = ["{python}", "-m", "pairaudit.refserver", "--model", "{model}", "--host", "{host}", "--port", "{port}",
           "--max-model-len", "{max_model_len}", "--threads", "1"]
MODEL = "SmolLM2-135M-Instruct"
REF_ENV = {"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "PAIRAUDIT_REF_SPEC_NGRAM": "0"}


def launch_arm(**kw):
    return {"mode": "launch", "command": REF_CMD, "env": REF_ENV, "model": MODEL, "max_model_len": 1024,
            "health_timeout_s": 300, **kw}


# ------------------------------------------------------------------ the arm spec

def test_api_key_env_is_access_not_identity():
    attach = {"mode": "attach", "url": "http://h:8000", "model": "m"}
    keyed = resolve_spec("control", {**attach, "api_key_env": "PROD_KEY"})
    assert keyed.api_key_env == "PROD_KEY"
    # the same server reached with a key or without: one identity, one spec hash
    assert keyed.spec_sha256 == resolve_spec("control", attach).spec_sha256
    assert resolve_spec("control", attach).api_key_env is None
    assert ArmSpec.from_json(keyed.to_json()) == keyed
    # a spec file written before keys existed reads back as a server reached without one
    old = {k: v for k, v in keyed.to_json().items() if k != "api_key_env"}
    assert ArmSpec.from_json(old).api_key_env is None


def test_launched_reference_servers_and_vllm_get_their_key_variable():
    assert resolve_spec("control", launch_arm()).api_key_env == armspec.REFSERVER_KEY_ENV == refapi.API_KEY_ENV
    vllm = launch_arm(command=["{vllm_python}", "-m", "vllm.entrypoints.openai.api_server", "--port", "{port}"])
    assert resolve_spec("control", vllm).api_key_env == armspec.VLLM_KEY_ENV == "VLLM_API_KEY"
    other = launch_arm(command=["my-server", "--port", "{port}"])
    assert resolve_spec("control", other).api_key_env is None
    assert resolve_spec("control", {**other, "api_key_env": "MY_SERVER_KEY"}).api_key_env == "MY_SERVER_KEY"


@pytest.mark.parametrize("cfg, words", [
    (launch_arm(api_key_env="1BAD"), "arms.control.api_key_env: '1BAD' is not an environment variable name"),
    (launch_arm(env={**REF_ENV, "PAIRAUDIT_REF_API_KEY": "k"}), "arms.control.env.PAIRAUDIT_REF_API_KEY"),
    ({"mode": "attach", "url": "http://h", "model": "m", "api_key_env": 3}, "is not an environment variable"),
])
def test_a_bad_api_key_env_is_refused_by_name(cfg, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("(", r"\(")):
        resolve_spec("control", cfg)


def test_the_reference_servers_check_follows_vllms():
    key = "k-123"
    assert refapi.authorized("/v1/models", f"Bearer {key}", key)
    assert refapi.authorized("/v1/models", f"bearer {key}", key)
    assert not refapi.authorized("/v1/models", None, key)
    assert not refapi.authorized("/v1/chat/completions", "Bearer wrong", key)
    assert not refapi.authorized("/v1/completions", key, key)          # no scheme
    # what vLLM leaves open stays open; no key configured: everything passes
    assert all(refapi.authorized(p, None, key) for p in ("/health", "/metrics", "/version", "/tokenize"))
    assert refapi.authorized("/v1/models", None, None)


def test_the_preflight_fails_a_server_that_answers_without_the_key(fake):
    ep = fake()                                   # answers every request, key or not
    keyed = Endpoint(ep.base_url, model="fake-model", timeout_s=10, api_key="s3cret")
    spec = resolve_spec("candidate", {"mode": "attach", "url": ep.base_url, "model": "fake-model",
                                      "max_model_len": 256})
    result = run_preflight(keyed, spec)
    assert result["verdict"] == "FAIL" and result["failed_probe"] == "api_key_required"
    probe = result["probes"][-1]
    assert "not refused" in probe["reason"] and probe["calls"][0]["without_key"] is True
    assert [p["name"] for p in result["probes"]] == probe_names(False, keyed=True)[:2]
    assert "s3cret" not in json.dumps(result)
    # without a key the probe is not asked
    assert "api_key_required" not in [p["name"] for p in run_preflight(ep, spec)["probes"]]


# ------------------------------------------------------------------ real servers

def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)


@pytest.mark.server
def test_every_launch_gets_the_launch_key_the_server_checks_and_nothing_records(tmp_path, monkeypatch):
    monkeypatch.setenv(apikey.KEY_FILE_ENV, str(tmp_path / "keys" / "server-api-key"))
    spec = resolve_spec("control", launch_arm())
    keys = []
    for n in range(2):
        log = tmp_path / f"ref{n}.log"
        with Server(spec, log_path=log) as srv:
            key = environ_of(srv.pid)[armspec.REFSERVER_KEY_ENV]
            keys.append(key)
            url = srv.facts()["url"]
            assert requests.get(url + "/v1/models", timeout=30).status_code == 401
            assert requests.get(url + "/v1/models", timeout=30,
                                headers={"Authorization": "Bearer not-the-key"}).status_code == 401
            assert requests.get(url + "/v1/models", timeout=30,
                                headers={"Authorization": f"Bearer {key}"}).status_code == 200
            assert requests.get(url + "/health", timeout=30).status_code == 200
            result = run_preflight(srv.endpoint, spec)
            assert result["verdict"] == "PASS", result["failed_probe"]
            assert [p["name"] for p in result["probes"]] == probe_names(False, keyed=True)
            assert result["probes"][1]["status"] == 401
            # never on its command line (every user of the host can read it)
            assert key not in " ".join(srv.facts()["command"])
            assert Path(f"/proc/{srv.pid}/cmdline").read_bytes().find(key.encode()) == -1
            facts = json.dumps(srv.facts(), default=str)
            if n == 0:
                # an attached arm reads its key from the audit's environment, named by api_key_env
                attach = resolve_spec("control", {"mode": "attach", "url": url, "model": MODEL,
                                                  "api_key_env": "PAIRAUDIT_TEST_ENDPOINT_KEY"})
                monkeypatch.delenv("PAIRAUDIT_TEST_ENDPOINT_KEY", raising=False)
                with pytest.raises(ServerError, match="api_key_env PAIRAUDIT_TEST_ENDPOINT_KEY: the variable is "
                                                      "not set"):
                    Server(attach).start()
                monkeypatch.setenv("PAIRAUDIT_TEST_ENDPOINT_KEY", key)
                with Server(attach) as att:
                    assert run_preflight(att.endpoint, attach)["verdict"] == "PASS"
        assert key not in facts and key not in log.read_text()
    # one key for every start (vLLM's compile cache key hashes it), made on first use, readable by its owner only
    key_file = tmp_path / "keys" / "server-api-key"
    assert keys[0] == keys[1] == key_file.read_text().strip() and len(keys[0]) >= 32
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700


def test_the_launch_key_is_made_once_and_refused_when_others_could_read_it(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "pairaudit" / "server-api-key"
    monkeypatch.delenv(apikey.KEY_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert apikey.key_file() == path
    first = apikey.launch_key()
    assert apikey.launch_key() == first and path.read_text() == first + "\n"
    assert not [p for p in path.parent.iterdir() if p != path]      # no temporary file left beside it
    path.chmod(0o640)
    with pytest.raises(apikey.KeyFileError, match=r"server-api-key is open to other users \(mode 640\).*delete it"):
        apikey.launch_key()
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(apikey.KeyFileError, match="does not hold a key"):
        apikey.launch_key()
    path.unlink()
    assert apikey.launch_key() != first                              # deleted: a new key at the next start
    (tmp_path / "f").write_text("")                                   # a file, where a directory is needed
    monkeypatch.setenv(apikey.KEY_FILE_ENV, str(tmp_path / "f" / "key"))
    with pytest.raises(apikey.KeyFileError, match=r"f/key cannot be made .*PAIRAUDIT_SERVER_KEY_FILE"):
        apikey.launch_key()


def test_a_server_whose_key_file_is_unusable_stops_before_it_starts(tmp_path, monkeypatch):
    bad = tmp_path / "server-api-key"
    bad.write_text(secrets.token_urlsafe(32))
    bad.chmod(0o644)
    monkeypatch.setenv(apikey.KEY_FILE_ENV, str(bad))
    with pytest.raises(ServerError, match=r"\[arm control\] the server key file .* is open to other users"):
        Server(resolve_spec("control", launch_arm()), log_path=tmp_path / "ref.log").start()
    assert not (tmp_path / "ref.log").exists() or "pairaudit launch" not in (tmp_path / "ref.log").read_text()


@pytest.mark.workflow
def test_an_audit_of_endpoints_behind_a_key_writes_the_key_nowhere(tmp_path, monkeypatch):
    """Both arms attached to one reference server that demands a key; every file the audit leaves is grepped."""
    from refserver_fixture import RefServer
    from test_workflow import TINY, make_project, snake

    key = "pa-" + secrets.token_urlsafe(24)
    server = RefServer(env={**REF_ENV, refapi.API_KEY_ENV: key}, max_model_len=1024, log_dir=tmp_path)
    try:
        assert requests.get(server.url + "/v1/models", timeout=30).status_code == 401
        config = yaml.safe_load(TINY.read_text())
        config["audit"] = "keyed"
        arm = {"mode": "attach", "url": server.url, "model": MODEL, "max_model_len": 1024, "speculative": False,
               "api_key_env": "PAIRAUDIT_TEST_ENDPOINT_KEY"}
        config["arms"] = {"control": arm, "candidate": dict(arm)}
        project = make_project(tmp_path / "project", config)
        monkeypatch.setenv("PAIRAUDIT_TEST_ENDPOINT_KEY", key)
        proc = snake(project, "promotion")
    finally:
        server.stop()
    res = project / "results" / "keyed"
    decision = json.loads((res / "promotion" / "decision.json").read_text())
    assert decision["gates"]["preflight:control"]["verdict"] == "PASS"
    pre = json.loads((res / "preflight" / "candidate.json").read_text())
    assert [p["name"] for p in pre["probes"]][:2] == ["health", "api_key_required"] and pre["verdict"] == "PASS"
    # every file under the project the audit wrote to, the terminal's output too
    leaked = [str(p) for p in project.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaked == [], leaked
    assert key not in proc.stdout and key not in proc.stderr
    files = sum(1 for p in res.rglob("*") if p.is_file())
    assert files > 40, files      # the grep saw the whole audit: receipts, journals, logs, exports, report
    assert os.environ["PAIRAUDIT_TEST_ENDPOINT_KEY"] == key
