"""Boundary gate: the haystack generator, the boundary stage on real servers, boundary-v1.

The real-server part uses a small max_model_len so every case runs in seconds:
identical arms PASS; a candidate with the planted capacity-tail defect
(PAIRAUDIT_REF_FAULT_TAIL=16) fails the max-16 case while its max-32 control
passes, so the decision is REJECT; a length over max_model_len gets the
server's 400 and the gate reports a configuration error, not a model failure.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pairaudit import gates
from pairaudit.answers import stage as answers_stage
from pairaudit.boundary import cases as boundary
from pairaudit.boundary import stage as boundary_stage
from pairaudit.core import artifacts, contracts
from pairaudit.core.settings import BoundarySettings
from pairaudit.plans import stage as plan_stage
from pairaudit.refserver.tokenizer import ChatTokenizer
from pairaudit.serving import armspec, launch
from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model
from pairaudit.serving.phase import PhaseServer

MODEL = "SmolLM2-135M-Instruct"
MML = 512
# Retrieval at 1/2 and 0.9 of 512 (461 + 32 <= 512), the tail cases at 496+16 and 480+32.
# Seed chosen so SmolLM2 retrieves the values in every case on the fp32 control (measured).
CFG = {"fractions": [0.5, 0.9], "seed": 0, "retrieval_max_tokens": 32, "request_timeout_s": 300}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    t = ChatTokenizer(resolve_model(EMBEDDED_NAME)[0])
    return t


def tokenize_with(t):
    return lambda s: t(s, add_special_tokens=False).input_ids


# ------------------------------------------------------------ haystack (unit)

@pytest.mark.parametrize("n", [120, 257, 512, 2032, 4080])
def test_haystack_has_exact_length_and_plants_at_spread_positions(tok, n):
    values = boundary.planted_values(0, "c", 3, 3)
    hay = boundary.build_haystack(tokenize_with(tok), n, values=values, seed=0, case="c")
    ids = hay["ids"]
    assert len(ids) == n
    plant = boundary.DEFAULT_PROMPT["plant"]
    body_start = hay["head_tokens"]
    body_len = n - hay["head_tokens"] - hay["question_tokens"]
    for i, (pos, v) in enumerate(zip(hay["positions"], values)):
        want = tok(plant.format(ordinal=boundary.ORDINALS[i], value=v), add_special_tokens=False).input_ids
        assert ids[pos:pos + len(want)] == want
        # plant i sits in the i-th third of the body: spread, in order
        rel = (pos - body_start) / body_len
        assert i / 3 <= rel < (i + 1) / 3, (i, rel)
    # the only numbers in the whole prompt are the planted ones, in order
    assert boundary.extract_numbers(tok.decode(ids, skip_special_tokens=False)) == values
    assert ids[:hay["head_tokens"]] == tok(boundary.DEFAULT_PROMPT["head"], add_special_tokens=False).input_ids


def test_haystack_is_deterministic_by_seed(tok):
    t = tokenize_with(tok)
    a = boundary.build_haystack(t, 400, values=[111, 222, 333], seed=1, case="c")
    b = boundary.build_haystack(t, 400, values=[111, 222, 333], seed=1, case="c")
    c = boundary.build_haystack(t, 400, values=[111, 222, 333], seed=2, case="c")
    assert a == b
    assert a["ids"] != c["ids"] and len(c["ids"]) == 400
    assert boundary.planted_values(5, "tail-16", 3, 3) == boundary.planted_values(5, "tail-16", 3, 3)
    assert boundary.planted_values(5, "tail-16", 3, 3) != boundary.planted_values(6, "tail-16", 3, 3)


def test_planted_values_are_distinct_with_exact_digits():
    for seed in range(20):
        v = boundary.planted_values(seed, "x", 4, 3)
        assert len(set(v)) == 4 and all(100 <= x <= 999 for x in v)
    assert all(10 <= x <= 99 for x in boundary.planted_values(0, "x", 5, 2))
    with pytest.raises(armspec.ConfigError):
        boundary.planted_values(0, "x", 11, 1)


def test_haystack_too_short_for_its_frame_is_refused(tok):
    with pytest.raises(boundary.BoundaryError, match="cannot hold the frame"):
        boundary.build_haystack(tokenize_with(tok), 40, values=[1, 2, 3], seed=0, case="c")


def test_answer_of_three_values_fits_the_tail_budget(tok):
    # the tail case allows 16 tokens including EOS; digits are single tokens
    answer = tok("343, 706, and 657.", add_special_tokens=False).input_ids
    assert len(answer) + 1 == 16


def test_settings_defaults_plan_and_errors():
    s = boundary.settings({})
    assert s["fractions"] == [0.125, 0.5, 0.98] and s["tail_offsets"] == [16, 32] and s["values"] == 3
    plan = boundary.case_plan(s, 2048)
    assert [(p["case"], p["prompt_tokens"], p["max_tokens"]) for p in plan] == [
        ("retrieval-0.125", 256, 32), ("retrieval-0.5", 1024, 32), ("retrieval-0.98", 2007, 32),
        ("tail-16", 2032, 16), ("tail-32", 2016, 32)]
    with pytest.raises(armspec.ConfigError, match=r"boundary: unknown key\(s\) \['fraction'\]"):
        boundary.settings({"fraction": [0.5]})
    with pytest.raises(armspec.ConfigError, match="boundary.fractions"):
        boundary.settings({"fractions": [0.5, -1]})
    with pytest.raises(armspec.ConfigError, match="boundary.tail_offsets"):
        boundary.settings({"tail_offsets": [16, 0]})
    with pytest.raises(armspec.ConfigError, match="boundary.prompt.plant"):
        boundary.settings({"prompt": {"plant": "no value here"}})


def test_request_body_is_explicit_greedy_with_a_fresh_salt_per_case():
    a, b = (boundary.case_salt("audit", "control", "tail-16") for _ in range(2))
    assert a != b and a.startswith("audit-control-tail-16-")
    body = boundary.request_body(MODEL, [1, 2, 3], max_tokens=16, seed=0, salt=a)
    assert body["prompt"] == [1, 2, 3] and body["temperature"] == 0.0 and body["ignore_eos"] is False
    assert body["max_tokens"] == 16 and body["cache_salt"] == a and body["top_k"] == -1


def test_salts_stay_within_what_vllm_accepts_whatever_the_audit_name():
    # vLLM 0.32 refuses a cache_salt over 128 characters or holding '/' (400)
    for prefix in ("audit", "team/exp 7@host\\x", "a" * 300, ""):
        salt = boundary.case_salt(prefix, "candidate", "retrieval-0.125")
        assert len(salt) <= 128 and re.fullmatch(r"[A-Za-z0-9_.-]+", salt), salt
        assert salt.split("-")[-1] != "" and len(salt.rsplit("-", 1)[1]) == 24  # the random part survives whole
    long = boundary.case_salt("a" * 300, "candidate", "tail-16")
    assert "candidate-tail-16-" in long  # cut from the left: the specific end is kept


def test_the_modules_defaults_are_the_schemas():
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())
    props = schema["properties"]["boundary"]["properties"]
    assert set(props) == set(boundary.DEFAULTS)
    assert all(props[k]["default"] == v for k, v in boundary.DEFAULTS.items())
    # the frame is SmolLM2's ChatML and asks for the planted values
    assert boundary.DEFAULTS["prompt"]["head"].startswith("<|im_start|>system")
    assert "{value}" in boundary.DEFAULTS["prompt"]["plant"]
    assert boundary.settings({})["tail_offsets"] == [16, 32]


def test_the_gate_refuses_cases_answered_by_a_server_the_spec_no_longer_describes(tmp_path):
    """The cases and receipts are read as they stand (`ancient`); the spec file is the arm now."""
    paths = {}
    for arm in ("control", "candidate"):
        cfg = {"mode": "attach", "url": "http://gpu-host:8000", "model": MODEL, "max_model_len": MML}
        paths[arm] = {"spec": str(tmp_path / f"specs/{arm}.json"), "launch": str(tmp_path / f"launch/{arm}.json"),
                      "cases": str(tmp_path / f"boundary/{arm}.json")}
        plan_stage.arm_spec_stage(arm=arm, arm_cfg=cfg, out_path=paths[arm]["spec"])
        artifacts.write_json(paths[arm]["launch"], {"schema": contracts.LAUNCH_SCHEMA, "arm": arm,
                                                    "spec_sha256": armspec.read_spec(paths[arm]["spec"]).spec_sha256})
        artifacts.write_json(paths[arm]["cases"], {"schema": contracts.BOUNDARY_SCHEMA, "arm": arm, "max_model_len": MML,
                                                   "cases": [], "first_long": None,
                                                   "provenance": artifacts.provenance([paths[arm]["launch"]], {})})

    def gate_of():
        return boundary_stage.boundary_gate_stage(
            arm_paths={a: paths[a]["cases"] for a in paths}, launch_paths={a: paths[a]["launch"] for a in paths},
            spec_paths={a: paths[a]["spec"] for a in paths}, out_path=str(tmp_path / "boundary/gate.json"))

    assert gate_of()["provenance"]["consumed"][paths["candidate"]["spec"]]  # the specs are the gate's inputs
    # the candidate's config changed (another context length) after its cases ran
    plan_stage.arm_spec_stage(arm="candidate", arm_cfg={"mode": "attach", "url": "http://gpu-host:8000",
                                                        "model": MODEL, "max_model_len": 2 * MML},
                              out_path=paths["candidate"]["spec"])
    with pytest.raises(artifacts.ArtifactError, match="now describes") as ei:
        gate_of()
    assert paths["candidate"]["cases"] in str(ei.value) and "rerun the candidate answers phase" in str(ei.value)
    # a spec file of the other arm is refused by name too
    with pytest.raises(artifacts.ArtifactError, match="the spec of arm 'control', expected arm 'candidate'"):
        boundary_stage.boundary_gate_stage(
            arm_paths={a: paths[a]["cases"] for a in paths}, launch_paths={a: paths[a]["launch"] for a in paths},
            spec_paths={a: paths["control"]["spec"] for a in paths}, out_path=str(tmp_path / "g2.json"))


# ------------------------------------------------------- real servers (stage)

@pytest.fixture(scope="module")
def servers(shared_server):
    return {"fp32": shared_server(None, MML), "tail": shared_server({"PAIRAUDIT_REF_FAULT_TAIL": "16"}, MML)}


def run_arm(tmp_path, arm, url, cfg=CFG):
    """One arm's boundary cases as its answers phase runs them: the plan, the arm's spec file, one server session."""
    arm_cfg = {"mode": "attach", "url": url, "model": MODEL, "max_model_len": MML}
    spec_path, plan_path = tmp_path / f"specs/{arm}.json", tmp_path / "boundary/plan.json"
    plan_stage.arm_spec_stage(arm=arm, arm_cfg=arm_cfg, out_path=str(spec_path))
    plan_stage.boundary_plan_stage(boundary=BoundarySettings.from_json(boundary.settings(cfg)), out_path=str(plan_path))
    spec = armspec.read_spec(spec_path, arm=arm)
    launch_path = tmp_path / f"launch-{arm}.json"
    rec = launch.receipt(spec)
    artifacts.write_json(launch_path, rec)
    out = tmp_path / f"boundary-{arm}.json"
    with PhaseServer(spec, phase="answers", log_path=str(tmp_path / f"{arm}.log"), receipt=rec,
                     starts_log=str(tmp_path / "starts.jsonl")) as ps:
        doc = answers_stage.boundary_cases(ps, arm=arm,
                                           cfg=BoundarySettings.from_json(artifacts.read_json(plan_path)["params"]),
                                           audit="test",
                                           journal=tmp_path / f"journal/boundary/{arm}.jsonl",
                                           receipt_path=str(launch_path))
    artifacts.write_json(out, doc)
    assert artifacts.read_json(out)["schema"] == contracts.BOUNDARY_SCHEMA
    return str(out), str(launch_path), doc, str(spec_path)


@pytest.fixture(scope="module")
def control(servers, tmp_path_factory):
    return run_arm(tmp_path_factory.mktemp("control"), "control", servers["fp32"].url)


def gate(tmp_path, control, candidate):
    out = tmp_path / "gate.json"
    doc = boundary_stage.boundary_gate_stage(arm_paths={"control": control[0], "candidate": candidate[0]},
                                             launch_paths={"control": control[1], "candidate": candidate[1]},
                                             spec_paths={"control": control[3], "candidate": candidate[3]},
                                             out_path=str(out))
    assert artifacts.read_json(out)["schema"] == contracts.BOUNDARY_GATE_SCHEMA
    return doc


@pytest.mark.server
def test_control_arm_retrieves_every_value_at_exact_lengths(control):
    doc = control[2]
    assert doc["max_model_len"] == MML
    assert [c["case"] for c in doc["cases"]] == ["retrieval-0.5", "retrieval-0.9", "tail-16", "tail-32"]
    for c in doc["cases"]:
        assert c["status"] == 200 and c["usage_prompt_tokens"] == c["prompt_tokens"]
        assert c["prompt_tokens"] + c["max_tokens"] <= MML
        assert c["correct"] and c["finish_reason"] == "stop", (c["case"], c["text"])
        assert c["ttft_s"] > 0 and c["input_tokens_per_s"] > 0
    tail = next(c for c in doc["cases"] if c["case"] == "tail-16")
    assert tail["prompt_tokens"] == MML - 16 and tail["max_tokens"] == 16
    # the first request with at least half the context is the first long one
    assert doc["first_long"]["case"] == "retrieval-0.5" and doc["first_long"]["ttft_s"] > 0


@pytest.mark.server
def test_identical_arms_pass(servers, control, tmp_path):
    cand = run_arm(tmp_path, "candidate", servers["fp32"].url)
    g = gate(tmp_path, control, cand)
    assert g["gate"]["verdict"] == "PASS", g["gate"]["reasons"]
    assert all(row["identical_text"] for row in g["cases"])
    assert gates.promotion_v1({"boundary": g["gate"]})["verdict"] == "PROMOTE"
    row = g["cases"][0]
    assert row["control"]["ttft_s"] > 0 and row["candidate"]["prompt_tokens"] == row["control"]["prompt_tokens"]


@pytest.mark.server
def test_capacity_tail_fault_fails_the_tail_case_only_and_rejects(servers, control, tmp_path):
    cand = run_arm(tmp_path, "candidate", servers["tail"].url)
    g = gate(tmp_path, control, cand)
    assert g["gate"]["verdict"] == "FAIL"
    assert [f["case"] for f in g["gate"]["candidate_failures"]] == ["tail-16"]
    rows = {r["case"]: r for r in g["cases"]}
    assert not rows["tail-16"]["identical_text"]
    assert rows["tail-16"]["control"]["correct"] and not rows["tail-16"]["candidate"]["correct"]
    # the max-32 control case and the retrieval cases never reach the last 16 positions: they pass
    for name in ("tail-32", "retrieval-0.5", "retrieval-0.9"):
        assert rows[name]["candidate"]["correct"] and rows[name]["candidate"]["finish_reason"] == "stop"
        assert rows[name]["identical_text"]
    assert gates.promotion_v1({"boundary": g["gate"]})["verdict"] == "REJECT"


@pytest.mark.server
def test_length_over_max_model_len_is_a_configuration_error(servers, tmp_path):
    cfg = {**CFG, "fractions": [1.05], "tail_offsets": [16]}
    docs = [run_arm(tmp_path, arm, servers["fp32"].url, cfg) for arm in ("control", "candidate")]
    over = docs[1][2]["cases"][0]
    assert over["case"] == "retrieval-1.05" and over["prompt_tokens"] == round(1.05 * MML)
    assert over["status"] == 400 and over["config_error"].startswith("HTTP 400")
    assert "maximum context length" in over["config_error"]
    assert isinstance(over["error_body"], dict) and over["error_body"]["error"]["code"] == 400
    g = gate(tmp_path, *docs)
    assert g["gate"]["verdict"] == "INCONCLUSIVE"
    assert g["gate"]["candidate_failures"] == []
    assert g["gate"]["reasons"][0].startswith("configuration error:")
    assert "maximum context length" in g["gate"]["reasons"][0]
    assert g["cases"][0]["candidate"]["error_body"] == over["error_body"]
    assert gates.promotion_v1({"boundary": g["gate"]})["verdict"] == "INCONCLUSIVE"


@pytest.mark.server
def test_a_case_the_server_clamps_is_a_configuration_error_never_a_correct_answer(servers, tmp_path):
    # 0.99 * 512 = 507 prompt tokens + 32 asked > 512: vLLM 0.32 (and the reference
    # server, which follows it) answers 200 with max_tokens lowered to 5, where an
    # older release refused with a 400. Both must end as a configuration error.
    cfg = {**CFG, "fractions": [0.99], "tail_offsets": [16]}
    docs = [run_arm(tmp_path, arm, servers["fp32"].url, cfg) for arm in ("control", "candidate")]
    case = docs[1][2]["cases"][0]
    assert case["case"] == "retrieval-0.99" and case["status"] == 200
    assert case["usage"]["completion_tokens"] == MML - case["prompt_tokens"] < case["max_tokens"]
    assert case["finish_reason"] == "length" and case["clamped"] and not case["correct"]
    assert case["clamp"]["over_context"] is True
    assert case["config_error"].startswith("clamped by the server: max_tokens clamped: asked 32, got 5")
    g = gate(tmp_path, *docs)
    assert g["gate"]["verdict"] == "INCONCLUSIVE" and g["gate"]["candidate_failures"] == []
    assert g["cases"][0]["candidate"]["clamped"] is True
    # the tail case fits exactly and is not clamped
    assert g["cases"][1]["candidate"]["clamped"] is False and g["cases"][1]["candidate"]["correct"]
