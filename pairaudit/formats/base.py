"""What a dataset format is: one object holding how its rows become items, how they are prompted, how an
answer is scored, and how its lines read in an lm-eval sample log.

Every format is one :class:`DatasetFormat`, defined in its own module of this
package and registered in :mod:`pairaudit.formats.registry`; the dataset stage
(``pairaudit.datasets.formats``), the scorer (``pairaudit.quality.scoring``)
and the lm-eval export (``pairaudit.interop.lmeval``) look a format up there
and never branch on its name (``docs/extending.md``, "A dataset format").

Formats whose answers are code run that code through the sandbox, which
lives in ``quality`` above this package: such a format builds a
:class:`CodeJob` (the program, its tests, how they split) and asks the
:class:`ScoreContext`'s ``run_code`` for a :class:`CodeOutcome`, so that
the format states what runs and the quality package alone decides how.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class FormatError(ValueError):
    """A row, an item or an entry option of a format is malformed; the message names the field."""


def required(fmt: str, i: int, row: dict, keys: tuple[str, ...]) -> list:
    """The row's values of ``keys``; FormatError naming every missing one."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise FormatError(f"{fmt} row {i}: missing field(s) {', '.join(missing)}")
    return [row[k] for k in keys]


# ------------------------------------------------------------------ code formats

@dataclass(frozen=True)
class AssertTests:
    """Tests that are assert statements (MBPP's form): each may split into a call and its expectation."""
    statements: tuple[str, ...]
    imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckFunction:
    """A ``check(candidate)`` function of asserts (HumanEval's form), called with the entry point."""
    test: str
    entry_point: str


@dataclass(frozen=True)
class CodeJob:
    """Model-written code and the tests it must pass, as ``quality.scoring`` runs them.

    ``program`` runs first, then ``tests`` (in the sandbox's harness);
    ``keep`` names what the tests call, which the harness keeps from the
    program's reach; ``split`` is the form of the tests, which says whether
    they can be judged outside the sandbox (``pairaudit/quality/split.py``).
    """
    item_id: str | None
    program: str
    tests: tuple[str, ...]
    imports: tuple[str, ...]
    keep: tuple[str, ...]
    split: AssertTests | CheckFunction


@dataclass(frozen=True)
class CodeFailure:
    test: str
    why: str


@dataclass(frozen=True)
class CodeOutcome:
    """What running a :class:`CodeJob` showed: the record's judging fields, and the verdict's facts.

    ``fields`` are the score record's judging keys in their order (``judged_by``,
    ``sandbox``, ``stderr_tail``, ``split`` or ``split_refused``); ``why`` is
    set when the tests did not run to completion (a timeout, a crash, memory),
    and then ``failed`` is empty; otherwise ``failed`` lists the failed tests,
    first first (empty: every test passed).
    """
    judged_by: str
    fields: Mapping[str, Any]
    why: str | None
    failed: tuple[CodeFailure, ...]


@dataclass(frozen=True)
class ScoreContext:
    """What a scorer may need beyond the item and the reply: the sandbox, for formats that run code."""
    run_code: Callable[[CodeJob], CodeOutcome] | None = None

    def run(self, job: CodeJob) -> CodeOutcome:
        if self.run_code is None:
            raise FormatError(f"item {job.item_id!r}: its answer is code, and this scoring has no sandbox to run it")
        return self.run_code(job)


# ------------------------------------------------------------------ the format

def _no_fields(item: dict) -> dict:
    return {}


def _gold_target(item: Mapping[str, Any], score: Mapping[str, Any]) -> str:
    gold = score.get("gold", (item.get("reference") or {}).get("answer"))
    return "" if gold is None else str(gold)


def _no_options(options: Mapping[str, Any], where: str) -> dict:
    return {}


@dataclass(frozen=True)
class LmEvalFilter:
    """An lm-eval filter line beside the primary one: its name, and the score record key holding
    ``{"extracted", "correct"}`` under it (gsm8k's ``flexible-extract`` reads ``flexible``)."""
    name: str
    score_key: str


@dataclass(frozen=True)
class DatasetFormat:
    """One dataset format (module docstring). Register it in :mod:`pairaudit.formats.registry`.

    - ``normalize_row(i, row, options)`` -> ``{"id", "question", "reference"}``
      of source row ``i`` (FormatError naming the field otherwise), where
      ``options`` are the dataset entry's values of this format's own keys.
    - ``options``: those keys, each with what it does (the words of the
      error that refuses it on an entry of another format);
      ``check_options(options, where)`` checks their values at load.
    - ``templates``: template name -> the user message, ``str.format``-ed with
      ``question`` and ``prompt_fields(item)``; ``shots``: worked (question,
      answer) exchanges shown before the question by the ``shots`` template.
    - ``score(item, text, ctx)`` -> the score record's verdict fields
      (``correct``, ``extracted``, ``reason``, ``method``, format extras).
    - ``runs_code``: its scorer runs the answer in the sandbox (scored a few at a time).
    - ``lmeval_target(item, score)``: the ``target`` of its lm-eval sample
      lines; ``lmeval_filters``: filter lines written beside ``strict-match``.
    """
    name: str
    normalize_row: Callable[[int, dict, Mapping[str, Any]], dict]
    templates: Mapping[str, str]
    score: Callable[[dict, str, ScoreContext], dict]
    shots: tuple[tuple[str, str], ...] = ()
    prompt_fields: Callable[[dict], dict] = _no_fields
    runs_code: bool = False
    options: Mapping[str, str] = field(default_factory=dict)
    check_options: Callable[[Mapping[str, Any], str], dict] = _no_options
    lmeval_target: Callable[[Mapping[str, Any], Mapping[str, Any]], str] = _gold_target
    lmeval_filters: tuple[LmEvalFilter, ...] = ()

    def __post_init__(self) -> None:
        # frozen all the way down: one object serves every stage and every dataset of a run, so a
        # template edited in place by one caller would change the prompts of all the others
        object.__setattr__(self, "templates", MappingProxyType(dict(self.templates)))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        if "shots" in self.templates:
            raise ValueError(f"format {self.name}: the shots template is made from brief and the shots")
        if self.shots and "brief" not in self.templates:
            raise ValueError(f"format {self.name}: shots need a brief template to ask each question with")

    def template_names(self) -> tuple[str, ...]:
        return (*self.templates, "shots") if self.shots else tuple(self.templates)

    def template(self, name: str) -> str:
        """The user message template ``name`` (``shots`` asks each question as ``brief`` does)."""
        if name == "shots" and self.shots:
            return self.templates["brief"]
        return self.templates[name]
