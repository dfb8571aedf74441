"""Every artifact the promotion reads, read back as its type: the other phases' and its own decision.json.

A stage writes its artifact as a JSON dict (``contracts.PATHS`` says where,
its schema id says what); a reader that indexes that dict with
``doc.get("bar", {}).get("win_pct", 2.0)`` turns a renamed field into a quiet
default. Here each artifact is a frozen dataclass whose ``from_json`` checks
the schema id and every field it declares, and refuses, naming the artifact
and the field, one that is missing or of another type
(:class:`FieldError`). A field with a default may be absent from the file
(the artifact's writer leaves it out in some state, e.g. a bracket not run);
one without a default must be there. Fields a record does not declare are
kept on disk but not read.

Nested records (a paired table, a boundary case's arm side, a rule result)
are dataclasses too and are checked the same way, their field named by its
path (``speed/decision.json: bar.win_pct``). A field typed ``dict`` or
``Any`` is read as it stands: it is evidence passed on whole (a rule's
parameters, a server's failure record), not read field by field here.

The original dict stays on each record as ``raw`` (not compared, not
shown): a rule that is applied again (``gates.apply_quality``) takes the
table as its own stage wrote it.

This module imports only core modules, so every phase can read its inputs
through it.
"""

from __future__ import annotations

import os
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Mapping, TypeVar

from pairaudit.core.artifacts import ArtifactError, read_json
from pairaudit.core.contracts import (
    BOUNDARY_GATE_SCHEMA,
    DECISION_SCHEMA,
    DIVERGENCE_SCHEMA,
    LAUNCH_SCHEMA,
    LEDGER_SCHEMA,
    PAIRED_SCHEMA,
    PHASE_SCHEMA,
    PREFLIGHT_SCHEMA,
    SCORES_SCHEMA,
    SPEED_DECISION_SCHEMA,
)

R = TypeVar("R", bound="Record")


class FieldError(ArtifactError):
    """A field of an artifact is missing or of the wrong type; ``artifact`` and ``field`` name it."""

    def __init__(self, artifact: str, field_path: str, problem: str):
        super().__init__(f"{artifact}: field {field_path!r} {problem}")
        self.artifact, self.field, self.problem = artifact, field_path, problem


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _convert(tp: Any, value: Any, artifact: str, path: str) -> Any:
    """``value`` checked against ``tp`` (and built into records where ``tp`` names one)."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(tp)
        if value is None and type(None) in members:
            return None
        for m in members:
            if m is type(None):
                continue
            try:
                return _convert(m, value, artifact, path)
            except FieldError:
                if len([x for x in members if x is not type(None)]) == 1:
                    raise
        raise FieldError(artifact, path, f"is {type(value).__name__}, expected {_type_name(tp)}")
    if isinstance(tp, type) and issubclass(tp, Record):
        if not isinstance(value, Mapping):
            raise FieldError(artifact, path, f"is {type(value).__name__}, expected an object ({tp.__name__})")
        return _build(tp, value, artifact, prefix=f"{path}.")
    base = origin or tp
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base in (dict, Mapping):
        ok = isinstance(value, Mapping)
    else:
        ok = isinstance(value, base)
    if not ok:
        raise FieldError(artifact, path, f"is {type(value).__name__}, expected {_type_name(tp)}")
    args = typing.get_args(tp)
    if base is list and args and args[0] is not Any:
        return [_convert(args[0], v, artifact, f"{path}[{i}]") for i, v in enumerate(value)]
    if base in (dict, Mapping) and len(args) == 2 and args[1] is not Any:
        return {k: _convert(args[1], v, artifact, f"{path}.{k}") for k, v in value.items()}
    return value


def _build(cls: type[R], doc: Mapping[str, Any], artifact: str, *, prefix: str = "") -> R:
    hints = _hints(cls)
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "raw":
            continue
        key = f.metadata.get("key", f.name)
        if key not in doc:
            if f.default is MISSING and f.default_factory is MISSING:
                raise FieldError(artifact, prefix + key, "is missing")
            continue
        kw[f.name] = _convert(hints[f.name], doc[key], artifact, prefix + key)
    out = cls(**kw, raw=doc)
    out.validate(artifact, prefix)
    return out


@dataclass(frozen=True, kw_only=True)
class Record:
    """Base of every artifact record: ``from_json`` builds and checks it (see the module docstring)."""

    SCHEMA: ClassVar[str | None] = None   # the artifact's schema id; None for a record inside an artifact
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    def validate(self, artifact: str, prefix: str) -> None:
        """What the fields must satisfy together (a record whose fields depend on its state overrides it)."""

    @classmethod
    def from_json(cls: type[R], doc: Any, *, where: str | os.PathLike | None = None) -> R:
        """The record of ``doc``; :class:`FieldError` (an ``ArtifactError``) names what does not fit."""
        artifact = str(where) if where is not None else (cls.SCHEMA or cls.__name__)
        if not isinstance(doc, Mapping):
            raise ArtifactError(f"{artifact}: expected a JSON object, got {type(doc).__name__}")
        if cls.SCHEMA is not None and doc.get("schema") != cls.SCHEMA:
            raise ArtifactError(f"{artifact}: schema {doc.get('schema')!r}, expected {cls.SCHEMA!r}")
        return _build(cls, doc, artifact)

    @classmethod
    def read(cls: type[R], path: str | os.PathLike) -> R:
        """The artifact at ``path`` through ``from_json``."""
        return cls.from_json(read_json(path), where=path)


def as_record(cls: type[R], doc: R | Mapping[str, Any] | None, where: str | None = None) -> R | None:
    """``doc`` as a ``cls`` record: a record passes, a dict is read through ``from_json``, None stays None."""
    if doc is None or isinstance(doc, cls):
        return doc
    return cls.from_json(doc, where=where)


# ------------------------------------------------------------ rule results

@dataclass(frozen=True, kw_only=True)
class RuleResult(Record):
    """A registered rule's result (``gates``: rule, verdict, reasons, params, deviations), as stored or made.

    Beside the rule's own fields, what the stage or the decision added to
    it: ``stage_verdict`` (what the rule said where the decision counts it
    otherwise), ``informational``, the stage's own ``stage_deviations``, and
    the parts of its evidence it could not apply to. The numbers only one
    rule carries are read by that rule's record below.
    """
    rule: str
    verdict: str
    reasons: list[str]
    params: dict = field(default_factory=dict)         # a rule that did not run records none
    deviations: dict = field(default_factory=dict)     # name -> {registered, used}
    informational: bool = False                        # speed.informational: only a LOSS of this gate gates
    stage_verdict: str | None = None
    stage_deviations: list[dict] = field(default_factory=list)   # {gate, what, detail}
    missing_cases: list | None = None                  # boundary cases required but not run
    not_evaluated_datasets: list | None = None         # grid-tie: datasets without a record
    counts_unrecorded_datasets: list | None = None     # grid-tie: datasets without selected/compared counts

    def as_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True, kw_only=True)
class QualityResult(RuleResult):
    """quality-v1 / quality-v2 (``gates.quality``); the loss bound, multiplicity and items needed are v2's."""
    n: int | None
    control_correct: int | None
    candidate_correct: int | None
    control_only: list[int]
    candidate_only: list[int]
    net: int
    mcnemar_p: float | None
    mde: dict | None = None                # absent in a paired doc made before the detectable-loss field
    loss_bound: dict | None = None
    multiplicity: dict | None = None
    needed: dict | None = None


@dataclass(frozen=True, kw_only=True)
class GridTieProbe(Record):
    index: Any
    verdict: str | None = None
    dataset: str | None = None
    step: float | None = None
    gap_in_steps: float | None = None


@dataclass(frozen=True, kw_only=True)
class GridTieResult(RuleResult):
    """grid-tie-v1, per dataset (``grid_tie_v1``) or over the audit (``grid_tie_audit``)."""
    scope: str | None = None
    n_divergent: int | None = None
    selected: int | None = None
    compared: int | None = None
    failed_clauses: list | None = None
    unevaluated_clauses: list | None = None
    datasets: dict | None = None
    probes: list[GridTieProbe] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class DeterminismResult(RuleResult):
    # absent where the rule never ran its repeats (an arm's server died before them): the verdict and
    # reasons say why
    arms: dict[str, dict] = field(default_factory=dict)
    nondeterministic_arms: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class BoundaryResult(RuleResult):
    candidate_failures: list[dict] = field(default_factory=list)   # boundary_v1 writes all four; a stage
    control_failures: list[dict] = field(default_factory=list)     # not run writes none of them
    candidate_cases: list | None = None
    identical_text_cases: Any = None


@dataclass(frozen=True, kw_only=True)
class Win2V1Result(RuleResult):
    """win2-v1 per cell (``gates.win2_v1``); the speed stage's combined gate carries the cells' verdicts instead."""
    primary: dict = field(default_factory=dict)
    repeats: int | None = None
    guards: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class PooledResult(RuleResult):
    """win2-v2 / win2-v3: one verdict over every deciding cell (the speed gate carries these keys)."""
    repeats: Any = None
    starts: int = 3
    pooled_gain_pct: float | None = None
    lower_bound_pct: float | None = None
    half_width_pct: float | None = None
    noise: dict | None = None
    rates: dict | None = None
    needed: Any = None


# each gate's result record (the rule a result names picks it: ``promotion.decision.rule_result``,
# through the registry, which core cannot import)
RESULT_RECORDS: dict[str, type[RuleResult]] = {
    "quality": QualityResult, "grid_tie": GridTieResult, "determinism": DeterminismResult,
    "boundary": BoundaryResult, "speed": Win2V1Result, "speed-pooled": PooledResult,
}


# -------------------------------------------------------------- paired

@dataclass(frozen=True, kw_only=True)
class PairedCounts(Record):
    """``table`` of ``paired/<dataset>.json`` (``contracts.PairedTable``), the fields the promotion reads."""
    n: int
    indices: list[int]
    control_correct: int
    candidate_correct: int
    both_correct: int
    neither_correct: int
    control_only: list[int]
    candidate_only: list[int]
    net: int
    exact_text_matches: int
    bodies_identical: bool
    natural_finish: dict[str, int | None]
    exact_text_match_indices: list[int] = field(default_factory=list)   # absent in an lm-eval stand-in table
    body_mismatch_indices: list[int] = field(default_factory=list)
    unnatural_finish_indices: dict[str, list[int]] = field(default_factory=dict)
    unanswered_indices: dict[str, list[int]] = field(default_factory=dict)
    error_indices: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Paired(Record):
    """``paired/<dataset>.json``: both arms' scores item by item and the quality rule over them."""
    SCHEMA = PAIRED_SCHEMA
    dataset: str
    format: str                         # the dataset's answer format
    table: PairedCounts
    quality: QualityResult
    bootstrap: dict | None              # the paired bootstrap interval; None without items
    provenance: dict
    arm_failed: Any = None              # the arm whose server failed under the audit; absent in a table built
                                        # outside the paired stage (an lm-eval sample log, a test)


# -------------------------------------------------------------- serving

@dataclass(frozen=True, kw_only=True)
class LaunchReceipt(Record):
    """``launch/<arm>.json``: what each arm's server was (``serving.launch``), as the promotion reads it."""
    SCHEMA = LAUNCH_SCHEMA
    arm: str
    mode: str
    spec_sha256: str
    model: str | None
    env: dict[str, Any] | None = None            # launch arms only
    command: Any = None
    command_identity: Any = None
    served_model_name: str | None = None
    model_sha256: str | None = None
    max_model_len: int | None = None
    url: str | None = None
    speculative: bool | None = None
    packages: dict | None = None
    server_packages: dict | None = None
    machine: dict | None = None                  # {hostname, platform, cpu_count, accelerators}
    server: dict | None = None                   # what the server reported at launch: /version, /v1/models


@dataclass(frozen=True, kw_only=True)
class PreflightProbe(Record):
    name: str
    reason: str | None = None
    passed: bool = field(default=False, metadata={"key": "pass"})


@dataclass(frozen=True, kw_only=True)
class Preflight(Record):
    """``preflight/<arm>.json``: the rehearsal of the API the audit relies on."""
    SCHEMA = PREFLIGHT_SCHEMA
    arm: str
    verdict: str | None
    failed_probe: str | None
    probes: list[PreflightProbe]
    max_model_len: int | None = None             # as the probes discovered it; None: not learned


@dataclass(frozen=True, kw_only=True)
class AnswersPhase(Record):
    """``answers/<arm>.json`` (the phase record): here only whether the arm's server failed."""
    SCHEMA = PHASE_SCHEMA
    arm: str
    failure: dict | None                         # a serving.failures.FailureRecord; None: it answered everything


@dataclass(frozen=True, kw_only=True)
class ScoresHeader(Record):
    """The header line of ``scores/<dataset>/<arm>.jsonl``."""
    SCHEMA = SCORES_SCHEMA
    dataset: str
    arm: str


# ---------------------------------------------------------- diagnostics

@dataclass(frozen=True, kw_only=True)
class Divergence(Record):
    """One item of ``divergences`` (``contracts.DivergenceRecord``)."""
    index: Any
    diverged: bool | None
    first_divergence: int | None = None           # absent on an item that did not diverge
    control_len: int | None = None
    candidate_len: int | None = None
    control_token_id: int | None = None
    candidate_token_id: int | None = None
    shared_prefix: list[int] | None = None        # the token ids both arms produced before it; None: not known


@dataclass(frozen=True, kw_only=True)
class DivergenceDoc(Record):
    """``divergence/<dataset>.json``: greedy divergences, each arm's top-20 there, grid-tie and determinism."""
    SCHEMA = DIVERGENCE_SCHEMA
    dataset: str
    divergences: list[Divergence]
    items: list | None = None            # the items asked; without it the compared counts are not recorded
    grid_tie: GridTieResult | None
    determinism: DeterminismResult | None = None         # None: no determinism repeats were asked
    probes: dict[str, list[dict]] = field(default_factory=dict)   # arm -> its top-20 at each divergence, from its greedy run
    not_run: str | None = None


# ------------------------------------------------------------- boundary

@dataclass(frozen=True, kw_only=True)
class BoundarySide(Record):
    """One arm's answer to one boundary case, as ``boundary/gate.json`` sets them side by side."""
    text: str | None = None
    extracted: Any = None
    correct: bool | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    ttft_s: float | None = None
    input_tokens_per_s: float | None = None
    config_error: str | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class BoundaryPair(Record):
    """One case of ``boundary/gate.json`` ``cases``: both arms' answers (None: that arm did not run it)."""
    case: str
    expected: str | None
    identical_text: bool | None
    control: BoundarySide | None
    candidate: BoundarySide | None
    planted: list | None = None


@dataclass(frozen=True, kw_only=True)
class FirstLong(Record):
    case: str | None = None
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    input_tokens_per_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class BoundaryGateDoc(Record):
    """``boundary/gate.json``: boundary-v1 over both arms' cases, and the cases side by side."""
    SCHEMA = BOUNDARY_GATE_SCHEMA
    gate: BoundaryResult | None
    max_model_len: dict[str, int | None] = field(default_factory=dict)
    cases: list[BoundaryPair] = field(default_factory=list)
    first_long: dict[str, FirstLong | None] = field(default_factory=dict)


# ---------------------------------------------------------------- speed

@dataclass(frozen=True, kw_only=True)
class SpeedBar(Record):
    """``bar`` of ``speed/decision.json``: the win bar and the metrics it is taken on."""
    win_pct: float
    primary: str
    lower_is_better: list[str]
    guards: list[str] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SpeedSpread(Record):
    """One cell of ``spread``: the control's in-window and archive spread of the primary metric."""
    window_pct: Any                           # per repeat, None where a repeat has no value
    archive_pct: float | None
    archive_n: int | None
    archive_with_window_pct: float | None
    archive_with_window_n: int | None
    win_pct: float | None
    config_hash: str | None
    window_max_pct: float | None = None       # a bracket recorded before it: the report takes the largest repeat


@dataclass(frozen=True, kw_only=True)
class SpeedCellResult(Record):
    """One cell of ``win2``: the rule's result for that cell."""
    verdict: str | None
    primary: dict = field(default_factory=dict)   # win2-v1's per-metric numbers; pooled rules keep none per cell


@dataclass(frozen=True, kw_only=True)
class SpeedArchive(Record):
    path: str | None
    appended: int | None = None


@dataclass(frozen=True, kw_only=True)
class SpeedGate(RuleResult):
    """The speed gate of ``speed/decision.json``: a win2 result with the cells' verdicts."""
    cells: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SpeedStartRecord(Record):
    """One start of ``speed/decision.json`` ``starts`` (``speed.stage``, ``speed.sweep``): its arm and role, when."""
    start: str
    arm: str
    role: str | None = None        # control_before, candidate, ...; a sweep's: control or candidate
    started_at: str | None = None
    stopped_at: str | None = None


@dataclass(frozen=True, kw_only=True)
class SpeedCellRecord(Record):
    """One cell of ``speed/decision.json`` ``cells``, as it ran."""
    name: str
    concurrency: int = 1
    prompt: str | None = None
    input_len: int | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class SpeedDecisionDoc(Record):
    """``speed/decision.json`` (``contracts.SpeedDecision``): the bracket and its gate.

    A bracket that was not measured (``not_run`` says why) carries its gate
    and nothing measured; one that carries its series must carry with them
    the bar and the per-cell results (the figures and the report read them
    together). A gate alone is read as the gate.
    """
    SCHEMA = SPEED_DECISION_SCHEMA
    gate: SpeedGate | None
    audit: str | None = None
    not_run: str | None = None
    failure: dict | None = None                   # the FailureRecord of a server that broke the bracket
    bar: SpeedBar | None = None
    series: dict[str, dict[str, list]] | None = None      # cell -> metric -> per repeat [s1, s2, s3, ...]
    win2: dict[str, SpeedCellResult] | None = None
    spread: dict[str, SpeedSpread] | None = None
    archive: SpeedArchive | None = None
    hosts: list | None = None
    bench_serve: dict[str, dict[str, BenchServeRow | None]] = field(default_factory=dict)
    # one candidate of a sweep's shared-control bracket: its name, the bracket's candidates and every
    # start's arm in run order (pairaudit.speed.sweep); None in a two-arm audit
    sweep: dict | None = None
    starts: list[SpeedStartRecord] = field(default_factory=list)   # in run order
    cells: list[SpeedCellRecord] = field(default_factory=list)
    pooled: dict[str, dict[str, list]] = field(default_factory=dict)  # cell -> start -> per repeat server counters
    params: dict = field(default_factory=dict)                   # the bracket's settings as run
    streams: str | None = None                                   # where its streams.jsonl was written

    MEASURED: ClassVar[tuple[str, ...]] = ("bar", "win2")

    def start_roles(self, n: int) -> list[str]:
        """Each of ``n`` starts' role for this decision: control, candidate, or other (another candidate's
        start in a shared-control bracket); a two-arm bracket alternates control, candidate, ..."""
        arms = (self.sweep or {}).get("arms")
        if not isinstance(arms, list) or len(arms) < n:
            return ["control" if k % 2 == 0 else "candidate" for k in range(n)]
        me = (self.sweep or {}).get("candidate")
        return ["control" if a == "control" else "candidate" if a == me else "other" for a in arms[:n]]

    def validate(self, artifact: str, prefix: str) -> None:
        if self.series is not None:
            for name in self.MEASURED:
                if getattr(self, name) is None:
                    raise FieldError(artifact, prefix + name, "is missing (a measured bracket carries it beside "
                                     "its series)")

    @property
    def primary(self) -> str | None:
        """The primary metric: the bar's, else the gate's parameter (a bracket not measured has no bar)."""
        if self.bar is not None:
            return self.bar.primary
        return None if self.gate is None else self.gate.params.get("primary")

    @property
    def win_pct(self) -> float | None:
        return None if self.bar is None else self.bar.win_pct


@dataclass(frozen=True, kw_only=True)
class ArchivedStart(Record):
    """One line of ``results/control-archive.jsonl`` (``speed.archive.archive_line``): a control start's means."""
    audit: str | None
    cell: str
    config_hash: str | None
    metrics: dict[str, float | None]


@dataclass(frozen=True, kw_only=True)
class LatencySummary(Record):
    """One latency summary of ``vllm bench serve``'s table (``speed.metrics.bench_serve_table``), in ms."""
    mean: float | None = None
    median: float | None = None
    p99: float | None = None


@dataclass(frozen=True, kw_only=True)
class BenchServeRow(Record):
    """``bench_serve[cell][start]`` of ``speed/decision.json``: the client's view of one start."""
    completed: int | None
    failed: int | None
    duration_s: float | None = None          # the cell's waves' wall time in this start
    total_output_tokens: int | None = None
    output_throughput: float | None
    ttft_ms: LatencySummary
    tpot_ms: LatencySummary
    itl_ms: LatencySummary
    e2el_ms: LatencySummary


# ------------------------------------------------------------- decision
# decision.json is the promotion's own artifact; the report, the calibration summary, the
# ledger and ``pairaudit verdict`` read it back through these records.

@dataclass(frozen=True, kw_only=True)
class GateEntry(Record):
    """One gate of decision.json ``gates``: its rule's verdict, the outcome under promotion-v1, key numbers."""
    rule: str | None
    verdict: str | None
    outcome: str | None
    reasons: list[str]
    deviations: dict = field(default_factory=dict)
    stage_verdict: str | None = None
    # the key numbers the calibration summary and the report name (``decision._key_numbers``), per rule
    nondeterministic_arms: list[str] | None = None
    candidate_cases: Any = None
    candidate_failures: Any = None
    control_failures: Any = None
    identical_text_cases: Any = None
    point_gain_pct: float | None = None
    win_pct: float | None = None


@dataclass(frozen=True, kw_only=True)
class DeviationLine(Record):
    """One of decision.json ``deviations``: a loosening of the registered procedure."""
    gate: str
    what: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class DatasetLine(Record):
    """One dataset of decision.json ``datasets`` (``decision._dataset_summary``)."""
    format: str | None
    n: int | None
    indices: list | None
    rule: str | None
    control_correct: int | None
    candidate_correct: int | None
    control_only: list[int]
    candidate_only: list[int]
    net: int | None
    mcnemar_p: float | None
    exact_text_matches: int | None
    natural_finish: dict[str, int | None]
    bodies_identical: bool | None
    verdict: str | None
    loss_bound: dict | None
    needed: int | None
    mde: dict | None
    bootstrap: dict | None


@dataclass(frozen=True, kw_only=True)
class ArmLine(Record):
    """One arm of decision.json ``arms`` (``decision._arm_summary``): its launch receipt and preflight."""
    mode: str | None
    spec_sha256: str | None
    env: dict | None
    command: Any
    model: str | None
    served_model_name: str | None
    model_sha256: str | None
    max_model_len: int | None
    url: str | None
    speculative: bool | None
    machine: dict | None
    preflight: str | None


@dataclass(frozen=True, kw_only=True)
class CalibrationCitation(Record):
    """decision.json ``calibration_ref``: which calibration a decision cites (it never decides).

    ``promotion.calibration.cite`` makes it; the decision writes ``to_json``.
    """
    path: str
    sha256: str
    time: str | None
    audit: str | None
    headline: str
    flagged: list

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "raw"}


@dataclass(frozen=True, kw_only=True)
class DecisionDoc(Record):
    """``promotion/decision.json`` (``contracts.Decision``) as ``decision.decide`` makes it.

    ``change``, ``calibration_ref``, ``evidence`` and ``provenance`` are
    added by ``promotion_stage``: a decision made by ``decide`` alone has none.
    ``gate_verdict`` is checked where recorded.
    """
    SCHEMA = DECISION_SCHEMA
    rule: str
    decision: str
    gates: dict[str, GateEntry | None]
    reasons: list[str]
    deciding_gates: list[str]
    identical_arms: bool
    calibration: bool
    deviations: list[DeviationLine]
    not_evaluated: list[str]
    multiplicity: dict | None
    datasets: dict[str, DatasetLine]
    arms: dict[str, ArmLine]
    switch_diff: list[dict]
    notes: list[str]
    preflight: dict[str, str | None]
    gate_verdict: str | None = None
    change: dict | None = None
    calibration_ref: CalibrationCitation | None = None
    evidence: dict | None = None
    provenance: dict | None = None


@dataclass(frozen=True, kw_only=True)
class LedgerLine(Record):
    """One line of ``results/ledger.jsonl`` (``promotion.ledger.ledger_entry``), as the report lists it."""
    SCHEMA = LEDGER_SCHEMA
    time: str | None
    audit: str | None
    decision: str
    config_sha256: str | None
    not_evaluated: list[str]


@dataclass(frozen=True, kw_only=True)
class LossBound(Record):
    """quality-v2's ``loss_bound``: the one-sided upper bound on the candidate's loss, against the margin."""
    level: float
    upper_pct: float | None
    margin_pct: float
    ruled_out: bool


@dataclass(frozen=True, kw_only=True)
class DetectableLoss(Record):
    """``mde`` (``stats.minimum_detectable_loss``): the smallest net loss the table could show."""
    net_loss: int | None
    rate: float | None


@dataclass(frozen=True, kw_only=True)
class LossFacts(Record):
    """What a quality result, or decision.json's dataset line, says of the loss (``render.loss_text``).

    quality-v1 results carry only ``mde``; the bound and the items needed are quality-v2's.
    """
    loss_bound: LossBound | None = None
    needed: Any = None                   # the rule's {items, ...}, or the dataset line's item count
    mde: DetectableLoss | None = None
