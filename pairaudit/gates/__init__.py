"""The registered decision rules, one module per family; this package is their registry.

Every rule is a pure function of its evidence returning a JSON-able dict with
``rule`` (the registered name), ``verdict``, ``reasons``, ``params`` and
``deviations`` (``common.registered_params``). ``REGISTERED`` maps each
rule's name to its :class:`Rule` (function, registered parameters, the gate
it decides); the decisions select a rule by name through it (``rule``,
``rules_of``, ``Rule.apply``), so that one name always means one rule and a
rule added here is one a config may name.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pairaudit.gates.boundary import BOUNDARY_REQUIRED_CASES, CAPACITY_TAIL_CASE, boundary_missing_cases, boundary_v1
from pairaudit.gates.determinism import determinism_v1
from pairaudit.gates.grid_tie import GRID_TIE_V1, PROBE_CLAUSES, grid_tie_audit, grid_tie_probe, grid_tie_v1
from pairaudit.gates.promotion import NO_CHANGE, promotion_v1
from pairaudit.gates.quality import QUALITY_V1, QUALITY_V2, mde_reason, per_dataset_level, quality_v1, quality_v2
from pairaudit.gates.server_failure import server_failure_v1
from pairaudit.gates.speed import (
    WIN2_V1,
    WIN2_V2,
    WIN2_V3,
    WIN2_V4,
    WIN2_V5,
    bracket_arms,
    evidence_from_controls,
    looks_for,
    sequential_verdicts,
    simulate_sequences,
    simulate_windows,
    sweep_layout,
    sweep_next,
    sweep_round,
    win2_v1,
    win2_v2,
    win2_v2_needed,
    win2_v2_rates,
    win2_v3,
    win2_v3_rates,
    win2_v4,
    win2_v5,
    win2_v5_rates,
    win2_v5_size,
)


@dataclass(frozen=True)
class Rule:
    """One registered rule: its name, the gate it decides, its function and its registered parameters.

    ``apply`` is how every decision calls a rule: the evidence, the
    registered parameters the configuration sets (``params`` may hold other
    keys: a rule reads only its own), and the other inputs the rule takes.
    """
    name: str
    decides: str                        # the gate: quality, grid_tie, determinism, boundary, speed, promotion, servers
    fn: Callable[..., dict]
    params: Mapping[str, Any] = field(default_factory=dict)   # the registered values (common.registered_params)
    takes: tuple[str, ...] = ()         # inputs beyond the evidence and the parameters
    pooled: bool = False                # speed: one verdict over every deciding cell, not one per cell combined
    carries: tuple[str, ...] = ()       # speed: what the gate carries of the result beside verdict and reasons
    sequential: bool = False            # speed: grows the bracket while undecided (the stage asks it for more starts)
    # What the decision's neighbours say of this rule, kept with it so that a rule added here carries them. None is
    # "not registered": ``need`` refuses it and ``registry_problems`` names it at load, never a fallback.
    on_identical_arms: tuple[str, ...] | None = None  # the verdicts an A/A calibration (identical arms) should give
    compares: str | None = None         # speed: how the report says the rule compares the primary metric
    why_not: str | None = None          # every rule but its gate's default: why it is not the default (a deviation)

    def need(self, what: str) -> Any:
        """The registered value of field ``what``; ValueError when this rule registers none."""
        value = getattr(self, what)
        if value is None:
            raise ValueError(f"rule {self.name} registers no {what} (pairaudit.gates.REGISTERED): set it there")
        return value

    def apply(self, data: Any, params: Mapping[str, Any] | None = None, /, **inputs: Any) -> dict:
        """The rule on its evidence ``data``; an input it does not take is not passed (quality-v1 has no
        family size, win2-v2 no host evidence)."""
        given = params or {}
        return self.fn(data, **{k: given[k] for k in self.params if k in given},
                       **{k: v for k, v in inputs.items() if k in self.takes})


_SPEED_INPUTS = ("primary", "guards", "reported", "lower_is_better")
_POOLED_CARRIES = ("noise", "rates", "needed", "pooled_gain_pct", "half_width_pct", "lower_bound_pct", "loss_tests",
                   "repeats", "reported")

# How the report says a sequential rule compares the primary metric.
_SEQ_COMPARES = ("{rule} compares the mean of the candidate starts with the mean of the control starts (alternating "
                 "C, T, C ...), over all repeats and deciding cells")

# Every registered rule, each family's default first: what a config's rules may name, and the one table
# every decision (quality, grid-tie, determinism, boundary, speed, servers, promotion) dispatches through.
# on_identical_arms: what each rule should say when control and candidate are the same server (the A/A
# calibration). Speed: no gain is the right answer (NO_WIN); a WIN or a LOSS is a false alarm, INCONCLUSIVE
# means the host cannot decide at the bar. quality-v2 INCONCLUSIVE on identical arms says the datasets are too
# small to rule out the margin (a sizing fact the gate states with the items needed), not that the host's
# starts disagree: not flagged.
REGISTERED: dict[str, Rule] = {r.name: r for r in (
    Rule("quality-v2", "quality", quality_v2, QUALITY_V2, takes=("datasets",),
         on_identical_arms=("PASS", "INCONCLUSIVE")),
    Rule("quality-v1", "quality", quality_v1, QUALITY_V1, on_identical_arms=("PASS",),
         why_not="quality-v1 passes any net >= 0, so a table too small to see a loss passes as if it had ruled one "
                 "out"),
    Rule("grid-tie-v1", "grid_tie", grid_tie_v1, GRID_TIE_V1, takes=("selected", "compared"),
         on_identical_arms=("PASS",)),
    Rule("determinism-v1", "determinism", determinism_v1, on_identical_arms=("PASS",)),
    Rule("boundary-v1", "boundary", boundary_v1, on_identical_arms=("PASS",)),
    Rule("win2-v5", "speed", win2_v5, WIN2_V5, takes=(*_SPEED_INPUTS, "decide", "max_starts", "evidence", "arms",
                                                          "candidate", "start_names"),
         pooled=True, sequential=True,
         carries=(*_POOLED_CARRIES, "more_starts", "starts", "arms", "looks", "alpha_per_look", "plan",
                  "next_starts", "upper_bound_pct"),
         on_identical_arms=("NO_WIN",), compares=_SEQ_COMPARES.format(rule="win2-v5")),
    Rule("win2-v4", "speed", win2_v4, WIN2_V4, takes=(*_SPEED_INPUTS, "decide", "max_starts", "evidence", "arms",
                                                          "candidate", "start_names"),
         pooled=True, sequential=True,
         carries=(*_POOLED_CARRIES, "more_starts", "starts", "arms", "looks", "alpha_per_look"),
         on_identical_arms=("NO_WIN",), compares=_SEQ_COMPARES.format(rule="win2-v4"),
         why_not="win2-v4's NO_WIN is a precision test (the half-width within the bar), not a bound on the gain: "
                 "a real gain of the bar can end NO_WIN; and its bracket is not sized from the noise"),
    Rule("win2-v3", "speed", win2_v3, WIN2_V3, takes=(*_SPEED_INPUTS, "decide", "max_starts", "evidence", "arms",
                                                          "candidate", "start_names"),
         pooled=True, sequential=True,
         carries=(*_POOLED_CARRIES, "more_starts", "starts", "arms", "looks", "alpha_per_look"),
         on_identical_arms=("NO_WIN",), compares=_SEQ_COMPARES.format(rule="win2-v3"),
         why_not="win2-v3 tests at alpha / looks at every look and gives every loss test an equal share, so it "
                 "needs more starts to decide at the same false WIN/LOSS rates"),
    Rule("win2-v2", "speed", win2_v2, WIN2_V2, takes=(*_SPEED_INPUTS, "decide"), pooled=True,
         carries=_POOLED_CARRIES, on_identical_arms=("NO_WIN",),
         compares="win2-v2 compares s2 with s1 and s3 over all repeats and deciding cells",
         why_not="win2-v2 floors the start-to-start noise at start_noise_pct whatever the host's evidence, so a "
                 "2 % bar is out of reach of one bracket"),
    Rule("win2-v1", "speed", win2_v1, WIN2_V1,
         takes=(*_SPEED_INPUTS, "clock_caps", "throttled", "archive_spread_pct"), on_identical_arms=("NO_WIN",),
         compares="win2-v1 pairs s2 with the mean of s1 and s3",
         why_not="win2-v1 does not bound its false WIN/LOSS under start-level noise"),
    Rule("promotion-v1", "promotion", promotion_v1, takes=("identical_arms",)),
    Rule("server-failure-v1", "servers", server_failure_v1, on_identical_arms=("PASS",)),
)}


def registry_problems(registry: Mapping[str, Rule] | None = None) -> list[str]:
    """What a registered rule lacks of the fields its gate needs (the load check reports them): every rule its
    calibration expectation, every speed rule its report wording, every rule but its gate's default its why-not."""
    table = REGISTERED if registry is None else registry
    speed = [name for name, r in table.items() if r.decides == "speed"]
    first: dict[str, str] = {}
    for name, r in table.items():
        first.setdefault(r.decides, name)
    # promotion-v1 makes the decision itself, not one of its gates: no calibration expectation
    need = {name: (["on_identical_arms"] if table[name].decides != "promotion" else [])
            + (["compares"] if name in speed else [])
            + (["why_not"] if first[table[name].decides] != name else []) for name in table}
    return [f"rule {name} registers no {what} (pairaudit.gates.REGISTERED)"
            for name, whats in need.items() for what in whats if getattr(table[name], what) is None]


def rules_of(decides: str) -> tuple[str, ...]:
    """The registered rules of one gate, its default first."""
    return tuple(name for name, r in REGISTERED.items() if r.decides == decides)


def rule(name: Any, decides: str) -> Rule:
    """The registered rule ``name`` of gate ``decides``; ValueError naming the registered ones otherwise."""
    r = REGISTERED.get(str(name))
    if r is None or r.decides != decides:
        raise ValueError(f"unknown {decides.replace('_', '-')} rule {name!r} "
                         f"(registered: {', '.join(rules_of(decides))})")
    return r


QUALITY_RULES = rules_of("quality")   # rules.quality.rule selects; the default first
SEQUENTIAL_RULES = tuple(name for name, r in REGISTERED.items() if r.sequential)


def default_rule(decides: str) -> Rule:
    """The registered default rule of gate ``decides`` (its first): for a gate no config selects."""
    names = rules_of(decides)
    if not names:
        raise ValueError(f"no rule registered for gate {decides!r}")
    return REGISTERED[names[0]]


def apply_quality(rule_name: str, table: Mapping[str, Any], params: Mapping[str, Any], *, datasets: int = 1) -> dict:
    """The configured quality rule on one table: ``params`` is rules.quality (each rule takes its own keys)."""
    return rule(rule_name, "quality").apply(table, params, datasets=datasets)


__all__ = [
    "BOUNDARY_REQUIRED_CASES", "CAPACITY_TAIL_CASE", "GRID_TIE_V1", "NO_CHANGE", "PROBE_CLAUSES", "QUALITY_RULES",
    "QUALITY_V1", "QUALITY_V2", "REGISTERED", "Rule", "SEQUENTIAL_RULES", "WIN2_V1", "WIN2_V2", "WIN2_V3", "WIN2_V4", "WIN2_V5",
    "apply_quality", "bracket_arms", "default_rule", "registry_problems",
    "boundary_missing_cases", "boundary_v1", "determinism_v1", "evidence_from_controls", "grid_tie_audit",
    "grid_tie_probe", "grid_tie_v1", "looks_for", "mde_reason", "per_dataset_level", "promotion_v1", "quality_v1",
    "quality_v2", "rule", "rules_of", "sequential_verdicts", "server_failure_v1", "simulate_sequences", "simulate_windows", "sweep_layout",
    "sweep_next", "sweep_round", "win2_v1",
    "win2_v2", "win2_v2_needed", "win2_v2_rates", "win2_v3", "win2_v3_rates", "win2_v4", "win2_v5", "win2_v5_rates", "win2_v5_size",
]
