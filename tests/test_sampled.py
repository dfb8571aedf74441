"""pairaudit.answers.sampled: request bodies, the journal, resume, and the stage.

Unit tests first; then error paths against tests/fake_server.py (connection
refused, 500s, recovery); then one end-to-end run against the real reference
server (marker ``server``).
"""

import json
import socket
import threading
from collections import Counter
from pathlib import Path

import fake_server
import pytest

from pairaudit.answers import sampled
from pairaudit.answers.sampled import Journal, SampledError, collect, is_final, pending_items, read_journal, run_items
from pairaudit.core import artifacts, defaults
from pairaudit.core.settings import SamplingSettings
from pairaudit.plans import requests as plan_requests
from pairaudit.plans.requests import body_sha256, request_body
from pairaudit.serving.client import Endpoint

SAMPLING = {"base_seed": 1000, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "max_tokens": 16,
            "concurrency": 2}


def item(index, question="What is 2 + 3?"):
    return {"index": index, "id": f"q{index}", "format": "gsm8k", "question": question,
            "reference": {"answer": "5"},
            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": question}]}


def bodies_for(indices, *, model="fake-model", audit="a1", dataset="ds", sampling=SAMPLING):
    return {i: request_body(item(i), sampling, model=model, audit=audit, dataset=dataset) for i in indices}


# ---------------------------------------------------------------- request bodies

def test_request_body_every_sampling_field_explicit():
    body = request_body(item(7), SAMPLING, model="m", audit="a1", dataset="ds")
    for k in plan_requests.SAMPLING_FIELDS:
        assert body[k] == SAMPLING[k], k
    assert body["seed"] == 1007
    assert body["model"] == "m" and body["messages"] == item(7)["messages"]
    # fields a server would otherwise fill with its own (build-dependent) default
    explicit = {"min_tokens": 0, "n": 1, "stop": [], "ignore_eos": False, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "repetition_penalty": 1.0, "skip_special_tokens": True,
                "stream": False, "chat_template_kwargs": {}}
    for k, v in explicit.items():
        assert body[k] == v, k
    assert isinstance(body["cache_salt"], str) and len(body["cache_salt"]) == 32


def test_request_body_has_no_silent_defaults():
    partial = {k: v for k, v in SAMPLING.items() if k != "min_p"}
    with pytest.raises(KeyError):
        request_body(item(0), partial, model="m", audit="a", dataset="d")


def test_seed_is_base_seed_plus_index():
    seeds = {i: b["seed"] for i, b in bodies_for([0, 3, 41]).items()}
    assert seeds == {0: 1000, 3: 1003, 41: 1041}
    other = request_body(item(3), {**SAMPLING, "base_seed": 5}, model="m", audit="a1", dataset="ds")
    assert other["seed"] == 8


def test_salt_identical_across_arms_and_fresh_across_audits():
    control = request_body(item(2), SAMPLING, model="served-control", audit="a1", dataset="ds")
    candidate = request_body(item(2), SAMPLING, model="served-candidate", audit="a1", dataset="ds")
    assert control["cache_salt"] == candidate["cache_salt"]
    assert {k: v for k, v in control.items() if k != "model"} == \
           {k: v for k, v in candidate.items() if k != "model"}
    salts = {
        request_body(item(2), SAMPLING, model="m", audit="a2", dataset="ds")["cache_salt"],  # other audit
        request_body(item(2), SAMPLING, model="m", audit="a1", dataset="ds2")["cache_salt"],  # other dataset
        request_body(item(3), SAMPLING, model="m", audit="a1", dataset="ds")["cache_salt"],  # other item
        control["cache_salt"],
    }
    assert len(salts) == 4


def test_body_sha256_ignores_model_only():
    a = request_body(item(1), SAMPLING, model="x", audit="a1", dataset="ds")
    b = request_body(item(1), SAMPLING, model="y", audit="a1", dataset="ds")
    assert body_sha256(a) == body_sha256(b)
    assert body_sha256(a) == artifacts.sha256_json({k: v for k, v in a.items() if k != "model"})
    hotter = request_body(item(1), {**SAMPLING, "temperature": 0.8}, model="x", audit="a1", dataset="ds")
    assert body_sha256(hotter) != body_sha256(a)
    other_q = request_body(item(1, "What is 2 + 4?"), SAMPLING, model="x", audit="a1", dataset="ds")
    assert body_sha256(other_q) != body_sha256(a)


# ---------------------------------------------------------------- journal

def attempt(index, n, status, body, **kw):
    return {"index": index, "attempt": n, "body_sha256": body_sha256(body), "body": body, "status": status,
            "response": kw.get("response"), "error": kw.get("error"), "finish_reason": None, "usage": None,
            "timings": {}, "server": {}}


def test_read_journal_missing_file_is_empty(tmp_path):
    assert read_journal(tmp_path / "none.jsonl") == []


def test_journal_append_and_read(tmp_path):
    path = tmp_path / "j" / "control.jsonl"
    j = Journal(path)
    j.append({"index": 0, "attempt": 1, "text": "é"})
    j.append({"index": 1, "attempt": 1})
    j.close()
    assert read_journal(path) == [{"index": 0, "attempt": 1, "text": "é"}, {"index": 1, "attempt": 1}]
    j = Journal(path)  # reopening an intact journal adds no blank line
    j.append({"index": 2, "attempt": 1})
    j.close()
    assert path.read_text().count("\n") == 3 and "\n\n" not in path.read_text()


@pytest.mark.parametrize("cut_text", ["plain ascii", "café ×÷ 😀 ☃"])
def test_crash_cut_line_is_skipped_and_next_append_starts_fresh(tmp_path, cut_text):
    path = tmp_path / "j.jsonl"
    good = json.dumps({"index": 0, "attempt": 1}) + "\n"
    cut = json.dumps({"index": 1, "attempt": 1, "text": cut_text}, ensure_ascii=False).encode()
    # cut inside the last character (mid UTF-8 sequence for the non-ASCII case)
    path.write_bytes(good.encode() + cut[:-3])
    assert read_journal(path) == [{"index": 0, "attempt": 1}]
    j = Journal(path)
    j.append({"index": 1, "attempt": 2})
    j.close()
    raw = path.read_bytes()
    assert raw.startswith(good.encode() + cut[:-3] + b"\n")  # the cut line is kept, never repaired
    assert raw.endswith(b'\n{"index": 1, "attempt": 2}\n')
    assert read_journal(path) == [{"index": 0, "attempt": 1}, {"index": 1, "attempt": 2}]


# ---------------------------------------------------------------- pending / collect

@pytest.mark.parametrize("status, final", [(200, True), (400, True), (404, True), (None, False),
                                           (500, False), (503, False)])
def test_is_final(status, final):
    assert is_final({"status": status}) is final


def test_pending_items_final_and_open():
    bodies = bodies_for([0, 1, 2, 3, 4])
    atts = [attempt(0, 1, 200, bodies[0]), attempt(1, 1, 400, bodies[1]), attempt(2, 1, None, bodies[2]),
            attempt(3, 1, 500, bodies[3]), attempt(3, 2, 503, bodies[3])]
    by_index, done = pending_items(bodies, atts)
    assert done == {0, 1}
    assert [a["attempt"] for a in by_index[3]] == [1, 2]
    assert by_index[4] == []


def test_pending_items_ignores_stale_bodies_and_foreign_indices():
    bodies = bodies_for([0, 1])
    old = bodies_for([0, 1], sampling={**SAMPLING, "max_tokens": 32})
    atts = [attempt(0, 1, 200, old[0]),          # answered under an old sampling config
            attempt(1, 1, 200, bodies[1]),
            attempt(9, 1, 200, bodies[1])]      # an index that is not selected any more
    by_index, done = pending_items(bodies, atts)
    assert done == {1}
    assert by_index[0] == [] and set(by_index) == {0, 1}


def test_collect_keeps_prior_transport_errors_beside_the_answer():
    bodies = bodies_for([0, 1, 2])
    by_index = {
        0: [attempt(0, 1, None, bodies[0], error="transport: connection: refused"),
            attempt(0, 2, 500, bodies[0], error="http 500: boom"),
            attempt(0, 3, 200, bodies[0], response={"answer": "first"})],
        1: [attempt(1, 1, 200, bodies[1], response={"answer": "primary"}),
            attempt(1, 2, 200, bodies[1], response={"answer": "retry"})],  # must never replace the primary
        2: [attempt(2, 1, None, bodies[2], error="transport: timeout: x")],
    }
    records, open_items = collect(bodies, by_index)
    assert open_items == [2]
    assert [r["index"] for r in records] == [0, 1]
    r0, r1 = records
    assert r0["attempt"] == 3 and r0["response"] == {"answer": "first"}
    assert [(p["attempt"], p["status"]) for p in r0["prior_attempts"]] == [(1, None), (2, 500)]
    assert r1["attempt"] == 1 and r1["response"] == {"answer": "primary"} and r1["prior_attempts"] == []


# ---------------------------------------------------------------- fake server: error paths

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake(monkeypatch):
    """An in-process fake; ``counts[index]`` = POSTs that reached the model part, ``fail`` forces 500s."""
    counts, fail = Counter(), set()
    orig = fake_server.handle_post

    def counting(st, path, body):
        idx = body["seed"] - SAMPLING["base_seed"]
        counts[idx] += 1
        if idx in fail:
            return fake_server._err(500, f"planted failure for item {idx}", "InternalServerError")
        return orig(st, path, body)

    monkeypatch.setattr(fake_server, "handle_post", counting)
    srv = fake_server.make_server(max_model_len=256)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    srv.counts, srv.fail = counts, fail
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def run_pass(url, bodies, jpath):
    """One resume pass the way answer_dataset does it: read the journal, ask only the open items."""
    by_index, done = pending_items(bodies, read_journal(jpath))
    todo = {i: b for i, b in bodies.items() if i not in done}
    j = Journal(jpath)
    try:
        with Endpoint(url, model="fake-model", timeout_s=10) as ep:
            run_items(ep, todo, j, concurrency=2, server={"url": url, "pid": None}, timeout_s=10, prior=by_index)
    finally:
        j.close()
    return by_index, todo


def test_transport_errors_and_500s_are_open_attempts_then_recovery(fake, tmp_path):
    bodies = bodies_for([0, 1, 2])
    jpath = tmp_path / "journal" / "ds" / "control.jsonl"

    # pass 1: nothing listens -> connection refused, recorded, no exception
    dead = f"http://127.0.0.1:{free_port()}"
    by_index, todo = run_pass(dead, bodies, jpath)
    assert sorted(todo) == [0, 1, 2]
    atts = read_journal(jpath)
    assert len(atts) == 3
    assert all(a["status"] is None and a["error"].startswith("transport: connection") for a in atts)
    assert all(a["attempt"] == 1 and a["response"] is None for a in atts)
    assert pending_items(bodies, atts)[1] == set()

    # pass 2: the server answers 0 and 2, and 500s item 1
    fake.fail.add(1)
    by_index, todo = run_pass(fake.url, bodies, jpath)
    assert sorted(todo) == [0, 1, 2]
    assert fake.counts == Counter({0: 1, 1: 1, 2: 1})
    atts = read_journal(jpath)
    assert len(atts) == 6
    a1 = [a for a in atts if a["index"] == 1][-1]
    assert a1["status"] == 500 and a1["attempt"] == 2 and "planted failure for item 1" in a1["error"]
    assert a1["error_body"]["error"]["message"] == "planted failure for item 1"  # server's words kept
    assert pending_items(bodies, atts)[1] == {0, 2}
    records, open_items = collect(bodies, by_index)
    assert open_items == [1] and [r["index"] for r in records] == [0, 2]

    # pass 3: the fake recovered; only item 1 is asked again
    fake.fail.clear()
    fake.counts.clear()
    by_index, todo = run_pass(fake.url, bodies, jpath)
    assert sorted(todo) == [1]
    assert fake.counts == Counter({1: 1})
    records, open_items = collect(bodies, by_index)
    assert open_items == []
    rec = {r["index"]: r for r in records}
    assert rec[1]["status"] == 200 and rec[1]["attempt"] == 3
    assert [(p["attempt"], p["status"]) for p in rec[1]["prior_attempts"]] == [(1, None), (2, 500)]
    assert rec[1]["prior_attempts"][0]["error"].startswith("transport: connection")
    assert rec[0]["attempt"] == 2 and [p["status"] for p in rec[0]["prior_attempts"]] == [None]
    assert rec[0]["response"]["choices"][0]["finish_reason"] == "length" and rec[0]["finish_reason"] == "length"
    assert rec[0]["usage"]["completion_tokens"] == 16
    assert len(read_journal(jpath)) == 7  # append-only: every attempt is still there

    # pass 4: nothing open, nothing asked
    fake.counts.clear()
    _, todo = run_pass(fake.url, bodies, jpath)
    assert todo == {} and sum(fake.counts.values()) == 0


def test_http500_fault_keeps_items_open(tmp_path):
    srv = fake_server.make_server(faults=("http500",))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        bodies = bodies_for([0, 1])
        jpath = tmp_path / "j.jsonl"
        run_pass(url, bodies, jpath)
        atts = read_journal(jpath)
        assert [a["status"] for a in atts] == [500, 500]
        assert all("internal boom" in a["error"] for a in atts)
        assert pending_items(bodies, atts)[1] == set()
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_400_is_a_final_answer(fake, tmp_path):
    # prompt + max_tokens beyond the fake's 256-token context -> 400 with the server's message
    big = {**SAMPLING, "max_tokens": 300}
    bodies = {0: request_body(item(0), big, model="fake-model", audit="a1", dataset="ds")}
    jpath = tmp_path / "j.jsonl"
    run_pass(fake.url, bodies, jpath)
    fake.counts.clear()
    by_index, todo = run_pass(fake.url, bodies, jpath)
    assert todo == {} and sum(fake.counts.values()) == 0
    records, open_items = collect(bodies, by_index)
    assert open_items == [] and records[0]["status"] == 400
    assert "maximum context length" in records[0]["error"]
    assert records[0]["response"] is None


# ---------------------------------------------------------------- the phase and the assembly
# What the workflow runs: the answers phase of an arm (its server answers every
# planned request, journaled), then the sampled job that assembles one
# dataset's artifact from the journal (answers.stage.assemble).

def write_stage_inputs(tmp_path, *, arm_cfg, n=3, seed=1, sampling=SAMPLING):
    """The dataset, each arm's spec file and planned requests: the inputs of the answers phase."""
    from pairaudit.datasets import formats as datasets
    from pairaudit.plans import stage as plan_stage
    cfg = {"name": "arith", "format": "gsm8k", "source": {"generated": {"kind": "arith", "n": 10, "seed": 7}},
           "select": {"count": n, "seed": seed}, "prompt_template": "brief"}
    ds = datasets.prepare_dataset(cfg, cache_dir=tmp_path / "cache", base_dir=tmp_path)
    ds["provenance"] = artifacts.provenance([], {"config": cfg})
    paths = {"dataset": tmp_path / "datasets" / "arith.json"}
    artifacts.write_json(paths["dataset"], ds)
    for arm in ("control", "candidate"):
        paths[f"spec_{arm}"] = tmp_path / "specs" / f"{arm}.json"
        plan_stage.arm_spec_stage(arm=arm, arm_cfg=arm_cfg, out_path=str(paths[f"spec_{arm}"]))
        paths[f"requests_{arm}"] = tmp_path / "requests" / "arith" / f"{arm}.json"
        plan_stage.requests_stage(dataset_path=str(paths["dataset"]), spec_path=str(paths[f"spec_{arm}"]),
                                  sampling=sampling, audit="t1", out_path=str(paths[f"requests_{arm}"]))
    return ds, paths


def phase_kwargs(tmp_path, paths, arm, sampling):
    return dict(arm=arm, spec_path=str(paths[f"spec_{arm}"]), requests_paths={"arith": str(paths[f"requests_{arm}"])},
                sampling=SamplingSettings.from_json(defaults.filled({"api": "chat", **sampling}, "sampling")), audit="t1", boundary_plan_path=None,
                journal_dir=str(tmp_path / "journal"),
                receipt_path=str(tmp_path / "launch" / f"{arm}.json"),
                preflight_path=str(tmp_path / "preflight" / f"{arm}.json"),
                phase_path=str(tmp_path / "answers" / f"{arm}.json"), boundary_path=None,
                server_log=str(tmp_path / "logs" / f"answers-{arm}.log"),
                starts_log=str(tmp_path / "servers" / "starts.jsonl"))


def assemble_kwargs(tmp_path, paths, arm):
    return dict(dataset_path=str(paths["dataset"]), requests_path=str(paths[f"requests_{arm}"]),
                journal_path=str(tmp_path / "journal" / "sampled" / "arith" / f"{arm}.jsonl"),
                out_path=str(tmp_path / "sampled" / "arith" / f"{arm}.jsonl"),
                receipt_path=str(tmp_path / "launch" / f"{arm}.json"),
                preflight_path=str(tmp_path / "preflight" / f"{arm}.json"),
                phase_path=str(tmp_path / "answers" / f"{arm}.json"))


def test_assembly_refuses_open_items_unless_the_phase_failed(tmp_path):
    bodies = bodies_for([0, 1])
    jpath = tmp_path / "j.jsonl"
    with Journal(jpath) as j:
        j.append(attempt(0, 1, 200, bodies[0], response={"choices": []}))
        j.append(attempt(1, 1, None, bodies[1], error="transport: connection: refused"))
    kw = dict(name="ds", arm="control", bodies=bodies, journal_path=str(jpath), out_path=str(tmp_path / "s.jsonl"),
              consumed=[], params={})
    with pytest.raises(SampledError, match=r"1 item\(s\) have no answer yet \[1\].*rerun to ask only the open"):
        sampled.assemble_records(**kw)
    assert not (tmp_path / "s.jsonl").exists()
    # after a server failure the answered items are kept, and the artifact says the arm failed
    failure = {"arm": "control", "stage": "sampled", "what": "ds item 1", "kind": "dead", "status": None,
               "error": "transport: connection: refused"}
    header = sampled.assemble_records(**kw, failure=failure)
    assert header["n"] == 1 and "ds item 1" in header["arm_failed"]


def test_preflight_fail_refuses_to_sample(tmp_path):
    from test_launch import fake_cfg

    from pairaudit.answers import stage as answers_stage
    # a server whose completions carry 19 top logprobs fails the completion_logprobs20 probe
    _, paths = write_stage_inputs(tmp_path, arm_cfg=fake_cfg("logprobs_few"))
    kw = phase_kwargs(tmp_path, paths, "control", SAMPLING)
    doc = answers_stage.answers_phase(**kw)
    f = doc["failure"]
    assert doc["preflight"] == "FAIL" and f["arm"] == "control" and f["what"] == "probe completion_logprobs20"
    assert artifacts.read_json(kw["preflight_path"])["failed_probe"] == "completion_logprobs20"
    asm = assemble_kwargs(tmp_path, paths, "control")
    assert doc["datasets"] == {} and not Path(asm["journal_path"]).exists()  # nothing was asked
    # the sampled artifact says the arm failed, and why, and holds no answer
    header = answers_stage.assemble(**asm)
    msg = header["arm_failed"]
    assert "completion_logprobs20" in msg and "control" in msg and header["n"] == 0
    assert artifacts.read_jsonl(asm["out_path"]) == (header, [])


@pytest.fixture(scope="module")
def refserver(shared_server):
    return shared_server(None, 1024)


@pytest.mark.server
def test_answers_phase_and_assembly_end_to_end_real_server(refserver, tmp_path):
    from pairaudit.answers import stage as answers_stage
    from pairaudit.serving import armspec
    from pairaudit.serving.phase import PhaseServer

    sampling = {**SAMPLING, "concurrency": 1, "request_timeout_s": 120}
    arm_cfg = {"mode": "attach", "url": refserver.url, "model": "SmolLM2-135M-Instruct", "max_model_len": 1024}
    ds, paths = write_stage_inputs(tmp_path, arm_cfg=arm_cfg, n=2, sampling=sampling)
    indices = ds["indices"]
    assert len(indices) == 2

    out = {}
    for arm in ("control", "candidate"):
        phase = answers_stage.answers_phase(**phase_kwargs(tmp_path, paths, arm, sampling))
        assert phase["failure"] is None and phase["datasets"]["arith"] == {"items": 2, "from_journal": 0, "asked": 2}
        kw = assemble_kwargs(tmp_path, paths, arm)
        header = answers_stage.assemble(**kw)
        h, recs = artifacts.read_jsonl(kw["out_path"])
        assert h == header
        assert h["schema"] == "pairaudit.sampled/v1" and h["arm"] == arm and h["dataset"] == "arith"
        assert h["n"] == 2 and h["arm_failed"] is None and h["max_model_len"] == 1024
        consumed = h["provenance"]["consumed"]
        assert consumed == {p: artifacts.sha256_file(p) for p in
                            (kw["dataset_path"], kw["requests_path"], kw["receipt_path"], kw["preflight_path"])}
        # the bodies answered are the ones planned under this sampling config
        assert artifacts.read_json(kw["requests_path"])["provenance"]["params"]["sampling"] == sampling
        assert [srv["url"] for srv in h["servers"]] == [refserver.url]  # the server that answered every item
        assert [r["index"] for r in recs] == sorted(indices)  # one record per item, index order
        for r in recs:
            assert r["status"] == 200 and r["error"] is None and r["prior_attempts"] == []
            assert r["body"]["seed"] == sampling["base_seed"] + r["index"]
            assert r["body_sha256"] == body_sha256(r["body"])
            assert r["usage"]["completion_tokens"] <= 16
            assert r["finish_reason"] in ("stop", "length")
            assert isinstance(r["response"]["choices"][0]["message"]["content"], str)
        assert len(read_journal(Path(kw["journal_path"]))) == 2
        out[arm] = (kw, recs)

    # both arms asked exactly the same thing, item by item
    assert [r["body_sha256"] for r in out["control"][1]] == [r["body_sha256"] for r in out["candidate"][1]]

    # a rerun resumes: nothing is asked again, the journal does not grow, the artifact is the same
    kw, recs = out["control"]
    first = Path(kw["out_path"]).read_bytes()
    bodies = plan_requests.bodies(plan_requests.read_requests(kw["requests_path"]))
    spec = armspec.read_spec(paths["spec_control"], arm="control")
    with PhaseServer(spec, phase="answers", log_path=str(tmp_path / "again.log"), receipt=None,
                     starts_log=str(tmp_path / "starts.jsonl")) as ps, \
            Journal(Path(kw["journal_path"]), owner="answers control") as journal:
        counts = sampled.answer_dataset(ps.get(), "arith", bodies, journal, sampling=SamplingSettings.from_json(defaults.filled({"api": "chat", **sampling}, "sampling")))
    assert counts == {"items": 2, "from_journal": 2, "asked": 0}
    header = answers_stage.assemble(**kw)
    assert header["n"] == 2
    assert len(read_journal(Path(kw["journal_path"]))) == 2
    _, again = artifacts.read_jsonl(kw["out_path"])
    assert again == recs
    assert [json.loads(x) for x in Path(kw["out_path"]).read_bytes().splitlines()[1:]] == \
        [json.loads(x) for x in first.splitlines()[1:]]
