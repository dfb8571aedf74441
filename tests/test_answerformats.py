"""The qa and multiple_choice formats: rows, prompts, and known-answer scoring built to pass and to fail."""

import json
import re
from pathlib import Path

import pytest
import yaml

from pairaudit.datasets import formats as datasets
from pairaudit.datasets.formats import DatasetError, prepare_dataset
from pairaudit.plans import change
from pairaudit.formats import answerformats as af
from pairaudit.quality import scoring

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[1]


def qa_item(answer, *, aliases=(), extract=None):
    row = {"question": "q?", "answer": answer, "aliases": list(aliases)}
    it = datasets.normalize("qa", [row], extract=extract)[0]
    return {**it, "format": "qa"}


def mc_item(choices, answer):
    return datasets.normalize("multiple_choice", [{"question": "q?", "choices": choices, "answer": answer}])[0]


# ------------------------------------------------------------------ normalization

@pytest.mark.parametrize("a,b,equal", [
    ("  The Eiffel-Tower. ", "the eiffeltower", True),
    ("PARIS", "paris", True),
    ("Paris,\n  France", "paris france", True),
    ("Paris", "Paris, France", False),
    ("ﬁne", "fine", True),            # NFKC folds the ligature
    ("Straße", "STRASSE", True),       # casefold, not lower()
    ("42", "42.0", False),             # text, not numbers
])
def test_normalize_text(a, b, equal):
    assert (af.normalize_text(a) == af.normalize_text(b)) is equal


@pytest.mark.parametrize("text,numbers", [
    ("She sells 9 eggs for $18.", ["9", "18"]),
    ("1,000 plus 2,500.5 is 3,500.5", ["1000", "2500.5", "3500.5"]),
    ("5-3 = 2", ["5", "3", "2"]),
    ("x2 and v1.3", []),                # glued to a word: not a number of the answer
    ("-7 degrees", ["-7"]),
])
def test_numbers_in(text, numbers):
    assert af.numbers_in(text) == numbers


# ------------------------------------------------------------------ qa scoring

@pytest.mark.parametrize("text,correct", [
    ("Paris", True), ("paris.", True), ("  PARIS!\n", True),
    ("Paris, France", False), ("The answer is Paris", False), ("Lyon", False), ("", False),
])
def test_qa_exact(text, correct):
    rec = af.score(qa_item("Paris"), text)
    assert rec["correct"] is correct and rec["method"] == "qa-exact"
    assert ("==" if correct else "!=") in rec["reason"]


def test_qa_exact_aliases():
    it = qa_item("the Pacific Ocean", aliases=["Pacific", "Pacific Ocean"])
    assert af.score(it, "Pacific")["correct"] and af.score(it, "pacific ocean")["correct"]
    assert not af.score(it, "Atlantic")["correct"]


@pytest.mark.parametrize("text,correct,extracted", [
    ("2 + 40 = 42", True, "42"),
    ("It is 42.0.", True, "42.0"),
    ("42 apples, then 7 more", False, "7"),   # the LAST number is the answer
    ("forty-two", False, None),
    ("$4,2", False, "2"),
])
def test_qa_last_number(text, correct, extracted):
    rec = af.score(qa_item("42", extract={"method": "last_number"}), text)
    assert (rec["correct"], rec["extracted"]) == (correct, extracted)


def test_qa_last_number_thousands():
    assert af.score(qa_item("1000", extract={"method": "last_number"}), "about 1,000")["correct"]


@pytest.mark.parametrize("extract,text,correct,extracted", [
    ({"method": "regex", "pattern": r"Answer:\s*(.+)"}, "blah\nAnswer: Mars", True, "Mars"),
    ({"method": "regex", "pattern": r"Answer:\s*(.+)"}, "Answer: Venus\nAnswer: Mars", False, "Venus"),
    ({"method": "regex", "pattern": r"Answer:\s*(.+)", "occurrence": "last"}, "Answer: Venus\nAnswer: Mars",
     True, "Mars"),
    ({"method": "regex", "pattern": r"Answer:\s*(.+)"}, "Mars", False, None),        # no match, no fallback
    ({"method": "regex", "pattern": r"(Mars|Venus)", "group": 0}, "I think MARS", False, None),  # case-sensitive re
    ({"method": "regex", "pattern": r"(?i)(mars|venus)", "group": 0}, "I think MARS", True, "MARS"),
    ({"method": "regex", "pattern": r"is (a)?(\w+)", "group": 1}, "it is Mars", False, None),  # group took no part
])
def test_qa_regex(extract, text, correct, extracted):
    rec = af.score(qa_item("Mars", extract=extract), text)
    assert (rec["correct"], rec["extracted"]) == (correct, extracted)


@pytest.mark.parametrize("extract,msg", [
    ({"method": "fuzzy"}, "extract.method: 'fuzzy' is not one of exact, last_number, regex"),
    ({"method": "regex"}, "extract.pattern: method regex needs a non-empty pattern string"),
    ({"method": "regex", "pattern": "(unclosed"}, "extract.pattern: '(unclosed' is not a valid regular expression"),
    ({"method": "regex", "pattern": "Answer: (.+)", "group": 2}, "extract.group: 2 is not a group of the pattern (allowed: 0..1)"),
    ({"method": "regex", "pattern": "(x)", "occurrence": "middle"}, "extract.occurrence: 'middle' is not one of first, last"),
    ({"method": "exact", "group": 1}, "extract.group: not a key of method exact (allowed: method)"),
])
def test_extract_config_errors_name_the_key(extract, msg):
    with pytest.raises(af.FormatError, match=re.escape(msg)):
        af.resolve_extract(extract)


def test_last_number_needs_numeric_answers():
    with pytest.raises(DatasetError, match="qa row 0: extract method last_number needs numeric answers, got 'Paris'"):
        qa_item("Paris", extract={"method": "last_number"})
    with pytest.raises(DatasetError, match="got 'seven'"):
        qa_item("7", aliases=["seven"], extract={"method": "last_number"})


# ------------------------------------------------------------------ multiple choice

CHOICES = ["Venus", "Earth", "Mercury", "Mars"]


@pytest.mark.parametrize("text,letter", [
    ("C", "C"), (" C. ", "C"), ("(C)", "C"), ("C)", "C"), ("C:", "C"),
    ("C. Mercury", "C"), ("(C) mercury", "C"), ("C) Mercury.", "C"),
    ("Mercury is closest.\nAnswer: C", "C"), ("answer: (C).", "C"),
    ("Answer: C\nI am sure.\nAnswer: C", "C"),
    ("D", "D"),
])
def test_mc_reads_the_letter(text, letter):
    got, _ = af.extract_letter(text, CHOICES)
    assert got == letter


@pytest.mark.parametrize("text,why", [
    ("c", "no letter read"),                         # lowercase is not a letter answer
    ("C. Venus", "not that choice's text"),          # letter and text disagree
    ("The answer is C", "no letter read"),           # prose is not read
    ("Answer: C\nAnswer: B", "different letters"),   # ambiguous
    ("Answer: C because it is closest", "no letter read"),
    ("CD", "no letter read"),
    ("", "no letter read"),
])
def test_mc_reads_nothing_when_not_strict(text, why):
    got, rule = af.extract_letter(text, CHOICES)
    assert got is None and why in rule


def test_mc_scoring_right_wrong_and_not_a_choice():
    it = mc_item(CHOICES, "C")
    assert af.score(it, "C")["correct"] is True
    wrong = af.score(it, "B")
    assert wrong["correct"] is False and wrong["extracted"] == "B" and "B != gold C" in wrong["reason"]
    beyond = af.score(it, "E")
    assert beyond["correct"] is False and "E is not a choice (choices A..D)" in beyond["reason"]
    none = af.score(it, "I think Mercury")
    assert none["correct"] is False and none["extracted"] is None


@pytest.mark.parametrize("row,msg", [
    ({"question": "q", "choices": ["a"], "answer": "A"}, "choices must be a list of 2..26"),
    ({"question": "q", "choices": ["a", ""], "answer": "A"}, "choices must be a list of 2..26"),
    ({"question": "q", "choices": ["a", "b"], "answer": "C"}, "answer 'C' is not one of the letters A, B"),
    ({"question": "q", "choices": ["a", "b"], "answer": 0}, "answer 0 is not one of the letters A, B"),
    ({"choices": ["a", "b"], "answer": "A"}, "missing field question"),
])
def test_mc_row_errors(row, msg):
    with pytest.raises(DatasetError, match=msg):
        datasets.normalize("multiple_choice", [row])


# ------------------------------------------------------------------ the shipped files, end to end

def test_shipped_files_prepare_prompt_and_score_their_own_answers(tmp_path):
    for name, fmt, template, extract in (("qa_facts.jsonl", "qa", "default", {"method": "exact"}),
                                         ("mc_facts.jsonl", "multiple_choice", "default", None)):
        cfg = {"name": fmt, "format": fmt, "source": {"local": str(DATA / name)}, "select": {"count": "all"},
               "prompt_template": template, **({"extract": extract} if extract else {})}
        doc = prepare_dataset(cfg, cache_dir=tmp_path, base_dir=REPO)
        rows = [json.loads(line) for line in (DATA / name).read_text().splitlines()]
        assert len(doc["items"]) == len(rows) == 12
        for it, row in zip(doc["items"], rows):
            user = it["messages"][-1]["content"]
            assert user.startswith(row["question"])
            gold = row["answer"]
            if fmt == "multiple_choice":
                # every choice is shown with its letter; the answer letter is not given away
                assert all(f"{chr(65 + j)}. {c}" in user for j, c in enumerate(row["choices"]))
                right, wrong = gold, next(ch for ch in "ABCD" if ch != gold)
            else:
                right, wrong = f"{gold.upper()}.", "not the answer"
            assert scoring.score_item(it, right)["correct"] is True, (row, right)
            assert scoring.score_item(it, wrong)["correct"] is False, (row, wrong)
    assert len({json.loads(line)["answer"] for line in (DATA / "mc_facts.jsonl").read_text().splitlines()}) == 4


def test_extract_only_for_qa_and_checked_at_entry(tmp_path):
    base = {"name": "m", "format": "multiple_choice", "source": {"local": str(DATA / "mc_facts.jsonl")},
            "select": {"count": "all"}, "prompt_template": "default"}
    with pytest.raises(DatasetError, match=r"datasets\[0\]\.extract: only a qa dataset reads its answer"):
        datasets.check_entry({**base, "extract": {"method": "exact"}}, "datasets[0]")
    qa = {**base, "format": "qa", "source": {"local": str(DATA / "qa_facts.jsonl")}}
    with pytest.raises(DatasetError, match=r"datasets\[0\]\.extract\.method: 'fuzzy' is not one of"):
        datasets.check_entry({**qa, "extract": {"method": "fuzzy"}}, "datasets[0]")
    with pytest.raises(DatasetError, match=r"prompt_template: 'shots' is not one of default, plain, answer_line"):
        datasets.check_entry({**qa, "prompt_template": "shots"}, "datasets[0]")


def test_schema_accepts_the_documented_example_and_refuses_a_bad_method():
    """The example in docs/configuration.md validates against config/schema.yaml as the workflow validates."""
    from snakemake.utils import validate

    text = (REPO / "docs" / "configuration.md").read_text()
    block = text.split("<!-- qa-mc-example -->", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    example = yaml.safe_load(block)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    change.derive_arms(config)  # the change form becomes the two arms, as at load
    config["datasets"] = example["datasets"]
    validate(config, str(REPO / "config" / "schema.yaml"))
    # the defaults Snakemake's validation fills in must not put regex keys into an exact entry
    for entry in config["datasets"]:
        datasets.check_entry(entry, entry["name"])
    bad = json.loads(json.dumps(config))
    bad["datasets"][0]["extract"] = {"method": "fuzzy"}
    with pytest.raises(Exception, match="fuzzy"):
        validate(bad, str(REPO / "config" / "schema.yaml"))
