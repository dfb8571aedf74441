"""``pairaudit pair`` on real lm-eval output: lm-eval 0.4.13 against the reference server, control and candidate.

tests/data/lmeval/<task>/<arm>/ holds what lm-eval itself wrote (make_logs.py
there made it; command.txt has the exact command), so this runs without
lm-eval: arith_tiny (twelve items of the generated arith suite, which the
135M model gets right part of the time). The pairing of lm-eval's verdicts must equal pairaudit's own
pairing of the same answers, scored by pairaudit's gsm8k scorer.
"""

import json
from pathlib import Path

import pytest

from pairaudit.cli import main
from pairaudit.cli.codes import EXIT
from pairaudit.core import stats
from pairaudit.datasets import formats as datasets
from pairaudit.interop import lmeval
from pairaudit.quality import scoring

DATA = Path(__file__).resolve().parent / "data" / "lmeval"
ARMS = ("control", "candidate")
TASKS = ("arith_tiny",)


def sample_log(task: str, arm: str) -> Path:
    found = sorted((DATA / task / arm).glob(f"samples_{task}_*.jsonl"))
    assert len(found) == 1, found
    return found[0]


def lm_eval_lines(task: str, arm: str) -> list[dict]:
    return [json.loads(x) for x in sample_log(task, arm).read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("task", TASKS)
def test_the_logs_are_lm_evals_own_output(task):
    for arm in ARMS:
        lines = lm_eval_lines(task, arm)
        assert {s["filter"] for s in lines} == {"strict-match", "flexible-extract"}
        assert len(lines) == 24 and sorted({s["doc_id"] for s in lines}) == list(range(12))
        assert all(set(lmeval.REQUIRED) <= set(s) and s["metrics"] == ["exact_match"] for s in lines)
        results = json.loads(next((DATA / task / arm).glob("results_*.json")).read_text())
        assert results["n-samples"][task]["effective"] == 12
        assert results["task_hashes"][task] == lmeval.task_hash(lines)   # lm-eval's hash, recomputed
        assert "lm-eval 0.4.13" in (DATA / task / arm / "command.txt").read_text()
        log = lmeval.read_log(sample_log(task, arm))   # its hashes match its content, as lm-eval wrote them
        assert log.task == task and log.filter == "strict-match" and len(log.docs) == 12


def own_scores(task: str, arm: str) -> dict[int, dict]:
    """pairaudit's gsm8k scorer on lm-eval's answers, per doc_id (the doc is the row lm-eval read)."""
    out = {}
    for s in lm_eval_lines(task, arm):
        if s["filter"] != "strict-match":
            continue
        item = datasets.normalize("gsm8k", [s["doc"]])[0]
        out[s["doc_id"]] = {**scoring.score_item(item, s["resps"][0][0]), "text": s["resps"][0][0]}
    return out


@pytest.mark.parametrize("task", TASKS)
def test_pairaudits_scorer_agrees_with_lm_eval_on_every_answer(task):
    """lm_eval_exact_match is lm-eval's strict verdict; the flexible extraction is lm-eval's flexible one."""
    for arm in ARMS:
        own = own_scores(task, arm)
        for s in lm_eval_lines(task, arm):
            sc = own[s["doc_id"]]
            if s["filter"] == "strict-match":
                assert sc["lm_eval_exact_match"] == (s["exact_match"] == 1.0), (arm, s["doc_id"], s["resps"])
                assert (sc["extracted"] is None) == (s["filtered_resps"] == ["[invalid]"])
            else:
                assert (sc["flexible"]["extracted"] == sc["gold"]) == (s["exact_match"] == 1.0), (arm, s["doc_id"])


@pytest.mark.parametrize("task", TASKS)
def test_pair_gives_pairaudits_own_pairing_of_the_same_answers(capsys, task):
    res = lmeval.pair_logs(sample_log(task, "control"), sample_log(task, "candidate"))
    own = {arm: own_scores(task, arm) for arm in ARMS}
    # pairaudit's pairing of the same answers, judged by lm-eval's string comparison as lm-eval's metric is
    scores = {arm: [{"index": d, "correct": sc["lm_eval_exact_match"], "answered": True, "finish_reason": "stop",
                     "text": sc["text"]} for d, sc in sorted(own[arm].items())] for arm in ARMS}
    records = [{"index": d, "body_sha256": "same prompt", "error": None} for d in sorted(own["control"])]
    table = stats.paired_table(scores["control"], scores["candidate"], records, records)
    for key in ("n", "control_only", "candidate_only", "both_correct", "neither_correct", "net", "mcnemar_p",
                "control_correct", "candidate_correct", "exact_text_matches", "exact_text_match_indices"):
        assert res.table[key] == table[key], key
    # and the command says the same, with the verdict's exit code
    code = main(["pair", str(sample_log(task, "control")), str(sample_log(task, "candidate")), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["table"]["control_only"] == table["control_only"]
    assert doc["table"]["candidate_only"] == table["candidate_only"]
    assert code == EXIT[doc["quality"]["verdict"]]
    assert doc["quality"]["verdict"] in ("PASS", "HOLD", "FAIL")   # lm-eval's logs carry no finish reason to fail


def test_the_arith_table_is_not_trivial():
    """On arith the model is right part of the time, and the candidate (bf16 LM head, n-gram speculation)
    does not copy the control: the table has right answers and different texts."""
    res = lmeval.pair_logs(sample_log("arith_tiny", "control"), sample_log("arith_tiny", "candidate"))
    assert res.table["control_correct"] + res.table["candidate_correct"] > 0
    assert res.table["exact_text_matches"] < res.table["n"]


@pytest.mark.parametrize("doc_id", [0, 7])
def test_a_candidate_log_of_another_prompt_is_refused(tmp_path, doc_id):
    lines = lm_eval_lines("arith_tiny", "candidate")
    for s in lines:
        if s["doc_id"] == doc_id:
            arg = s["arguments"]["gen_args_0"]
            arg["arg_0"] = arg["arg_0"].replace("Question:", "Q:", 1)
            s["prompt_hash"] = lmeval.hash_string(arg["arg_0"])
    p = tmp_path / sample_log("arith_tiny", "candidate").name
    p.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in lines))
    with pytest.raises(lmeval.LmEvalLogError, match=rf"the prompt differs \(prompt_hash\) at doc_ids \[{doc_id}\]"):
        lmeval.pair_logs(sample_log("arith_tiny", "control"), p)
