"""pairaudit.datasets.stage (score and paired on hand-written artifacts) and pairaudit.core.jobs."""

import logging

import pytest

from pairaudit.core import artifacts, defaults, jobs
from pairaudit.core.artifacts import ArtifactError
from pairaudit.core.settings import QualitySettings
from pairaudit.plans.requests import body_sha256
from pairaudit.quality import stage as quality_stage

QUESTIONS = {0: ("Ann has 2 apples and gets 3 more. How many?", "5"),
             1: ("Bob reads 4 pages a day for 3 days. How many pages?", "12"),
             2: ("A box holds 10 pens; 3 are taken. How many remain?", "7"),
             3: ("Two bags of 6 marbles each. How many marbles?", "12")}


def dataset_doc():
    items = []
    for i, (q, ans) in QUESTIONS.items():
        items.append({"index": i, "id": f"g{i}", "format": "gsm8k", "question": q,
                      "reference": {"answer": ans, "solution": f"...\n#### {ans}"},
                      "messages": [{"role": "user", "content": q}]})
    return {"schema": "pairaudit.dataset/v1", "name": "gsm_hand", "format": "gsm8k", "prompt_template": "brief",
            "source": {"kind": "local"}, "select": {"count": "all"}, "indices": list(QUESTIONS), "items": items}


def record(i, text, *, finish="stop", seed_offset=0):
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTIONS[i][0]}], "seed": 1000 + i + seed_offset}
    return {"index": i, "attempt": 1, "body": body, "body_sha256": body_sha256(body), "status": 200,
            "error": None, "finish_reason": finish,
            "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": finish}]},
            "prior_attempts": []}


def write_sampled(path, arm, records, dataset_path, schema="pairaudit.sampled/v1"):
    header = {"schema": schema, "dataset": "gsm_hand", "arm": arm, "n": len(records),
              "provenance": artifacts.provenance([dataset_path], {})}
    artifacts.write_jsonl(path, header, records)


CONTROL = {0: "2 + 3 = 5\n#### 5", 1: "4 * 3 = 12\n#### 12", 2: "10 - 3 = 7\n#### 7", 3: "6 + 6\n#### 12"}


@pytest.fixture
def audit(tmp_path):
    """Dataset + both arms' sampled files; candidate answers are a parameter of build()."""
    ds = tmp_path / "datasets" / "gsm_hand.json"
    artifacts.write_json(ds, dataset_doc())

    def build(candidate_texts, *, candidate_records=None, score=True):
        paths = {"dataset": str(ds), "sampled": {}, "scores": {}}
        for arm, texts in (("control", CONTROL), ("candidate", candidate_texts)):
            sp = tmp_path / "sampled" / "gsm_hand" / f"{arm}.jsonl"
            recs = [record(i, t) for i, t in sorted(texts.items())]
            if arm == "candidate" and candidate_records is not None:
                recs = candidate_records
            write_sampled(sp, arm, recs, str(ds))
            paths["sampled"][arm] = str(sp)
            paths["scores"][arm] = str(tmp_path / "scores" / "gsm_hand" / f"{arm}.jsonl")
            if score:
                quality_stage.score_stage(dataset_path=str(ds), sampled_path=str(sp), out_path=paths["scores"][arm],
                                   sandbox_limits={})
        return paths

    return build


def paired(paths, tmp_path, **quality):
    return quality_stage.paired_stage(dataset_path=paths["dataset"], sampled_paths=paths["sampled"],
                               score_paths=paths["scores"], out_path=str(tmp_path / "paired" / "gsm_hand.json"),
                               quality=QualitySettings.from_json(defaults.filled(quality or {"max_net_loss": 0, "alpha": 0.05}, "rules", "quality")))


# ---------------------------------------------------------------- score

def test_score_stage_writes_scores_with_provenance(audit, tmp_path):
    texts = {0: "#### 5", 1: "The answer is 12.", 2: "#### 8", 3: "#### 1,2"}
    paths = audit(texts)
    h, recs = artifacts.read_jsonl(paths["scores"]["candidate"])
    assert h["schema"] == "pairaudit.scores/v1" and h["arm"] == "candidate" and h["format"] == "gsm8k"
    assert h["dataset"] == "gsm_hand" and h["n"] == 4
    by = {r["index"]: r for r in recs}
    assert by[0]["correct"] and by[0]["extracted"] == "5"
    assert not by[1]["correct"] and by[1]["extracted"] is None  # strict: no '#### N', a miss stays a miss
    assert by[1]["flexible"]["correct"]                       # ... recorded beside it, not instead of it
    assert not by[2]["correct"] and by[2]["extracted"] == "8" and "!=" in by[2]["reason"]
    assert by[3]["correct"]  # "1,2" -> 12 after the comma is stripped
    assert h["correct"] == 2
    assert all(r["text"] == texts[r["index"]] and r["finish_reason"] == "stop" for r in recs)
    assert h["provenance"]["consumed"] == {paths["dataset"]: artifacts.sha256_file(paths["dataset"]),
                                           paths["sampled"]["candidate"]:
                                               artifacts.sha256_file(paths["sampled"]["candidate"])}


def test_score_stage_refuses_wrong_schema(audit, tmp_path):
    paths = audit(CONTROL, score=False)
    bad = tmp_path / "bad.jsonl"
    write_sampled(bad, "control", [record(0, "#### 5")], paths["dataset"], schema="pairaudit.scores/v1")
    out = tmp_path / "out.jsonl"
    with pytest.raises(ArtifactError) as ei:
        quality_stage.score_stage(dataset_path=paths["dataset"], sampled_path=str(bad), out_path=str(out),
                           sandbox_limits={})
    assert str(bad) in str(ei.value) and "pairaudit.sampled/v1" in str(ei.value)
    assert not out.exists()


def test_score_stage_refuses_a_dataset_changed_after_sampling(audit, tmp_path):
    paths = audit(CONTROL, score=False)
    doc = artifacts.read_json(paths["dataset"])
    doc["items"][0]["reference"]["answer"] = "6"
    artifacts.write_json(paths["dataset"], doc)
    with pytest.raises(ArtifactError) as ei:
        quality_stage.score_stage(dataset_path=paths["dataset"], sampled_path=paths["sampled"]["control"],
                           out_path=str(tmp_path / "out.jsonl"), sandbox_limits={})
    assert paths["dataset"] in str(ei.value) and paths["sampled"]["control"] in str(ei.value)


# ---------------------------------------------------------------- paired

def test_paired_identical_arms_are_inconclusive_on_four_items(audit, tmp_path):
    paths = audit(dict(CONTROL))
    doc = paired(paths, tmp_path)
    assert doc["schema"] == "pairaudit.paired/v1" and doc["dataset"] == "gsm_hand" and doc["format"] == "gsm8k"
    t = doc["table"]
    assert t["n"] == 4 and t["control_correct"] == t["candidate_correct"] == 4
    assert t["control_only"] == [] and t["candidate_only"] == []
    assert t["exact_text_matches"] == 4 and t["bodies_identical"]
    assert t["natural_finish"] == {"control": 4, "candidate": 4}
    # quality-v2 (the default): 4 identical items cannot rule out a loss of 3 points
    assert doc["quality"]["rule"] == "quality-v2" and doc["quality"]["verdict"] == "INCONCLUSIVE"
    assert doc["quality"]["reasons"][0].startswith("cannot rule out a loss of")
    assert artifacts.read_json(tmp_path / "paired" / "gsm_hand.json") == doc
    consumed = doc["provenance"]["consumed"]
    assert set(consumed) == {paths["dataset"], *paths["sampled"].values(), *paths["scores"].values()}
    # the rule and every parameter as the stage was given them (rules.quality as resolved at load)
    assert doc["provenance"]["params"] == {"quality": {"rule": "quality-v2", "margin_pct": 3.0, "level": 0.95,
                                                       "max_net_loss": 0, "alpha": 0.05}, "datasets": 1}
    # quality-v1, selected, passes the same table (net 0)
    v1 = paired(paths, tmp_path, rule="quality-v1", max_net_loss=0, alpha=0.05)
    assert v1["quality"]["rule"] == "quality-v1" and v1["quality"]["verdict"] == "PASS"


def test_paired_candidate_loss_is_inconclusive_with_indices(audit, tmp_path):
    cand = {**CONTROL, 2: "10 - 3 = 6\n#### 6", 3: "6 + 6 = 12. So 12."}  # two strict misses
    paths = audit(cand)
    doc = paired(paths, tmp_path)
    t = doc["table"]
    assert t["control_only"] == [2, 3] and t["candidate_only"] == [] and t["net"] == -2
    assert t["exact_text_matches"] == 2 and t["exact_text_match_indices"] == [0, 1]
    assert t["mcnemar_p"] == pytest.approx(0.5)
    q = doc["quality"]
    # worse, but p=0.5 >= 0.05: not shown, and not ruled out either (quality-v2)
    assert q["verdict"] == "INCONCLUSIVE" and q["net"] == -2
    v1 = paired(paths, tmp_path, rule="quality-v1", max_net_loss=0, alpha=0.05)["quality"]
    assert v1["verdict"] == "HOLD"   # quality-v1: an unresolved loss holds
    # the registered allowance is a parameter; using it is recorded as a deviation
    doc2 = paired(paths, tmp_path, rule="quality-v1", max_net_loss=2, alpha=0.05)
    assert doc2["quality"]["verdict"] == "PASS" and "max_net_loss" in doc2["quality"]["deviations"]


def test_paired_body_mismatch_or_unnatural_finish_is_invalid(audit, tmp_path):
    cand_recs = [record(i, t) for i, t in sorted(CONTROL.items())]
    cand_recs[1] = record(1, CONTROL[1], seed_offset=7)  # a different request for item 1
    cand_recs[3] = record(3, CONTROL[3], finish="length")
    paths = audit(CONTROL, candidate_records=cand_recs)
    doc = paired(paths, tmp_path)
    t = doc["table"]
    assert not t["bodies_identical"] and t["body_mismatch_indices"] == [1]
    assert t["unnatural_finish_indices"]["candidate"] == [3]
    q = doc["quality"]
    assert q["verdict"] == "INVALID"
    assert any("[1]" in r for r in q["reasons"]) and any("[3]" in r for r in q["reasons"])


def test_paired_refuses_sampled_file_edited_after_scoring(audit, tmp_path):
    paths = audit(dict(CONTROL))
    sp = paths["sampled"]["candidate"]
    h, recs = artifacts.read_jsonl(sp)
    recs[2]["response"]["choices"][0]["message"]["content"] = "#### 99"  # hand edit after scoring
    artifacts.write_jsonl(sp, h, recs)
    out = tmp_path / "paired" / "gsm_hand.json"
    with pytest.raises(ArtifactError) as ei:
        paired(paths, tmp_path)
    msg = str(ei.value)
    assert sp in msg and paths["scores"]["candidate"] in msg and "changed" in msg
    assert not out.exists()


def test_paired_refuses_dataset_edited_after_scoring(audit, tmp_path):
    paths = audit(dict(CONTROL))
    doc = artifacts.read_json(paths["dataset"])
    doc["name"] = "gsm_hand"  # same content re-written: not a change
    artifacts.write_json(paths["dataset"], doc)
    paired(paths, tmp_path)
    doc["items"][1]["question"] += " "
    artifacts.write_json(paths["dataset"], doc)
    with pytest.raises(ArtifactError, match="changed since it was consumed"):
        paired(paths, tmp_path)


def test_paired_refuses_swapped_arms(audit, tmp_path):
    paths = audit(dict(CONTROL))
    paths["sampled"] = {"control": paths["sampled"]["candidate"], "candidate": paths["sampled"]["control"]}
    paths["scores"] = {"control": paths["scores"]["candidate"], "candidate": paths["scores"]["control"]}
    with pytest.raises(ArtifactError, match="expected control"):
        paired(paths, tmp_path)


# ---------------------------------------------------------------- jobs

def test_run_job_returns_result_and_logs(tmp_path):
    log = tmp_path / "job.log"

    def my_stage(*, x):
        return {"x": x}

    try:
        assert jobs.run_job(str(log), my_stage, x=3) == {"x": 3}
    finally:
        logging.getLogger().handlers.clear()
    text = log.read_text()
    assert "my_stage start" in text and "my_stage done" in text


def test_run_job_failure_exits_1_with_traceback_in_log(tmp_path, capsys):
    log = tmp_path / "job.log"

    def failing_stage():
        raise ArtifactError("results/x.jsonl: schema None, expected 'pairaudit.sampled/v1'")

    try:
        with pytest.raises(SystemExit) as ei:
            jobs.run_job(str(log), failing_stage)
    finally:
        logging.getLogger().handlers.clear()
    assert ei.value.code == 1
    text = log.read_text()
    assert "Traceback" in text and "failing_stage failed: ArtifactError" in text
    assert "expected 'pairaudit.sampled/v1'" in capsys.readouterr().err
