"""The registered decision rules, one module per family; this package is their registry.

Every rule is a pure function of its evidence returning a JSON-able dict with
``rule`` (the registered name), ``verdict``, ``reasons``, ``params`` and
``deviations`` (``common.registered_params``). Stages read a rule through this
registry (``gates.quality_v1``) so that one name always means one rule.
"""

from pairaudit.gates.boundary import BOUNDARY_REQUIRED_CASES, CAPACITY_TAIL_CASE, boundary_missing_cases, boundary_v1
from pairaudit.gates.determinism import determinism_v1
from pairaudit.gates.grid_tie import GRID_TIE_V1, PROBE_CLAUSES, grid_tie_audit, grid_tie_probe, grid_tie_v1
from pairaudit.gates.promotion import NO_CHANGE, promotion_v1
from pairaudit.gates.quality import (QUALITY_RULES, QUALITY_V1, QUALITY_V2, apply_quality, mde_reason,
                                     per_dataset_level, quality_v1, quality_v2)
from pairaudit.gates.server_failure import server_failure_v1
from pairaudit.gates.speed import (
    WIN2_V1,
    WIN2_V2,
    WIN2_V3,
    WIN2_V4,
    SEQUENTIAL_RULES,
    bracket_arms,
    evidence_from_controls,
    looks_for,
    sequential_verdicts,
    simulate_sequences,
    simulate_windows,
    win2_v1,
    win2_v2,
    win2_v2_needed,
    win2_v2_rates,
    win2_v3,
    win2_v3_rates,
    win2_v4,
)

# name -> the rule's function: what a config's `rules:` section may name
REGISTERED = {
    "quality-v2": quality_v2,
    "quality-v1": quality_v1,
    "grid-tie-v1": grid_tie_v1,
    "determinism-v1": determinism_v1,
    "boundary-v1": boundary_v1,
    "win2-v1": win2_v1,
    "win2-v2": win2_v2,
    "win2-v4": win2_v4,
    "win2-v3": win2_v3,
    "promotion-v1": promotion_v1,
    "server-failure-v1": server_failure_v1,
}

__all__ = [
    "BOUNDARY_REQUIRED_CASES", "CAPACITY_TAIL_CASE", "GRID_TIE_V1", "NO_CHANGE", "PROBE_CLAUSES", "QUALITY_RULES",
    "QUALITY_V1", "QUALITY_V2", "REGISTERED", "SEQUENTIAL_RULES", "WIN2_V1", "WIN2_V2", "WIN2_V3", "WIN2_V4", "apply_quality", "bracket_arms",
    "boundary_missing_cases", "boundary_v1", "determinism_v1", "evidence_from_controls", "grid_tie_audit",
    "grid_tie_probe", "grid_tie_v1", "looks_for", "mde_reason", "per_dataset_level", "promotion_v1", "quality_v1",
    "quality_v2", "sequential_verdicts", "server_failure_v1", "simulate_sequences", "simulate_windows", "win2_v1",
    "win2_v2", "win2_v2_needed", "win2_v2_rates", "win2_v3", "win2_v3_rates", "win2_v4",
]
