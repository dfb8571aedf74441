"""The change form: one server and a named change derive the two arms, checked at load.

Known answers: the embedded default, written as server + change, derives
exactly the two arms it used to state; a flag switch and a boolean flag land
in the command; every way of stating a change twice or not at all is
refused naming its key; the decision records the change and says when the
launch receipts do not show it; the A/A calibration keeps working.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pairaudit.plans import change as changes
from pairaudit.promotion import calibration
from pairaudit.serving import armspec, launch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "config.yaml"
REF_COMMAND = ["{python}", "-m", "pairaudit.refserver", "--model", "{model}", "--host", "{host}", "--port", "{port}",
               "--max-model-len", "{max_model_len}"]
# The embedded default's two arms as config/config.yaml stated them before it used the change form.
STATED = {
    "control": {"mode": "launch", "command": REF_COMMAND,
                "env": {"PAIRAUDIT_REF_LM_HEAD_BF16": "0", "PAIRAUDIT_REF_SPEC_NGRAM": "0"},
                "model": "SmolLM2-135M-Instruct", "max_model_len": 2048, "speculative": False,
                "health_timeout_s": 300},
    "candidate": {"mode": "launch", "command": REF_COMMAND,
                  "env": {"PAIRAUDIT_REF_LM_HEAD_BF16": "1", "PAIRAUDIT_REF_SPEC_NGRAM": "4"},
                  "model": "SmolLM2-135M-Instruct", "max_model_len": 2048, "speculative": True,
                  "health_timeout_s": 300},
}


def default() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def server(**extra) -> dict:
    return {"mode": "launch", "command": ["vllm", "serve", "{model}", "--port", "{port}", "--seed", "0"],
            "env": {"CUDA_VISIBLE_DEVICES": "0"}, "model": "m", "max_model_len": 4096, **extra}


def derive(srv, switches, **change) -> tuple[dict, list[str]]:
    cfg = {"server": srv, "change": {"name": "c", "switches": switches, **change}}
    return cfg, changes.derive_arms(cfg)


# ------------------------------------------------------------- derivation

def test_the_default_derives_exactly_the_two_arms_it_used_to_state():
    cfg = default()
    assert "arms" not in cfg and {"server", "change"} <= set(cfg)
    assert changes.derive_arms(cfg) == []
    assert cfg["arms"] == STATED
    # same keys in the same order: the workflow's params (and so its reruns) see no difference
    assert [list(a) for a in cfg["arms"].values()] == [list(a) for a in STATED.values()]
    assert changes.arm_differences(cfg["arms"]["control"], cfg["arms"]["candidate"]) == {
        "env": ["PAIRAUDIT_REF_LM_HEAD_BF16", "PAIRAUDIT_REF_SPEC_NGRAM"], "command": False, "other": ["speculative"]}


def test_a_bare_on_key_reads_back_as_on():
    # YAML 1.1 reads `on:` as the boolean true; the change form reads it back
    sw = yaml.safe_load("{env: X, rollback: '0', on: '1'}")
    assert True in sw and "on" not in sw
    cfg, problems = derive(server(), [sw])
    assert problems == [] and cfg["change"]["switches"][0] == {"env": "X", "rollback": "0", "on": "1"}
    assert cfg["arms"]["candidate"]["env"]["X"] == "1" and cfg["arms"]["control"]["env"]["X"] == "0"


def test_flag_switches_are_appended_and_a_boolean_flag_is_absent_or_present():
    cfg, problems = derive(server(), [
        {"env": "VLLM_USE_FLASHINFER_SAMPLER", "rollback": "0", "on": "1"},
        {"flag": "--attention-backend", "rollback": "FLASH_ATTN", "on": "FLASHINFER"},
        {"flag": "--enforce-eager", "rollback": "absent", "on": "present"},
        {"flag": "--speculative-config", "rollback": "absent", "on": '{"method": "ngram"}', "speculative": True}])
    assert problems == []
    c, k = cfg["arms"]["control"], cfg["arms"]["candidate"]
    base = ["vllm", "serve", "{model}", "--port", "{port}", "--seed", "0"]
    assert c["command"] == base + ["--attention-backend", "FLASH_ATTN"]
    assert k["command"] == base + ["--attention-backend", "FLASHINFER", "--enforce-eager",
                                   "--speculative-config", '{"method": "ngram"}']
    assert c["env"] == {"CUDA_VISIBLE_DEVICES": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert (c["speculative"], k["speculative"]) == (False, True)
    # both resolve as ordinary arms (the JSON braces are not placeholders)
    assert list(armspec.resolve_spec("candidate", k).command_identity or ())[-1] == '{"method": "ngram"}'
    # a subset: only the eager switch on
    one = changes.arm_config(cfg["server"], changes.from_config(cfg), {"--enforce-eager"})
    assert one["command"] == base + ["--attention-backend", "FLASH_ATTN", "--enforce-eager"]
    assert one["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and one["speculative"] is False


def test_the_examples_in_the_change_form_derive_arms_that_differ_only_by_their_switches():
    for path in sorted((ROOT / "config" / "examples").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        if "candidates" in cfg:
            assert path.name == "sweep.yaml"  # several changes: tests/test_sweep.py derives its arms
            continue
        if "change" not in cfg:
            assert path.name == "vllm-attach.yaml"  # attach arms: pairaudit sets no switch, two arms it is
            continue
        assert changes.derive_arms(cfg) == [], path.name
        chg = changes.from_config(cfg)
        diff = changes.arm_differences(cfg["arms"]["control"], cfg["arms"]["candidate"])
        assert diff["env"] == sorted(s.name for s in chg.switches if s.kind == "env"), path.name
        assert diff["command"] == any(s.kind == "flag" for s in chg.switches), path.name


def test_the_vllm_pair_variant_in_its_comment_is_a_valid_switch():
    text = (ROOT / "config" / "examples" / "vllm-pair.yaml").read_text()
    lines = [ln.strip().lstrip("#").strip() for ln in text.splitlines()
             if "{flag: --speculative-config" in ln or "on: \"{" in ln]
    entry = yaml.safe_load(" ".join(lines).lstrip("- "))
    cfg, problems = derive(server(), [entry])
    assert problems == []
    assert cfg["arms"]["candidate"]["command"][-2] == "--speculative-config"
    assert '"num_speculative_tokens": 4' in cfg["arms"]["candidate"]["command"][-1]
    assert cfg["arms"]["candidate"]["speculative"] is True and cfg["arms"]["control"]["speculative"] is False


# ------------------------------------------------------------- refusals

REFUSED = [
    ("env-also-in-server", server(), [{"env": "CUDA_VISIBLE_DEVICES", "rollback": "0", "on": "1"}],
     ["change.switches[0].env: CUDA_VISIBLE_DEVICES is also set in server.env"]),
    ("flag-also-in-server", server(), [{"flag": "--seed", "rollback": "0", "on": "1"}],
     ["change.switches[0].flag: --seed is also in server.command (server.command[5]"]),
    ("flag-with-equals-in-server", server(command=["x", "--dtype=float32", "{port}"]),
     [{"flag": "--dtype", "rollback": "float32", "on": "bfloat16"}], ["--dtype is also in server.command"]),
    ("same-values", server(), [{"env": "X", "rollback": "1", "on": 1}],
     ["change.switches[0]: rollback and on are both '1'"]),
    ("env-absent", server(), [{"env": "X", "rollback": "absent", "on": "1"}],
     ["change.switches[0].rollback: 'absent' is for flag switches"]),
    ("boolean-value", server(), [{"env": "X", "rollback": False, "on": True}],
     ["change.switches[0].rollback: False", "quote YAML's booleans"]),
    ("twice", server(), [{"env": "X", "rollback": "0", "on": "1"}, {"env": "X", "rollback": "0", "on": "2"}],
     ["change.switches[1].env: X is already switched by change.switches[0]"]),
    ("both-kinds", server(), [{"env": "X", "flag": "--x", "rollback": "0", "on": "1"}],
     ["change.switches[0]: give exactly one of env, flag (got env, flag)"]),
    ("unknown-key", server(), [{"env": "X", "rollback": "0", "on": "1", "default": "0"}],
     ["change.switches[0]: unknown key 'default'"]),
    ("flag-with-value", server(), [{"flag": "--dtype=bf16", "rollback": "absent", "on": "present"}],
     ["change.switches[0].flag: '--dtype=bf16'"]),
    ("no-switches", server(), [], ["change.switches: []", "non-empty list"]),
    ("attach", {"mode": "attach", "url": "http://h:1", "model": "m"}, [{"env": "X", "rollback": "0", "on": "1"}],
     ["server.mode: 'attach' (allowed: launch"]),
]


@pytest.mark.parametrize("srv,switches,texts", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_change_stated_wrongly_is_refused_naming_the_key(srv, switches, texts):
    cfg, problems = derive(copy.deepcopy(srv), copy.deepcopy(switches))
    msg = "\n".join(problems)
    assert "arms" not in cfg, "nothing is derived from a refused change"
    for text in texts:
        assert text in msg, f"{text!r} not in {msg!r}"


def test_every_problem_of_a_change_is_reported_at_once():
    _, problems = derive(server(), [{"env": "CUDA_VISIBLE_DEVICES", "rollback": "0", "on": "1"},
                                    {"flag": "--seed", "rollback": "0", "on": "1"}], name="bad name")
    assert len(problems) == 3 and problems[0].startswith("change.name: 'bad name'")


def test_both_forms_at_once_and_half_a_change_form_are_refused_naming_the_keys():
    cfg = default()
    cfg["arms"] = copy.deepcopy(STATED)
    assert changes.derive_arms(cfg) == [
        "arms and server and change: both forms at once (allowed: either arms (control and candidate) or server + "
        "change, which derives them); a --configfile in one form merged over a config in the other does this: pass "
        "--replace-workflow-config"]
    only = default()
    del only["change"]
    assert changes.derive_arms(only) == ["change: missing (allowed: server and change together; the change form "
                                         "needs both)"]
    two_arm = {"arms": copy.deepcopy(STATED)}
    assert changes.derive_arms(two_arm) == [] and two_arm == {"arms": STATED}  # the two-arm form still loads


# --------------------------------------------------- the record and the receipts

def _receipts(cfg):
    return {arm: launch.receipt(armspec.resolve_spec(arm, cfg["arms"][arm])) for arm in ("control", "candidate")}


def test_the_decision_records_the_change_and_that_the_receipts_show_it():
    cfg = default()
    changes.derive_arms(cfg)
    rec = changes.decision_record(cfg, _receipts(cfg))
    assert rec["name"] == "bf16-head-ngram" and rec["receipts_agree"] is True and rec["receipt_problems"] == []
    assert [(s["kind"], s["name"], s["rollback"], s["on"]) for s in rec["switches"]] == [
        ("env", "PAIRAUDIT_REF_LM_HEAD_BF16", "0", "1"), ("env", "PAIRAUDIT_REF_SPEC_NGRAM", "0", "4")]
    assert changes.decision_record({"arms": STATED}, _receipts(cfg)) is None  # the two-arm form states no change


def test_receipts_from_other_arms_are_named():
    cfg, problems = derive(server(), [{"env": "S", "rollback": "0", "on": "1"},
                                      {"flag": "--attention-backend", "rollback": "FLASH_ATTN", "on": "FLASHINFER"},
                                      {"flag": "--enforce-eager", "rollback": "absent", "on": "present"}])
    assert problems == []
    receipts = _receipts(cfg)
    assert changes.decision_record(cfg, receipts)["receipts_agree"] is True
    # the candidate's receipt is the control's: nothing of the change is on
    receipts["candidate"] = receipts["control"]
    rec = changes.decision_record(cfg, receipts)
    assert rec["receipts_agree"] is False
    assert rec["receipt_problems"] == [
        "the candidate's launch receipt has S='0', the change sets '1'",
        "the candidate's launch receipt does not show '--attention-backend FLASHINFER' in its command",
        "the candidate's launch receipt does not show '--enforce-eager' in its command"]


def test_the_report_names_the_change_and_its_switches():
    from pairaudit.promotion.render import _change_lines

    cfg = default()
    changes.derive_arms(cfg)
    text = "\n".join(_change_lines(changes.decision_record(cfg, _receipts(cfg))))
    assert "### The change: `bf16-head-ngram`" in text
    assert "| `PAIRAUDIT_REF_SPEC_NGRAM` | env, speculative | `0` | `4` |" in text
    assert "do not show" not in text
    assert _change_lines(None) == []


def test_the_promotion_records_the_change_in_decision_json_and_the_report(tmp_path):
    from test_report import _write_inputs, launch_rec, passing_pair, preflights

    from pairaudit.core.artifacts import read_json
    from pairaudit.promotion import stage as report

    cfg = default()
    changes.derive_arms(cfg)
    pair = passing_pair()

    def run(name, env_control, env_candidate, config=cfg):
        la = {"control": launch_rec("control", env_control), "candidate": launch_rec("candidate", env_candidate)}
        ins = _write_inputs(tmp_path / name / "in", pair, la, preflights())
        out = tmp_path / name / "out"
        report.promotion_stage(ins["paired"], ins["launch"], ins["preflight"], out / "decision.json",
                               out / "report.md", out / "manifest.json", out / "paired.png", config=config)
        return read_json(out / "decision.json"), (out / "report.md").read_text()

    d, md = run("agree", cfg["arms"]["control"]["env"], cfg["arms"]["candidate"]["env"])
    assert d["change"]["name"] == "bf16-head-ngram" and d["change"]["receipts_agree"] is True
    assert not [n for n in d["notes"] if "change" in n]
    assert "### The change: `bf16-head-ngram`" in md and "| `PAIRAUDIT_REF_LM_HEAD_BF16` | env | `0` | `1` |" in md
    # receipts of other arms than the config's change: said, never silently recorded as the change
    d, md = run("disagree", cfg["arms"]["control"]["env"], cfg["arms"]["control"]["env"])
    assert d["change"]["receipts_agree"] is False
    assert any(n.startswith("the config's change 'bf16-head-ngram' does not match the launch receipts: the "
                            "candidate's launch receipt has PAIRAUDIT_REF_LM_HEAD_BF16='0'") for n in d["notes"])
    assert "The launch receipts do not show this change" in md
    # a record, never a gate: the same evidence without the change form decides the same
    plain, _ = run("plain", cfg["arms"]["control"]["env"], cfg["arms"]["control"]["env"], config=None)
    assert plain["change"] is None and (plain["decision"], plain["reasons"]) == (d["decision"], d["reasons"])


# ------------------------------------------------------------- calibration

def test_the_calibration_of_a_change_runs_the_derived_control_against_itself():
    cfg = default()
    changes.derive_arms(cfg)
    cal = calibration.calibration_config(cfg)
    assert "server" not in cal and "change" not in cal  # A/A: no change under audit
    assert cal["arms"]["candidate"] == cal["arms"]["control"] == STATED["control"]
    assert changes.derive_arms(cal) == [] and calibration.check(cal) == []
    assert "server" in cfg and cfg["arms"]["candidate"] == STATED["candidate"]  # the audit's own config untouched


@pytest.mark.workflow
def test_the_workflow_refuses_both_forms_at_load_naming_the_keys(tmp_path):
    """A two-arm --configfile merged over the change-form default: stopped before anything runs."""
    overlay = tmp_path / "arms.yaml"
    overlay.write_text(yaml.safe_dump({"arms": STATED}))
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    proc = subprocess.run([snakemake, "-n", "promotion", "--configfile", str(overlay)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "arms and server and change: both forms at once" in out and "nothing has run" in out
