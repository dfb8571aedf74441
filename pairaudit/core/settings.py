"""The config's sections as frozen records, resolved once when the workflow loads.

The Snakefile validates the config against ``config/schema.yaml`` (which
fills every default: the schema is the one place a default is kept) and the
load check (``pairaudit.configcheck``) resolves each section once, with the
checks that need code: the speed section by ``pairaudit.speed.bracket.resolve_config``,
the boundary section by ``pairaudit.boundary.cases.settings``, each dataset
entry by building its items (``pairaudit.datasets.formats``), which fixes the
selected item indices.  The result is one :class:`AuditSettings`.

A job gets its section as the record's JSON in its rule's params (so a changed
section reruns exactly the jobs that read it) and reads it back with the
record's ``from_json``, the way a phase reads ``specs/<arm>.json`` back into an
``ArmSpec``: a missing, unknown or mistyped field is refused naming it, and
nothing is resolved, defaulted or selected again.

``to_json`` gives the section as the config had it after the schema filled
its defaults (key order included), so the artifacts that record a section in
their provenance record it as before.  This module checks shapes and types
only; what a value may be (a metric's name, a rule's) is the resolver's to
check, in the package that knows it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence


class SettingsError(ValueError):
    """A settings record's JSON is not one ``to_json`` wrote; the message names the field."""


# ------------------------------------------------------------------ helpers

def freeze(value: Any) -> Any:
    """A read-only deep copy of a JSON value: mappings become mapping proxies, lists tuples (order kept)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """``freeze`` undone: plain dicts and lists, as JSON has them."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return copy.deepcopy(value)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (list, tuple)) and all(check(x) for x in v)


def _is_mapping(v: Any) -> bool:
    return isinstance(v, Mapping)


Check = tuple[str, Callable[[Any], bool], str]


def _fields(doc: Any, cls: type, where: str, checks: Sequence[Check], optional: Sequence[str] = ()) -> dict:
    """``doc``'s fields, each checked; a missing (not optional), unknown or mistyped one names itself."""
    if not isinstance(doc, Mapping):
        raise SettingsError(f"{where}: must be a mapping, got {type(doc).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(doc) - set(names))
    missing = [n for n in names if n not in doc and n not in optional]
    if unknown or missing:
        raise SettingsError(f"{where}: fields differ from a {cls.__name__}'s (missing: {missing or 'none'}, "
                            f"unknown: {unknown or 'none'}; allowed: {', '.join(names)})")
    for name, ok, what in checks:
        if name in doc and not ok(doc[name]):
            raise SettingsError(f"{where}.{name}: {doc[name]!r} is not {what}")
    return {n: doc.get(n) for n in names}


def _json(record: Any, *, omit_none: Sequence[str] = ()) -> dict[str, Any]:
    """A record's fields in declaration order, thawed; the ``omit_none`` ones left out while unset."""
    return {f.name: thaw(getattr(record, f.name)) for f in fields(record)
            if not (f.name in omit_none and getattr(record, f.name) is None)}


# -------------------------------------------------------------------- speed

@dataclass(frozen=True)
class SpeedCell:
    """One workload cell of the speed bracket (``speed.cells[i]``)."""
    name: str
    prompt: str
    input_len: int
    concurrency: int
    decide: bool

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "cell") -> SpeedCell:
        return cls(**_fields(doc, cls, where, (
            ("name", is_str, "a string"), ("prompt", is_str, "a string"),
            ("input_len", is_int, "an integer"), ("concurrency", is_int, "an integer"),
            ("decide", _is_bool, "true or false"))))


@dataclass(frozen=True)
class SpeedSettings:
    """The ``speed:`` section, resolved (``pairaudit.speed.bracket.resolve_config``); fields in the schema's order.

    ``max_starts`` is what the bracket may grow to under its rule (3 for the
    rules registered for one bracket, whatever the config says).
    """
    enabled: bool
    cells: tuple[SpeedCell, ...]
    repeats: int
    waves: int
    repeat_s: float | None
    max_starts: int
    evidence_max_age_h: float
    output_len: int
    base_seed: int
    primary: str
    guards: tuple[str, ...]
    reported: tuple[str, ...]
    win_pct: float
    informational: bool
    expected_clock_cap: Mapping[str, Any] | None
    accept_unverifiable_clock: bool
    rule: str
    start_noise_pct: float
    request_timeout_s: float
    archive: str

    def __post_init__(self) -> None:
        # frozen all the way down: one record is read by every start of the bracket
        object.__setattr__(self, "cells", tuple(self.cells))
        object.__setattr__(self, "guards", tuple(self.guards))
        object.__setattr__(self, "reported", tuple(self.reported))
        object.__setattr__(self, "expected_clock_cap", freeze(self.expected_clock_cap))

    @property
    def deciding(self) -> list[str]:
        """The names of the cells that decide."""
        return [c.name for c in self.cells if c.decide]

    @property
    def metrics(self) -> list[str]:
        """Every metric with a role: the primary, the guards, the reported ones (in that order)."""
        return [self.primary, *self.guards, *self.reported]

    @property
    def rule_params(self) -> dict[str, Any]:
        """The section's fields by name: what the selected rule's registered parameters are read from
        (``gates.Rule.apply`` takes only the rule's own, e.g. ``win_pct``, ``start_noise_pct``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of(cls, value: SpeedSettings | Mapping[str, Any]) -> SpeedSettings:
        """``value`` itself, or the record a mapping written by ``to_json`` stands for (``from_json``)."""
        return value if isinstance(value, cls) else cls.from_json(value)

    def to_json(self) -> dict[str, Any]:
        out = _json(self)
        out["cells"] = [c.to_json() for c in self.cells]
        return out

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "speed") -> SpeedSettings:
        got = _fields(doc, cls, where, (
            ("enabled", _is_bool, "true or false"), ("cells", _list_of(_is_mapping), "a list of cells"),
            ("repeats", is_int, "an integer"), ("waves", is_int, "an integer"),
            ("repeat_s", _opt(is_num), "a number or null"), ("max_starts", is_int, "an integer"),
            ("evidence_max_age_h", is_num, "a number"), ("output_len", is_int, "an integer"), ("base_seed", is_int, "an integer"),
            ("primary", is_str, "a string"), ("guards", _list_of(is_str), "a list of strings"),
            ("reported", _list_of(is_str), "a list of strings"), ("win_pct", is_num, "a number"),
            ("informational", _is_bool, "true or false"),
            ("expected_clock_cap", _opt(_is_mapping), "a mapping or null"),
            ("accept_unverifiable_clock", _is_bool, "true or false"), ("rule", is_str, "a string"),
            ("start_noise_pct", is_num, "a number"), ("request_timeout_s", is_num, "a number"),
            ("archive", is_str, "a string")))
        got["cells"] = tuple(SpeedCell.from_json(c, where=f"{where}.cells[{i}]") for i, c in enumerate(got["cells"]))
        return cls(**got)


# ----------------------------------------------------------------- sampling

@dataclass(frozen=True)
class SamplingSettings:
    """The ``sampling:`` section (the sampled runs of the answers phase); fields in the schema's order."""
    api: str
    base_seed: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_tokens: int
    concurrency: int
    chat_template_kwargs: Mapping[str, Any]
    request_timeout_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "chat_template_kwargs", freeze(self.chat_template_kwargs))

    @property
    def primary(self) -> dict[str, Any]:
        """The sampling parameters the preflight rehearses (its primary request's)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "sampling") -> SamplingSettings:
        return cls(**_fields(doc, cls, where, (
            ("api", is_str, "a string"), ("base_seed", is_int, "an integer"), ("temperature", is_num, "a number"),
            ("top_p", is_num, "a number"), ("top_k", is_int, "an integer"), ("min_p", is_num, "a number"),
            ("max_tokens", is_int, "an integer"), ("concurrency", is_int, "an integer"),
            ("chat_template_kwargs", _is_mapping, "a mapping"), ("request_timeout_s", is_num, "a number"))))


# ------------------------------------------------------------------ scoring

@dataclass(frozen=True)
class SandboxSettings:
    """``scoring.sandbox``: the limits every sandboxed program runs under (``pairaudit.quality.sandbox``)."""
    timeout_s: float
    cpu_s: int
    memory_mb: int
    fsize_mb: int
    nproc: int

    @property
    def limits(self) -> dict[str, Any]:
        """The limits as the sandbox's keyword arguments (``sandbox.run_tests``, ``sandbox.run_calls``)."""
        return _json(self)

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "scoring.sandbox") -> SandboxSettings:
        return cls(**_fields(doc, cls, where, (
            ("timeout_s", is_num, "a number"), ("cpu_s", is_int, "an integer"), ("memory_mb", is_int, "an integer"),
            ("fsize_mb", is_int, "an integer"), ("nproc", is_int, "an integer"))))


@dataclass(frozen=True)
class ScoringSettings:
    """The ``scoring:`` section (how the score stage judges answers)."""
    sandbox: SandboxSettings

    def to_json(self) -> dict[str, Any]:
        return {"sandbox": self.sandbox.to_json()}

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "scoring") -> ScoringSettings:
        got = _fields(doc, cls, where, ())
        return cls(sandbox=SandboxSettings.from_json(got["sandbox"], where=f"{where}.sandbox"))


# ------------------------------------------------------------------- greedy

@dataclass(frozen=True)
class GreedySettings:
    """The ``greedy:`` section (greedy diagnostics for grid-tie-v1 and determinism-v1)."""
    items: str
    concordant: int
    seed: int
    max_tokens: int
    determinism_repeats: int

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "greedy") -> GreedySettings:
        return cls(**_fields(doc, cls, where, (
            ("items", is_str, "a string"), ("concordant", is_int, "an integer"), ("seed", is_int, "an integer"),
            ("max_tokens", is_int, "an integer"), ("determinism_repeats", is_int, "an integer"))))


# ----------------------------------------------------------------- boundary

@dataclass(frozen=True)
class BoundarySettings:
    """The ``boundary:`` section, resolved (``pairaudit.boundary.cases.settings``: the prompt's parts filled)."""
    enabled: bool
    fractions: tuple[float, ...]
    values: int
    digits: int
    seed: int
    retrieval_max_tokens: int
    tail_offsets: tuple[int, ...]
    request_timeout_s: float
    prompt: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", tuple(self.fractions))
        object.__setattr__(self, "tail_offsets", tuple(self.tail_offsets))
        object.__setattr__(self, "prompt", freeze(self.prompt))

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "boundary") -> BoundarySettings:
        return cls(**_fields(doc, cls, where, (
            ("enabled", _is_bool, "true or false"), ("fractions", _list_of(is_num), "a list of numbers"),
            ("values", is_int, "an integer"), ("digits", is_int, "an integer"), ("seed", is_int, "an integer"),
            ("retrieval_max_tokens", is_int, "an integer"),
            ("tail_offsets", _list_of(is_int), "a list of integers"),
            ("request_timeout_s", is_num, "a number"),
            ("prompt", lambda v: _is_mapping(v) and all(is_str(x) for x in v.values()),
             "a mapping of strings"))))


# -------------------------------------------------------------------- rules

@dataclass(frozen=True)
class GridTieSettings:
    """``rules.grid_tie``: grid-tie-v1's parameters."""
    max_divergent: int

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "rules.grid_tie") -> GridTieSettings:
        return cls(**_fields(doc, cls, where, (("max_divergent", is_int, "an integer"),)))


@dataclass(frozen=True)
class QualitySettings:
    """``rules.quality``: the quality rule and its parameters (``detect_loss_pct`` only when set)."""
    rule: str
    margin_pct: float
    level: float
    max_net_loss: int
    alpha: float
    detect_loss_pct: float | None = None

    @property
    def rule_params(self) -> dict[str, Any]:
        """The parameters the rules read (``gates.Rule.apply`` takes only the selected rule's own)."""
        return {k: v for k, v in _json(self, omit_none=("detect_loss_pct",)).items() if k != "rule"}

    def to_json(self) -> dict[str, Any]:
        return _json(self, omit_none=("detect_loss_pct",))

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "rules.quality") -> QualitySettings:
        return cls(**_fields(doc, cls, where, (
            ("rule", is_str, "a string"), ("margin_pct", is_num, "a number"), ("level", is_num, "a number"),
            ("max_net_loss", is_int, "an integer"), ("alpha", is_num, "a number"),
            ("detect_loss_pct", _opt(is_num), "a number or null")), optional=("detect_loss_pct",)))


@dataclass(frozen=True)
class RulesSettings:
    """The ``rules:`` section: the registered rules' parameters."""
    grid_tie: GridTieSettings
    quality: QualitySettings

    def to_json(self) -> dict[str, Any]:
        return {"grid_tie": self.grid_tie.to_json(), "quality": self.quality.to_json()}

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "rules") -> RulesSettings:
        got = _fields(doc, cls, where, ())
        return cls(grid_tie=GridTieSettings.from_json(got["grid_tie"], where=f"{where}.grid_tie"),
                   quality=QualitySettings.from_json(got["quality"], where=f"{where}.quality"))


# ----------------------------------------------------------------- datasets

@dataclass(frozen=True)
class DatasetSettings:
    """One ``datasets[i]`` entry, resolved at load.

    ``entry`` is the entry as configured (its keys in their order: what the
    dataset artifact records); ``where`` names it in messages (``datasets[2]``).
    ``indices`` are the selected items, chosen once, at load, from the rows
    the config fixes (a generated suite, a local or packaged file); None for
    a hub file, whose rows exist only once the dataset stage has downloaded
    them, so its one selection is there.  ``source_sha256`` is the source
    file's content hash at load (local and packaged files; None otherwise),
    which reruns the dataset's jobs when the file changes.
    """
    name: str
    where: str
    entry: Mapping[str, Any]
    indices: tuple[int, ...] | None
    source_sha256: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "entry", freeze(self.entry))
        if self.indices is not None:
            object.__setattr__(self, "indices", tuple(self.indices))

    @property
    def format(self) -> str:
        return str(self.entry["format"])

    @property
    def prompt_template(self) -> str:
        return str(self.entry["prompt_template"])

    @property
    def source(self) -> Mapping[str, Any]:
        return self.entry["source"]

    @property
    def select(self) -> Mapping[str, Any]:
        return self.entry["select"]

    @property
    def extract(self) -> Mapping[str, Any] | None:
        return self.entry.get("extract")

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "dataset") -> DatasetSettings:
        got = _fields(doc, cls, where, (
            ("name", is_str, "a string"), ("where", is_str, "a string"),
            ("entry", _is_mapping, "a mapping"),
            ("indices", _opt(_list_of(lambda i: is_int(i) and i >= 0)), "a list of item indices or null"),
            ("source_sha256", _opt(is_str), "a string or null")))
        if got["entry"].get("name") != got["name"]:
            raise SettingsError(f"{where}.name: {got['name']!r} is not its entry's name "
                                f"{got['entry'].get('name')!r}")
        return cls(**got)


# --------------------------------------------------------------- the audit

@dataclass(frozen=True)
class AuditSettings:
    """Every resolved section of one audit's config; ``speed`` and ``boundary`` are None when disabled."""
    speed: SpeedSettings | None
    boundary: BoundarySettings | None
    greedy: GreedySettings
    rules: RulesSettings
    datasets: tuple[DatasetSettings, ...]
    sampling: SamplingSettings
    scoring: ScoringSettings

    def __post_init__(self) -> None:
        object.__setattr__(self, "datasets", tuple(self.datasets))

    def dataset(self, name: str) -> DatasetSettings:
        for d in self.datasets:
            if d.name == name:
                return d
        raise KeyError(f"no dataset named {name!r} (datasets: {', '.join(d.name for d in self.datasets)})")
