"""The one table of dataset formats: name -> :class:`~pairaudit.formats.base.DatasetFormat`.

The dataset stage, the scorer and the lm-eval export find a format only
here (``get``), so a format is one module plus its line in ``BUILTIN`` (and
its name in the config schema's ``format`` enum, which a test ties to this
table). ``register`` adds one at run time, for a format kept outside the
package; ``unregister`` takes it away again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pairaudit.formats import answerformats, gsm8k, humaneval, math_boxed, mbpp
from pairaudit.formats.base import DatasetFormat, FormatError

# The order is the order error messages and the docs list them in.
BUILTIN: tuple[DatasetFormat, ...] = (gsm8k.FORMAT, math_boxed.FORMAT, mbpp.FORMAT, humaneval.FORMAT,
                                      answerformats.QA, answerformats.MULTIPLE_CHOICE)

_TABLE: dict[str, DatasetFormat] = {}


def register(fmt: DatasetFormat) -> DatasetFormat:
    """Add ``fmt``; a name already taken is an error (a format is never replaced silently)."""
    if not isinstance(fmt, DatasetFormat):
        raise TypeError(f"register: {fmt!r} is not a DatasetFormat")
    if fmt.name in _TABLE:
        raise ValueError(f"dataset format {fmt.name!r} is already registered")
    _TABLE[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    if any(f.name == name for f in BUILTIN):
        raise ValueError(f"dataset format {name!r} is built in and stays registered")
    del _TABLE[name]


@contextmanager
def registered(fmt: DatasetFormat) -> Iterator[DatasetFormat]:
    """``fmt`` registered for the length of a ``with`` block (a test's own format)."""
    register(fmt)
    try:
        yield fmt
    finally:
        unregister(fmt.name)


def names() -> tuple[str, ...]:
    return tuple(_TABLE)


def get(name: object, where: str = "format") -> DatasetFormat:
    """The registered format ``name``; FormatError naming ``where`` and the registered names otherwise."""
    fmt = _TABLE.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise FormatError(f"{where}: {name!r} is not one of {', '.join(_TABLE)}")
    return fmt


for _fmt in BUILTIN:
    register(_fmt)
