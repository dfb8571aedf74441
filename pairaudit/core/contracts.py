"""Every artifact's contract in one place: its schema id, where it lands, the fields of the main records.

A schema id is written into each artifact's ``"schema"`` field by its stage and
checked by every reader (``artifacts.check_schema``, or the artifact's record
in ``readers``, which checks its fields too); the constants below are the only
spelling of those ids. ``PATHS`` gives where each artifact lands,
relative to ``results/<audit>/`` unless it starts with ``results/`` (logs shared
by every audit), and where the files that are no artifact of their own go
(journals, logs, the promotion's reports); the rules take their input, output
and log patterns from it (``artifact`` in ``rules/common.smk``), the library
every path it composes (``audit_path``, ``journal_path``).

The TypedDicts at the end document the fields of the main records once; the
modules that write them point here. ``pairaudit.core.readers`` reads them back
as frozen records.

This module imports nothing from the package, so every module can import it.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

ARMS = ("control", "candidate")
# The finish reason of an answer the model ended itself; anything else (a
# length cut, an abort) cannot count as a fair comparison of the two arms.
NATURAL_FINISH = "stop"

# ------------------------------------------------------------- schema ids

ARM_SPEC_SCHEMA = "pairaudit.arm-spec/v1"
BISECT_SCHEMA = "pairaudit.bisect/v1"
BISECT_PROBES_SCHEMA = "pairaudit.bisect-probes/v1"
BOUNDARY_PLAN_SCHEMA = "pairaudit.boundary.cases-plan/v1"
BOUNDARY_SCHEMA = "pairaudit.boundary/v1"
BOUNDARY_GATE_SCHEMA = "pairaudit.boundary_gate/v1"
CALIBRATION_SCHEMA = "pairaudit.calibration/v1"
CALIBRATION_LOG_SCHEMA = "pairaudit.calibration_log/v1"
CONTROL_ARCHIVE_SCHEMA = "pairaudit.control_archive/v1"
DATASET_SCHEMA = "pairaudit.dataset/v1"
DECISION_SCHEMA = "pairaudit.decision/v1"
DIVERGENCE_SCHEMA = "pairaudit.divergence/v1"
GREEDY_SCHEMA = "pairaudit.greedy/v1"
LAUNCH_SCHEMA = "pairaudit.launch/v1"
LEDGER_SCHEMA = "pairaudit.ledger/v1"
MANIFEST_SCHEMA = "pairaudit.manifest/v1"
PAIRED_SCHEMA = "pairaudit.paired/v1"
PHASE_SCHEMA = "pairaudit.phase/v1"
PREFLIGHT_SCHEMA = "pairaudit.preflight/v1"
REQUESTS_SCHEMA = "pairaudit.requests/v1"
SAMPLED_SCHEMA = "pairaudit.sampled/v1"
SCORES_SCHEMA = "pairaudit.scores/v1"
SERVER_START_SCHEMA = "pairaudit.server-start/v1"
SPEED_DECISION_SCHEMA = "pairaudit.speed_decision/v1"
SPEED_STREAMS_SCHEMA = "pairaudit.speed_streams/v1"
TIME_PLAN_SCHEMA = "pairaudit.time-plan/v1"

# ------------------------------------------------------------------ paths
# Keys of PATHS that are no schema of their own: the files and directories an
# audit writes beside its artifacts.  A journal pattern is relative to the
# audit directory like the rest; the phases take the journal directory and
# place each journal under it by its pattern (``journal_path``).

DIAGNOSTICS_PHASE = "diagnostics-phase"    # the diagnostics phase's record (PHASE_SCHEMA, like answers/{arm}.json)
JOURNAL = "journal"                        # the append-only journals, outside every job's outputs
JOURNAL_SAMPLED = "journal-sampled"        # every attempt at every item (JournalAttempt)
JOURNAL_PREFLIGHT = "journal-preflight"    # every start's preflight rehearsal
JOURNAL_BOUNDARY = "journal-boundary"      # every boundary case answered
JOURNAL_FAILURES = "journal-failures"      # every server failure of an answers phase, with its confirmation
JOURNAL_GREEDY = "journal-greedy"          # every greedy run and determinism repeat (the answers phase's)
LOGS = "logs"                              # the jobs' logs, logs/<stage>/...
BISECT_REPORT = "bisect-report"
EXPORTS_LMEVAL = "exports-lm-eval"
EXPORTS_VLLM_BENCH = "exports-vllm-bench"
SERVER_LOG = "server-log"                  # one phase's server output, by phase and arm (or bracket start)
REPORT_MD = "report-md"                    # the promotion's reports and figures (promotion_stage writes them)
REPORT_SUMMARY = "report-summary"
REPORT_HTML = "report-html"
REPORT_PAIRED_PLOT = "report-paired-plot"
REPORT_DIVERGENCE_PLOT = "report-divergence-plot"
REPORT_BOUNDARY = "report-boundary"
REPORT_SPEED_PLOT = "report-speed-plot"
REPORT_ARCHIVE_PLOT = "report-archive-plot"

# Every audit's directory is results/<audit>/; what every audit shares sits in results/ itself.
RESULTS = "results"

PATHS = {
    ARM_SPEC_SCHEMA: "specs/{arm}.json",
    REQUESTS_SCHEMA: "requests/{dataset}/{arm}.json",
    BOUNDARY_PLAN_SCHEMA: "boundary/plan.json",
    LAUNCH_SCHEMA: "launch/{arm}.json",
    PREFLIGHT_SCHEMA: "preflight/{arm}.json",
    PHASE_SCHEMA: "answers/{arm}.json",   # and diagnostics/phase.json
    BOUNDARY_SCHEMA: "boundary/{arm}.json",
    BOUNDARY_GATE_SCHEMA: "boundary/gate.json",
    DATASET_SCHEMA: "datasets/{dataset}.json",
    SAMPLED_SCHEMA: "sampled/{dataset}/{arm}.jsonl",
    SCORES_SCHEMA: "scores/{dataset}/{arm}.jsonl",
    PAIRED_SCHEMA: "paired/{dataset}.json",
    GREEDY_SCHEMA: "greedy/{dataset}/{arm}.jsonl",
    DIVERGENCE_SCHEMA: "divergence/{dataset}.json",
    SPEED_DECISION_SCHEMA: "speed/decision.json",
    SPEED_STREAMS_SCHEMA: "speed/streams.jsonl",
    TIME_PLAN_SCHEMA: "plan/{run}.json",     # one per run that had jobs to run, {run} its UTC start
    SERVER_START_SCHEMA: "servers/starts.jsonl",
    BISECT_SCHEMA: "bisect/result.json",
    BISECT_REPORT: "bisect/report.md",
    BISECT_PROBES_SCHEMA: "journal/bisect/{key}.json",
    DECISION_SCHEMA: "promotion/decision.json",
    MANIFEST_SCHEMA: "promotion/manifest.json",
    CALIBRATION_SCHEMA: "promotion/calibration.json",
    LEDGER_SCHEMA: "results/ledger.jsonl",
    CONTROL_ARCHIVE_SCHEMA: "results/control-archive.jsonl",
    CALIBRATION_LOG_SCHEMA: "results/calibrations.jsonl",
    DIAGNOSTICS_PHASE: "diagnostics/phase.json",
    JOURNAL: "journal",
    JOURNAL_SAMPLED: "journal/sampled/{dataset}/{arm}.jsonl",
    JOURNAL_PREFLIGHT: "journal/preflight/{arm}.jsonl",
    JOURNAL_BOUNDARY: "journal/boundary/{arm}.jsonl",
    JOURNAL_FAILURES: "journal/failures/{arm}.jsonl",
    JOURNAL_GREEDY: "journal/greedy/{dataset}/{arm}.jsonl",
    LOGS: "logs",
    EXPORTS_LMEVAL: "exports/lm-eval",       # the evidence in other tools' formats (pairaudit.interop): no self-hash
    EXPORTS_VLLM_BENCH: "exports/vllm-bench",
    SERVER_LOG: "logs/servers/{name}.log",
    REPORT_MD: "promotion/report.md",
    REPORT_SUMMARY: "promotion/summary.rst",
    REPORT_HTML: "promotion/decision.html",
    REPORT_PAIRED_PLOT: "promotion/paired.png",
    REPORT_DIVERGENCE_PLOT: "promotion/divergence.png",
    REPORT_BOUNDARY: "promotion/boundary.html",
    REPORT_SPEED_PLOT: "promotion/speed.png",
    REPORT_ARCHIVE_PLOT: "promotion/control_archive.png",
}

# Directories of an audit that hold no artifacts (append-only logs and job
# logs): the load-time check of every artifact's self-hash skips them.
NOT_ARTIFACT_DIRS = tuple(dict.fromkeys(PATHS[k].split("/")[0]
                                         for k in (JOURNAL, LOGS, SERVER_START_SCHEMA, EXPORTS_LMEVAL)))


def audit_dir(audit: str) -> str:
    """``results/<audit>``: where an audit's artifacts land."""
    return f"{RESULTS}/{audit}"


def audit_path(key: str, audit: str | None = None) -> str:
    """Where ``PATHS[key]`` lands: under ``results/<audit>/`` unless shared by every audit (``results/...``).

    Without ``audit``, the path relative to the audit directory (shared paths stay as they are).
    """
    path = PATHS[key]
    if path.startswith(f"{RESULTS}/") or audit is None:
        return path
    return f"{audit_dir(audit)}/{path}"


# A sweep (several candidates against one control, docs/sweeps.md): the per-arm artifacts stay where they
# are, an arm per candidate beside the control; what compares the control with one candidate (its paired
# tables, greedy runs and divergences, gates, decision, reports) lands under candidates/<name>/, at the
# path it has in a two-arm audit; the sweep's own summary under sweep/.
CANDIDATES_DIR = "candidates"
SWEEP_SUMMARY = "pairaudit.sweep-summary/v1"   # schema id of sweep/summary.json (promotion/sweep.py)
SWEEP_SUMMARY_MD = "sweep-summary-md"
SWEEP_SUMMARY_HTML = "sweep-summary-html"
SWEEP_PATHS = {
    SWEEP_SUMMARY: "sweep/summary.json",
    SWEEP_SUMMARY_MD: "sweep/summary.md",
    SWEEP_SUMMARY_HTML: "sweep/summary.html",
}


def arm_role(arm: str) -> str:
    """An arm's role in a comparison: ``control``, or ``candidate`` for any other arm (a sweep's candidates
    are arms named by their change; each is compared with the control as the candidate)."""
    return ARMS[0] if arm == ARMS[0] else ARMS[1]


def candidate_path(key: str, audit: str, candidate: str) -> str:
    """Where a sweep's candidate keeps ``PATHS[key]``: ``results/<audit>/candidates/<candidate>/<path>``."""
    return f"{audit_dir(audit)}/{CANDIDATES_DIR}/{candidate}/{PATHS[key]}"


def sweep_path(key: str, audit: str) -> str:
    """Where a sweep's summary lands (``SWEEP_PATHS``), under ``results/<audit>/``."""
    return f"{audit_dir(audit)}/{SWEEP_PATHS[key]}"


def journal_path(journal_dir: str, key: str, **fields: str) -> str:
    """The journal ``key`` (``JOURNAL_*``) with its fields filled, under the audit's ``journal_dir``."""
    rel = PATHS[key].format(**fields)
    root = PATHS[JOURNAL]
    if not rel.startswith(f"{root}/"):
        raise KeyError(f"{key}: {rel} is not a journal (under {root}/)")
    return f"{journal_dir}/{rel[len(root) + 1:]}"


# ---------------------------------------------------------------- records
# The fields of the main records, documented once. They are plain JSON dicts
# on disk; these TypedDicts are their contract (writers fill them by these
# names), not runtime checks: what the promotion reads back is checked at run
# time by the artifact's record in ``pairaudit.core.readers``.


class Timings(TypedDict):
    started_at: str                 # ISO-8601 UTC, when the request was sent
    elapsed_s: float | None


class JournalAttempt(TypedDict):
    """One line of ``journal/sampled/<dataset>/<arm>.jsonl``: one attempt at one item (append-only)."""
    index: int
    attempt: int                    # 1, 2, ... per item; the first final attempt is the primary answer
    body_sha256: str                # sha256 of the request body without ``model``: equal across arms
    body: dict                      # the request as sent, every sampling field explicit
    status: int | None              # HTTP status; None = transport error (the item stays open)
    response: dict | None           # the body of a 200
    error_body: Any                 # the server's own words on any other status
    error: str | None
    finish_reason: str | None
    usage: dict | None
    timings: Timings
    server: dict                    # {"url", "pid"} of the server that answered


class SampledRecord(JournalAttempt, total=False):
    """One record of ``sampled/<dataset>/<arm>.jsonl``: the item's first final attempt, in index order."""
    prior_attempts: list[JournalAttempt]   # earlier attempts without a final answer, kept as evidence


class PairingFacts(TypedDict):
    """What ``stats.paired_table`` reads of an arm's sampled record: a SampledRecord has these keys, and so
    has the stand-in ``interop.lmeval`` builds for a sample log, which has no journal behind it."""
    index: int
    body_sha256: str
    error: str | None


class ScoreRecord(TypedDict, total=False):
    """One record of ``scores/<dataset>/<arm>.jsonl`` (``scoring.score_records``), same order as sampled."""
    index: int
    id: str
    correct: bool                   # the PRIMARY verdict; diagnostics never replace it
    extracted: str | None           # what was read out of the answer (number, boxed LaTeX, code)
    reason: str                     # why, in words a reviewer can check, e.g. "strict match '#### 72' == gold 72"
    method: str                     # "strict-regex", "math-verify", "normalized-string", "sandbox", ...
    finish_reason: str | None
    answered: bool
    text: str | None                # the scored text: chat message.content (null content = no answer)
    reasoning: str | None           # message.reasoning / reasoning_content, kept, never scored
    clamped: bool                   # the server lowered max_tokens (client.clamping); never a natural finish
    clamp: dict | None              # the client.clamping record when clamped
    # gsm8k
    gold: Any                       # the reference answer (gsm8k, math)
    flexible: dict                  # {extracted, correct}: the last number, as lm-eval's flexible filter
    comparison: str                 # "numeric"
    lm_eval_exact_match: bool
    # math
    boxed_command: str | None       # "boxed" | "fbox"
    math_verify: dict | None        # {equal, error}
    # mbpp / humaneval
    code_source: str                # where the code was read from (a fenced block, the whole text)
    program_layout: str             # humaneval: how prompt and completion were joined
    tests_total: int
    tests_failed: int | None
    first_failure: str | None
    sandbox: dict                   # mechanism, fallback_reason, isolation, harness report
    stderr_tail: str
    judged_by: str                  # code: "split" (calls in the sandbox, expectations compared outside) | "in_sandbox"
    split: dict                     # judged_by split: {assertions, calls, failed, incomplete}
    split_refused: str              # judged_by in_sandbox: why the tests did not split


class PairedTable(TypedDict):
    """``table`` of ``paired/<dataset>.json`` (``stats.paired_table``): both arms scored item by item."""
    n: int                          # paired items
    indices: list[int]              # sorted item indices
    control_correct: int
    candidate_correct: int
    both_correct: int
    neither_correct: int
    control_only: list[int]         # items only the control got right (b)
    candidate_only: list[int]       # items only the candidate got right (c)
    net: int                        # len(candidate_only) - len(control_only)
    mcnemar_p: float                # exact two-sided on (b, c)
    exact_text_matches: int
    exact_text_match_indices: list[int]
    bodies_identical: bool
    body_mismatch_indices: list[int]
    natural_finish: dict[str, int | None]           # arm -> items that ended with finish_reason "stop"; None where
                                                    # the source records no finish reason (an lm-eval sample log)
    unnatural_finish_indices: dict[str, list[int]]
    unanswered_indices: dict[str, list[int]]
    error_indices: dict[str, list[int]]


class GreedyRecord(TypedDict, total=False):
    """One record of ``greedy/<dataset>/<arm>.jsonl`` (``answers.greedy.greedy_one``; determinism repeats too)."""
    index: Any
    body: dict
    body_sha256: str                # sha256 of the canonical full body
    request_sha256: str             # ... without model and cache_salt: equal across arms
    status: int | None
    error: str | None               # HTTP error, transport error or a parse error
    response_body: Any              # the server's own words, on an error
    token_ids: list[int]            # generated ids incl. a final EOS, from logprobs
    text: str | None
    finish_reason: str | None
    usage: dict | None
    top20: list[list[list[float]]]  # per generated position: [[id, logprob], ...] as served, unrounded
    salt: str                       # a fresh cache_salt per generation
    output_sha256: str | None       # sha256 of canonical JSON of token_ids (None on error)
    clamped: bool                   # the server lowered max_tokens
    clamp: dict | None
    timings: Timings
    # journaled by the answers phase's GreedyPlan beside each run:
    run: str                        # "greedy" | "determinism"
    slot: Any                       # the item index (greedy) or the repeat number (determinism)
    key: dict                       # what the run was asked under (max_tokens, determinism index, template kwargs)
    prompt_ids: list[int]           # the chat prompt as the server's own template rendered it
    messages_sha256: str            # the item's chat messages the prompt was rendered from


class ProbeResult(TypedDict, total=False):
    """A forced-prefix top-20 probe of the switch bisection (``answers.greedy.run_probe``)."""
    top20: list[list[float]] | None  # [[id, logprob], ...] after prompt + shared prefix
    token_id: int | None
    salt: str
    body: dict
    body_sha256: str
    status: int | None
    error: str | None
    response_body: Any
    prompt_tokens: int | None       # usage.prompt_tokens as the server counted it
    sent_prompt_len: int            # len(prompt_ids) + len(prefix) as sent
    timings: Timings


class GreedyTop(TypedDict):
    """One arm's evidence at one divergence in ``divergence/<dataset>.json`` ``probes`` (``greedy.greedy_tops``).

    From the arm's own greedy run: at the first divergence both arms share the
    prompt and the prefix, so the run's top-20 there is the arm's distribution
    on the shared prefix. No extra request is made."""
    index: Any
    first_divergence: int | None    # the position k both arms reached with the same k tokens
    source: str                     # where the top list comes from: "greedy" (the arm's greedy run at k)
    top20: list[list[float]] | None  # [[id, logprob], ...] at position k, as served; None: not available (error)
    token_id: int | None            # the arm's greedy token at k
    prompt_tokens: int | None       # the greedy run's usage.prompt_tokens, as the server counted it
    prefix_len: int | None          # prompt_tokens + k: the shared prefix the arm decoded position k after
    salt: str | None                # the greedy run's cache_salt
    error: str | None               # why there is no top list (a failed run, an output ending at k)


class DivergenceRecord(TypedDict):
    """One item of ``divergence/<dataset>.json`` ``divergences`` (``greedy.divergence_records``)."""
    index: Any
    diverged: bool | None           # None: not comparable (an error, or equal up to a server's clamp)
    first_divergence: int | None    # first position whose token ids differ
    control_token_id: int | None    # ids at first_divergence (None past an output's end)
    candidate_token_id: int | None
    shared_prefix: list[int] | None
    prefix_equal: bool
    control_len: int
    candidate_len: int
    control_greedy_top: list | None   # each arm's own greedy top-20 at first_divergence
    candidate_greedy_top: list | None
    clamped: list[str]              # arms whose server lowered max_tokens
    error: str | None
    prompt_ids_equal: NotRequired[bool]  # set by the phase: both arms' templates rendered the same prompt


class BisectProbe(TypedDict):
    """One subset's probe of one item in ``bisect/result.json`` (``pairaudit.bisect.stage``)."""
    on: list[str]                   # the switches on (every other at rollback), in the change's order
    token_id: int | None            # the probed server's greedy token at the divergence
    outcome: str                    # "candidate" | "control" | "other" | "error"
    moved: bool | None              # token_id is the candidate's; None on a failed probe
    top20: list[list[float]] | None  # [[id, logprob], ...] at the divergence, as served
    error: str | None


class BisectItemResult(TypedDict):
    """One divergent greedy item of ``bisect/result.json``."""
    dataset: str
    index: int
    first_divergence: int
    control_token_id: int
    candidate_token_id: int
    status: str                     # "found" | "not_reproduced" | "moves_without_switches" | "undecided"
    responsible: list[str] | None   # the smallest switch set that gives the candidate's token
    asked: int                      # distinct subsets this item's search asked (confirmations incl.)
    bound: int                      # 2 * k * ceil(log2 n) + 2, k = len(responsible)
    probes: list[BisectProbe]       # every subset asked, in order


class BoundaryCase(TypedDict, total=False):
    """One case of ``boundary/<arm>.json`` ``cases``, in the order run."""
    case: str                       # "retrieval-0.125" | "tail-16" | "tail-32" ...
    kind: str                       # "retrieval" | "tail"
    prompt_tokens: int              # built and sent, as token ids
    max_tokens: int
    planted: list[int]
    expected: str                   # e.g. "343 706 657"
    positions: list[int]            # token index of each planted sentence
    prompt_sha256: str
    request: dict                   # the body without the ids
    status: int | None
    text: str | None
    finish_reason: str | None
    usage: dict | None
    usage_prompt_tokens: int | None
    extracted: list[int]            # numbers in the answer
    correct: bool                   # exactly the planted values, in order
    ttft_s: float | None
    e2el_s: float | None
    started_at: str                 # ISO-8601 UTC, when the request was sent
    input_tokens_per_s: float | None  # prompt tokens / TTFT
    error: str | None
    error_body: Any
    clamped: bool                   # max_tokens silently lowered
    clamp: dict | None
    config_error: str | None        # the server refused the request (4xx), or clamped a case that did not fit
    key: str                        # journal only: the plan, context and salt the case was asked under


class SpeedDecision(TypedDict, total=False):
    """``speed/decision.json``: the bracket and its gate (details of each part: ``pairaudit/speed/bracket.py``).

    Read back as ``readers.SpeedDecisionDoc``."""
    schema: str
    audit: str
    gate: dict                      # the speed verdict as a rule result: rule, verdict, reasons, params,
                                    # deviations, stage_deviations, informational, decision_cells, cells,
                                    # clock_check; win2-v2 also noise, rates, needed, pooled_gain_pct, ...
    win2: dict                      # per cell: the rule's result for that cell
    bar: dict                       # {win_pct, primary, guards, reported, lower_is_better}
    starts: list[dict]              # s1, s2, s3: role, arm, host, clock before/after, server facts, warm-up
    hosts: list[str]
    clock_check: dict
    cells: list[dict]               # each cell as run, with its prompt_tokens
    pooled: dict                    # cell -> start -> per repeat pooled server counters and rates
    series: dict                    # cell -> metric -> per repeat [s1, s2, s3]
    deviations: list[dict]
    bench_serve: dict               # cell -> start -> vllm bench serve's table
    spread: dict                    # cell -> in-window and archive spread of the primary metric
    archive: dict                   # {path, appended}
    streams: str                    # path of streams.jsonl
    params: dict
    provenance: dict
    not_run: str                    # why the bracket was not measured (then the gate is INCONCLUSIVE)
    failure: dict                   # a failures.FailureRecord of the server that broke the bracket
    sweep: dict                     # one candidate of a shared-control bracket (pairaudit.speed.sweep): its
                                    # name, the bracket's candidates and arm per start, its windows, the
                                    # control starts it was compared to and those pooled into its variance


class Decision(TypedDict, total=False):
    """``promotion/decision.json`` (``promotion.decision.decide`` + ``promotion.stage.promotion_stage``), in full::

    {"schema": "pairaudit.decision/v1", "rule": "promotion-v1",
     "decision": "PROMOTE" | "HOLD" | "REJECT" | "INCONCLUSIVE",
     "reasons": [str, ...],          # promotion-v1: one line per gate, in gate order
                                     # (identical arms: "no change under audit: ..." first)
     "deciding_gates": [str, ...],   # the gates whose outcome is the decision; ["arms"] for identical arms
     "gate_verdict": str,            # what the gates alone give (differs only for identical arms)
     "identical_arms": bool,         # control and candidate have the same spec_sha256
     "calibration": bool,            # decided in A/A calibration mode
     "deviations": [{"gate", "what", "detail"}],   # every loosening (decision_deviations): gates not
                                     # evaluated, non-registered parameters, informational gates,
                                     # gates applied to part of their evidence, calibration
     "gates": {name: None | {"rule", "verdict", "outcome", "reasons": [every reason],
                             "deviations": {...}, ...key numbers of that rule}},
     "not_evaluated": [str, ...],
     "multiplicity": None | {"gates": "quality", "method": "bonferroni", "datasets", "family_level",
                             "per_dataset_level", "statement"},   # how quality-v2's per-dataset bounds hold
                                     # together over the audit; None when no quality-v2 gate decided
     "datasets": {name: {"format", "n", "indices", "rule", "control_correct", "candidate_correct",
                         "loss_bound": None | {"method", "level", "upper_pct", "loss_pct", "margin_pct",
                                               "ruled_out"},          # quality-v2's Tango bound
                         "needed": int | None,   # quality-v2 INCONCLUSIVE: about how many items would rule out the margin
                         "control_only": [int], "candidate_only": [int], "net", "mcnemar_p",
                         "exact_text_matches", "natural_finish": {arm: int},
                         "bodies_identical", "verdict",
                         "mde": stats.minimum_detectable_loss | None,   # smallest detectable net loss
                         "bootstrap": {...} | None}},
     "arms": {arm: {"mode", "spec_sha256", "env", "command", "model", "served_model_name",
                    "model_sha256", "max_model_len", "url", "packages", "machine",
                    "preflight": "PASS" | "FAIL" | None}},
     "switch_diff": [{"name", "control", "candidate"}],   # None = not set by that arm
     "change": None | {"name", "description", "switches": [{"kind": "env" | "flag", "name", "rollback", "on",
                                                            "speculative"}],
                       "control", "candidate", "receipts_agree": bool, "receipt_problems": [str]},
                                     # added by promotion_stage in the change form (pairaudit/plans/change.py);
                                     # a disagreement with the launch receipts is also a note
     "notes": [str, ...],            # comparability facts that do not decide (e.g. model differs)
     "preflight": {arm: "PASS" | "FAIL" | None},
     "calibration_ref": None | {"path", "sha256", "time", "audit", "headline", "flagged"},
                                     # added by promotion_stage: the latest A/A calibration of the same
                                     # control spec on the same host (pairaudit/promotion/calibration.py); it never
                                     # changes the decision, and None is stated in the report
     "evidence": {                   # added by promotion_stage from the later stages' artifacts
       "boundary_cases": None | [{"case", "planted", "expected", "identical_text",
                                  arm: None | {"text", "extracted", "correct", "finish_reason", "prompt_tokens",
                                               "max_tokens", "ttft_s", "input_tokens_per_s", "config_error"}}],
       "speed": None | {"primary", "win_pct", "hosts", "cells": {cell: {"verdict", "repeats_s1_s2_s3",
                                                                        "point_gain_pct", "t_interval",
                                                                        "max_control_spread_pct"}}}}}
    """
    schema: str
    rule: str                       # "promotion-v1"
    decision: str                   # PROMOTE | HOLD | REJECT | INCONCLUSIVE
    reasons: list[str]              # one line per gate, in gate order ("no change under audit" first for identical arms)
    deciding_gates: list[str]       # the gates whose outcome is the decision; ["arms"] for identical arms
    gate_verdict: str               # what the gates alone give (differs only for identical arms)
    identical_arms: bool            # control and candidate have the same spec_sha256
    calibration: bool               # decided in A/A calibration mode
    deviations: list[dict]          # every loosening: {gate, what, detail}
    gates: dict                     # name -> None | {rule, verdict, outcome, reasons, deviations, key numbers}
    not_evaluated: list[str]
    multiplicity: dict | None       # quality-v2: Bonferroni over the datasets (method, levels, statement)
    datasets: dict                  # name -> the paired summary: counts, only-control/candidate, mcnemar_p, mde, ...
    arms: dict                      # arm -> mode, spec_sha256, env, command, model, max_model_len, packages, ...
    switch_diff: list[dict]         # {name, control, candidate}; None = not set by that arm
    change: dict | None             # the change form's name, switches and receipt check; None for two stated arms
    notes: list[str]                # comparability facts that do not decide
    preflight: dict                 # arm -> PASS | FAIL | None
    calibration_ref: dict | None    # the latest A/A calibration of the same control on the same host; never decides
    evidence: dict                  # boundary cases side by side, the speed summary
    provenance: dict
