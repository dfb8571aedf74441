"""Greedy runs, divergence, forced-prefix probes and determinism (the diagnostics of discordant items)."""

from __future__ import annotations

import dataclasses
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
from pairaudit.core.settings import GreedySettings
from pairaudit.diagnostics import greedy as g
from pairaudit.diagnostics.divergence import find_divergences, probe_arm
from pairaudit.diagnostics.plan import GreedyPlan
from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.phase import PhaseError, PhaseServer

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
    s1, s2 = g.fresh_salt(), g.fresh_salt()
    assert s1 != s2 and 1 <= len(s1) <= 1024
    body = g.greedy_body(MODEL, [1, 2, 3], max_tokens=48, salt=s1)
    for k, v in SAMPLING.items():
        assert body[k] == v and type(body[k]) is type(v), k
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 48 and body["cache_salt"] == s1
    assert body["model"] == MODEL
    probe = g.probe_body(MODEL, [1, 2, 3, 4], s2)
    for k, v in SAMPLING.items():
        assert probe[k] == v, k
    assert probe["max_tokens"] == 1 and probe["prompt"] == [1, 2, 3, 4] and probe["cache_salt"] == s2
    # only the salt (and model) is outside the cross-arm request identity
    other = g.greedy_body("other-name", [1, 2, 3], max_tokens=48, salt=s2)
    assert g.request_sha256(body) == g.request_sha256(other)
    assert sha256_json(body) != sha256_json(other)


def test_parse_token_keys_strict():
    assert g.parse_token_key("token_id:42") == 42
    for bad in ("42", "hello", "token_id:", "token_id:-1", "token_id:4x"):
        with pytest.raises(ValueError):
            g.parse_token_key(bad)
    assert g.parse_top({"token_id:7": -0.5, "token_id:3": -0.625}) == [[7, -0.5], [3, -0.625]]


def test_greedy_record_schema_and_fresh_salts():
    tops = [grid_top(11, range(100, 119)), grid_top(12, range(200, 219)), grid_top(2, range(300, 319))]

    def answer(path, body):
        assert path == "/v1/completions"
        return 200, completion_body([11, 12, 2], tops, prompt_tokens=len(body["prompt"]))

    ep = StubEndpoint(answer)
    # one greedy_one per item, one after another, as the diagnostics phase's GreedyPlan.run calls it
    recs = [g.greedy_one(ep, MODEL, ids, max_tokens=8, index=i) for i, ids in ((3, [1, 2]), (5, [1, 4]))]
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
    r = g.greedy_one(ep, MODEL, [1], max_tokens=4, index=0)
    assert r["status"] == 400 and "maximum context length" in r["error"]
    assert r["response_body"]["error"]["message"].startswith("maximum")
    assert r["token_ids"] == [] and r["output_sha256"] is None

    # keys by decoded string: the server ignored return_tokens_as_token_ids
    body = completion_body([1], [[[1, -0.1]]])
    body["choices"][0]["logprobs"]["tokens"] = ["hello"]
    r = g.greedy_one(StubEndpoint(lambda p, b: (200, body)), MODEL, [1], max_tokens=4, index=0)
    assert r["error"].startswith("malformed completion") and r["output_sha256"] is None

    # logprobs must cover every generated token
    body = completion_body([1, 2], [[[1, -0.1]], [[2, -0.1]]])
    body["usage"]["completion_tokens"] = 3
    r = g.greedy_one(StubEndpoint(lambda p, b: (200, body)), MODEL, [1], max_tokens=4, index=0)
    assert "completion_tokens=3" in r["error"]


def test_prompt_ids_error_keeps_server_body():
    ep = StubEndpoint(lambda p, b: (404, {"error": {"message": "The model `nope` does not exist."}}))
    with pytest.raises(g.GreedyError, match="does not exist"):
        g.prompt_ids(ep, "nope", [{"role": "user", "content": "hi"}])
    ep = StubEndpoint(lambda p, b: (200, {"count": 3, "tokens": [1, 2, 3]}))
    assert g.prompt_ids(ep, MODEL, [{"role": "user", "content": "hi"}], {"enable_thinking": False}) == [1, 2, 3]
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
    clamp = g.clamping({"max_tokens": 8}, "length", {"completion_tokens": 2, "prompt_tokens": 20}, 22)
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


def _probe(index, top, prompt_tokens, error=None):
    return {"index": index, "top20": top, "prompt_tokens": prompt_tokens, "error": error, "salt": "s"}


def test_grid_tie_inputs_match_rule_and_pass_on_a_grid_tie():
    divs = g.divergence_records([_rec(0, [1, 2, 3]), _rec(1, [5, 6])], [_rec(0, [1, 9, 3]), _rec(1, [5, 6])])
    ctop = grid_top(2, [9] + list(range(100, 118)))
    ktop = grid_top(9, [2] + list(range(100, 118)))
    inputs = g.grid_tie_inputs(divs, [_probe(0, ctop, 12)], [_probe(0, ktop, 12)])
    assert inputs == [{"index": 0, "control_token_id": 2, "candidate_token_id": 9, "candidate_top": ktop,
                       "control_top": ctop, "control_prefix_len": 12, "candidate_prefix_len": 12}]
    v = gates.grid_tie_v1(inputs)
    assert v["verdict"] == "PASS", v["reasons"]
    # probes keyed by index after a JSON round trip (string keys) are found too
    keyed = json.loads(json.dumps({0: _probe(0, ctop, 12)}))
    assert g.grid_tie_inputs(divs, keyed, {"0": _probe(0, ktop, 12)}) == inputs


def test_comparison_counts():
    divs = g.divergence_records([_rec(0, [1, 2]), _rec(1, [5]), _rec(2, [7])],
                                [_rec(0, [1, 3]), _rec(1, [5]), _rec(2, [7])])
    divs[2].update(diverged=None, error="the arms tokenized the chat prompt differently")
    assert g.comparison_counts([0, 1, 2, 3], divs) == {"selected": 4, "compared": 2, "diverged": 1, "unresolved": 1}
    assert g.comparison_counts([], []) == {"selected": 0, "compared": 0, "diverged": 0, "unresolved": 0}
    with pytest.raises(ValueError, match="outside the selection"):
        g.comparison_counts([0, 1], divs)


def test_grid_tie_inputs_missing_or_failed_probe_stops():
    divs = g.divergence_records([_rec(0, [1, 2])], [_rec(0, [1, 3])])
    ktop = grid_top(3, [2] + list(range(100, 118)))
    inputs = g.grid_tie_inputs(divs, [], [_probe(0, ktop, 11, error="http 400: bad")])
    assert inputs[0]["control_top"] is None and inputs[0]["candidate_top"] is None
    assert inputs[0]["control_prefix_len"] is None
    v = gates.grid_tie_v1(inputs)
    assert v["verdict"] == "STOP" and "finite_values" in v["failed_clauses"]
    # unequal forced-prefix token counts are carried through to their clause
    inputs = g.grid_tie_inputs(divs, [_probe(0, ktop, 11)], [_probe(0, ktop, 12)])
    v = gates.grid_tie_v1(inputs)
    assert v["verdict"] == "STOP" and v["failed_clauses"] == ["equal_prefix_lengths"]


# ------------------------------------------- the phase's pieces on a fake server
# probe_arm and GreedyPlan are what diagnostics_phase runs; here against the
# in-process fake server (a real HTTP server, attached as an arm) so every
# request they send can be counted and a failure planted.

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
    return PhaseServer(fake.spec, phase="diagnostics", log_path=str(tmp_path / "srv.log"), receipt=None,
                       starts_log=fake.starts)


def test_probes_force_the_shared_prefix_with_their_own_salt_and_resume_from_the_journal(fake, tmp_path):
    greedy_runs = {"control": [{**_rec(0, [1, 2, 3]), "prompt_ids": [40, 41]}, {**_rec(1, [5]), "prompt_ids": [50]}],
                   "candidate": [{**_rec(0, [1, 2, 9]), "prompt_ids": [40, 41]}, {**_rec(1, [5]), "prompt_ids": [50]}]}
    order, divs, prompt_ids, probed = find_divergences(greedy_runs)
    assert order == [0, 1] and [d["index"] for d in probed] == [0]  # only a divergence is probed
    journal = tmp_path / "journal" / "probes.jsonl"
    with _session(fake, tmp_path) as ps:
        probes = probe_arm(ps, probed, prompt_ids, journal)
    assert len(probes) == 1 and len(fake.calls) == 1
    p, sent = probes[0], fake.calls[0]
    assert sent["prompt"] == [40, 41, 1, 2] and sent["max_tokens"] == 1 and sent["temperature"] == 0.0
    assert p["index"] == 0 and p["first_divergence"] == 2 and p["error"] is None
    assert len(p["top20"]) == 20 and p["token_id"] == p["top20"][0][0]
    assert p["prompt_tokens"] == 4 == p["sent_prompt_len"]
    assert p["salt"] == sent["cache_salt"] and p["body_sha256"] == sha256_json(p["body"])
    # a rerun probes nothing the journal holds and starts no server
    with _session(fake, tmp_path) as ps:
        again = probe_arm(ps, probed, prompt_ids, journal)
        assert ps.starts == 0
    assert again == probes and len(fake.calls) == 1


DATASET = {"name": "ds", "items": [{"index": 0, "messages": [{"role": "user", "content": "2 + 2 ="}]}]}
PAIRED = {"table": {"indices": [0], "control_only": [], "candidate_only": []}}
REPEATS = GreedySettings(items="all", concordant=0, seed=0, max_tokens=2, determinism_repeats=3)


def _determinism(fake, tmp_path, cfg=REPEATS):
    plan = GreedyPlan(DATASET, PAIRED, cfg, {}, tmp_path / "journal" / "greedy.jsonl")
    with _session(fake, tmp_path) as ps:
        if plan.todo:
            plan.run(ps.get(), "control")
    return plan


def test_determinism_repeats_hash_alike_each_with_a_fresh_salt(fake, tmp_path):
    header, records = _determinism(fake, tmp_path).header_and_records("control", [])
    det = header["determinism"]
    assert len(records) == 1 and len(det["records"]) == 3 and det["index"] == 0
    assert det["hashes"] == [sha256_json(det["records"][0]["token_ids"])] * 3
    assert len({c["cache_salt"] for c in fake.calls}) == 4  # the greedy run and each repeat: no cache reuse
    assert gates.determinism_v1({"control": det["hashes"]})["verdict"] == "PASS"


def test_a_repeat_without_an_answer_is_not_a_repeat_until_a_rerun_asks_it_again(fake, tmp_path):
    fake.fail[4] = 503  # the third repeat (after the greedy run and two repeats)
    plan = _determinism(fake, tmp_path)
    with pytest.raises(PhaseError, match=r"greedy runs without an answer: \[\('determinism', 2\)\]"):
        plan.header_and_records("control", [])
    journaled = read_log(tmp_path / "journal" / "greedy.jsonl")
    assert [r["status"] for r in journaled] == [200, 200, 200, 503]  # the failure is kept as evidence
    again = _determinism(fake, tmp_path)
    assert len(fake.calls) == 5  # the rerun asked only the open repeat
    det = again.header_and_records("control", [])[0]["determinism"]
    assert len(set(det["hashes"])) == 1 and gates.determinism_v1({"control": det["hashes"]})["verdict"] == "PASS"


def test_refused_repeats_are_never_counted_as_repeats_that_matched(fake, tmp_path):
    # max_tokens beyond the fake's 256-token context: every repeat gets the same 400, a final answer
    plan = _determinism(fake, tmp_path, dataclasses.replace(REPEATS, max_tokens=300))
    det = plan.header_and_records("control", [])[0]["determinism"]
    assert all(r["status"] == 400 for r in det["records"])
    assert all(h.startswith("error:") for h in det["hashes"]) and len(set(det["hashes"])) == 3
    verdict = gates.determinism_v1({"control": det["hashes"]})
    assert verdict["verdict"] == "STOP" and verdict["nondeterministic_arms"] == ["control"]


# ------------------------------------------------------- real-server tests
# Greedy runs, probes and determinism on the reference server run through the
# diagnostics phase itself (tests/test_diagnostics_stages.py); here only what
# one request shows.

def _messages(text):
    return [{"role": "user", "content": text}]


control = module_server()


def _ep(server):
    from pairaudit.serving.client import Endpoint

    return Endpoint(server.url, model=MODEL, timeout_s=300)


@pytest.mark.server
def test_prompt_ids_real_server_error_keeps_body(control):
    with pytest.raises(g.GreedyError, match="does not exist"):
        g.prompt_ids(_ep(control), "no-such-model", _messages("hi"))


@pytest.mark.server
def test_a_greedy_run_past_the_context_records_the_servers_clamp(control):
    # Like vLLM 0.32 the server lowers max_tokens to what fits rather than refusing.
    ep = _ep(control)
    # counting: a prompt the model goes on continuing rather than ending
    text = ", ".join(str(i % 100) for i in range(control.max_model_len))
    ids = ep.post_json("/tokenize", {"model": MODEL, "prompt": text})["body"]["tokens"][:control.max_model_len - 3]
    rec = g.greedy_one(ep, MODEL, ids, max_tokens=8, index=0)
    assert rec["error"] is None and rec["finish_reason"] == "length"
    assert rec["clamped"] is True and len(rec["token_ids"]) == 3
    assert rec["clamp"]["asked"] == 8 and rec["clamp"]["completion_tokens"] == 3
    # an unclamped run of the same prompt says so
    assert g.greedy_one(ep, MODEL, ids[:20], max_tokens=4, index=1)["clamped"] is False


def test_a_journal_shared_with_another_job_is_waited_for_then_read_so_nothing_is_asked_twice(fake, tmp_path, caplog):
    """A sweep's candidates share the control's greedy journal: a job that finds another one writing it waits,
    then reads what that job wrote, and asks only what is still missing (here nothing)."""
    import logging

    shared = tmp_path / "journal" / "greedy" / "ds" / "control.jsonl"
    first = _determinism(fake, tmp_path / "first")  # what the other candidate's job asks the control
    asked = len(fake.calls)
    assert asked == 4
    waiting = GreedyPlan(DATASET, PAIRED, REPEATS, {}, shared)
    assert len(waiting.todo) == 4
    caplog.set_level(logging.INFO, logger="pairaudit.core.jsonlog")
    other = AppendLog(shared, owner="greedy control (the other candidate)")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with _session(fake, tmp_path) as ps:
                waiting.run(ps.get(), "control")
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while "waiting for" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "the other candidate" in caplog.text, caplog.text
    for rec in read_log(tmp_path / "first" / "journal" / "greedy.jsonl"):
        other.append(rec)
    other.close()
    t.join(30)
    assert not t.is_alive() and errors == []
    assert len(fake.calls) == asked  # every run came from the other job's records
    (got, got_runs), (want, want_runs) = (p.header_and_records("control", []) for p in (waiting, first))
    assert got_runs == want_runs and got["determinism"] == want["determinism"]  # the provenance names its journal
    assert "is free after" in caplog.text
