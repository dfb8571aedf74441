"""The ``humaneval`` format: complete a Python function; it passes when the row's ``check(candidate)`` holds.

Source row (HumanEval): ``prompt`` (signature and docstring), ``test`` (a
``check`` function of asserts), ``entry_point``, ``canonical_solution``,
optionally ``task_id``. The item reference holds the four fields.

The reply's code either defines the entry point (it is appended to the
prompt, whose stub it replaces) or continues the prompt's body
(``program``); it runs with ``check(<entry point>)`` through the scoring
context's sandbox, or, where the check's asserts split, as calls judged
outside it (``pairaudit/quality/split.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pairaudit.formats.base import CheckFunction, CodeJob, DatasetFormat, ScoreContext, required
from pairaudit.formats.code import extract_code


def normalize_row(i: int, row: dict, options: Mapping[str, Any]) -> dict:
    prompt, test, entry, canon = required("humaneval", i, row, ("prompt", "test", "entry_point", "canonical_solution"))
    return {"id": str(row.get("task_id", i)), "question": prompt,
            "reference": {"prompt": prompt, "test": test, "entry_point": entry, "canonical_solution": canon}}


def program(item: dict, code: str) -> tuple[str, str, str]:
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


def score(item: dict, text: str, ctx: ScoreContext) -> dict:
    code, source = extract_code(text)
    entry = item["reference"]["entry_point"]
    body, test, layout = program(item, code)
    out = {"extracted": code, "method": "sandbox", "code_source": source, "program_layout": layout,
           "tests_total": 1}
    run = ctx.run(CodeJob(item_id=item.get("id"), program=body, tests=(test,), imports=(), keep=(entry,),
                          split=CheckFunction(item["reference"]["test"], entry)))
    out.update(run.fields)
    if run.why:
        return {**out, "correct": False, "first_failure": run.why, "reason": run.why}
    if not run.failed:
        return {**out, "correct": True, "first_failure": None, "reason": f"check({entry}) passed"}
    first = run.failed[0]
    # split: the failed assertion is one line of the check, worth naming; in the sandbox the
    # failed "test" is the whole check, so only the error is said
    err = f"{first.why} in {first.test!r}" if run.judged_by == "split" else first.why
    return {**out, "correct": False, "first_failure": err, "reason": f"check({entry}) failed: {err}"}


def lmeval_target(item: Mapping[str, Any], score: Mapping[str, Any]) -> str:
    ref = item.get("reference") or {}
    return f"{ref.get('test', '')}\n\ncheck({ref.get('entry_point')})\n"


FORMAT = DatasetFormat(
    name="humaneval",
    normalize_row=normalize_row,
    templates={"default": "Complete this Python function:\n\n```python\n{question}```\n\n"
                          "Reply with the complete function (including the def line) in one ```python code block."},
    score=score,
    runs_code=True,
    lmeval_target=lmeval_target,
)
