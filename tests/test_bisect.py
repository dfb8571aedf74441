"""Switch bisection: the delta-debugging search on known answers, then on the real reference server.

The search (``pairaudit.bisect.search``) is checked against pure oracles
whose answer is known: one responsible switch among four, a pair that moves
only together, none, and every oracle over three and four switches (the
bound and the guarantee that the returned set was itself answered "moves"
hold whatever the oracle says).  The stage (``pairaudit.bisect.stage``) is
then run on the real reference server with switches that plant real numeric
changes -- the BF16 LM head flips greedy argmaxes -- beside switches that
move nothing (n-gram speculation cannot act on a one-token probe, and two
variables the server never reads), and run again to show a rerun starts
nothing.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from pairaudit.bisect import search
from pairaudit.bisect import stage as bstage
from pairaudit.core import artifacts
from pairaudit.core.contracts import BISECT_SCHEMA, DIVERGENCE_SCHEMA, GREEDY_SCHEMA
from pairaudit.plans import change as changes

FOUR = ["A", "B", "C", "D"]


class Counting:
    """An oracle that counts how often it is really asked (each ask = one server start)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, on: frozenset[str]):
        self.calls.append(on)
        return self.fn(on)


# ------------------------------------------------------------ the bound

def test_the_bound_is_2k_ceil_log2_n_plus_the_two_confirmations():
    assert [search.bound(n, 1) for n in (1, 2, 3, 4, 5, 8, 9)] == [2, 4, 6, 6, 8, 8, 10]
    assert search.bound(4, 2) == 10 and search.bound(4, 0) == 2 and search.bound(16, 3) == 26
    with pytest.raises(ValueError):
        search.bound(0, 0)


# ------------------------------------------------------- known answers

@pytest.mark.parametrize("culprit", FOUR)
def test_four_switches_only_one_moves_it_is_found_within_the_bound(culprit):
    oracle = Counting(lambda on: culprit in on)
    res = search.find_responsible(FOUR, oracle)
    assert res.status == "found" and res.responsible == (culprit,)
    assert res.asked == len(oracle.calls) <= search.bound(4, 1) == 6
    # the two confirmations come first: every switch on, then every switch at rollback
    assert oracle.calls[:2] == [frozenset(FOUR), frozenset()]
    # the first half holds A and B: found after one halving test each level; C and D cost the other half's test
    assert res.asked == {"A": 4, "B": 5, "C": 5, "D": 6}[culprit]
    assert res.queries[-1] == search.Query(on=(culprit,), moved=True)  # the answer itself was asked


@pytest.mark.parametrize("pair", list(itertools.combinations(FOUR, 2)), ids="+".join)
def test_two_switches_that_move_only_together_are_found_as_the_pair(pair):
    oracle = Counting(lambda on: set(pair) <= on)
    res = search.find_responsible(FOUR, oracle)
    assert res.status == "found" and res.responsible == pair
    assert res.asked == len(oracle.calls) <= search.bound(4, 2) == 10
    assert frozenset(pair) in oracle.calls  # the pair itself was asked and moved
    assert all(not oracle.fn(frozenset([s])) for s in pair)  # neither alone: the oracle is honest


def test_none_moves_says_so_after_the_two_confirmations():
    oracle = Counting(lambda on: False)
    res = search.find_responsible(FOUR, oracle)
    assert res.status == "not_reproduced" and res.responsible is None
    assert res.asked == 2 == search.bound(4, 0)
    assert res.to_json()["responsible"] is None


def test_an_outcome_the_rollback_server_already_gives_is_not_the_changes():
    res = search.find_responsible(FOUR, lambda on: True)
    assert res.status == "moves_without_switches" and res.responsible is None and res.asked == 2


def test_a_failed_probe_leaves_the_item_undecided_naming_the_subset():
    res = search.find_responsible(FOUR, lambda on: None if on == frozenset({"A", "B"}) else "D" in on)
    assert res.status == "undecided" and res.responsible is None and res.undecided_on == ("A", "B")


def test_one_switch_needs_only_the_confirmations():
    oracle = Counting(lambda on: "A" in on)
    res = search.find_responsible(["A"], oracle)
    assert res.responsible == ("A",) and res.asked == 2 == search.bound(1, 1)


def test_every_subset_is_asked_once_and_a_shared_cache_makes_a_second_item_free():
    """Counting starts: the stage answers every item from one start per subset."""
    starts: dict[frozenset, dict] = {}

    def start(on):  # one "server start": the outcome for every item at once
        starts.setdefault(on, {"x": "C" in on, "y": "C" in on, "z": {"A", "D"} <= on})
        return starts[on]

    results = {item: search.find_responsible(FOUR, lambda on, item=item: start(on)[item]) for item in "xyz"}
    assert results["x"].responsible == results["y"].responsible == ("C",)
    assert results["z"].responsible == ("A", "D")
    asked_x = {frozenset(q.on) for q in results["x"].queries}
    assert asked_x == {frozenset(q.on) for q in results["y"].queries}  # y asked exactly x's subsets: no new start
    assert len(starts) == len(asked_x | {frozenset(q.on) for q in results["z"].queries})
    assert len(starts) <= 2 + (search.bound(4, 1) - 2) + (search.bound(4, 2) - 2)


def _all_oracles(n):
    """Every truth table over the subsets of n switches with all-on True and all-off False."""
    names = [chr(ord("A") + i) for i in range(n)]
    middle = [frozenset(c) for r in range(1, n) for c in itertools.combinations(names, r)]
    for bits in itertools.product((False, True), repeat=len(middle)):
        table = dict(zip(middle, bits))
        table[frozenset(names)], table[frozenset()] = True, False
        yield names, table


@pytest.mark.parametrize("n", [2, 3, 4])
def test_for_every_oracle_the_bound_holds_and_the_set_returned_was_answered_moves(n):
    """Whatever the oracle (monotone or not), the search stays within 2 k ceil(log2 n) + 2 asks."""
    count = 0
    for names, table in _all_oracles(n):
        res = search.find_responsible(names, table.__getitem__)
        assert res.status == "found"
        k = len(res.responsible)
        assert 1 <= k <= n and res.asked <= search.bound(n, k), (table, res)
        assert table[frozenset(res.responsible)] is True
        assert len({q.on for q in res.queries}) == res.asked  # never the same subset twice
        count += 1
    assert count == 2 ** (2 ** n - 2)


@pytest.mark.parametrize("n", [3, 4])
def test_on_a_monotone_oracle_the_set_is_minimal(n):
    """Monotone (adding a switch never undoes a move): no switch of the result can be dropped."""
    checked = 0
    for names, table in _all_oracles(n):
        if any(table[a] and not table[b] for a in table for b in table if a < b):
            continue
        res = search.find_responsible(names, table.__getitem__)
        r = frozenset(res.responsible)
        assert all(not table[r - {s}] for s in r), (table, res.responsible)
        checked += 1
    assert checked > 10  # the monotone ones are a real family, not a handful


def test_the_search_halves_in_the_changes_order_so_same_answers_give_same_asks():
    a = search.find_responsible(FOUR, lambda on: "B" in on)
    b = search.find_responsible(FOUR, lambda on: "B" in on)
    assert [q.on for q in a.queries] == [q.on for q in b.queries] == [
        ("A", "B", "C", "D"), (), ("A", "B"), ("A",), ("B",)]


# ------------------------------------------------------------- the text

def test_the_summary_names_what_each_switch_moves():
    items = [{"dataset": "arith", "index": 14, "status": "found", "responsible": ["PAIRAUDIT_REF_LM_HEAD_BF16"]},
             {"dataset": "arith", "index": 97, "status": "found", "responsible": ["PAIRAUDIT_REF_LM_HEAD_BF16"]},
             {"dataset": "algebra", "index": 3, "status": "found", "responsible": ["X", "Y"]},
             {"dataset": "algebra", "index": 5, "status": "not_reproduced", "responsible": None}]
    lines = bstage.summary_lines(["PAIRAUDIT_REF_LM_HEAD_BF16", "PAIRAUDIT_REF_SPEC_NGRAM", "X", "Y"], items)
    assert lines == [
        "PAIRAUDIT_REF_LM_HEAD_BF16 alone moves items 14, 97 (arith) at their first divergence",
        "X + Y move item 3 (algebra) at their first divergence only together (no smaller set of switches does)",
        "PAIRAUDIT_REF_SPEC_NGRAM moves none",
        "item 5 (algebra): every switch on does not give the candidate's token at the divergence: not "
        "reproduced by one teacher-forced step"]


# ------------------------------------------------- the stage without servers

def _write_diagnostics(tmp: Path, divergences: list[dict], records: list[dict], name: str = "t") -> tuple:
    gpath, dpath = tmp / "greedy" / name / "control.jsonl", tmp / "divergence" / f"{name}.json"
    gpath.parent.mkdir(parents=True, exist_ok=True)
    dpath.parent.mkdir(parents=True, exist_ok=True)
    artifacts.write_jsonl(gpath, {"schema": GREEDY_SCHEMA, "dataset": name, "arm": "control",
                                  "provenance": artifacts.provenance([])}, records)
    # the bisection reads the divergences only; grid-tie's verdict is the diagnostics' own (None: not decided here)
    artifacts.write_json(dpath, {"schema": DIVERGENCE_SCHEMA, "dataset": name, "divergences": divergences,
                                 "grid_tie": None, "provenance": artifacts.provenance([gpath])})
    return {name: str(dpath)}, {name: str(gpath)}


def test_the_items_to_bisect_are_the_divergences_with_a_token_in_each_arm_and_a_prompt(tmp_path):
    recs = [{"index": i, "prompt_ids": [1, 2, 3 + i]} for i in range(3)]
    divs = [{"index": 0, "diverged": True, "first_divergence": 2, "control_token_id": 7, "candidate_token_id": 9,
             "shared_prefix": [5, 6]},
            {"index": 1, "diverged": True, "first_divergence": 4, "control_token_id": 7, "candidate_token_id": None},
            {"index": 2, "diverged": False},
            {"index": 3, "diverged": True, "first_divergence": 0, "control_token_id": 1, "candidate_token_id": 2}]
    d, g = _write_diagnostics(tmp_path, divs, recs)
    items, skipped, notes = bstage.divergent_items(d, g)
    assert [(it.index, it.first_divergence, it.control_token_id, it.candidate_token_id, it.prompt_ids,
             it.shared_prefix) for it in items] == [(0, 2, 7, 9, (1, 2, 3), (5, 6))]
    assert [(s["index"], s["reason"].split(":")[0]) for s in skipped] == [
        (1, "one arm's output ends at the divergence"), (3, "no prompt ids for the item in " + g["t"])]
    assert notes == []
    # a divergence record that does not fit its type is refused naming the file and the field
    d, g = _write_diagnostics(tmp_path, [{**divs[0], "diverged": "yes"}], recs)
    with pytest.raises(artifacts.ArtifactError, match=r"divergence/t\.json.*divergences\[0\]\.diverged"):
        bstage.divergent_items(d, g)


def _stage(tmp: Path, dpaths, gpaths, arms, server=None, change=None, out="bisect"):
    return bstage.bisect_stage(divergence_paths=dpaths, greedy_paths=gpaths, arms=arms, server=server,
                               change=change, journal_dir=str(tmp / "journal"),
                               server_log_dir=str(tmp / "logs" / "servers"),
                               starts_log=str(tmp / "servers" / "starts.jsonl"),
                               out_result=str(tmp / out / "result.json"), out_report=str(tmp / out / "report.md"))


def test_attach_arms_say_bisection_needs_launch_mode_and_start_nothing(tmp_path):
    d, g = _write_diagnostics(tmp_path, [], [])
    arms = {"control": {"mode": "attach", "url": "http://127.0.0.1:1", "model": "m"},
            "candidate": {"mode": "attach", "url": "http://127.0.0.1:2", "model": "m"}}
    doc = _stage(tmp_path, d, g, arms)
    assert doc["status"] == "needs_launch_mode" and "needs launch mode" in doc["message"]
    assert artifacts.read_json(tmp_path / "bisect" / "result.json")["schema"] == BISECT_SCHEMA
    assert "needs launch mode" in (tmp_path / "bisect" / "report.md").read_text()
    assert not (tmp_path / "servers").exists()


def test_the_two_arm_form_has_no_switches_to_bisect(tmp_path):
    d, g = _write_diagnostics(tmp_path, [], [])
    arm = {"mode": "launch", "command": ["x", "{port}"], "model": "m", "max_model_len": 64}
    doc = _stage(tmp_path, d, g, {"control": arm, "candidate": arm})
    assert doc["status"] == "no_switches" and "No switches to bisect" in doc["message"]
    assert doc["starts"]["started"] == 0 and not (tmp_path / "servers").exists()


# ------------------------------------------------- the real reference server

MODEL = "SmolLM2-135M-Instruct"
# "17 times 23" flips at its first token with the BF16 head; "sky is blue" later (picked once,
# tests/test_greedy.py). A few tokens each: the item's divergence is what is bisected, not the answer.
PROMPTS = ["What is 17 times 23? Show your work.", "Explain why the sky is blue in two sentences."]
GREEDY_TOKENS = 18
LM_HEAD, NGRAM = "PAIRAUDIT_REF_LM_HEAD_BF16", "PAIRAUDIT_REF_SPEC_NGRAM"
INERT_A, INERT_B = "PAIRAUDIT_TEST_INERT_A", "PAIRAUDIT_TEST_INERT_B"   # no program reads them
SERVER = {"mode": "launch", "command": ["{python}", "-m", "pairaudit.refserver", "--model", "{model}", "--host",
                                        "{host}", "--port", "{port}", "--max-model-len", "{max_model_len}"],
          "model": MODEL, "max_model_len": 512, "speculative": False, "health_timeout_s": 300}
# The numeric switch third, so the search has to halve past the inert first half.
CHANGE = {"name": "planted", "switches": [
    {"env": INERT_A, "rollback": "0", "on": "1"},
    {"env": NGRAM, "rollback": "0", "on": "4", "speculative": True},
    {"env": LM_HEAD, "rollback": "0", "on": "1"},
    {"env": INERT_B, "rollback": "0", "on": "1"}]}


@pytest.fixture(scope="module")
def real_audit(tmp_path_factory):
    """Greedy runs of the change's two derived arms on the real server, written as the diagnostics write them."""
    from pairaudit.answers import greedy
    from pairaudit.diagnostics.divergence import find_divergences
    from pairaudit.serving import armspec, launch

    tmp = tmp_path_factory.mktemp("bisect")
    cfg = {"server": json.loads(json.dumps(SERVER)), "change": json.loads(json.dumps(CHANGE))}
    assert changes.derive_arms(cfg) == []
    records = {}
    for arm in ("control", "candidate"):
        spec = armspec.resolve_spec(arm, cfg["arms"][arm])
        with launch.Server(spec, log_path=tmp / f"{arm}.log") as srv:
            recs = []
            for i, text in enumerate(PROMPTS):
                ids = greedy.prompt_ids(srv.endpoint, MODEL, [{"role": "user", "content": text}])
                rec = greedy.greedy_one(srv.endpoint, MODEL, ids, max_tokens=GREEDY_TOKENS, index=i)
                rec["prompt_ids"] = ids
                assert rec["error"] is None, rec
                recs.append(rec)
            records[arm] = recs
    _, divergences, _ = find_divergences(records)
    probed = [d for d in divergences if d["diverged"]]
    assert 0 in [d["index"] for d in probed], divergences  # the BF16 head flips the first prompt at token 0
    d, g = _write_diagnostics(tmp, divergences, records["control"], name="tiny")
    return tmp, d, g, cfg, probed


@pytest.mark.server
def test_the_bf16_head_alone_moves_the_real_divergence_and_a_rerun_starts_nothing(real_audit):
    tmp, d, g, cfg, probed = real_audit
    doc = _stage(tmp, d, g, cfg["arms"], server=cfg["server"], change=cfg["change"])
    assert doc["status"] == "done" and doc["switches"] == [INERT_A, NGRAM, LM_HEAD, INERT_B]
    by_index = {it["index"]: it for it in doc["items"]}
    assert set(by_index) == {p["index"] for p in probed}
    first = by_index[0]
    assert first["first_divergence"] == 0 and first["status"] == "found"
    assert first["responsible"] == [LM_HEAD]
    # all on, all at rollback, the inert half, the half with the head, the head alone
    assert [p["on"] for p in first["probes"]] == [[INERT_A, NGRAM, LM_HEAD, INERT_B], [], [INERT_A, NGRAM],
                                                  [LM_HEAD, INERT_B], [LM_HEAD]]
    assert [p["outcome"] for p in first["probes"]] == ["candidate", "control", "control", "candidate", "candidate"]
    assert first["asked"] == 5 <= first["bound"] == search.bound(4, 1) == 6
    for p in first["probes"]:  # the greedy token is a top-1 of the top-20 (with the BF16 head: tied on its grid)
        assert len(p["top20"]) == 20 and dict(p["top20"])[p["token_id"]] == max(v for _, v in p["top20"])
    for it in doc["items"]:
        # a later divergence under speculation may not be one a single forced step reproduces; never another switch
        assert it["status"] in ("found", "not_reproduced") and it["responsible"] in ([LM_HEAD], None), it
        assert it["asked"] <= it["bound"]
    assert f"{LM_HEAD} alone moves" in " ".join(doc["summary"])
    assert f"{NGRAM} moves none" in doc["summary"] and f"{INERT_A} moves none" in doc["summary"]
    # one fresh start per subset, each logged like every start, each probing every item
    starts = [json.loads(line) for line in (tmp / "servers" / "starts.jsonl").read_text().splitlines()]
    assert doc["starts"]["started"] == doc["starts"]["asked"] == len(doc["subsets"]) <= doc["starts"]["bound"]
    assert [s["event"] for s in starts] == ["ready", "stopped"] * doc["starts"]["started"]
    assert {s["phase"] for s in starts} == {"bisect"}
    report = (tmp / "bisect" / "report.md").read_text()
    assert report.startswith("## Switch bisection: `planted`") and f"{LM_HEAD} alone moves" in report

    # the same evidence again: every subset answered from its kept probes, no server started
    again = _stage(tmp, d, g, cfg["arms"], server=cfg["server"], change=cfg["change"], out="again")
    assert again["starts"]["started"] == 0 and again["starts"]["kept"] == doc["starts"]["asked"]
    assert [it["responsible"] for it in again["items"]] == [it["responsible"] for it in doc["items"]]
    assert len((tmp / "servers" / "starts.jsonl").read_text().splitlines()) == len(starts)


def test_the_kept_probes_are_keyed_by_subset_server_and_items(monkeypatch):
    chg, problems = changes.parse_change(json.loads(json.dumps(CHANGE)), SERVER)
    assert problems == []

    def prober(items, server=SERVER):
        return bstage.Prober(server=server, change=chg, items=items, journal_dir="/nonexistent",
                             server_log_dir="/nonexistent", starts_log=None)

    it = bstage.BisectItem("t", 0, 0, 1, 2, (5, 6), ())
    p = prober([it])
    keys = {p.key(frozenset()), p.key(frozenset({LM_HEAD})), p.key(frozenset({LM_HEAD, NGRAM}))}
    assert len(keys) == 3 and p.key(frozenset({LM_HEAD})) == p.key(frozenset({LM_HEAD}))
    assert prober([bstage.BisectItem("t", 0, 0, 1, 2, (5, 7), ())]).key(frozenset()) != p.key(frozenset())
    assert prober([it], {**SERVER, "max_model_len": 1024}).key(frozenset()) != p.key(frozenset())
    # the interpreter's path is a fact of the host, not of the server: moving a venv keeps the kept probes
    monkeypatch.setattr(sys, "executable", "/elsewhere/bin/python")
    assert prober([it]).key(frozenset()) == p.key(frozenset())


# --------------------------------------------------------- the workflow target

@pytest.mark.workflow
def test_snakemake_bisect_on_a_change_form_audit(tmp_path):
    """`snakemake bisect` on the tiny audit written as server + change: the rule runs what it needs, not promotion."""
    import yaml
    from test_workflow import TINY, make_project, planned_jobs, snake

    config = yaml.safe_load(TINY.read_text())
    config["audit"] = "bisect"
    arm = config.pop("arms")["control"]
    config["server"] = {k: v for k, v in arm.items() if k != "env"}
    config["change"] = {"name": "bf16-head", "switches": [{"env": INERT_A, "rollback": "0", "on": "1"},
                                                           {"env": LM_HEAD, "rollback": "0", "on": "1"}]}
    # every item greedy, long enough for the BF16 head to flip an argmax somewhere (about 2 % of the positions
    # teacher-forced); whether it does depends on the host's CPU numerics, so both outcomes are checked below
    config["greedy"].update(items="all", max_tokens=48, determinism_repeats=2)
    config["boundary"]["enabled"] = config["speed"]["enabled"] = False
    project = make_project(tmp_path / "p", config)
    assert "bisect" not in {rule for rule, _ in planned_jobs(project, "promotion")}
    snake(project, "bisect", timeout=3000)
    res = project / "results" / "bisect"
    doc = json.loads((res / "bisect" / "result.json").read_text())
    assert not (res / "promotion").exists()  # the diagnostic never runs the decision
    assert doc["status"] in ("done", "no_divergence"), doc["message"]
    assert doc["switches"] == [INERT_A, LM_HEAD]
    for it in doc["items"]:  # the only numeric switch, or a divergence one forced step does not reproduce
        assert it["responsible"] in ([LM_HEAD], None) and it["asked"] <= it["bound"] <= search.bound(2, 1)
    starts = [json.loads(line) for line in (res / "servers" / "starts.jsonl").read_text().splitlines()]
    bisect_starts = [s for s in starts if s["phase"] == "bisect" and s["event"] == "ready"]
    assert len(bisect_starts) == doc["starts"]["started"] == doc["starts"]["asked"]
    assert (res / "bisect" / "report.md").read_text().startswith("## Switch bisection: `bf16-head`")
    # asked again, with the same evidence: from the kept probes, no server
    snake(project, "bisect", "--forcerun", "bisect")
    again = json.loads((res / "bisect" / "result.json").read_text())
    assert again["starts"]["started"] == 0 and again["starts"]["kept"] == doc["starts"]["asked"]
    assert len((res / "servers" / "starts.jsonl").read_text().splitlines()) == len(starts)
