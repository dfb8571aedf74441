"""``pairaudit pair`` on real lm-eval output: lm-eval 0.4.13 against the reference server, control and candidate.

tests/data/lmeval/<task>/<arm>/ holds what lm-eval itself wrote (make_logs.py
there made it; command.txt has the exact command), so this runs without
lm-eval: arith_tiny (twelve items of the generated arith suite, which the
135M model gets right part of the time). The pairing of lm-eval's verdicts must equal pairaudit's own
pairing of the same answers, scored by pairaudit's gsm8k scorer.
"""

import json
import shutil
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
# The two arms are two servers on two ports: the only recorded setting the change may differ in.
CHANGE = ["model_args.base_url"]


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
    res = lmeval.pair_logs(sample_log(task, "control"), sample_log(task, "candidate"), change=CHANGE)
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
    code = main(["pair", str(sample_log(task, "control")), str(sample_log(task, "candidate")), "--json",
                 "--change", "model_args.base_url"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["table"]["control_only"] == table["control_only"]
    assert doc["table"]["candidate_only"] == table["candidate_only"]
    assert code == EXIT[doc["quality"]["verdict"]]
    # lm-eval's logs carry no finish reason to fail
    assert doc["quality"]["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")


def test_the_arith_table_is_not_trivial():
    """On arith the model is right part of the time, and the candidate (bf16 LM head, n-gram speculation)
    does not copy the control: the table has right answers and different texts."""
    res = lmeval.pair_logs(sample_log("arith_tiny", "control"), sample_log("arith_tiny", "candidate"), change=CHANGE)
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
    shutil.copy(results_log("arith_tiny", "candidate"), tmp_path)
    with pytest.raises(lmeval.LmEvalLogError, match=rf"the prompt differs \(prompt_hash\) at doc_ids \[{doc_id}\]"):
        lmeval.pair_logs(sample_log("arith_tiny", "control"), p, change=CHANGE)


def results_log(task: str, arm: str) -> Path:
    found = sorted((DATA / task / arm).glob("results_*.json"))
    assert len(found) == 1, found
    return found[0]


def second_run(tmp_path: Path, *, seed: int, stamp: str = "2026-12-02T03-10-00.000000") -> Path:
    """The control server run again, with lm-eval's API seed ``seed`` (model_args seed=...): its results file
    records the seed (in model_args and the task config's metadata copy of them); the samples do not."""
    results = json.loads(results_log("arith_tiny", "control").read_text())
    results["config"]["model_args"]["seed"] = seed
    results["configs"]["arith_tiny"]["metadata"]["seed"] = seed
    results["date"] += 600.0
    out = tmp_path / "control-again"
    out.mkdir()
    (out / f"results_{stamp}.json").write_text(json.dumps(results, indent=2))
    samples = out / f"samples_arith_tiny_{stamp}.jsonl"
    shutil.copy(sample_log("arith_tiny", "control"), samples)
    return samples


def test_two_runs_with_different_api_seeds_are_not_a_pair(tmp_path, capsys):
    """The same server twice, API seeds 1234 and 999: refused (exit 2) naming the seed, whatever is declared."""
    again = second_run(tmp_path, seed=999)
    for change in ([], ["--change", "model_args.base_url"]):
        assert main(["pair", str(sample_log("arith_tiny", "control")), str(again), *change]) == 2
        err = capsys.readouterr().err
        assert "not a pair" in err and "model_args.seed: control 1234, candidate 999" in err
    # declaring the seed as the change under audit is the user's statement, and then it pairs
    assert main(["pair", str(sample_log("arith_tiny", "control")), str(again), "--change", "model_args.seed"]) == 4
    out = capsys.readouterr().out
    assert "quality-v2: INCONCLUSIVE" in out and "cannot rule out a loss of" in out


def test_one_run_twice_is_not_a_pair(tmp_path, capsys):
    log = str(sample_log("arith_tiny", "control"))
    assert main(["pair", log, log]) == 2
    assert "one run, not a pair" in capsys.readouterr().err
    # a copy of the same run (same samples, same results file) is the same run too
    copy = tmp_path / "copy"
    shutil.copytree(DATA / "arith_tiny" / "control", copy)
    assert main(["pair", log, str(copy / Path(log).name), "--change", "model_args.base_url"]) == 2
    assert "one run, not a pair" in capsys.readouterr().err


def test_a_proper_pair_is_paired_and_an_undeclared_difference_is_named(capsys):
    control, candidate = str(sample_log("arith_tiny", "control")), str(sample_log("arith_tiny", "candidate"))
    # the arms are two servers: their base_url differs, and it must be declared
    assert main(["pair", control, candidate]) == 2
    err = capsys.readouterr().err
    assert "model_args.base_url" in err and "--change" in err
    code = main(["pair", control, candidate, "--change", "model_args.base_url", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["table"]["n"] == 12 and code == EXIT[doc["quality"]["verdict"]]
    assert doc["quality"]["rule"] == "quality-v2"


def test_a_log_without_its_results_file_is_refused(tmp_path, capsys):
    alone = tmp_path / sample_log("arith_tiny", "candidate").name
    shutil.copy(sample_log("arith_tiny", "candidate"), alone)
    assert main(["pair", str(sample_log("arith_tiny", "control")), str(alone)]) == 2
    assert "no results_<timestamp>.json beside" in capsys.readouterr().err


def test_make_logs_reads_the_arms_of_the_config_in_its_change_form():
    """make_logs.py (docs/interop.md cites it) derives both arms' switches from config/config.yaml."""
    import runpy

    import yaml

    env = runpy.run_path(str(DATA / "make_logs.py"), run_name="make_logs")["arm_env"]
    cfg = yaml.safe_load((DATA.parents[2] / "config" / "config.yaml").read_text())
    # YAML 1.1 reads the key `on` as True
    for arm, keys in (("control", ("rollback",)), ("candidate", ("on", True))):
        assert env(arm) == {s["env"]: str(next(s[k] for k in keys if k in s)) for s in cfg["change"]["switches"]}
