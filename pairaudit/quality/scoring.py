"""Score one model answer against one dataset item, and every sampled record of a dataset.

Items come from ``pairaudit.datasets.formats`` (``{"index", "id", "format", "question",
"reference": {...}}``). Every score record says why it scored so, in words a
reviewer can check against the raw text.

Score record of ``score_item`` (all formats)::

    {"correct": bool,             # the PRIMARY verdict; diagnostics never replace it
     "extracted": str | None,     # what was read out of the answer (number, boxed latex, code)
     "reason": str,               # why, e.g. "strict match '#### 72' == gold 72"
     "method": str,               # how it was judged, e.g. "strict-regex", "math-verify", "sandbox"
     ...format extras}

Format extras:

- gsm8k: ``gold`` (normalized), ``flexible`` = {"extracted", "correct"} from the
  lm-eval flexible extractor (last number), recorded beside the strict verdict;
  ``comparison`` = "numeric" (GSM8K_COMPARISON) and ``lm_eval_exact_match``:
  what lm-eval's string comparison says of the same strict extraction (they
  differ only where the numbers are equal but written differently, e.g.
  ``#### 72.0`` against gold 72: correct here, wrong in lm-eval).
- math: ``gold``, ``boxed_command`` ("boxed"/"fbox"), ``method`` in
  {"math-verify", "normalized-string", "none"}; ``math_verify`` = {"equal", "error"}.
- qa / multiple_choice: ``gold``, ``method`` ("qa-exact", "qa-last_number",
  "qa-regex", "mc-letter"), qa ``aliases``, ``extract``, ``normalized``; mc ``rule``
  (:mod:`pairaudit.formats.answerformats`).
- mbpp / humaneval: ``code_source`` ("fenced-python", "fenced", "unclosed-fence",
  "raw"), ``tests_total``, ``tests_failed`` (mbpp), ``first_failure`` (str|None),
  ``sandbox`` = the sandbox result without its output tails (the tails are
  folded into ``reason``/``first_failure``): it states which isolation ran
  (``mechanism`` "bwrap"/"fallback", ``fallback_reason``, ``isolation``) and
  the harness's verified report (``harness``); ``stderr_tail`` (short);
  ``judged_by``: "split" when every test split into calls run in the
  sandbox and expectations compared here (``pairaudit/quality/split.py``:
  correct only when every call answered with plain data that satisfies its
  expectation; ``split`` = {"assertions", "calls", "failed": [{"test",
  "why"}], "incomplete"}), else "in_sandbox" (``split_refused`` says why it
  did not split, null when the caller asked for that path): correct only
  when the harness's nonce-tagged report says every test ran and passed --
  never on exit code 0 alone.

Score record of ``score_records`` (one per sampled record, same order): ``contracts.ScoreRecord``.
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from typing import Sequence, cast

from pairaudit.core import defaults
from pairaudit.core.contracts import SampledRecord, ScoreRecord
from pairaudit.formats import answerformats
from pairaudit.formats.boxed import last_boxed
from pairaudit.quality import sandbox, split
from pairaudit.serving.client import chat_message, clamping

FORMATS = ("gsm8k", "math", "mbpp", "humaneval", *answerformats.FORMATS)

# lm-eval-harness gsm8k filters (strict takes the first match, flexible the last).
GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")



# ---------------------------------------------------------------- gsm8k
#
# Strict GSM8K scoring extracts like lm-eval (first "#### N", the same regex,
# the same stripping of ",", "$" and a trailing ".") but compares the numbers,
# not the strings: "#### 72.0", "#### 072" and "#### 0.50" equal gold 72, 72
# and 0.5. A model that writes the right number is right. lm-eval compares
# strings, so its strict score can be lower on the same answers; every record
# keeps lm-eval's verdict beside ours (``lm_eval_exact_match``) so the two
# scores can be told apart item by item.
GSM8K_COMPARISON = "numeric"

def normalize_number(text: str) -> str:
    """Strip what lm-eval strips before comparing: ``,``, ``$``, surrounding space, a trailing ``.``."""
    out = text.replace(",", "").replace("$", "").strip()
    if out.endswith("."):
        out = out[:-1]
    return out


def numbers_equal(a: str, b: str) -> bool:
    """Numeric equality of two normalized number strings (72.0 == 72); string equality otherwise."""
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, ValueError):
        return a == b


def _flexible(text: str) -> str | None:
    matches = GSM8K_FLEXIBLE.findall(text)
    if not matches:
        return None
    last = matches[-1]
    return last[0] or last[1]


def score_gsm8k(item: dict, text: str) -> dict:
    gold = normalize_number(item["reference"]["answer"])
    flex_raw = _flexible(text)
    flex_norm = normalize_number(flex_raw) if flex_raw is not None else None
    flexible = {"extracted": flex_norm,
                "correct": flex_norm is not None and numbers_equal(flex_norm, gold)}
    m = GSM8K_STRICT.search(text)
    if m is None:
        return {"correct": False, "extracted": None, "method": "strict-regex", "gold": gold,
                "reason": "no '#### N' found", "flexible": flexible,
                "comparison": GSM8K_COMPARISON, "lm_eval_exact_match": False}
    got = normalize_number(m.group(1))
    ok = numbers_equal(got, gold)
    lm_eval = got == gold  # lm-eval: the same normalization, then string equality
    reason = (f"strict match '#### {m.group(1)}' == gold {gold}" if ok
              else f"strict match '#### {m.group(1)}' != gold {gold}")
    if ok and not lm_eval:
        reason += " (equal as numbers; lm-eval's string comparison counts it wrong)"
    return {"correct": ok, "extracted": got, "method": "strict-regex", "gold": gold,
            "reason": reason, "flexible": flexible,
            "comparison": GSM8K_COMPARISON, "lm_eval_exact_match": lm_eval}


# ---------------------------------------------------------------- math

def normalize_latex(s: str) -> str:
    """A light, conservative normal form: only rewrites that cannot change the value."""
    s = s.strip()
    s = re.sub(r"\\(left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[,!;: ]", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    return s


MATH_VERIFY_TIMEOUT_S = 5
# math-verify has no timeout off the main thread; very long answers are where
# sympy can stall, so they are judged by text only (and the record says so).
MAX_MATH_ANSWER_CHARS = 1000


class _TimeoutLog(logging.Handler):
    """Collects math-verify's own timeout warnings (it returns False on timeout and only logs)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Timeout during"):
            self.messages.append(msg.split(":")[0])


def _math_verify_equal(gold: str, pred: str) -> tuple[bool, str | None]:
    """Equivalence by math-verify; returns (equal, error). Never raises."""
    if len(pred) > MAX_MATH_ANSWER_CHARS:
        return False, f"answer longer than {MAX_MATH_ANSWER_CHARS} chars, not parsed"
    try:
        from math_verify import parse, verify
    except ImportError as exc:  # pragma: no cover - math-verify is a pinned dependency
        return False, f"math-verify unavailable: {exc}"
    # math-verify's own timeouts use SIGALRM, which only works in the main thread;
    # elsewhere they must be off.
    main = threading.current_thread() is threading.main_thread()
    limit = MATH_VERIFY_TIMEOUT_S if main else None
    watch = _TimeoutLog()
    mv_logger = logging.getLogger("math_verify")
    mv_logger.addHandler(watch)
    try:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=limit)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=limit)
        timed_out = f"math-verify timeout ({limit}s): {watch.messages[0]}" if watch.messages else None
        if not g:
            return False, timed_out or "math-verify could not parse the gold answer"
        if not p:
            return False, timed_out or "math-verify could not parse the extracted answer"
        equal = bool(verify(g, p, timeout_seconds=limit))
        if not equal and watch.messages:
            return False, f"math-verify timeout ({limit}s): {watch.messages[0]}"
        return equal, None
    except Exception as exc:  # math-verify/sympy failures must not kill a scoring run
        return False, f"math-verify error: {type(exc).__name__}: {exc}"
    finally:
        mv_logger.removeHandler(watch)


def score_math(item: dict, text: str) -> dict:
    gold = item["reference"]["answer"]
    box = last_boxed(text)
    if box is None:
        return {"correct": False, "extracted": None, "method": "none", "gold": gold,
                "boxed_command": None, "math_verify": None, "reason": "no \\boxed{} answer found"}
    pred, cmd = box
    equal, error = _math_verify_equal(gold, pred)
    mv = {"equal": equal, "error": error}
    base = {"extracted": pred, "gold": gold, "boxed_command": cmd, "math_verify": mv}
    if equal:
        return {**base, "correct": True, "method": "math-verify",
                "reason": f"{cmd} '{pred}' equivalent to gold '{gold}' (math-verify)"}
    # Identical text (up to spacing and \left/\right) is the same answer even
    # where math-verify cannot parse it (e.g. plain words); say so explicitly.
    if normalize_latex(pred) == normalize_latex(gold):
        note = f"; math-verify: {error}" if error else "; math-verify said not equal"
        return {**base, "correct": True, "method": "normalized-string",
                "reason": f"{cmd} '{pred}' matches gold '{gold}' as normalized text{note}"}
    why = f" ({error})" if error else ""
    return {**base, "correct": False, "method": "math-verify",
            "reason": f"{cmd} '{pred}' not equivalent to gold '{gold}'{why}"}


# ---------------------------------------------------------------- code

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)


def extract_code(text: str) -> tuple[str, str]:
    """Code from the LAST ```python block, else the last ``` block, else an unclosed fence, else the raw text."""
    blocks = _FENCE.findall(text)
    py = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if py:
        return py[-1], "fenced-python"
    if blocks:
        return blocks[-1][1], "fenced"
    m = None
    for m in re.finditer(r"```[A-Za-z0-9_+-]*[ \t]*\n", text):
        pass
    if m is not None:
        # Output cut off (or fence never closed): everything after the last opener.
        return text[m.end():], "unclosed-fence"
    return text, "raw"


def _last_error_line(stderr: str) -> str | None:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else None


def _sandbox_reason(res: dict, limits: dict) -> str | None:
    mem = res.get("memory") or {}
    if mem.get("exceeded"):
        peak = f", peak {mem['peak_mb']} MB" if mem.get("peak_mb") is not None else ""
        return (f"killed for memory: the program's processes together went over memory_mb "
                f"{limits['memory_mb']} MB ({mem.get('bound')}{peak})")
    if res["status"] == "timeout":
        if res.get("timeout_kind") == "cpu":
            return f"timeout: CPU limit {limits['cpu_s']}s exceeded"
        return f"timeout after {limits['timeout_s']}s"
    if res["status"] == "error":
        return f"sandbox error: {res.get('error')}"
    return None


def _slim(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("stdout_tail", "stderr_tail")}


def _run_code_tests(code: str, tests: list[str], imports: list[str], keep: list[str],
                    sandbox_limits: dict | None) -> tuple[dict, dict, str | None, list | None]:
    """Run the tests in the sandbox; (limits, result, why-not-run, failed list) from the verified report only.

    Exit code 0 alone never passes: the verdict is the harness's nonce-tagged
    report (see ``pairaudit.quality.sandbox``), so exiting early, printing a fake
    marker or patching ``assert``/builtins does not score.
    """
    limits = {**defaults.section("scoring", "sandbox"), **(sandbox_limits or {})}
    res = sandbox.run_tests(code, tests, imports=imports, keep=keep, **limits)
    why = _sandbox_reason(res, limits)
    if why:
        return limits, res, why, None
    rep = res.get("harness") or {}
    if rep.get("stage") == "solution":
        return limits, res, f"tests did not run to completion: the code raised {rep.get('error')}", None
    if rep.get("stage") != "tests" or not isinstance(rep.get("failed"), list):
        err = _last_error_line(res["stderr_tail"]) or f"exit code {res['returncode']}"
        return limits, res, f"tests did not run to completion: {err}", None
    failed = rep["failed"]
    if not failed and res["status"] != "passed":
        # Every test passed, yet the process did not exit cleanly afterwards.
        return limits, res, f"tests passed but the sandbox ended with exit code {res['returncode']}", None
    return limits, res, None, failed


def _plan(plan: split.SplitPlan | split.NotSplit, judge: str, item: dict) -> split.SplitPlan | str | None:
    """The plan to judge outside the sandbox, or why the item runs in it (None: the caller asked so)."""
    if judge not in split.JUDGES:
        raise ValueError(f"judge {judge!r} is not one of {', '.join(split.JUDGES)}")
    if judge == "in_sandbox":
        return None
    if isinstance(plan, split.NotSplit):
        if judge == "split":
            raise ValueError(f"item {item.get('id')!r} does not split: {plan.why}")
        return plan.why
    return plan


def _split_record(code: str, plan: split.SplitPlan, imports: list[str], keep: list[str],
                  sandbox_limits: dict | None) -> tuple[dict, str | None, list[split.SplitFailure]]:
    """(record fields, why the calls did not all answer, failed assertions) of the split path."""
    limits = {**defaults.section("scoring", "sandbox"), **(sandbox_limits or {})}
    run = split.run_split(code, plan, imports=imports, keep=keep, limits=limits)
    res = run["sandbox"]
    fields = {"judged_by": "split", "sandbox": _slim(res), "stderr_tail": res["stderr_tail"][-1000:],
              "split": {"assertions": run["assertions"], "calls": run["calls"], "failed": run["failed"][:5],
                        "incomplete": run["incomplete"]}}
    why = None
    if run["incomplete"]:
        why = _sandbox_reason(res, limits) or f"tests did not run to completion: {run['incomplete']}"
    return fields, why, run["failed"]


def score_mbpp(item: dict, text: str, *, sandbox_limits: dict | None = None, judge: str = "auto") -> dict:
    ref = item["reference"]
    code, source = extract_code(text)
    tests = list(ref["tests"])
    keep = [ref["function_name"]] if ref.get("function_name") else []
    imports = list(ref.get("test_imports") or [])
    out = {"extracted": code, "method": "sandbox", "code_source": source, "tests_total": len(tests)}
    plan = _plan(split.plan_mbpp(tests, imports), judge, item)
    if isinstance(plan, split.SplitPlan):
        fields, why, sfailed = _split_record(code, plan, imports, keep, sandbox_limits)
        out.update(fields)
        if why:
            return {**out, "correct": False, "tests_failed": None, "first_failure": why, "reason": why}
        if not sfailed:
            return {**out, "correct": True, "tests_failed": 0, "first_failure": None,
                    "reason": f"{len(tests)}/{len(tests)} tests passed"}
        first = f"{sfailed[0]['why']} in {sfailed[0]['test']!r}"
        return {**out, "correct": False, "tests_failed": len(sfailed), "first_failure": first,
                "reason": f"{len(sfailed)}/{len(tests)} tests failed: {first}"}
    limits, res, why, failed = _run_code_tests(code, tests, imports, keep, sandbox_limits)
    out.update({"judged_by": "in_sandbox", "split_refused": plan, "sandbox": _slim(res),
                "stderr_tail": res["stderr_tail"][-1000:]})
    if why:
        return {**out, "correct": False, "tests_failed": None, "first_failure": why, "reason": why}
    if not failed:
        return {**out, "correct": True, "tests_failed": 0, "first_failure": None,
                "reason": f"{len(tests)}/{len(tests)} tests passed"}
    first = f"{failed[0]['error']} in {failed[0]['test']!r}"
    return {**out, "correct": False, "tests_failed": len(failed), "first_failure": first,
            "reason": f"{len(failed)}/{len(tests)} tests failed: {first}"}


def humaneval_program(item: dict, code: str) -> tuple[str, str, str]:
    """(solution text, test text, layout): the completion either defines the entry point or continues the prompt."""
    ref = item["reference"]
    entry = ref["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        # The prompt stub (signature + docstring) is valid Python on its own;
        # keeping it first preserves the prompt's imports and helper functions,
        # and the completion's definition then replaces the stub.
        body, layout = ref["prompt"] + "\n" + code, "prompt+full-function"
    else:
        body, layout = ref["prompt"] + code, "prompt+continuation"
    return body, f"{ref['test']}\n\ncheck({entry})\n", layout


def score_humaneval(item: dict, text: str, *, sandbox_limits: dict | None = None, judge: str = "auto") -> dict:
    code, source = extract_code(text)
    entry = item["reference"]["entry_point"]
    body, test, layout = humaneval_program(item, code)
    out = {"extracted": code, "method": "sandbox", "code_source": source, "program_layout": layout,
           "tests_total": 1}
    plan = _plan(split.plan_humaneval(item["reference"]["test"], entry), judge, item)
    if isinstance(plan, split.SplitPlan):
        fields, why, sfailed = _split_record(body, plan, [], [entry], sandbox_limits)
        out.update(fields)
        if why:
            return {**out, "correct": False, "first_failure": why, "reason": why}
        if not sfailed:
            return {**out, "correct": True, "first_failure": None, "reason": f"check({entry}) passed"}
        err = f"{sfailed[0]['why']} in {sfailed[0]['test']!r}"
        return {**out, "correct": False, "first_failure": err, "reason": f"check({entry}) failed: {err}"}
    limits, res, why, failed = _run_code_tests(body, [test], [], [entry], sandbox_limits)
    out.update({"judged_by": "in_sandbox", "split_refused": plan, "sandbox": _slim(res),
                "stderr_tail": res["stderr_tail"][-1000:]})
    if why:
        return {**out, "correct": False, "first_failure": why, "reason": why}
    if not failed:
        return {**out, "correct": True, "first_failure": None, "reason": f"check({entry}) passed"}
    err = failed[0]["error"]
    return {**out, "correct": False, "first_failure": err, "reason": f"check({entry}) failed: {err}"}


# ---------------------------------------------------------------- dispatch

def score_item(item: dict, text: str, *, sandbox_limits: dict | None = None, judge: str = "auto") -> dict:
    """Score ``text`` (the model's answer) for ``item``; see the module docstring for the record.

    ``judge`` (code items only): "auto" judges outside the sandbox every item
    whose tests split and the rest in it; "split" and "in_sandbox" force one
    path ("split" is an error for an item that does not split).
    """
    fmt = item.get("format")
    if fmt == "gsm8k":
        return score_gsm8k(item, text)
    if fmt == "math":
        return score_math(item, text)
    if fmt == "mbpp":
        return score_mbpp(item, text, sandbox_limits=sandbox_limits, judge=judge)
    if fmt == "humaneval":
        return score_humaneval(item, text, sandbox_limits=sandbox_limits, judge=judge)
    if fmt in answerformats.FORMATS:  # qa, multiple_choice: no code runs
        return answerformats.score(item, text)
    raise ValueError(f"item format {fmt!r} is not one of {', '.join(FORMATS)}")


def response_text(response: dict | None) -> tuple[str | None, str | None]:
    """(text, finish_reason) of the first choice of a chat or completions response."""
    ans = response_answer(response)
    return ans["text"], ans["finish_reason"]


def response_answer(response: dict | None) -> dict:
    """``{"text", "finish_reason", "reasoning", "usage"}`` of the first choice.

    ``text`` is the chat message's ``content`` (or a completion's ``text``);
    the reasoning a vLLM reasoning parser split off (``message.reasoning`` in
    0.32, ``reasoning_content`` before) is kept beside it and never scored.
    """
    out = {"text": None, "finish_reason": None, "reasoning": None,
           "usage": response.get("usage") if isinstance(response, dict) else None}
    if not isinstance(response, dict):
        return out
    choices = response.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return out
    ch = choices[0]
    out["finish_reason"] = ch.get("finish_reason")
    if isinstance(ch.get("message"), dict):
        msg = chat_message(ch)
        out.update(text=msg["content"], reasoning=msg["reasoning"])
    elif isinstance(ch.get("text"), str):
        out["text"] = ch["text"]
    return out


def _no_text_reason(response: dict | None, reasoning: str | None) -> str:
    choices = response.get("choices") if isinstance(response, dict) else None
    if not choices:
        return "response has no choices"
    msg = choices[0].get("message") if isinstance(choices[0], dict) else None
    if isinstance(msg, dict) and msg.get("content") is None:
        if reasoning:
            return (f"message.content is null (the server returned {len(reasoning)} characters of "
                    "reasoning and no final answer)")
        return "message.content is null"
    return "response has no text"


def score_records(dataset_doc: dict, sampled_records: Sequence[SampledRecord], *,
                  sandbox_limits: dict | None = None, workers: int = 2,
                  max_model_len: int | None = None) -> list[ScoreRecord]:
    """Score every sampled record of one dataset/arm; unknown indices are an error, never skipped.

    ``max_model_len`` (the arm's, when known) lets a clamp record say whether
    the request itself did not fit. Code items run ``workers`` sandboxes at a time (each sandbox is a separate
    process, so threads suffice); the output keeps the input order.
    """
    by_index = {it["index"]: it for it in dataset_doc["items"]}
    for rec in sampled_records:
        if rec["index"] not in by_index:
            raise KeyError(f"sampled record index {rec['index']} is not an item of dataset "
                           f"{dataset_doc.get('name')!r}")

    def one(rec: SampledRecord) -> ScoreRecord:
        idx = rec["index"]
        item = by_index[idx]
        ans = response_answer(rec.get("response"))
        text, finish = ans["text"], ans["finish_reason"]
        clamp = clamping(rec.get("body"), finish, ans["usage"], max_model_len)
        # the text rides along so the paired stage can count exact-text matches
        base: ScoreRecord = {"index": idx, "id": item["id"], "finish_reason": finish, "text": text,
                             "reasoning": ans["reasoning"], "clamped": clamp["clamped"],
                             "clamp": clamp if clamp["clamped"] else None}
        if rec.get("error") or text is None:
            err = rec.get("error") or _no_text_reason(rec.get("response"), ans["reasoning"])
            return {**base, "correct": False, "extracted": None, "answered": False,
                    "method": "none", "reason": f"no answer: {err}"}
        # the scorers return the verdict fields of contracts.ScoreRecord for their format
        scored = cast(ScoreRecord, score_item(item, text, sandbox_limits=sandbox_limits))
        if clamp["clamped"]:
            # A clamped answer was cut short by the server, not by the model:
            # its score stands (nothing is adjusted) but never as a natural finish.
            scored = {**scored, "reason": f"{scored['reason']}; {clamp['reason']}"}
        return {**base, **scored, "answered": True}

    code = dataset_doc.get("format") in ("mbpp", "humaneval") or any(
        it.get("format") in ("mbpp", "humaneval") for it in dataset_doc["items"][:1])
    if not code or workers <= 1 or len(sampled_records) < 2:
        return [one(rec) for rec in sampled_records]
    with ThreadPoolExecutor(max_workers=int(workers)) as ex:
        return list(ex.map(one, sampled_records))
