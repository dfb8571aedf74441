"""``pairaudit audit --control URL --candidate URL``: a first audit of two running endpoints with no YAML.

The workflow test starts two real reference servers (the control fp32, the candidate with the BF16 LM
head), runs the command in a scratch copy of the project with a small ``--limit``, and checks that the
decision is of those two endpoints, that the command exits with its code, and that the written config is
kept: the same command again runs that file and reruns nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pairaudit.cli import audit
from pairaudit.cli.codes import EXIT, REFUSED

REPO = Path(__file__).resolve().parents[1]


def args(**kw) -> argparse.Namespace:
    base = dict(control="http://127.0.0.1:1", candidate="http://127.0.0.1:2", datasets="arith,algebra", limit=None,
                audit="attach", model=None, max_tokens=None, api_key_env=None, speculative=None, no_speed=False,
                speed_informational=False,
                cores=2, dry_run=False, rewrite=False)
    return argparse.Namespace(**{**base, **kw})


def test_the_dataset_names_are_the_projects_own_entries():
    known = audit.known_datasets()
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["datasets"]
    assert [d["name"] for d in default] == list(known)[:len(default)]   # the embedded default's first
    assert {"gsm8k", "math500", "mbpp"} <= set(known)


def test_limit_selects_n_items_keeping_the_seed():
    entry = {"name": "a", "source": {"generated": {"kind": "arith", "n": 5, "seed": 7}},
             "select": {"count": 32, "seed": 3}}
    assert audit.limited(entry, 2)["select"] == {"count": 2, "seed": 3}
    assert audit.limited(entry, 9)["select"] == {"count": 5, "seed": 3}   # never past the suite's size
    assert audit.limited({"select": {"indices": [4, 1, 8]}}, 2)["select"] == {"indices": [4, 1]}
    hub = {"name": "h", "source": {"hf": {"repo": "r"}}, "select": {"count": 32, "seed": 1}}
    assert audit.limited(hub, 100)["select"] == {"count": 100, "seed": 1}   # the load check knows the rows
    assert audit.limited(entry, None) == entry and audit.limited(entry, None) is not entry


def test_the_speed_cells_are_shortened_only_where_the_context_is_too_short():
    assert audit.fitted_cells([40960, 32768]) is None   # the schema's cells fit: the defaults stand
    cells = audit.fitted_cells([4096, 1024])
    output_len = audit.defaults.section("speed")["output_len"]
    assert cells is not None and all(c["input_len"] + output_len <= 1024 for c in cells if c["prompt"] != "short")
    assert [c["name"] for c in cells] == [c["name"] for c in audit.defaults.section("speed")["cells"]]
    with pytest.raises(audit.AuditArgsError, match="--no-speed"):
        audit.fitted_cells([output_len + 8])


def test_an_unknown_dataset_is_refused_naming_the_known_ones():
    with pytest.raises(audit.AuditArgsError, match=r"unknown nosuch \(allowed: arith, algebra, .*gsm8k"):
        audit.build_config(args(datasets="arith,nosuch"))


def test_the_endpoints_model_and_context_come_from_their_models_list(fake):
    ep = fake()
    assert audit.served_model(ep.base_url, model=None, api_key=None)[0] == "fake-model"
    with pytest.raises(audit.AuditArgsError, match="does not serve 'other'"):
        audit.served_model(ep.base_url, model="other", api_key=None)
    with pytest.raises(audit.AuditArgsError, match="did not answer"):
        audit.served_model("http://127.0.0.1:9", model=None, api_key=None)


def test_the_config_written_for_two_endpoints(fake):
    control, candidate = fake(max_model_len=1024), fake("no_len")
    config = audit.build_config(args(control=control.base_url + "/", candidate=candidate.base_url, limit=2,
                                     datasets="algebra", speculative="candidate", speed_informational=True,
                                     max_tokens=64))
    assert config["arms"]["control"] == {"mode": "attach", "url": control.base_url, "model": "fake-model",
                                         "served_model_name": "fake-model", "max_model_len": 1024,
                                         "speculative": False, "health_timeout_s": 60}
    assert "max_model_len" not in config["arms"]["candidate"]   # not listed: the server's own limit applies
    assert config["arms"]["candidate"]["speculative"] is True
    assert [(d["name"], d["select"]["count"]) for d in config["datasets"]] == [("algebra", 2)]
    assert config["sampling"]["max_tokens"] == 64 and config["greedy"]["max_tokens"] == 64
    assert config["speed"]["informational"] is True
    # the schema's cells, their prompts shortened to fit the smallest context a server lists
    assert [c["name"] for c in config["speed"]["cells"]] == [c["name"] for c in audit.defaults.section("speed")["cells"]]
    output_len = audit.defaults.section("speed")["output_len"]
    assert all(c["input_len"] + output_len <= 1024 for c in config["speed"]["cells"] if c["prompt"] != "short")
    with pytest.raises(audit.AuditArgsError, match="pass --no-speed"):
        audit.build_config(args(control=fake(max_model_len=output_len).base_url, candidate=candidate.base_url))
    tiny = audit.build_config(args(control=fake(max_model_len=output_len).base_url, candidate=candidate.base_url,
                                   no_speed=True))
    assert tiny["speed"] == {"enabled": False}


def test_a_kept_config_of_other_endpoints_is_refused(tmp_path):
    kept = tmp_path / "attach.yaml"
    kept.write_text(yaml.safe_dump({"arms": {"control": {"url": "http://a:1"}, "candidate": {"url": "http://b:2"}}}))
    assert audit.kept_config(kept, args(control="http://a:1/", candidate="http://b:2"))
    with pytest.raises(audit.AuditArgsError, match=r"arms.candidate.url http://b:2, not http://c:3"):
        audit.kept_config(kept, args(control="http://a:1", candidate="http://c:3"))


def test_outside_a_checkout_it_refuses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert audit.run(args()) == REFUSED


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.workflow
@pytest.mark.server
def test_one_command_audits_two_running_endpoints_and_keeps_its_config(shared_server, tmp_path):
    from test_workflow import TINY, make_project

    control = shared_server({}, 1024)
    candidate = shared_server({"PAIRAUDIT_REF_LM_HEAD_BF16": "1"}, 1024)
    project = make_project(tmp_path / "project", yaml.safe_load(TINY.read_text()))
    cmd = [sys.executable, "-m", "pairaudit.cli", "audit", "--control", control.url, "--candidate", candidate.url,
           "--datasets", "arith", "--limit", "2", "--no-speed", "--cores", "2", "--audit", "first"]
    first = subprocess.run(cmd, cwd=project, capture_output=True, text=True, timeout=1800)
    out = first.stdout + first.stderr
    decision_path = project / "results" / "first" / "promotion" / "decision.json"
    assert decision_path.is_file(), out[-6000:]
    decision = json.loads(decision_path.read_text())
    assert first.returncode == EXIT[decision["decision"]], out[-3000:]
    assert {arm: (a["mode"], a["url"]) for arm, a in decision["arms"].items()} == {
        "control": ("attach", control.url), "candidate": ("attach", candidate.url)}
    assert decision["datasets"]["arith"]["n"] == 2
    assert "speed" in decision["not_evaluated"]
    kept = project / "config" / "audits" / "first.yaml"
    config = yaml.safe_load(kept.read_text())
    assert config["arms"]["candidate"]["max_model_len"] == 1024   # asked of the server's /v1/models
    assert config["arms"]["control"]["served_model_name"] == "SmolLM2-135M-Instruct"

    before = _sha(decision_path)
    again = subprocess.run(cmd, cwd=project, capture_output=True, text=True, timeout=900)
    assert again.returncode == first.returncode, (again.stdout + again.stderr)[-3000:]
    assert "running the kept config/audits/first.yaml" in again.stdout
    assert _sha(decision_path) == before   # the kept config is the same audit: nothing reran
