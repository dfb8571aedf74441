"""Score one model answer against one dataset item, and every sampled record of a dataset.

Each format's scorer is its registered object's (:mod:`pairaudit.formats.registry`);
this module looks the item's format up, gives the code formats the sandbox
(``run_code``: the split path or the sandbox's own tests), and scores a
dataset's sampled records. Items come from ``pairaudit.datasets.formats`` (``{"index", "id", "format", "question",
"reference": {...}}``). Every score record says why it scored so, in words a
reviewer can check against the raw text.

Score record of ``score_item`` (all formats)::

    {"correct": bool,             # the PRIMARY verdict; diagnostics never replace it
     "extracted": str | None,     # what was read out of the answer (number, boxed latex, code)
     "reason": str,               # why, e.g. "strict match '#### 72' == gold 72"
     "method": str,               # how it was judged, e.g. "strict-regex", "math-verify", "sandbox"
     ...format extras}

Format extras (made by each format's scorer, ``pairaudit/formats/<module>.py``):

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

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Mapping, Sequence, cast

from pairaudit.core import defaults
from pairaudit.core.contracts import SampledRecord, ScoreRecord
from pairaudit.core.settings import SandboxSettings
from pairaudit.formats import registry
from pairaudit.formats.base import AssertTests, CheckFunction, CodeFailure, CodeJob, CodeOutcome, ScoreContext
from pairaudit.formats.code import extract_code
from pairaudit.formats.gsm8k import GSM8K_COMPARISON, normalize_number, numbers_equal
from pairaudit.quality import sandbox, split
from pairaudit.serving.client import chat_message, clamping

# Moved to their formats' modules; named here for the callers that import them from the scorer.
__all__ = ["GSM8K_COMPARISON", "extract_code", "normalize_number", "numbers_equal", "response_answer",
           "response_text", "score_item", "score_records"]


# ---------------------------------------------------------------- code: the sandbox and the split path

def sandbox_settings(limits: SandboxSettings | Mapping[str, Any] | None = None) -> SandboxSettings:
    """The sandbox's limits as a record: ``limits`` itself, or a ``scoring.sandbox`` mapping (or none: an empty
    one) with the schema's defaults filled in for what it leaves out."""
    if isinstance(limits, SandboxSettings):
        return limits
    return SandboxSettings.from_json(defaults.filled(dict(limits or {}), "scoring", "sandbox"))


def _last_error_line(stderr: str) -> str | None:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else None


def _sandbox_reason(res: dict, limits: SandboxSettings) -> str | None:
    mem = res.get("memory") or {}
    if mem.get("exceeded"):
        peak = f", peak {mem['peak_mb']} MB" if mem.get("peak_mb") is not None else ""
        return (f"killed for memory: the program's processes together went over memory_mb "
                f"{limits.memory_mb} MB ({mem.get('bound')}{peak})")
    if res["status"] == "timeout":
        if res.get("timeout_kind") == "cpu":
            return f"timeout: CPU limit {limits.cpu_s}s exceeded"
        return f"timeout after {limits.timeout_s}s"
    if res["status"] == "error":
        return f"sandbox error: {res.get('error')}"
    return None


def _slim(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("stdout_tail", "stderr_tail")}


def _run_code_tests(code: str, tests: list[str], imports: list[str], keep: list[str],
                    limits: SandboxSettings) -> tuple[SandboxSettings, dict, str | None, list | None]:
    """Run the tests in the sandbox; (limits, result, why-not-run, failed list) from the verified report only.

    Exit code 0 alone never passes: the verdict is the harness's nonce-tagged
    report (see ``pairaudit.quality.sandbox``), so exiting early, printing a fake
    marker or patching ``assert``/builtins does not score.
    """
    res = sandbox.run_tests(code, tests, imports=imports, keep=keep, **limits.limits)
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
                  limits: SandboxSettings) -> tuple[dict, str | None, list[split.SplitFailure]]:
    """(record fields, why the calls did not all answer, failed assertions) of the split path."""
    run = split.run_split(code, plan, imports=imports, keep=keep, limits=limits.limits)
    res = run["sandbox"]
    fields = {"judged_by": "split", "sandbox": _slim(res), "stderr_tail": res["stderr_tail"][-1000:],
              "split": {"assertions": run["assertions"], "calls": run["calls"], "failed": run["failed"][:5],
                        "incomplete": run["incomplete"]}}
    why = None
    if run["incomplete"]:
        why = _sandbox_reason(res, limits) or f"tests did not run to completion: {run['incomplete']}"
    return fields, why, run["failed"]


def _split_plan(tests: AssertTests | CheckFunction) -> split.SplitPlan | split.NotSplit:
    """The split plan of a code job's tests, by their form (not by the dataset's format)."""
    if isinstance(tests, AssertTests):
        return split.plan_mbpp(tests.statements, tests.imports)
    return split.plan_humaneval(tests.test, tests.entry_point)


def run_code(job: CodeJob, *, sandbox_limits: SandboxSettings | Mapping[str, Any] | None = None,
             judge: str = "auto") -> CodeOutcome:
    """Run a code format's job: outside the sandbox where its tests split (``judge``), else in it.

    ``sandbox_limits``: ``scoring.sandbox`` (``sandbox_settings``: the schema's limits where it sets none).

    The score record's judging fields keep the order they always had
    (``judged_by``, then ``sandbox``/``stderr_tail``/``split``, or
    ``split_refused``/``sandbox``/``stderr_tail``).
    """
    plan = _plan(_split_plan(job.split), judge, {"id": job.item_id})
    program, imports, keep = job.program, list(job.imports), list(job.keep)
    limits = sandbox_settings(sandbox_limits)
    if isinstance(plan, split.SplitPlan):
        fields, why, sfailed = _split_record(program, plan, imports, keep, limits)
        return CodeOutcome("split", fields, why, tuple(CodeFailure(f["test"], f["why"]) for f in sfailed))
    _, res, why, failed = _run_code_tests(program, list(job.tests), imports, keep, limits)
    fields = {"judged_by": "in_sandbox", "split_refused": plan, "sandbox": _slim(res),
              "stderr_tail": res["stderr_tail"][-1000:]}
    return CodeOutcome("in_sandbox", fields, why, tuple(CodeFailure(f["test"], f["error"]) for f in failed or []))


# ---------------------------------------------------------------- dispatch

def score_item(item: dict, text: str, *, sandbox_limits: SandboxSettings | Mapping[str, Any] | None = None,
               judge: str = "auto") -> dict:
    """Score ``text`` (the model's answer) for ``item``; see the module docstring for the record.

    ``judge`` (code items only): "auto" judges outside the sandbox every item
    whose tests split and the rest in it; "split" and "in_sandbox" force one
    path ("split" is an error for an item that does not split).
    """
    fmt = item.get("format")
    if fmt not in registry.names():
        raise ValueError(f"item format {fmt!r} is not one of {', '.join(registry.names())}")
    ctx = ScoreContext(run_code=partial(run_code, sandbox_limits=sandbox_settings(sandbox_limits), judge=judge))
    return registry.get(fmt).score(item, text, ctx)


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
                  sandbox_limits: SandboxSettings | Mapping[str, Any] | None = None, workers: int = 2,
                  max_model_len: int | None = None) -> list[ScoreRecord]:
    """Score every sampled record of one dataset/arm; unknown indices are an error, never skipped.

    ``max_model_len`` (the arm's, when known) lets a clamp record say whether
    the request itself did not fit. Code items run ``workers`` sandboxes at a time (each sandbox is a separate
    process, so threads suffice); the output keeps the input order.
    """
    limits = sandbox_settings(sandbox_limits)
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
        scored = cast(ScoreRecord, score_item(item, text, sandbox_limits=limits))
        if clamp["clamped"]:
            # A clamped answer was cut short by the server, not by the model:
            # its score stands (nothing is adjusted) but never as a natural finish.
            scored = {**scored, "reason": f"{scored['reason']}; {clamp['reason']}"}
        return {**base, **scored, "answered": True}

    names = {dataset_doc.get("format"), *(it.get("format") for it in dataset_doc["items"][:1])}
    code = any(registry.get(n).runs_code for n in names if n in registry.names())
    if not code or workers <= 1 or len(sampled_records) < 2:
        return [one(rec) for rec in sampled_records]
    with ThreadPoolExecutor(max_workers=int(workers)) as ex:
        return list(ex.map(one, sampled_records))
