"""The ``mbpp`` format: write a Python function; its answer passes when every assert of the row's tests holds.

Source row (MBPP, original or sanitized): ``text`` or ``prompt``, ``code``
(the reference solution), ``test_list`` (assert statements), optionally
``test_imports``, ``test_setup_code`` and ``task_id``. Item reference:
``{"tests": [str], "test_imports": [str], "code": str, "function_name": str | None}``.

The prompt names only the function the tests call (never the tests). The
reply's code (:func:`pairaudit.formats.code.extract_code`) runs against the
tests through the scoring context's sandbox; the tests are asserts, so each
may be judged as a call in the sandbox and its expectation outside it
(``pairaudit/quality/split.py``).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Mapping
from typing import Any

from pairaudit.formats.base import AssertTests, CodeJob, DatasetFormat, FormatError, ScoreContext, required
from pairaudit.formats.code import extract_code


def first_called_function(tests: list[str], code: str | None) -> str | None:
    """Name of the function the tests exercise, for the prompt (never the test itself).

    Prefer a name the reference code defines; else the first called name that
    is not a builtin (``set(similar_elements(...))`` -> ``similar_elements``).
    """
    if not tests:
        return None
    defined = set(re.findall(r"^\s*def\s+([A-Za-z_]\w*)", code or "", re.M))
    try:
        tree = ast.parse(tests[0])
    except SyntaxError:
        return None
    called = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    for name in called:
        if name in defined:
            return name
    for name in called:
        if not hasattr(builtins, name):
            return name
    return None


def normalize_row(i: int, row: dict, options: Mapping[str, Any]) -> dict:
    text = row.get("prompt", row.get("text"))
    if text is None:
        raise FormatError(f"mbpp row {i}: missing field prompt (sanitized) or text (original)")
    code, tests = required("mbpp", i, row, ("code", "test_list"))
    imports = list(row.get("test_imports") or [])
    if row.get("test_setup_code"):
        imports.append(row["test_setup_code"])
    return {"id": str(row.get("task_id", i)), "question": text,
            "reference": {"tests": list(tests), "test_imports": imports, "code": code,
                          "function_name": first_called_function(list(tests), code)}}


def prompt_fields(item: dict) -> dict:
    name = item["reference"].get("function_name")
    if not name:
        raise FormatError(f"mbpp item {item['id']}: cannot tell the function name from its first test")
    return {"function_name": name}


def score(item: dict, text: str, ctx: ScoreContext) -> dict:
    ref = item["reference"]
    code, source = extract_code(text)
    tests = tuple(ref["tests"])
    imports = tuple(ref.get("test_imports") or [])
    out = {"extracted": code, "method": "sandbox", "code_source": source, "tests_total": len(tests)}
    run = ctx.run(CodeJob(item_id=item.get("id"), program=code, tests=tests, imports=imports,
                          keep=(ref["function_name"],) if ref.get("function_name") else (),
                          split=AssertTests(tests, imports)))
    out.update(run.fields)
    if run.why:
        return {**out, "correct": False, "tests_failed": None, "first_failure": run.why, "reason": run.why}
    if not run.failed:
        return {**out, "correct": True, "tests_failed": 0, "first_failure": None,
                "reason": f"{len(tests)}/{len(tests)} tests passed"}
    first = f"{run.failed[0].why} in {run.failed[0].test!r}"
    return {**out, "correct": False, "tests_failed": len(run.failed), "first_failure": first,
            "reason": f"{len(run.failed)}/{len(tests)} tests failed: {first}"}


FORMAT = DatasetFormat(
    name="mbpp",
    normalize_row=normalize_row,
    templates={"default": "{question}\nThe function must be named `{function_name}`.\n"
                          "Reply with the complete Python code in one ```python code block."},
    prompt_fields=prompt_fields,
    score=score,
    runs_code=True,
    lmeval_target=lambda item, score: "\n".join((item.get("reference") or {}).get("tests") or []),
)
