"""pairaudit.serving.armspec: the typed arm spec, its spec file, and host placeholders filled at launch.

No server here: what a launch does with the spec is in tests/test_launch.py and
the phases' tests, which start servers from spec files like these.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from test_launch import fake_cfg

from pairaudit.core import artifacts, contracts
from pairaudit.plans import stage as plan_stage
from pairaudit.serving import armspec
from pairaudit.serving.armspec import ArmSpec, ArmSpecError

VLLM_ARM = {"mode": "launch", "model": "SmolLM2-135M-Instruct", "max_model_len": 1024,
            "command": ["{vllm_python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}",
                        "--served-model-name", "{served_model_name}", "--port", "{port}",
                        "--speculative-config", '{"method": "ngram"}'],
            "env": {"VLLM_BATCH_INVARIANT": 1}, "speculative": True, "gpus": 1}
ATTACH_ARM = {"mode": "attach", "url": "http://gpu-host:8000/", "model": "m", "max_model_len": 64}


@pytest.mark.parametrize("cfg", [VLLM_ARM, ATTACH_ARM, fake_cfg()], ids=["launch-vllm", "attach", "launch-fake"])
def test_to_json_and_from_json_round_trip_exactly(cfg):
    spec = armspec.resolve_spec("control", cfg)
    doc = spec.to_json()
    through_a_file = json.loads(json.dumps(doc))
    again = ArmSpec.from_json(through_a_file)
    assert again == spec and again.to_json() == doc == through_a_file
    assert again.spec_sha256 == spec.spec_sha256
    assert set(doc) == {f.name for f in dataclasses.fields(ArmSpec)}
    # the GPUs a server takes are scheduling, not which server it is: recorded, outside the identity hash
    assert "gpus" in doc and "gpus" not in spec.identity()


def test_a_spec_is_immutable():
    spec = armspec.resolve_spec("control", VLLM_ARM)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.model = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.env["PAIRAUDIT_REF_LM_HEAD_BF16"] = "1"  # type: ignore[index]
    assert isinstance(spec.command_identity, tuple)


def test_host_placeholders_stay_symbolic_in_the_record_and_are_filled_where_the_server_runs(monkeypatch, tmp_path):
    # the node that resolves the spec (the arm_spec job) has its vLLM and cache here ...
    monkeypatch.setenv("PAIRAUDIT_VLLM_PYTHON", "/login-node/venv-vllm/bin/python")
    monkeypatch.setenv("PAIRAUDIT_CACHE", "/login-node/cache")
    path = tmp_path / "specs" / "candidate.json"
    plan_stage.arm_spec_stage(arm="candidate", arm_cfg=VLLM_ARM, out_path=str(path))
    text = path.read_text()
    assert "/login-node" not in text and sys.executable not in text  # no host path in the record
    # ... and the node that runs the server has them elsewhere
    monkeypatch.setenv("PAIRAUDIT_VLLM_PYTHON", "/gpu-node/venv-vllm/bin/python")
    monkeypatch.setenv("PAIRAUDIT_CACHE", "/gpu-node/cache")
    spec = armspec.read_spec(path, arm="candidate")
    cmd = spec.host_command()
    assert cmd[0] == "/gpu-node/venv-vllm/bin/python" and cmd[4].startswith("/gpu-node/cache/models/")
    assert cmd[6] == "SmolLM2-135M-Instruct" and cmd[8] == "{port}"  # filled at resolve / at start
    assert cmd[-1] == '{"method": "ngram"}'  # JSON arguments are not placeholders
    assert spec.command_identity[0] == "{vllm_python}" and spec.command_identity[4] == "{model_dir}"
    # the same arm on any host: the identity hash is the spec file's, wherever it is resolved
    assert artifacts.read_json(path)["spec_sha256"] == spec.spec_sha256 == armspec.resolve_spec(
        "candidate", VLLM_ARM).spec_sha256


def test_a_value_that_spells_a_host_placeholder_is_refused_at_resolve():
    cfg = {**fake_cfg(), "model": "x-{python}"}
    with pytest.raises(armspec.ConfigError, match=r"arms.control.command\[\d+\]: a value filled into '\{model\}'"):
        armspec.resolve_spec("control", cfg)


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d.pop("served_model_name"), r"missing: \['served_model_name'\]"),
    (lambda d: d.update(priority=1), r"unknown: \['priority'\]"),
    (lambda d: d.update(gpus=-1), r"spec.gpus: -1 is not a non-negative integer"),
    (lambda d: d.update(mode="lanch"), r"spec.mode: 'lanch' is not one of launch, attach"),
    (lambda d: d.update(env={"A": 1}), r"spec.env: \{'A': 1\} is not a mapping of strings"),
    (lambda d: d.update(max_model_len="1k"), r"spec.max_model_len: '1k' is not an integer or null"),
    (lambda d: d.update(command_identity=None), r"spec.command_identity: required for a launch arm"),
])
def test_from_json_names_the_bad_key(edit, msg):
    doc = armspec.resolve_spec("control", fake_cfg()).to_json()
    edit(doc)
    with pytest.raises(ArmSpecError, match=msg):
        ArmSpec.from_json(doc)


def test_read_spec_refuses_another_arm_a_foreign_hash_and_an_edit(tmp_path):
    path = tmp_path / "specs" / "control.json"
    doc = plan_stage.arm_spec_stage(arm="control", arm_cfg=fake_cfg(), out_path=str(path))
    assert doc["schema"] == contracts.ARM_SPEC_SCHEMA and armspec.read_spec(path).arm == "control"
    with pytest.raises(artifacts.ArtifactError, match="the spec of arm 'control', expected arm 'candidate'"):
        armspec.read_spec(path, arm="candidate")
    # a record whose hash is not its own identity hash (written under other rules) is refused
    artifacts.write_json(path, {**doc, "spec_sha256": "0" * 64})
    with pytest.raises(artifacts.ArtifactError, match="is not the identity hash"):
        armspec.read_spec(path)
    # a record that is not a spec is refused naming the file and the key
    artifacts.write_json(path, {**doc, "spec": {**doc["spec"], "port": "8000"}})
    with pytest.raises(artifacts.ArtifactError, match=rf"{path}: spec.port: '8000' is not an integer or null"):
        armspec.read_spec(path)
    # an edit by hand is caught by the file's content hash first
    plan_stage.arm_spec_stage(arm="control", arm_cfg=fake_cfg(), out_path=str(path))
    path.write_text(path.read_text().replace('"max_model_len": 256', '"max_model_len": 512'))
    with pytest.raises(artifacts.ArtifactError, match="edited after it was written"):
        armspec.read_spec(path)
