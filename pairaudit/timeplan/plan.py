"""The time plan: how long an audit will hold its host, per phase and arm, before any server starts.

Each step of the audit (a server start, an arm's sampled items, greedy runs
and boundary cases, the speed bracket's starts, the jobs that start no
server, the diagnostics among them) gets an **expected** and a **worst-case** wall time:

* from this host's own history (:mod:`pairaudit.timeplan.history`) where a
  server of the same identity (the launch receipt's ``spec_sha256``) ran
  before: its starts' time to healthy (a server's first start on the host
  apart: it may compile), its phases' served time, scaled to this config's
  item counts; expected is the median, worst the slowest seen times
  ``HISTORY_MARGIN``;
* else from the config alone, with the assumptions of the server's kind
  (:data:`KINDS`) stated on the step and in the plan's ``assumptions``:
  expected at those rates with answers half their ``max_tokens`` long, worst at
  half those rates with every answer ``max_tokens`` long, a start at most its
  ``health_timeout_s`` (a start slower than that fails).

The worst case takes every growth the config allows: the speed bracket at its
``max_starts``, every answer at its ``max_tokens``. The
phases are summed: one server per machine is the default profile's
``server_slots=1``, so the phases of one audit run one after the other.

The plan is an artifact of its own (``contracts.TIME_PLAN_SCHEMA``, with its
content hash), written at the start of every run that has jobs to run
(``plan/<UTC time>.json`` under the audit); the promotion sets the latest one
against what each phase took (:mod:`pairaudit.timeplan.actual`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from pairaudit import gates
from pairaudit.core import artifacts
from pairaudit.core.artifacts import utc_now
from pairaudit.core.contracts import ARMS, TIME_PLAN_SCHEMA, audit_dir, audit_path
from pairaudit.core.settings import AuditSettings, SpeedSettings
from pairaudit.serving.armspec import ArmSpec
from pairaudit.speed.bracket import WINDOW_DEADLINE_ENV
from pairaudit.timeplan.history import History, epoch, med

PHASES = ("answers", "speed", "diagnostics", "other")
# The slowest start or phase seen, times this, is the worst case from history: a host that ran a
# phase in 60 s once may run it in 75 s under another job's load (the CPU default took 428-720 s).
HISTORY_MARGIN = 1.25
# Worst case from assumptions: half the assumed rates, a start at three times its assumed time.
ASSUMED_SLOWDOWN = 2.0
ASSUMED_START_FACTOR = 3.0
# Expected length of a sampled answer, as a share of max_tokens (an assumption; every answer at
# max_tokens is the worst case).
ASSUMED_FILL = 0.5


@dataclass(frozen=True)
class Kind:
    """What a plan assumes of a server it has no history of (every number stated as an assumption)."""
    name: str
    start_s: float                # a warm start's time to healthy
    cold_start_s: float           # a server's first start on a host (compiling, caches)
    decode_tps: float             # generated tokens per second of one stream
    batch: int                    # streams that decode at that rate together (more queue)
    prefill_tps: float            # prompt tokens per second
    basis: str                    # where the numbers come from


KINDS = {
    "refserver-cpu": Kind("refserver-cpu", 4.0, 4.0, 30.0, 2, 400.0,
                          "the reference server on a 2-core CPU: 3.0-4.8 s to healthy, 29.8 tokens/s at "
                          "concurrency 1, a 2048-token prefill in about 5 s"),
    "refserver-gpu": Kind("refserver-gpu", 6.0, 6.0, 500.0, 2, 40000.0,
                          "the reference server on one GPU: 5.0-6.3 s to healthy on an H200, about 1,000 "
                          "generated tokens/s at concurrency 16"),
    "vllm-gpu": Kind("vllm-gpu", 65.0, 190.0, 300.0, 16, 50000.0,
                     "vLLM on one H100: a first start 187 s (compiling), later ones 57-68 s; 800 items at "
                     "about 147 items/s"),
    "vllm-cpu": Kind("vllm-cpu", 40.0, 60.0, 10.0, 2, 200.0,
                     "vLLM's CPU build at float32 on a 2-core CPU"),
    "attach": Kind("attach", 0.0, 0.0, 30.0, 4, 1000.0,
                   "an attached server is already up (no start); its rates are unknown"),
    "other": Kind("other", 60.0, 120.0, 20.0, 4, 1000.0, "a server of no known kind"),
}


def server_kind(spec: ArmSpec) -> str:
    """The :data:`KINDS` entry an arm's server is planned as when the host has no history of it."""
    if spec.mode == "attach":
        return "attach"
    cmd = list(spec.command_identity or ())
    on_gpu = spec.gpus > 0 or bool(spec.env.get("CUDA_VISIBLE_DEVICES"))
    if any("vllm" in a for a in cmd):
        return "vllm-gpu" if on_gpu else "vllm-cpu"
    if any("pairaudit.refserver" in a for a in cmd):
        device = next((cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "--device"), "cpu")
        return "refserver-gpu" if device.startswith("cuda") else "refserver-cpu"
    return "other"


@dataclass(frozen=True)
class ArmFacts:
    """What the plan needs of one arm's server: its identity (to find its history) and its kind."""
    arm: str
    spec_sha256: str
    kind: str
    health_timeout_s: float
    max_model_len: int | None = None

    @classmethod
    def of(cls, spec: ArmSpec) -> ArmFacts:
        return cls(arm=spec.arm, spec_sha256=spec.spec_sha256, kind=server_kind(spec),
                   health_timeout_s=float(spec.health_timeout_s), max_model_len=spec.max_model_len)


@dataclass(frozen=True)
class Step:
    """One line of the plan: a phase's part on one arm, how many, how long (expected, worst) and from what."""
    phase: str
    arm: str | None
    what: str
    count: int
    expected_s: float
    worst_s: float
    source: str                   # "history" | "assumed"
    basis: str                    # the records or the assumptions the numbers come from

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TimePlan:
    """The plan of one audit on one host (``contracts.TIME_PLAN_SCHEMA``); ``steps`` in the order they run."""
    audit: str
    host: str | None
    window_min: float | None
    steps: tuple[Step, ...]
    assumptions: tuple[str, ...] = ()
    history: tuple[str, ...] = ()           # the starts logs the history came from
    created_at: str = field(default_factory=utc_now)

    def phase(self, name: str) -> tuple[float, float]:
        """(expected, worst) seconds of one phase."""
        steps = [s for s in self.steps if s.phase == name]
        return sum(s.expected_s for s in steps), sum(s.worst_s for s in steps)

    @property
    def expected_s(self) -> float:
        return sum(s.expected_s for s in self.steps)

    @property
    def worst_s(self) -> float:
        return sum(s.worst_s for s in self.steps)

    @property
    def assumed(self) -> bool:
        return any(s.source == "assumed" for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"schema": TIME_PLAN_SCHEMA, "audit": self.audit, "host": self.host, "created_at": self.created_at,
                "window_min": self.window_min, "expected_s": self.expected_s, "worst_s": self.worst_s,
                "phases": {p: dict(zip(("expected_s", "worst_s"), self.phase(p))) for p in PHASES},
                "fits": None if self.window_min is None else self.worst_s <= 60.0 * self.window_min,
                "steps": [s.to_json() for s in self.steps], "assumptions": list(self.assumptions),
                "history": list(self.history)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str = "time plan") -> TimePlan:
        if doc.get("schema") != TIME_PLAN_SCHEMA:
            raise artifacts.ArtifactError(f"{where}: schema {doc.get('schema')!r}, expected {TIME_PLAN_SCHEMA!r}")
        try:
            steps = tuple(Step(**s) for s in doc["steps"])
            return cls(audit=doc["audit"], host=doc["host"], window_min=doc["window_min"], steps=steps,
                       assumptions=tuple(doc["assumptions"]), history=tuple(doc["history"]),
                       created_at=doc["created_at"])
        except (KeyError, TypeError) as exc:
            raise artifacts.ArtifactError(f"{where}: not a time plan ({exc})") from None


# ----------------------------------------------------------------- building

@dataclass(frozen=True)
class _Start:
    expected_s: float
    worst_s: float
    source: str
    basis: str


class _Planner:
    def __init__(self, arms: Mapping[str, ArmFacts], history: History):
        self.arms, self.history = arms, history
        self.assumptions: dict[str, str] = {}
        self.started: set[str] = set()          # specs this plan has started once already

    def kind(self, arm: str) -> Kind:
        k = KINDS[self.arms[arm].kind]
        self.assumptions[k.name] = f"assumed ({k.name}): {k.basis}"
        return k

    def start(self, arm: str) -> tuple[_Start, str]:
        """The next start of ``arm``'s server in this plan, and its label (cold or warm)."""
        facts = self.arms[arm]
        spec = facts.spec_sha256
        first = spec not in self.started
        self.started.add(spec)
        hist = self.history.starts(spec)
        if hist:
            warm, cold = self.history.warm(spec), self.history.cold(spec)
            seen = warm or cold
            worst = min(facts.health_timeout_s, max(seen) * HISTORY_MARGIN)
            return _Start(med(seen) or 0.0, worst, "history",
                          f"{len(hist)} earlier start(s) of this server here, {len(warm)} warm: "
                          f"median {med(seen):.1f} s, slowest {max(seen):.1f} s"), "warm"
        k = self.kind(arm)
        s = k.cold_start_s if first else k.start_s
        return _Start(s, min(facts.health_timeout_s, ASSUMED_START_FACTOR * s) if s else 0.0, "assumed",
                      f"assumed {s:g} s ({k.name}), worst {ASSUMED_START_FACTOR:g}x, at most health_timeout_s "
                      f"{facts.health_timeout_s:g}"), ("cold" if first else "warm")

    def served(self, arm: str, phase: str) -> list[float]:
        return [s.served_s for s in self.history.starts(self.arms[arm].spec_sha256, phase) if s.served_s is not None]


def _items(settings: AuditSettings) -> dict[str, int]:
    """Dataset -> selected items: the indices the load selected, else an integer ``select.count``."""
    out = {}
    for d in settings.datasets:
        if d.indices is not None:
            out[d.name] = len(d.indices)
        else:
            count = d.select.get("count")
            out[d.name] = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return out


def _decode_s(tokens: float, k: Kind, concurrency: int) -> float:
    return tokens / (k.decode_tps * max(1, min(concurrency, k.batch)))


def _speed_start_assumed(speed: SpeedSettings, k: Kind, first: bool) -> float:
    """One bracket start's measured work (warm-up and repeats) at a kind's assumed rates, without the start."""
    total = 0.0
    for c in speed.cells:
        wave = c.input_len / k.prefill_tps + speed.output_len / k.decode_tps * max(1.0, c.concurrency / k.batch)
        warm = wave * (2 if first and speed.repeat_s else 1)
        repeat = max(speed.repeat_s or 0.0, speed.waves * wave)
        total += warm + speed.repeats * repeat
    return total


def build_plan(settings: AuditSettings, arms: Mapping[str, ArmFacts], history: History, *, audit: str,
               sampling: Mapping[str, Any], window_min: float | None = None) -> TimePlan:
    """The audit's plan on the host ``history`` is of (see the module docstring)."""
    p = _Planner(arms, history)
    steps: list[Step] = []
    items = _items(settings)
    n_items = sum(items.values())
    max_tokens = int(sampling.get("max_tokens") or 0)
    concurrency = int(sampling.get("concurrency") or 1)
    candidates = [a for a in arms if a != ARMS[0]]

    def add_start(phase: str, arm: str) -> None:
        st, label = p.start(arm)
        steps.append(Step(phase, arm, f"server start ({label})", 1, st.expected_s, st.worst_s, st.source, st.basis))

    # answers: one start per arm, its sampled items and boundary cases
    for arm in arms:
        add_start("answers", arm)
        phases = [a for a in history.answers_phases(arms[arm].spec_sha256) if a.items]
        if phases:
            # the sampled items (with the preflight) scale with the items, the boundary cases with the cases
            # (a phase's served time holds its greedy runs too: they scale with the items as well)
            per_item = [(a.served_s - a.boundary_s) / a.items for a in phases]
            steps.append(Step("answers", arm, f"{n_items} sampled items, their greedy runs and the preflight", n_items,
                              med(per_item) * n_items, max(per_item) * n_items * HISTORY_MARGIN, "history",
                              f"{len(phases)} earlier answers phase(s) of this server here: "
                              f"{1 / med(per_item):.2f} items/s (median), {1 / max(per_item):.2f} (slowest)"))
            per_case = [a.boundary_s / a.cases for a in phases if a.cases]
            if settings.boundary is not None:
                cases = len(settings.boundary.fractions) + len(settings.boundary.tail_offsets)
                steps.append(Step("answers", arm, f"{cases} boundary cases", cases, med(per_case) * cases,
                                  max(per_case, default=0.0) * cases * HISTORY_MARGIN, "history",
                                  f"{len(per_case)} earlier answers phase(s) with boundary cases here"
                                  if per_case else "no boundary case recorded apart from the sampled items"))
        else:
            k = p.kind(arm)
            expected = _decode_s(n_items * max_tokens * ASSUMED_FILL, k, concurrency)
            worst = _decode_s(n_items * max_tokens, k, concurrency) * ASSUMED_SLOWDOWN
            steps.append(Step("answers", arm, f"{n_items} sampled items", n_items, expected, worst, "assumed",
                              f"assumed {k.decode_tps:g} tokens/s a stream, {min(concurrency, k.batch)} at once "
                              f"({k.name}); answers {ASSUMED_FILL:.0%} of max_tokens {max_tokens} (worst: all of "
                              f"it, at half the rate)"))
            # the greedy runs of every item and the determinism repeats, on the same server: the items' runs
            # at the sampling concurrency, the repeats one at a time
            g = settings.greedy
            repeats = g.determinism_repeats * len(items)
            steps.append(Step("answers", arm, f"{n_items} greedy runs and {repeats} determinism repeats",
                              n_items + repeats,
                              _decode_s(n_items * g.max_tokens * ASSUMED_FILL, k, concurrency)
                              + _decode_s(repeats * g.max_tokens * ASSUMED_FILL, k, 1),
                              (_decode_s(n_items * g.max_tokens, k, concurrency)
                               + _decode_s(repeats * g.max_tokens, k, 1)) * ASSUMED_SLOWDOWN, "assumed",
                              f"assumed {k.decode_tps:g} tokens/s a stream ({k.name}); greedy answers "
                              f"{ASSUMED_FILL:.0%} of greedy.max_tokens {g.max_tokens} (worst: all of it, at half "
                              "the rate)"))
            if settings.boundary is not None:
                b = settings.boundary
                cases = len(b.fractions) + len(b.tail_offsets)
                # the longest case fills the context; the retrieval cases are fractions of it
                one = (arms[arm].max_model_len or 2048) / k.prefill_tps + _decode_s(b.retrieval_max_tokens, k, 1)
                steps.append(Step("answers", arm, f"{cases} boundary cases", cases, cases * one * ASSUMED_FILL,
                                  cases * one * ASSUMED_SLOWDOWN, "assumed",
                                  f"assumed a prefill of up to max_model_len at {k.prefill_tps:g} tokens/s "
                                  f"({k.name})"))

    # speed: the bracket, control first and last, alternating with each candidate
    if settings.speed is not None:
        speed = settings.speed
        worst_n = speed.max_starts if len(candidates) <= 1 else 1 + len(candidates) * (speed.max_starts - 1)
        hist_n = [sum(1 for s in a.starts if s.phase == "speed") for a in history.audits
                  if any(s.phase == "speed" and s.spec_sha256 == arms[ARMS[0]].spec_sha256 for s in a.starts)]
        first_look = 1 + 2 * max(1, len(candidates))
        pilot = gates.rule(speed.rule, "speed").params.get("pilot_starts")
        if pilot is not None and len(candidates) <= 1:
            # a rule sized from its pilot looks first after it (win2-v5: 7 starts, or max_starts if fewer): no
            # two-arm bracket of it ends sooner, whatever the change
            first_look = gates.speed.pilot_of(int(pilot), speed.max_starts)
        expected_n = min(worst_n, max(first_look, int(med(hist_n) or first_look)))
        order = [ARMS[0]] + [a for _ in range(worst_n) for c in candidates for a in (c, ARMS[0])]
        for i, arm in enumerate(order[:worst_n]):
            st, label = p.start(arm)
            served = p.served(arm, "speed")
            if served:
                work_e, work_w, src = med(served) or 0.0, max(served) * HISTORY_MARGIN, "history"
                basis = f"{len(served)} earlier bracket start(s) of this server here; start: {st.basis}"
            else:
                k = p.kind(arm)
                w = _speed_start_assumed(speed, k, first=i == 0)
                work_e, work_w, src = w, w * ASSUMED_SLOWDOWN, "assumed"
                basis = (f"assumed {k.decode_tps:g} tokens/s ({k.name}) for {len(speed.cells)} cells x "
                         f"{speed.repeats} repeats; start: {st.basis}")
            grows = i >= expected_n
            source = "history" if src == st.source == "history" else "assumed"
            steps.append(Step("speed", arm, f"bracket start s{i + 1} ({label}{', if the bracket grows' if grows else ''})",
                              1, 0.0 if grows else st.expected_s + work_e, st.worst_s + work_w, source, basis))

    # the jobs that start no server: datasets, requests, scoring, pairing, the promotion
    gaps = _job_overhead(history, {f.spec_sha256 for f in arms.values()})
    if gaps:
        steps.append(Step("other", None, "jobs without a server (datasets, scoring, pairing, promotion)", 1,
                          med(gaps) or 0.0, max(gaps) * HISTORY_MARGIN, "history",
                          f"{len(gaps)} earlier audit(s) of these servers here: the wall time between their "
                          "first server start and their decision that no server held"))
    else:
        jobs = len(items) * len(arms) * 3 + 6
        steps.append(Step("other", None, f"about {jobs} jobs without a server", jobs, 1.5 * jobs,
                          1.5 * jobs * ASSUMED_SLOWDOWN, "assumed",
                          "assumed 1.5 s a job (interpreter start and imports: 7.5 s over 40 jobs of the CPU "
                          "default) and the scoring of generated suites"))
        p.assumptions["jobs"] = "assumed: 1.5 s for each job that starts no server"
    return TimePlan(audit=audit, host=history.host, window_min=window_min, steps=tuple(steps),
                    assumptions=tuple(p.assumptions.values()), history=history.sources)


def _job_overhead(history: History, specs: set[str]) -> list[float]:
    """Per earlier finished audit of these servers: its last run's wall time up to its decision, less its servers'.

    The run began when it wrote its plan; an audit with no plan is counted from its first server start (the
    jobs before it, datasets and requests, are then missed), and only when its span is one run's: an audit
    resumed a day later would count the day.
    """
    out = []
    for a in history.audits:
        if a.finished_at is None or not any(s.spec_sha256 in specs for s in a.starts):
            continue
        began = a.began_at if a.began_at is not None else min(s.started_at for s in a.starts)
        run = [s for s in a.starts if s.started_at >= began - 1.0]
        busy = sum(s.ready_s + (s.served_s or 0.0) for s in run)
        if not run or (a.began_at is None and a.finished_at - began > 3 * busy + 600):
            continue
        out.append(max(0.0, a.finished_at - began - busy))
    return out


# ------------------------------------------------------------------ window

def shrink_advice(plan: TimePlan, settings: AuditSettings | None, window_min: float) -> str:
    """Which phase to shrink, and by how much, for ``plan`` to fit ``window_min`` in its worst case."""
    over = plan.worst_s - 60.0 * window_min
    worst = {ph: plan.phase(ph)[1] for ph in PHASES}
    biggest = max(worst, key=lambda ph: worst[ph])
    line = (f"shrink the {biggest} phase (worst case {worst[biggest] / 60:.1f} min) by at least "
            f"{over / 60:.1f} min")
    if over > worst[biggest]:
        rest = ", ".join(f"{ph} {worst[ph] / 60:.1f} min" for ph in sorted(worst, key=lambda x: -worst[x])
                         if ph != biggest and worst[ph] > 0)
        line += f" (more than its whole worst case: the others too, {rest})"
    speed = settings.speed if settings is not None else None
    if speed is not None and speed.max_starts > 3:
        starts = [s for s in plan.steps if s.phase == "speed"]
        for m in range(speed.max_starts - 2, 2, -2):
            saved = sum(s.worst_s for s in starts[m:])
            if saved >= over:
                return f"{line}; speed.max_starts {speed.max_starts} -> {m} saves {saved / 60:.1f} min"
    if biggest == "answers":
        n = max((s.count for s in plan.steps if s.phase == "answers" and "items" in s.what), default=0)
        per = sum(s.worst_s for s in plan.steps if s.phase == "answers" and "items" in s.what) / max(1, n)
        if per > 0:
            return f"{line}; about {math.ceil(over / per)} fewer selected items (datasets[*].select.count)"
    return line


def window_problem(plan: TimePlan, settings: AuditSettings | None) -> str | None:
    """The load check's refusal of a plan whose worst case exceeds ``window_min`` (None when it fits)."""
    if plan.window_min is None or plan.worst_s <= 60.0 * plan.window_min:
        return None
    basis = ("this host's history" if not plan.assumed else "stated assumptions" if not plan.history
             else "this host's history and stated assumptions")
    return (f"window_min: {plan.window_min:g} min is shorter than the audit's worst case "
            f"{plan.worst_s / 60:.1f} min (expected {plan.expected_s / 60:.1f} min, from {basis}; "
            f"`pairaudit plan` lists every step): {shrink_advice(plan, settings, plan.window_min)}, or allow a "
            f"window of at least {math.ceil(plan.worst_s / 60)} min")


# --------------------------------------------------------------- deadline

# the speed job reads it (pairaudit.speed.bracket.window_deadline); the workflow's load sets it
DEADLINE_ENV = WINDOW_DEADLINE_ENV


def speed_deadline(plan: TimePlan, window_start: float) -> float | None:
    """When the speed bracket must have finished its last start (epoch seconds): the window's end less the
    worst case of what may still run after it (the diagnostics and the jobs without a server)."""
    if plan.window_min is None:
        return None
    after = plan.phase("diagnostics")[1] + plan.phase("other")[1]
    return window_start + 60.0 * plan.window_min - after


# ------------------------------------------------------------------ output

def _fmt(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def render_text(plan: TimePlan) -> str:
    """The plan as the terminal shows it: totals first, then each phase and arm, then the assumptions."""
    head = (f"time plan of audit {plan.audit} on host {plan.host or '?'}: expected {_fmt(plan.expected_s)}, "
            f"worst case {_fmt(plan.worst_s)}")
    if plan.window_min is not None:
        fits = plan.worst_s <= 60 * plan.window_min
        head += f"; window {plan.window_min:g} min: {'fits' if fits else 'does NOT fit'}"
    lines = [head, f"  {'phase':<12}{'arm':<11}{'expected':>10}{'worst':>10}  what (from)"]
    for ph in PHASES:
        rows: dict[tuple, list[Step]] = {}
        for s in plan.steps:
            if s.phase == ph:
                rows.setdefault((s.arm, s.what.split(" (")[0]), []).append(s)
        for (arm, what), group in rows.items():
            n = len(group)
            src = "history" if all(s.source == "history" for s in group) else "ASSUMED"
            label = f"{what}{f' x{n}' if n > 1 else ''}"
            lines.append(f"  {ph:<12}{arm or '-':<11}{_fmt(sum(s.expected_s for s in group)):>10}"
                         f"{_fmt(sum(s.worst_s for s in group)):>10}  {label} ({src})")
    for a in plan.assumptions:
        lines.append(f"  {a}")
    if not plan.history:
        lines.append("  no earlier audit of these servers on this host: every step is assumed from the config")
    return "\n".join(lines)


def runs_audit(jobs: Iterable[Any], audit: str) -> bool:
    """Whether any of a run's jobs (Snakemake's, at onstart) writes under ``results/<audit>/``: a run of the
    calibration alone writes none there, and must leave no plan in an audit it does not run."""
    prefix = audit_dir(audit).rstrip("/") + "/"
    return any(str(f).startswith(prefix) for job in jobs for f in job.output)


def write_plan(plan: TimePlan, audit: str) -> str:
    """Write the plan of a run that is starting as ``plan/<UTC time>.json`` under the audit; returns its path."""
    stamp = plan.created_at.replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
    path = audit_path(TIME_PLAN_SCHEMA, audit).format(run=stamp)
    artifacts.write_json(path, plan.to_json())
    return path


def latest_plan(audit: str, *, before: float | None = None) -> tuple[str, TimePlan] | None:
    """The latest plan written for ``audit`` (at or before ``before``, epoch seconds), or None."""
    d = Path(audit_dir(audit)) / Path(audit_path(TIME_PLAN_SCHEMA)).parent
    found: list[tuple[str, TimePlan]] = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            plan = TimePlan.from_json(artifacts.read_json(p), where=str(p))
        except artifacts.ArtifactError:
            continue
        if before is None or (epoch(plan.created_at) or 0.0) <= before:
            found.append((str(p), plan))
    return found[-1] if found else None


def arm_facts(specs: Mapping[str, ArmSpec]) -> dict[str, ArmFacts]:
    return {arm: ArmFacts.of(spec) for arm, spec in specs.items()}
