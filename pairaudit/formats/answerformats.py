"""The ``qa`` and ``multiple_choice`` dataset formats: rows to items, prompts, and strict, sandbox-free scoring.

Each is one :class:`~pairaudit.formats.base.DatasetFormat` (``QA``,
``MULTIPLE_CHOICE``), registered in :mod:`pairaudit.formats.registry`;
selection, the chat messages and the pairing are the same as for every other
format.

qa
--
Source row: ``question`` (str), ``answer`` (str, or a number, kept as its
text), optionally ``aliases`` (list of str: other answers that count as
right) and ``id``. Item reference: ``{"answer", "aliases", "extract"}``.

The dataset entry's ``extract`` says how the answer is read out of a reply
(default ``{method: exact}``)::

    extract: {method: exact}                         # the whole reply, normalized
    extract: {method: last_number}                   # the last number in the reply
    extract: {method: regex, pattern: "Answer:\\s*(.+)", group: 1, occurrence: last}

* ``exact``: the whole reply is the answer. It matches when its normalized
  text equals the normalized answer or an alias.
* ``last_number``: the last number written in the reply (``-?`` digits with
  optional ``,`` thousands separators and one decimal point; ``$`` and a
  trailing ``.`` are not part of it). It matches when it equals the answer
  as a number (``72.0`` = ``72``; ``1,000`` = ``1000``). Every answer and
  alias must then be a number: checked when the dataset is built.
* ``regex``: Python ``re`` with ``pattern``; ``group`` (default 1; 0 = the
  whole match) of the ``first`` (default) or ``last`` match, normalized and
  compared like ``exact``. No match is no answer (wrong), never a fallback.

Normalization (``normalize_text``): Unicode NFKC, case folded
(``str.casefold``), every Unicode punctuation character (categories ``P*``)
removed, runs of whitespace made one space, ends trimmed. So ``"  The
Eiffel-Tower."`` and ``"the eiffeltower"`` are equal; ``"Paris"`` and
``"Paris, France"`` are not (no substring matching, no article removal).

multiple_choice
---------------
Source row: ``question`` (str), ``choices`` (list of 2..26 non-empty
strings, shown as ``A.`` ``B.`` ...), ``answer`` (the correct letter, one
uppercase letter naming a choice), optionally ``id``. Item reference:
``{"choices", "answer"}``.

The letter is read strictly (``extract_letter``), in this order:

1. the whole reply (trimmed) is a letter: ``B``, ``B.``, ``B)``, ``B:``,
   ``(B)``;
2. the whole reply is a letter and that choice's text: ``B. Paris``,
   ``B) Paris``, ``(B) Paris`` (the text compared with the choice's after
   normalization; a text of another choice, or of none, reads nothing);
3. otherwise every line of the form ``Answer: B`` (``answer`` in any case,
   optional ``(``/``)`` around the letter, nothing after it but ``.``): all of
   them must name the same letter.

Only uppercase letters count (a lone ``a`` is an article), and a letter
beyond the choices is read but wrong ("not a choice"). Anything else reads
no letter, and the item is wrong; the reason says which rule applied.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from pairaudit.formats.base import DatasetFormat, FormatError

FORMATS = ("qa", "multiple_choice")
EXTRACT_METHODS = ("exact", "last_number", "regex")
OCCURRENCES = ("first", "last")
DEFAULT_EXTRACT = {"method": "exact"}
MAX_CHOICES = 26
LETTERS = string.ascii_uppercase

TEMPLATES = {
    "qa": {
        "default": "{question}\n\nReply with only the answer, nothing else.",
        "plain": "{question}",
        "answer_line": "{question}\n\nEnd your reply with one line of the form `Answer: <answer>`.",
    },
    "multiple_choice": {
        "default": "{question}\n\n{choices}\n\nReply with only the letter of the correct choice.",
        "answer_line": "{question}\n\n{choices}\n\nEnd your reply with one line of the form `Answer: <letter>`.",
    },
}


# ------------------------------------------------------------------ text

def normalize_text(text: str) -> str:
    """NFKC, casefold, Unicode punctuation removed, whitespace collapsed (module docstring)."""
    t = unicodedata.normalize("NFKC", str(text)).casefold()
    t = "".join(ch for ch in t if not unicodedata.category(ch).startswith("P"))
    return " ".join(t.split())


# A number as people write it: optional sign, digits with optional comma
# groups, an optional decimal part. Not glued to a letter or digit before it.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def numbers_in(text: str) -> list[str]:
    """Every number written in ``text``, commas dropped, in order."""
    return [m.group(0).replace(",", "") for m in _NUMBER.finditer(text)]


def as_number(text: str) -> Decimal | None:
    t = str(text).strip().replace(",", "").replace("$", "")
    if t.endswith("."):
        t = t[:-1]
    try:
        d = Decimal(t)
    except (InvalidOperation, ValueError):
        return None
    return d if d.is_finite() else None


# ------------------------------------------------------------ extract config

def resolve_extract(cfg: Any, where: str = "extract") -> dict:
    """The ``extract`` config with its defaults filled in; FormatError naming the key otherwise."""
    if cfg is None:
        return dict(DEFAULT_EXTRACT)
    if not isinstance(cfg, dict):
        raise FormatError(f"{where}: must be a mapping with method: {' | '.join(EXTRACT_METHODS)}")
    method = cfg.get("method")
    if method not in EXTRACT_METHODS:
        raise FormatError(f"{where}.method: {method!r} is not one of {', '.join(EXTRACT_METHODS)}")
    allowed = {"exact": {"method"}, "last_number": {"method"},
               "regex": {"method", "pattern", "group", "occurrence"}}[method]
    extra = sorted(set(cfg) - allowed)
    if extra:
        raise FormatError(f"{where}.{extra[0]}: not a key of method {method} (allowed: {', '.join(sorted(allowed))})")
    if method != "regex":
        return {"method": method}
    pattern = cfg.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise FormatError(f"{where}.pattern: method regex needs a non-empty pattern string")
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise FormatError(f"{where}.pattern: {pattern!r} is not a valid regular expression: {exc}") from None
    group = cfg.get("group", 1)
    if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group <= rx.groups:
        raise FormatError(f"{where}.group: {group!r} is not a group of the pattern (allowed: 0..{rx.groups})")
    occurrence = cfg.get("occurrence", "first")
    if occurrence not in OCCURRENCES:
        raise FormatError(f"{where}.occurrence: {occurrence!r} is not one of {', '.join(OCCURRENCES)}")
    return {"method": "regex", "pattern": pattern, "group": group, "occurrence": occurrence}


# ------------------------------------------------------------------ rows

def _text_field(fmt: str, i: int, row: dict, key: str) -> str:
    if key not in row:
        raise FormatError(f"{fmt} row {i}: missing field {key}")
    v = row[key]
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or str(v).strip() == "":
        raise FormatError(f"{fmt} row {i}: field {key} must be a non-empty string, got {v!r}")
    return str(v)


def normalize_row(fmt: str, i: int, row: dict, *, extract: dict | None = None) -> dict:
    """``{"id", "question", "reference"}`` of one source row (module docstring)."""
    question = _text_field(fmt, i, row, "question")
    if fmt == "qa":
        answer = _text_field(fmt, i, row, "answer")
        aliases = row.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
            raise FormatError(f"qa row {i}: field aliases must be a list of non-empty strings, got {aliases!r}")
        ext = resolve_extract(extract)
        if ext["method"] == "last_number":
            bad = [a for a in [answer, *aliases] if as_number(a) is None]
            if bad:
                raise FormatError(f"qa row {i}: extract method last_number needs numeric answers, got {bad[0]!r}")
        return {"id": str(row.get("id", i)), "question": question,
                "reference": {"answer": answer, "aliases": list(aliases), "extract": ext}}
    if fmt == "multiple_choice":
        choices = row.get("choices")
        if (not isinstance(choices, list) or not 2 <= len(choices) <= MAX_CHOICES
                or not all(isinstance(c, str) and c.strip() for c in choices)):
            raise FormatError(f"multiple_choice row {i}: field choices must be a list of 2..{MAX_CHOICES} "
                              f"non-empty strings, got {choices!r}")
        letter = row.get("answer")
        allowed = LETTERS[:len(choices)]
        if not isinstance(letter, str) or len(letter) != 1 or letter not in allowed:
            raise FormatError(f"multiple_choice row {i}: field answer {letter!r} is not one of the letters "
                              f"{', '.join(allowed)} (one per choice)")
        return {"id": str(row.get("id", i)), "question": question,
                "reference": {"choices": list(choices), "answer": letter}}
    raise FormatError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def prompt_fields(item: dict) -> dict:
    """The template fields beside ``question``: multiple_choice's lettered choices."""
    if item["format"] == "multiple_choice":
        return {"choices": "\n".join(f"{LETTERS[j]}. {c}" for j, c in enumerate(item["reference"]["choices"]))}
    return {}


# --------------------------------------------------------------- scoring

def _golds(ref: dict) -> list[str]:
    return [ref["answer"], *(ref.get("aliases") or [])]


def score_qa(item: dict, text: str) -> dict:
    ref = item["reference"]
    ext = resolve_extract(ref.get("extract"))
    method, golds = ext["method"], _golds(ref)
    base = {"method": f"qa-{method}", "gold": ref["answer"], "aliases": list(ref.get("aliases") or []),
            "extract": ext}
    if method == "last_number":
        nums = numbers_in(text)
        if not nums:
            return {**base, "correct": False, "extracted": None, "reason": "no number in the reply"}
        got = nums[-1]
        ok = any(as_number(got) == as_number(g) for g in golds)
        rel = "==" if ok else "!="
        return {**base, "correct": ok, "extracted": got,
                "reason": f"last number {got} {rel} gold {' / '.join(golds)} (compared as numbers)"}
    if method == "regex":
        matches = list(re.finditer(ext["pattern"], text))
        if not matches:
            return {**base, "correct": False, "extracted": None,
                    "reason": f"pattern {ext['pattern']!r} does not match the reply"}
        m = matches[0] if ext["occurrence"] == "first" else matches[-1]
        got = m.group(ext["group"])
        if got is None:
            return {**base, "correct": False, "extracted": None,
                    "reason": f"pattern {ext['pattern']!r} matched, but group {ext['group']} took no part in it"}
        where = f"{ext['occurrence']} match of {ext['pattern']!r}, group {ext['group']}"
    else:
        got, where = text, "the whole reply"
    norm = normalize_text(got)
    ok = any(norm == normalize_text(g) for g in golds)
    rel = "==" if ok else "!="
    return {**base, "correct": ok, "extracted": got, "normalized": norm,
            "reason": f"{where}: {norm!r} {rel} gold {' / '.join(repr(normalize_text(g)) for g in golds)} "
                      "(normalized: case, whitespace, punctuation)"}


_LONE = re.compile(r"^(?:\(([A-Z])\)|([A-Z])[.):]?)$")
_WITH_TEXT = re.compile(r"^(?:\(([A-Z])\)|([A-Z])[.)])\s+(\S.*)$", re.S)
_ANSWER_LINE = re.compile(r"^\s*answer\s*:\s*\(?([A-Z])\)?\.?\s*$", re.I | re.M)


def extract_letter(text: str, choices: list[str]) -> tuple[str | None, str]:
    """(letter or None, the rule that read it or why none was read): the strict reading of the docstring."""
    t = text.strip()
    m = _LONE.match(t)
    if m:
        return m.group(1) or m.group(2), "the reply is the letter"
    m = _WITH_TEXT.match(t)
    if m:
        letter, rest = m.group(1) or m.group(2), m.group(3)
        j = LETTERS.index(letter)
        if j < len(choices) and normalize_text(rest) == normalize_text(choices[j]):
            return letter, "the reply is the letter and its choice's text"
        if "\n" not in rest:
            return None, f"the reply names letter {letter} with text {rest!r}, which is not that choice's text"
    # the answer line: the letter itself is matched case-sensitively (a lone lowercase 'a' is a word)
    found = [m.group(1) for m in _ANSWER_LINE.finditer(text) if m.group(1).isupper()]
    if found:
        if len(set(found)) > 1:
            return None, f"'Answer:' lines name different letters {found}"
        return found[0], "an 'Answer: X' line"
    return None, "no letter read: the reply is not a letter, a letter with its choice, or an 'Answer: X' line"


def score_multiple_choice(item: dict, text: str) -> dict:
    ref = item["reference"]
    gold, choices = ref["answer"], ref["choices"]
    letter, rule = extract_letter(text, choices)
    base = {"method": "mc-letter", "gold": gold, "rule": rule}
    if letter is None:
        return {**base, "correct": False, "extracted": None, "reason": rule}
    if LETTERS.index(letter) >= len(choices):
        return {**base, "correct": False, "extracted": letter,
                "reason": f"{rule}: {letter} is not a choice (choices A..{LETTERS[len(choices) - 1]})"}
    ok = letter == gold
    return {**base, "correct": ok, "extracted": letter,
            "reason": f"{rule}: {letter} {'==' if ok else '!='} gold {gold}"}


def score(item: dict, text: str) -> dict:
    """Score record of one reply (``scoring.score_item`` for these formats)."""
    if item["format"] == "qa":
        return score_qa(item, text)
    if item["format"] == "multiple_choice":
        return score_multiple_choice(item, text)
    raise FormatError(f"format {item['format']!r} is not one of {', '.join(FORMATS)}")


# --------------------------------------------------------------- the formats

def _check_extract(options: Mapping[str, Any], where: str) -> dict:
    return {"extract": resolve_extract(options["extract"], f"{where}.extract")} if "extract" in options else {}


QA = DatasetFormat(
    name="qa",
    normalize_row=lambda i, row, options: normalize_row("qa", i, row, extract=options.get("extract")),
    templates=TEMPLATES["qa"],
    score=lambda item, text, ctx: score_qa(item, text),
    options={"extract": "reads its answer by an extract method"},
    check_options=_check_extract,
)
MULTIPLE_CHOICE = DatasetFormat(
    name="multiple_choice",
    normalize_row=lambda i, row, options: normalize_row("multiple_choice", i, row),
    templates=TEMPLATES["multiple_choice"],
    prompt_fields=prompt_fields,
    score=lambda item, text, ctx: score_multiple_choice(item, text),
)
