"""Dataset formats: one registered object each, tied to the config schema; a new one runs through the real stages.

The last test is the walk-through of docs/extending.md ("A dataset format"):
a format defined outside the package, registered through the public path
(``registry.registered``), is built into a dataset document by the dataset
stage's own function, scored by the score stage, and exported as lm-eval
lines, none of which names it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from pairaudit.core import artifacts, defaults
from pairaudit.datasets import formats as datasets
from pairaudit.formats import registry
from pairaudit.formats.base import DatasetFormat, FormatError, LmEvalFilter, ScoreContext
from pairaudit.interop import lmeval
from pairaudit.plans.requests import body_sha256
from pairaudit.quality import scoring
from pairaudit.quality import stage as quality_stage

SCHEMA = yaml.safe_load(defaults.PATH.read_text())
DATASET = SCHEMA["$defs"]["dataset"]["properties"]


def test_the_schemas_format_enum_is_the_registry():
    assert DATASET["format"]["enum"] == list(registry.names())
    assert registry.names() == tuple(f.name for f in registry.BUILTIN)


def test_every_formats_own_entry_keys_are_in_the_schema():
    for name in registry.names():
        for key in registry.get(name).options:
            assert key in DATASET, f"{name}'s entry key {key} is not a property of the schema's dataset"


def test_every_registered_format_is_complete():
    for name in registry.names():
        form = registry.get(name)
        assert form.name == name and "default" in form.template_names()
        for tname in form.template_names():
            assert "{question}" in form.template(tname), (name, tname)
        with pytest.raises(FormatError, match=f"{name} row 0"):
            form.normalize_row(0, {}, {})


def test_a_name_is_registered_once_and_a_builtin_stays():
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get("gsm8k"))
    with pytest.raises(ValueError, match="built in"):
        registry.unregister("qa")
    with pytest.raises(FormatError, match="format: 'nope' is not one of gsm8k, math, mbpp, humaneval, qa, "
                                          "multiple_choice"):
        registry.get("nope")


def test_a_code_format_without_a_sandbox_says_so():
    item = {"index": 0, "id": "t1", "format": "mbpp", "question": "q",
            "reference": {"tests": ["assert f() == 1"], "test_imports": [], "code": "", "function_name": "f"}}
    with pytest.raises(FormatError, match="item 't1': its answer is code, and this scoring has no sandbox"):
        registry.get("mbpp").score(item, "def f(): return 1", ScoreContext())


# ------------------------------------------------------------------ the walk-through

def _reverse_row(i: int, row: dict, options: Mapping[str, Any]) -> dict:
    if not isinstance(row.get("word"), str) or not row["word"].isalpha():
        raise FormatError(f"reverse row {i}: field word must be a word of letters, got {row.get('word')!r}")
    return {"id": str(row.get("id", i)), "question": row["word"],
            "reference": {"answer": row["word"][::-1], "ignore_case": bool(options.get("ignore_case", False))}}


def _reverse_score(item: dict, text: str, ctx: ScoreContext) -> dict:
    ref = item["reference"]
    got = text.strip()
    same = (got.casefold() == ref["answer"].casefold()) if ref["ignore_case"] else got == ref["answer"]
    loose = got.casefold() == ref["answer"].casefold()
    return {"correct": same, "extracted": got, "method": "reverse-exact", "gold": ref["answer"],
            "reason": f"{got!r} {'==' if same else '!='} gold {ref['answer']!r}",
            "loose": {"extracted": got, "correct": loose}}


def _check_ignore_case(options: Mapping[str, Any], where: str) -> dict:
    if "ignore_case" in options and not isinstance(options["ignore_case"], bool):
        raise FormatError(f"{where}.ignore_case: {options['ignore_case']!r} is not one of true, false")
    return dict(options)


REVERSE = DatasetFormat(
    name="reverse",
    normalize_row=_reverse_row,
    templates={"default": "Write the word {question} backwards ({length} letters). Reply with only that word."},
    prompt_fields=lambda item: {"length": len(item["question"])},
    score=_reverse_score,
    options={"ignore_case": "compares its answers ignoring case"},
    check_options=_check_ignore_case,
    lmeval_filters=(LmEvalFilter("loose-match", "loose"),),
)


def test_a_new_format_runs_through_the_dataset_score_and_export_stages(tmp_path):
    src = tmp_path / "words.jsonl"
    src.write_text("".join(json.dumps({"word": w}) + "\n" for w in ("pairs", "audit", "level")))
    entry = {"name": "words", "format": "reverse", "source": {"local": str(src)}, "select": {"count": "all"},
             "prompt_template": "default", "ignore_case": False}
    plain = {k: v for k, v in entry.items() if k != "ignore_case"}
    with pytest.raises(datasets.DatasetError, match=r"datasets\[0\]\.format: 'reverse' is not one of"):
        datasets.check_entry(plain, "datasets[0]")
    with pytest.raises(datasets.DatasetError, match=r"datasets\[0\]\.ignore_case: 'ignore_case' is not one of "
                                                    r"name, format, source, select, prompt_template, extract$"):
        datasets.check_entry(entry, "datasets[0]")
    with registry.registered(REVERSE):
        # the dataset stage: rows -> items -> prompts, checked like every entry
        doc = datasets.prepare_dataset(entry, cache_dir=tmp_path, base_dir=tmp_path, where="datasets[0]")
        assert [it["reference"]["answer"] for it in doc["items"]] == ["sriap", "tidua", "level"]
        assert doc["items"][0]["messages"][-1]["content"] == ("Write the word pairs backwards (5 letters). "
                                                              "Reply with only that word.")
        with pytest.raises(datasets.DatasetError, match=r"datasets\[0\]\.ignore_case: 'yes' is not one of true"):
            datasets.check_entry({**entry, "ignore_case": "yes"}, "datasets[0]")
        with pytest.raises(datasets.DatasetError, match=r"datasets\[0\]\.ignore_case: only a reverse dataset "
                                                        r"compares its answers ignoring case \(format is qa\)"):
            datasets.check_entry({**entry, "format": "qa"}, "datasets[0]")
        with pytest.raises(datasets.DatasetError, match="reverse row 1: field word must be a word"):
            datasets.normalize("reverse", [{"word": "ok"}, {"word": "n0t"}])

        # the score stage on sampled records, as the sampled stage writes them
        ds_path = tmp_path / "datasets" / "words.json"
        artifacts.write_json(ds_path, doc)
        replies = {0: "sriap", 1: "TIDUA", 2: "levels"}
        recs = []
        for it in doc["items"]:
            body = {"model": "m", "messages": it["messages"], "max_tokens": 8, "seed": it["index"]}
            recs.append({"index": it["index"], "attempt": 1, "body": body, "body_sha256": body_sha256(body),
                         "status": 200, "error": None, "finish_reason": "stop", "prior_attempts": [],
                         "response": {"choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant",
                                                               "content": replies[it["index"]]}}]}})
        sampled = tmp_path / "sampled" / "words" / "control.jsonl"
        artifacts.write_jsonl(sampled, {"schema": "pairaudit.sampled/v1", "dataset": "words", "arm": "control",
                                        "n": len(recs), "provenance": artifacts.provenance([ds_path], {})}, recs)
        scores = tmp_path / "scores" / "words" / "control.jsonl"
        header = quality_stage.score_stage(dataset_path=str(ds_path), sampled_path=str(sampled),
                                           out_path=str(scores), sandbox_limits={})
        _, scored = artifacts.read_jsonl(scores)
        assert header["correct"] == 1 and [s["correct"] for s in scored] == [True, False, False]
        assert scored[1]["reason"] == "'TIDUA' != gold 'tidua'" and scored[1]["loose"]["correct"] is True

        # the lm-eval export: the primary filter, then the format's own
        lines = lmeval.samples_for(doc, recs, scored, arm="control")
        assert [(ln["filter"], ln["exact_match"]) for ln in lines] == [
            ("strict-match", 1.0), ("strict-match", 0.0), ("strict-match", 0.0),
            ("loose-match", 1.0), ("loose-match", 1.0), ("loose-match", 0.0)]
        assert lines[0]["target"] == "sriap"
    # gone again: neither the stages nor the scorer know it
    assert "reverse" not in registry.names()
    with pytest.raises(ValueError, match="item format 'reverse' is not one of"):
        scoring.score_item(doc["items"][0], "sriap")


def test_the_scorer_scores_code_formats_a_few_at_a_time_by_the_registry():
    # score_records runs code items on threads: which formats run code is the registry's runs_code
    assert {n for n in registry.names() if registry.get(n).runs_code} == {"mbpp", "humaneval"}
    assert Path(scoring.__file__).read_text().count('"mbpp"') == 0
