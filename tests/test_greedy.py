"""Greedy runs (each arm's answers phase), divergences, grid-tie inputs from the greedy tops, determinism."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import fake_server
import numpy as np
import pytest
from refserver_fixture import module_server

from pairaudit import gates
from pairaudit.core.artifacts import sha256_json
from pairaudit.core.jsonlog import AppendLog, read_log
from pairaudit.answers import greedy as ag
from pairaudit.answers.greedy import GreedyPlan
from pairaudit.diagnostics import greedy as g
from pairaudit.diagnostics.divergence import divergence_doc, find_divergences
from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.phase import PhaseServer

MODEL = "SmolLM2-135M-Instruct"
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "seed": 0, "n": 1, "min_tokens": 0,
            "ignore_eos": False, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "logprobs": 20, "return_tokens_as_token_ids": True, "stop": [], "stop_token_ids": [],
            "stream": False, "echo": False, "skip_special_tokens": True}


# ------------------------------------------------------------------ helpers

def completion_body(ids, tops, *, prompt_tokens=10, finish="stop", text="x"):
    """A vLLM-shaped completions body with token-id keys."""
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish,
                         "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                      "token_logprobs": [0.0] * len(ids),
                                      "top_logprobs": [{f"token_id:{t}": v for t, v in top} for top in tops],
                                      "text_offset": [0] * len(ids)}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                      "total_tokens": prompt_tokens + len(ids)}}


class StubEndpoint:
    """Duck-typed Endpoint: answers post_json from a function and records each call."""

    base_url = "http://stub"

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def post_json(self, path, body, **kw):
        self.calls.append((path, json.loads(json.dumps(body))))
        status, resp = self.answer(path, body)
        err = None if 200 <= status < 300 else f"http {status}: {resp}"
        return {"method": "POST", "path": path, "status": status, "body": resp, "error": err,
                "elapsed_s": 0.0, "started_at": "t"}


def grid_top(top_id, other_ids, base=-0.75 - 1 / 3, step=0.125):
    """A synthetic BF16-grid top list: the first two tie at the top, the rest whole steps below.

    Served as FP32 values under a log-partition with no short decimal form,
    as a real server's are (grid-tie-v1 refuses rounded evidence).
    """
    vals = [base, base] + [base - step * (3 + i) for i in range(len(other_ids) - 1)]
    return [[t, float(np.float32(v))] for t, v in zip([top_id] + list(other_ids), vals)]


# --------------------------------------------------------------- unit tests

def test_first_divergence_on_ids():
    assert g.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert g.first_divergence([], []) is None
    assert g.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert g.first_divergence([5], [6]) == 0
    # one output a strict prefix of the other: they part where the shorter ends
    assert g.first_divergence([1, 2], [1, 2, 3]) == 2
    assert g.first_divergence([1, 2, 3], [1, 2]) == 2


def test_prefix_equal():
    assert g.prefix_equal([1, 2, 3], [1, 2, 4], 2)
    assert not g.prefix_equal([1, 2, 3], [1, 5, 4], 2)
    assert not g.prefix_equal([1], [1, 2], 2)  # too short to hold the prefix
    assert g.prefix_equal([1], [2], 0)


def test_bodies_every_field_explicit_and_salts_differ():
    s1, s2 = ag.fresh_salt(), ag.fresh_salt()
    assert s1 != s2 and 1 <= len(s1) <= 1024
    body = ag.greedy_body(MODEL, [1, 2, 3], max_tokens=48, salt=s1)
    for k, v in SAMPLING.items():
        assert body[k] == v and type(body[k]) is type(v), k
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 48 and body["cache_salt"] == s1
    assert body["model"] == MODEL
    probe = ag.probe_body(MODEL, [1, 2, 3, 4], s2)
    for k, v in SAMPLING.items():
        assert probe[k] == v, k
    assert probe["max_tokens"] == 1 and probe["prompt"] == [1, 2, 3, 4] and probe["cache_salt"] == s2
    # only the salt (and model) is outside the cross-arm request identity
    other = ag.greedy_body("other-name", [1, 2, 3], max_tokens=48, salt=s2)
    assert ag.request_sha256(body) == ag.request_sha256(other)
    assert sha256_json(body) != sha256_json(other)


def test_parse_token_keys_strict():
    assert ag.parse_token_key("token_id:42") == 42
    for bad in ("42", "hello", "token_id:", "token_id:-1", "token_id:4x"):
        with pytest.raises(ValueError):
            ag.parse_token_key(bad)
    assert ag.parse_top({"token_id:7": -0.5, "token_id:3": -0.625}) == [[7, -0.5], [3, -0.625]]


def test_greedy_record_schema_and_fresh_salts():
    tops = [grid_top(11, range(100, 119)), grid_top(12, range(200, 219)), grid_top(2, range(300, 319))]

    def answer(path, body):
        assert path == "/v1/completions"
        return 200, completion_body([11, 12, 2], tops, prompt_tokens=len(body["prompt"]))

    ep = StubEndpoint(answer)
    # one greedy_one per item, as the answers phase's GreedyPlan.run calls it
    recs = [ag.greedy_one(ep, MODEL, ids, max_tokens=8, index=i) for i, ids in ((3, [1, 2]), (5, [1, 4]))]
    assert [r["index"] for r in recs] == [3, 5]
    r = recs[0]
    assert set(r) >= {"index", "body", "body_sha256", "status", "error", "token_ids", "text", "finish_reason",
                      "top20", "usage", "salt", "output_sha256"}
    assert r["status"] == 200 and r["error"] is None
    assert r["token_ids"] == [11, 12, 2] and r["finish_reason"] == "stop"
    assert r["output_sha256"] == sha256_json([11, 12, 2])
    assert r["body_sha256"] == sha256_json(r["body"]) and r["body"]["cache_salt"] == r["salt"]
    assert len(r["top20"]) == 3 and r["top20"][0] == tops[0] and len(r["top20"][0]) == 20
    assert recs[0]["salt"] != recs[1]["salt"]
    assert [c[1]["prompt"] for c in ep.calls] == [[1, 2], [1, 4]]


def test_greedy_one_keeps_server_error_and_malformed_logprobs():
    ep = StubEndpoint(lambda p, b: (400, {"error": {"message": "maximum context length is 512"}}))
    r = ag.greedy_one(ep, MODEL, [1], max_tokens=4, index=0)
    assert r["status"] == 400 and "maximum context length" in r["error"]
    assert r["response_body"]["error"]["message"].startswith("maximum")
    assert r["token_ids"] == [] and r["output_sha256"] is None

    # keys by decoded string: the server ignored return_tokens_as_token_ids
    body = completion_body([1], [[[1, -0.1]]])
    body["choices"][0]["logprobs"]["tokens"] = ["hello"]
    r = ag.greedy_one(StubEndpoint(lambda p, b: (200, body)), MODEL, [1], max_tokens=4, index=0)
    assert r["error"].startswith("malformed completion") and r["output_sha256"] is None

    # logprobs must cover every generated token
    body = completion_body([1, 2], [[[1, -0.1]], [[2, -0.1]]])
    body["usage"]["completion_tokens"] = 3
    r = ag.greedy_one(StubEndpoint(lambda p, b: (200, body)), MODEL, [1], max_tokens=4, index=0)
    assert "completion_tokens=3" in r["error"]


def test_prompt_ids_error_keeps_server_body():
    ep = StubEndpoint(lambda p, b: (404, {"error": {"message": "The model `nope` does not exist."}}))
    with pytest.raises(ag.GreedyError, match="does not exist"):
        ag.prompt_ids(ep, "nope", [{"role": "user", "content": "hi"}])
    ep = StubEndpoint(lambda p, b: (200, {"count": 3, "tokens": [1, 2, 3]}))
    assert ag.prompt_ids(ep, MODEL, [{"role": "user", "content": "hi"}], {"enable_thinking": False}) == [1, 2, 3]
    assert ep.calls[0][0] == "/tokenize" and ep.calls[0][1]["chat_template_kwargs"] == {"enable_thinking": False}


def _rec(index, ids, tops=None, error=None):
    return {"index": index, "token_ids": ids, "top20": tops if tops is not None else [[[t, 0.0]] for t in ids],
            "error": error}


def test_divergence_records():
    ctrl = [_rec(0, [1, 2, 3]), _rec(1, [1, 2, 3]), _rec(2, [4, 5]), _rec(3, [7]), _rec(4, [1, 2, 3])]
    cand = [_rec(0, [1, 2, 3]), _rec(1, [1, 9, 8]), _rec(2, [4, 5, 6]), _rec(3, [7]), _rec(4, [], error="http 500: x")]
    recs = g.divergence_records(ctrl, cand)
    by = {r["index"]: r for r in recs}
    assert [r["index"] for r in recs] == [0, 1, 2, 3, 4]
    assert by[0]["diverged"] is False and by[0]["first_divergence"] is None and by[0]["prefix_equal"]
    d = by[1]
    assert d["diverged"] is True and d["first_divergence"] == 1
    assert (d["control_token_id"], d["candidate_token_id"]) == (2, 9)
    assert d["shared_prefix"] == [1] and d["prefix_equal"] is True
    assert (d["control_len"], d["candidate_len"]) == (3, 3)
    assert d["control_greedy_top"] == [[2, 0.0]] and d["candidate_greedy_top"] == [[9, 0.0]]
    assert by[2]["first_divergence"] == 2 and by[2]["control_token_id"] is None and by[2]["candidate_token_id"] == 6
    assert by[3]["diverged"] is False
    # a failed arm is an unknown, never "no divergence"
    assert by[4]["diverged"] is None and "candidate: http 500" in by[4]["error"]
    with pytest.raises(ValueError, match="different items"):
        g.divergence_records(ctrl, cand[:2])
    json.dumps(recs)


def test_a_clamped_arm_is_compared_only_up_to_its_cut():
    clamp = ag.clamping({"max_tokens": 8}, "length", {"completion_tokens": 2, "prompt_tokens": 20}, 22)
    assert clamp["clamped"] and clamp["over_context"]
    cut = {**_rec(0, [1, 2]), "clamped": True, "clamp": clamp}
    # equal up to the cut: unknown, with the server's clamp as the reason
    d = g.divergence_records([_rec(0, [1, 2, 3])], [cut])[0]
    assert d["diverged"] is None and d["clamped"] == ["candidate"]
    assert d["error"].startswith("clamped: candidate: max_tokens clamped: asked 8, got 2")
    # a divergence before the cut is real evidence
    d = g.divergence_records([_rec(0, [1, 7, 3])], [cut])[0]
    assert d["diverged"] is True and d["first_divergence"] == 1 and d["error"] is None
    # the unclamped arm stopping first (EOS) is a divergence where it stopped
    d = g.divergence_records([_rec(0, [1])], [cut])[0]
    assert d["diverged"] is True and d["first_divergence"] == 1 and d["error"] is None


def _run(index, ids, tops, *, prompt_ids=(40, 41), prompt_tokens=None, error=None):
    """A greedy record as the answers phase journals it: ids, top-20 per position, the served prompt count."""
    return {"index": index, "token_ids": list(ids), "top20": tops, "error": error, "salt": f"salt-{index}-{ids}",
            "prompt_ids": list(prompt_ids), "usage": {"prompt_tokens": len(prompt_ids) if prompt_tokens is None
                                                      else prompt_tokens, "completion_tokens": len(ids)}}


def _tops(n, at=None, top=None):
    """n positions of filler tops, ``top`` at position ``at``."""
    return [top if k == at else grid_top(1000 + k, range(2000, 2019)) for k in range(n)]


def _grid_case(ctop, ktop, *, control_prompt_tokens=None):
    """Item 0 diverges at position 2 (control 2, candidate 9); item 1 agrees. The divergence artifact of them."""
    control = [_run(0, [1, 5, 2, 3], _tops(4, 2, ctop), prompt_tokens=control_prompt_tokens),
               _run(1, [5, 6], _tops(2))]
    candidate = [_run(0, [1, 5, 9], _tops(3, 2, ktop)), _run(1, [5, 6], _tops(2))]
    order, divs, by_index = find_divergences({"control": control, "candidate": candidate})
    headers = {arm: {"determinism": {"hashes": ["h", "h"]}} for arm in ("control", "candidate")}
    return divergence_doc("ds", headers, by_index, divs, order, [], 3)


def test_grid_tie_inputs_from_the_greedy_tops_pass_on_a_one_step_bf16_tie():
    # the candidate's top-20 on the BF16 grid with its token and the control's tied at the top: a one-step tie
    ctop = grid_top(2, [9] + list(range(100, 118)))
    ktop = grid_top(9, [2] + list(range(100, 118)))
    doc = _grid_case(ctop, ktop)
    assert doc["top_lists"]["source"] == "greedy"
    inputs = doc["grid_tie_inputs"]
    # each arm's own top at the first divergence of its greedy run; the prefix = served prompt + the 2 shared tokens
    assert inputs == [{"index": 0, "control_token_id": 2, "candidate_token_id": 9, "candidate_top": ktop,
                       "control_top": ctop, "control_prefix_len": 4, "candidate_prefix_len": 4}]
    c, k = doc["probes"]["control"], doc["probes"]["candidate"]
    assert [p["index"] for p in c] == [p["index"] for p in k] == [0]
    assert c[0]["source"] == k[0]["source"] == "greedy" and c[0]["first_divergence"] == 2
    assert (c[0]["token_id"], k[0]["token_id"]) == (2, 9) and c[0]["salt"] != k[0]["salt"]
    assert doc["grid_tie"]["verdict"] == "PASS", doc["grid_tie"]["reasons"]
    assert doc["counts"] == {"selected": 2, "compared": 2, "diverged": 1, "unresolved": 0}
    # tops keyed by index after a JSON round trip (string keys) are found too
    keyed = json.loads(json.dumps({0: c[0]}))
    assert g.grid_tie_inputs(doc["divergences"], keyed, {"0": k[0]}) == inputs


def test_grid_tie_inputs_from_the_greedy_tops_stop_where_it_is_no_tie():
    # the control's token two whole steps below the candidate's top: more than one step, not a tie
    ctop = grid_top(2, [9] + list(range(100, 118)))
    vals = [v for _, v in grid_top(9, range(100, 119))]
    ktop = [[9, vals[0]], [100, vals[2]], [2, vals[3]]] + [[t, v] for t, v in zip(range(101, 118), vals[4:])]
    doc = _grid_case(ctop, ktop)
    assert doc["grid_tie"]["verdict"] == "STOP"
    assert "gap_within_one_step" in doc["grid_tie"]["failed_clauses"], doc["grid_tie"]["reasons"]
    # prompts counted differently by the two servers: the prefixes are not the same length
    doc = _grid_case(ctop, grid_top(9, [2] + list(range(100, 118))), control_prompt_tokens=3)
    assert doc["grid_tie_inputs"][0]["control_prefix_len"] == 5 and doc["grid_tie_inputs"][0]["candidate_prefix_len"] == 4
    assert doc["grid_tie"]["verdict"] == "STOP" and doc["grid_tie"]["failed_clauses"] == ["equal_prefix_lengths"]


def test_comparison_counts():
    divs = g.divergence_records([_rec(0, [1, 2]), _rec(1, [5]), _rec(2, [7])],
                                [_rec(0, [1, 3]), _rec(1, [5]), _rec(2, [7])])
    divs[2].update(diverged=None, error="the arms tokenized the chat prompt differently")
    assert g.comparison_counts([0, 1, 2, 3], divs) == {"selected": 4, "compared": 2, "diverged": 1, "unresolved": 1}
    assert g.comparison_counts([], []) == {"selected": 0, "compared": 0, "diverged": 0, "unresolved": 0}
    with pytest.raises(ValueError, match="outside the selection"):
        g.comparison_counts([0, 1], divs)


def test_a_divergence_without_a_top_list_stays_in_the_rule_and_stops():
    # the control stopped (EOS) where the candidate went on: no control token, no control top at that position
    ktop = grid_top(3, [2] + list(range(100, 118)))
    control, candidate = [_run(0, [1], _tops(1))], [_run(0, [1, 3], _tops(2, 1, ktop))]
    order, divs, by_index = find_divergences({"control": control, "candidate": candidate})
    tops = {arm: g.greedy_tops(divs, by_index[arm], arm) for arm in ("control", "candidate")}
    assert tops["control"][0]["top20"] is None and "no top-20 at position 1" in tops["control"][0]["error"]
    assert tops["candidate"][0]["top20"] == ktop and tops["candidate"][0]["prefix_len"] == 3
    inputs = g.grid_tie_inputs(divs, tops["control"], tops["candidate"])
    assert inputs[0]["control_top"] is None and inputs[0]["control_prefix_len"] is None
    v = gates.grid_tie_v1(inputs)
    assert v["verdict"] == "STOP" and "finite_values" in v["failed_clauses"]
    # a run that reports no served prompt count gives no prefix length, so no evidence either
    control = [_run(0, [1, 2], _tops(2, 1, ktop))]
    control[0]["usage"] = {"completion_tokens": 2}
    order, divs, by_index = find_divergences({"control": control, "candidate": candidate})
    top = g.greedy_tops(divs, by_index["control"], "control")[0]
    assert top["prefix_len"] is None and "usage.prompt_tokens" in top["error"]


def test_an_arm_whose_server_failed_in_its_answers_phase_gets_not_run_diagnostics(tmp_path):
    from pairaudit.core import artifacts, contracts
    from pairaudit.core.settings import GreedySettings
    from pairaudit.diagnostics import stage as diagnostics_stage

    answers = {}
    for arm in ("control", "candidate"):
        answers[arm] = str(tmp_path / f"answers-{arm}.json")
        failure = {"arm": arm, "stage": "greedy", "what": "ds greedy greedy 3", "kind": "dead", "status": None,
                   "error": "the server exited"} if arm == "candidate" else None
        artifacts.write_json(answers[arm], {"schema": contracts.PHASE_SCHEMA, "phase": "answers", "arm": arm,
                                            "failure": failure})
    greedy_paths = {"ds": {arm: str(tmp_path / f"g-{arm}.jsonl") for arm in ("control", "candidate")}}
    phase = diagnostics_stage.diagnostics_phase(
        dataset_paths={"ds": str(tmp_path / "absent.json")}, paired_paths={"ds": str(tmp_path / "absent.json")},
        receipt_paths={}, preflight_paths={}, answers_paths=answers,
        greedy=GreedySettings(items="discordant", concordant=1, seed=0, max_tokens=4, determinism_repeats=2),
        chat_template_kwargs={}, journal_dir=str(tmp_path / "journal"), greedy_paths=greedy_paths,
        divergence_paths={"ds": str(tmp_path / "d.json")}, phase_path=str(tmp_path / "phase.json"),
        max_divergent=3)
    assert phase["starts"] == [] and "candidate server failed in its answers phase" in phase["not_run"]
    doc = artifacts.read_json(tmp_path / "d.json")
    assert doc["grid_tie"]["verdict"] == doc["determinism"]["verdict"] == "INCONCLUSIVE"
    assert artifacts.read_jsonl(greedy_paths["ds"]["control"])[0]["not_run"] == phase["not_run"]


# --------------------------------------- the answers phase's greedy runs, on a fake server
# GreedyPlan is what the answers phase runs on its server; here against the in-process
# fake server (a real HTTP server, attached as an arm) so every request it sends can
# be counted and a failure planted.

@pytest.fixture
def fake(monkeypatch, tmp_path):
    """The fake server with every completions request recorded; ``fail`` maps a call number to a planted status."""
    calls, fail = [], {}
    orig = fake_server.handle_post

    def recording(st, path, body):
        if path == "/v1/completions":
            calls.append(json.loads(json.dumps(body)))
            if len(calls) in fail:
                return fake_server._err(fail[len(calls)], f"planted failure of call {len(calls)}", "Overloaded")
        return orig(st, path, body)

    monkeypatch.setattr(fake_server, "handle_post", recording)
    srv = fake_server.make_server(max_model_len=256)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    spec = resolve_spec("control", {"mode": "attach", "url": url, "model": "fake-model", "max_model_len": 256})
    yield SimpleNamespace(calls=calls, fail=fail, spec=spec, starts=str(tmp_path / "starts.jsonl"))
    srv.shutdown()
    srv.server_close()


def _session(fake, tmp_path):
    return PhaseServer(fake.spec, phase="answers", log_path=str(tmp_path / "srv.log"), receipt=None,
                       starts_log=fake.starts)


MESSAGES = {0: [{"role": "user", "content": "2 + 2 ="}]}


def _plan(journal, *, max_tokens=2, repeats=3, messages=MESSAGES):
    return GreedyPlan("ds", messages, max_tokens=max_tokens, determinism_repeats=repeats, chat_template_kwargs={},
                      journal=journal)


def _determinism(fake, tmp_path, max_tokens=2):
    plan = _plan(tmp_path / "journal" / "greedy.jsonl", max_tokens=max_tokens)
    with _session(fake, tmp_path) as ps:
        if plan.todo:
            with AppendLog(plan.journal) as jl:
                plan.run(ps.get(), jl, arm="control", concurrency=2)
    return plan


def test_determinism_repeats_hash_alike_each_with_a_fresh_salt(fake, tmp_path):
    records, det = _determinism(fake, tmp_path).records()
    assert len(records) == 1 and len(det["records"]) == 3 and det["index"] == 0
    assert det["hashes"] == [sha256_json(det["records"][0]["token_ids"])] * 3
    assert len({c["cache_salt"] for c in fake.calls}) == 4  # the greedy run and each repeat: no cache reuse
    assert gates.determinism_v1({"control": det["hashes"]})["verdict"] == "PASS"


def test_a_repeat_without_an_answer_is_not_a_repeat_until_a_rerun_asks_it_again(fake, tmp_path):
    fake.fail[4] = 503  # the last of the four runs (the greedy run and three repeats) to be sent
    plan = _determinism(fake, tmp_path)
    assert len(plan.todo) == 1
    with pytest.raises(ag.GreedyError, match="greedy runs without an answer"):
        plan.records()
    journaled = read_log(tmp_path / "journal" / "greedy.jsonl")
    assert sorted(r["status"] for r in journaled) == [200, 200, 200, 503]  # the failure is kept as evidence
    # the answers phase makes it its server failure: the request to send again on a fresh start, and why
    from pairaudit.answers.stage import _greedy_failure

    srv = SimpleNamespace(proc=None, log_tail=lambda n: "", spec=fake.spec)
    failure = _greedy_failure("control", plan, srv, None)
    assert failure["stage"] == "greedy" and failure["kind"] == "server_error" and failure["status"] == 503
    assert failure["request"]["path"] == "/v1/completions" and failure["request"]["body"]["temperature"] == 0.0
    again = _determinism(fake, tmp_path)
    assert len(fake.calls) == 5  # the rerun asked only the open run
    det = again.records()[1]
    assert len(set(det["hashes"])) == 1 and gates.determinism_v1({"control": det["hashes"]})["verdict"] == "PASS"


def test_refused_repeats_are_never_counted_as_repeats_that_matched(fake, tmp_path):
    # max_tokens beyond the fake's 256-token context: every repeat gets the same 400, a final answer
    det = _determinism(fake, tmp_path, max_tokens=300).records()[1]
    assert all(r["status"] == 400 for r in det["records"])
    assert all(h.startswith("error:") for h in det["hashes"]) and len(set(det["hashes"])) == 3
    verdict = gates.determinism_v1({"control": det["hashes"]})
    assert verdict["verdict"] == "STOP" and verdict["nondeterministic_arms"] == ["control"]


class SlowServer:
    """A duck-typed running server whose completions take a while: counts the requests in flight at once."""

    def __init__(self, delay=0.05):
        self.spec = SimpleNamespace(served_model_name=MODEL)
        self.delay, self.lock, self.in_flight, self.most, self.sent = delay, threading.Lock(), 0, 0, []

        def answer(path, body):
            if path == "/tokenize":
                return 200, {"tokens": [7, len(body["messages"][0]["content"])]}
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                self.sent.append(body["prompt"])
            time.sleep(self.delay)
            with self.lock:
                self.in_flight -= 1
            ids = [3, 4, 2]
            return 200, completion_body(ids, [grid_top(t, range(100, 119)) for t in ids],
                                        prompt_tokens=len(body["prompt"]))

        self.endpoint = StubEndpoint(answer)

    def assert_alive(self):
        return None


def test_the_determinism_repeats_run_alone_after_every_items_run(tmp_path):
    # each repeat the only request in the server: a batch-dependent server's numbers cannot fail determinism-v1
    messages = {i: [{"role": "user", "content": "x" * (i + 1)}] for i in range(6)}
    plan = _plan(tmp_path / "greedy.jsonl", max_tokens=8, repeats=3, messages=messages)
    srv = SlowServer()
    item0 = [7, 1]  # item 0's prompt ids as the stub tokenizes them: the repeated item's
    sent_as = []  # (requests in flight, requests sent before) for each run of item 0
    orig = srv.endpoint

    class Watch:
        def post_json(self, path, body, **kw):
            if path == "/v1/completions" and body["prompt"] == item0:
                sent_as.append((srv.in_flight, len(srv.sent)))
            return orig.post_json(path, body, **kw)

    srv.endpoint = Watch()
    with AppendLog(plan.journal) as jl:
        plan.run(srv, jl, arm="control", concurrency=4)
    assert srv.most > 1  # the items' runs were concurrent
    # item 0's own greedy run among the others, then its three repeats, each sent after all six items' runs with
    # nothing else in flight
    assert len(sent_as) == 4 and sent_as[1:] == [(0, 6), (0, 7), (0, 8)]


def test_every_item_runs_concurrently_and_a_crash_mid_run_resumes_asking_only_the_missing(tmp_path):
    messages = {i: [{"role": "user", "content": "x" * (i + 1)}] for i in (4, 1, 7, 2, 9, 5)}
    journal = tmp_path / "greedy" / "ds" / "control.jsonl"
    plan = _plan(journal, max_tokens=8, repeats=2, messages=messages)
    # every item in index order, then the repeats of the first item: fixed before anything runs
    assert plan.want == [("greedy", i) for i in (1, 2, 4, 5, 7, 9)] + [("determinism", 0), ("determinism", 1)]
    assert plan.det_index == 1
    srv = SlowServer()
    with AppendLog(journal) as jl:
        counts = plan.run(srv, jl, arm="control", concurrency=4)
    assert counts == {"runs": 8, "from_journal": 0, "asked": 8}
    assert srv.most > 1 and srv.most <= 4  # concurrent, bounded by sampling.concurrency
    full = read_log(journal)
    # a crash mid-run: the process died after three answers, the fourth cut short while it was being written
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    kept = {(r["run"], r["slot"]) for r in full[:3]}
    resumed, srv2 = _plan(journal, max_tokens=8, repeats=2, messages=messages), SlowServer(0.0)
    assert set(resumed.todo) == set(plan.want) - kept
    with AppendLog(journal) as jl:
        counts = resumed.run(srv2, jl, arm="control", concurrency=4)
    assert counts == {"runs": 8, "from_journal": 3, "asked": 5} and len(srv2.sent) == 5
    runs, det = resumed.records()
    assert [r["index"] for r in runs] == [1, 2, 4, 5, 7, 9] and det["index"] == 1 and len(det["hashes"]) == 2
    # nothing asked twice: every run answered exactly once in the journal (the cut line is skipped)
    answered = [(r["run"], r["slot"]) for r in read_log(journal)]
    assert sorted(answered, key=repr) == sorted(plan.want, key=repr)
    # a third run asks nothing
    third = _plan(journal, max_tokens=8, repeats=2, messages=messages)
    assert third.todo == [] and third.run(srv2, None, arm="control", concurrency=4)["asked"] == 0
    # a changed item is asked again (its messages are part of what a journaled run counts for); the rest is not
    changed = _plan(journal, max_tokens=8, repeats=2, messages={**messages, 7: [{"role": "user", "content": "y"}]})
    assert changed.todo == [("greedy", 7)]
    # so is every run under another max_tokens
    assert len(_plan(journal, max_tokens=9, repeats=2, messages=messages).todo) == 8


# ------------------------------------------------------- real-server tests
# Greedy runs and determinism on the reference server run through the answers
# phase and the diagnostics (tests/test_diagnostics_stages.py); here only what
# one request shows.

def _messages(text):
    return [{"role": "user", "content": text}]


control = module_server()


def _ep(server):
    from pairaudit.serving.client import Endpoint

    return Endpoint(server.url, model=MODEL, timeout_s=300)


@pytest.mark.server
def test_prompt_ids_real_server_error_keeps_body(control):
    with pytest.raises(ag.GreedyError, match="does not exist"):
        ag.prompt_ids(_ep(control), "no-such-model", _messages("hi"))


@pytest.mark.server
def test_a_greedy_run_past_the_context_records_the_servers_clamp(control):
    # Like vLLM 0.32 the server lowers max_tokens to what fits rather than refusing.
    ep = _ep(control)
    # counting: a prompt the model goes on continuing rather than ending
    text = ", ".join(str(i % 100) for i in range(control.max_model_len))
    ids = ep.post_json("/tokenize", {"model": MODEL, "prompt": text})["body"]["tokens"][:control.max_model_len - 3]
    rec = ag.greedy_one(ep, MODEL, ids, max_tokens=8, index=0)
    assert rec["error"] is None and rec["finish_reason"] == "length"
    assert rec["clamped"] is True and len(rec["token_ids"]) == 3
    assert rec["clamp"]["asked"] == 8 and rec["clamp"]["completion_tokens"] == 3
    # an unclamped run of the same prompt says so
    assert ag.greedy_one(ep, MODEL, ids[:20], max_tokens=4, index=1)["clamped"] is False
