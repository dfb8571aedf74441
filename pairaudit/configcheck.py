"""Load-time checks of the workflow config: everything that can be known before any job runs.

The Snakefile derives the arms of a config in the change form (``server`` +
``change``, :mod:`pairaudit.plans.change`) and then calls :func:`check_at_load`
right after the schema validation,
so a bad config fails with ``snakemake -n`` too, before a server is started.
The schema covers shapes and enums; this covers what needs code or files:

* every arm resolves (:func:`pairaudit.serving.armspec.resolve_spec`: command
  placeholders, env values, ...), and a reference-server arm's switches parse
  and suit the ``--device``/``--dtype`` its command names
  (:mod:`pairaudit.refserver.switches`), and its ``max_model_len`` fits the
  model's context;
* every dataset entry: unique names, the template, the source (a local file
  exists and matches its ``sha256`` pin, a package ships its file, a hub file
  is pinned), the selection against the source's size -- by building the
  dataset document exactly as the dataset stage will
  (:func:`pairaudit.datasets.formats.check_dataset`; never over the network: a hub
  file not yet in the cache is checked when it is downloaded);
* ``sampling.max_tokens`` (and ``greedy.max_tokens`` when set) against each
  arm's ``max_model_len`` and the longest selected prompt: counted in tokens
  with the served model's own tokenizer and chat template when the arm serves
  the embedded model (or a local model directory) on the reference server,
  else bounded by the prompt's UTF-8 bytes (a note, not an error: a byte
  bound cannot prove a prompt too long);
* the speed cells (:func:`pairaudit.speed.bracket.resolve`, unique names) and
  the boundary cases (:func:`pairaudit.boundary.cases.settings` / ``case_plan``);
* with ``rules.quality.detect_loss_pct`` set, a note for each dataset whose
  selected count cannot see that net loss (:func:`pairaudit.quality.sizing.detect_loss_notes`);
* under quality-v2, a note for each dataset whose selected count is too small to
  rule out ``rules.quality.margin_pct`` at the discordance the last audit (the
  ledger) or the host's A/A calibration observed, else a stated default
  (:func:`pairaudit.quality.sizing.margin_notes`): a note, never a refusal;
* the calibration keys (:func:`pairaudit.promotion.calibration.check`): a calibration's
  audit name and identical arms, and no audit named like another's calibration;
* the audit's time plan on this host (:func:`check_window`,
  :mod:`pairaudit.timeplan.plan`), printed before any server starts; with
  ``window_min`` set, a plan whose worst case exceeds the window is refused,
  naming the phase to shrink and by how much;
* every artifact already under ``results/<audit>/`` still has the content its
  writer recorded (:func:`pairaudit.core.artifacts.verify_tree`), so an edited
  file is refused by name even when Snakemake would rerun nothing.

Each section is resolved here once, into its frozen record
(:mod:`pairaudit.core.settings`): speed, boundary, greedy, rules and every
dataset entry with its selected item indices.  ``check_at_load`` returns them
as ``CheckResult.settings``, and the rules hand each job its section's record;
no job resolves, defaults or selects again.

Every message names the key path, the value and what is allowed.  Nothing
here starts a server, loads a model or touches the network.

YAML syntax errors: Snakemake parses ``--configfile`` files itself, before
the Snakefile runs, and reports only "Config file is not valid JSON or YAML"
(the parser's error, with file, line and column, survives only in the
``--verbose`` traceback).  ``python -m pairaudit.configcheck [--configfile
FILE ...] [--replace-workflow-config]`` reads the same files the way
Snakemake does and names file, line and column; it then runs every check
above on the merged config.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pairaudit import gates
from pairaudit.core import artifacts, defaults
from pairaudit.core.contracts import ARMS, CANDIDATES_DIR, DECISION_SCHEMA, MANIFEST_SCHEMA, PATHS, RESULTS, audit_dir
from pairaudit.core.settings import (
    AuditSettings,
    BoundarySettings,
    DatasetSettings,
    GreedySettings,
    RulesSettings,
    SamplingSettings,
    ScoringSettings,
    SettingsError,
    SpeedSettings,
)
from pairaudit.datasets import formats as datasets
from pairaudit.plans import change
from pairaudit.promotion import calibration
from pairaudit.quality import sizing
from pairaudit.quality.sizing import SelectedCount
from pairaudit.refserver import switches as ref_switches
from pairaudit.serving import armspec, gpupool
from pairaudit.serving.armspec import ArmSpec

SERVER_SLOTS_ENV = "PAIRAUDIT_SERVER_SLOTS"
AUDIT_ENV = "PAIRAUDIT_AUDIT"
EMBEDDED_MODELS = ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")


class ConfigCheckError(ValueError):
    """The config (or an artifact it would reuse) cannot run; the message lists every problem, one per line."""


@dataclass
class CheckResult:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # name -> dataset document, for the entries whose rows were at hand
    documents: dict[str, dict] = field(default_factory=dict)
    # each entry's selected item count where the load knows it (the document's, else an integer select.count)
    selected: list[SelectedCount] = field(default_factory=list)
    # each section resolved once, here; ``settings`` is set only when nothing is wrong
    datasets: list[DatasetSettings] = field(default_factory=list)
    speed: SpeedSettings | None = None
    boundary: BoundarySettings | None = None
    greedy: GreedySettings | None = None
    rules: RulesSettings | None = None
    sampling: SamplingSettings | None = None
    scoring: ScoringSettings | None = None
    settings: AuditSettings | None = None
    # each arm's resolved spec; and the audit's time plan on this host (pairaudit.timeplan.plan.TimePlan),
    # made by check_window once every other check passed
    specs: dict[str, ArmSpec] = field(default_factory=dict)
    plan: Any = None

    def raise_if_problems(self) -> None:
        if self.problems:
            raise ConfigCheckError(format_problems(self.problems))


def format_problems(problems: list[str]) -> str:
    n = len(problems)
    return (f"config check: {n} problem{'s' if n != 1 else ''} (nothing has run):\n"
            + "\n".join(f"  - {p}" for p in problems))


# ------------------------------------------------------------------- arms

def is_refserver(spec: ArmSpec) -> bool:
    """A launch arm whose command runs the embedded reference server."""
    return spec.mode == "launch" and any("pairaudit.refserver" in a for a in spec.command_identity or ())


def model_dir(spec: ArmSpec) -> Path | None:
    """The directory holding a reference-server arm's tokenizer, if it is on disk now (never converted here)."""
    if not is_refserver(spec):
        return None
    from pairaudit.serving import modelstore

    if spec.model in EMBEDDED_MODELS:
        # The converted copy is keyed by the packaged file's pinned sha256, which
        # the server checks at start; hashing the 98 MB file here is not needed.
        d = modelstore.cache_root() / "models" / modelstore.EMBEDDED_GGUF_SHA256
    else:
        d = Path(spec.model)
    return d if (d / "tokenizer.json").is_file() else None


BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> set[str] | None:
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def bf16_emulation_note(spec: ArmSpec, flags: set[str] | None = None) -> str | None:
    """A launched CPU vLLM (no ``gpus`` scheduled) in bfloat16 on a CPU without bf16 instructions: slow, emulated."""
    cmd = list(spec.command_identity or ())
    if spec.mode != "launch" or not any("vllm" in a for a in cmd) or spec.gpus > 0:
        return None
    dtype = next((cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "--dtype"), None)
    if dtype not in ("bfloat16", "bf16"):
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None or flags & set(BF16_FLAGS):
        return None
    return ("--dtype bfloat16 on a CPU without AVX512-BF16 or AMX-BF16 (/proc/cpuinfo): vLLM's CPU build "
            "computes bfloat16 in emulation here, measured at 0.3-2.4 generated tokens/s on a 2-core AVX2 host "
            "against tens for float32, so this arm's phases take hours; the audit is still valid, only slow "
            "(config/examples/vllm-cpu-fp16.yaml audits a real vLLM change this CPU runs at float32 speed)")


def check_arms(config: Mapping[str, Any], result: CheckResult) -> dict[str, ArmSpec]:
    """Each arm resolved once (``armspec.resolve_spec``), with the checks that need its resolved spec."""
    specs = {}
    given = config.get("arms") or {}
    # a sweep's arms are the control and one per candidate (derived at load); the two-arm form has exactly ARMS
    names = list(given) if change.is_sweep(config) else list(ARMS)
    extra = [] if change.is_sweep(config) else [a for a in given if a not in ARMS]
    for arm in extra:
        result.problems.append(f"arms.{arm}: unknown arm (allowed: control and candidate; several candidates are "
                               "a sweep: server + candidates, docs/sweeps.md)")
    for arm in names:
        cfg = given.get(arm)
        if cfg is None:
            result.problems.append(f"arms.{arm}: missing (allowed: a launch or attach arm)")
            continue
        try:
            spec = armspec.resolve_spec(arm, cfg)
        except armspec.ConfigError as exc:
            result.problems.append(str(exc))
            continue
        specs[arm] = spec
        note = bf16_emulation_note(spec)
        if note:
            result.notes.append(f"arms.{arm}.command: {note}")
        if is_refserver(spec):
            # the switches' values, and their fit to the --device/--dtype the command names
            for p in ref_switches.check_arm(dict(spec.env), list(spec.command_identity or ())):
                where = "command: " if p.startswith("--") else "env."
                result.problems.append(f"arms.{arm}.{where}{p}")
            mdir = model_dir(spec)
            if mdir is not None and spec.max_model_len:
                try:
                    limit = json.loads((mdir / "config.json").read_text()).get("max_position_embeddings")
                except (OSError, ValueError):
                    limit = None
                if isinstance(limit, int) and spec.max_model_len > limit:
                    result.problems.append(
                        f"arms.{arm}.max_model_len: {spec.max_model_len} exceeds the context of model "
                        f"{spec.model} ({limit} tokens; allowed: 16..{limit})")
    return specs


# --------------------------------------------------------------- datasets

def check_datasets(config: Mapping[str, Any], result: CheckResult, *, base_dir: Path, cache_dir: Path) -> None:
    seen: dict[str, int] = {}
    for i, entry in enumerate(config.get("datasets") or []):
        where = f"datasets[{i}]"
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str):
            if name in seen:
                # the workflow keys datasets by name: a second entry would silently replace the first
                result.problems.append(f"{where}.name: {name!r} is already the name of datasets[{seen[name]}] "
                                       f"(allowed: a name no other entry has)")
                continue
            seen[name] = i
        try:
            doc = datasets.check_dataset(entry, cache_dir=cache_dir, base_dir=base_dir, where=where)
        except datasets.DatasetError as exc:
            result.problems.append(str(exc))
            continue
        except OSError as exc:  # an unreadable source file
            result.problems.append(f"{where}.source: {exc}")
            continue
        if doc is None:
            result.notes.append(f"{where} ({name}): the hub file is not downloaded yet; its size, selection and "
                                f"prompt lengths are checked when the dataset stage downloads it")
        elif isinstance(name, str):  # a document is built only for an entry with a name
            result.documents[name] = doc
        result.datasets.append(datasets.resolve_entry(entry, doc, where=where, base_dir=base_dir))
        count = entry["select"].get("count")
        n = (len(doc["indices"]) if doc is not None
             else count if isinstance(count, int) and not isinstance(count, bool) else None)
        if n is not None:
            result.selected.append(SelectedCount(where=where, name=entry["name"], n=n))


# ---------------------------------------------------------------- lengths

_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(mdir: Path):
    key = str(mdir)
    if key not in _TOKENIZERS:
        from pairaudit.refserver.tokenizer import ChatTokenizer

        _TOKENIZERS[key] = ChatTokenizer(mdir)
    return _TOKENIZERS[key]


def chat_prompt_tokens(tok, messages: list[dict], chat_template_kwargs: Mapping[str, Any]) -> int:
    """Prompt tokens of a chat request, counted as the reference server counts them."""
    kwargs = {"add_generation_prompt": True, **dict(chat_template_kwargs or {})}
    text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    return len(tok(text, add_special_tokens=False).input_ids)


def _longest(doc: dict, measure) -> tuple[int, int]:
    best = (-1, -1)
    for item in doc["items"]:
        n = measure(item["messages"])
        if n > best[0]:
            best = (n, item["index"])
    return best


def byte_bound(messages: list[dict]) -> int:
    """An upper bound on a chat prompt's tokens without a tokenizer.

    Every token of a byte-level tokenizer covers at least one byte of the
    rendered text, so the rendered bytes bound the count; a ChatML-style
    template adds under 48 bytes per message (markers, role, newlines) and as
    much for the generation prompt.  A template that adds text of its own
    (a default date line, a default system prompt) can exceed it, which is
    why this bound only ever proves a fit.
    """
    return sum(len(m["content"].encode()) + 48 for m in messages) + 48


def check_lengths(config: Mapping[str, Any], specs: Mapping[str, ArmSpec], result: CheckResult) -> None:
    sampling = config.get("sampling") or {}
    asked = [("sampling.max_tokens", sampling.get("max_tokens"))]
    if result.greedy is not None:
        asked.append(("greedy.max_tokens", result.greedy.max_tokens))
    budgets: list[tuple[str, int]] = [(k, v) for k, v in asked if isinstance(v, int) and not isinstance(v, bool)]
    kwargs = sampling.get("chat_template_kwargs") or {}
    names = [d.get("name") for d in config.get("datasets") or [] if isinstance(d, dict)]
    exact: dict[tuple[str, str], tuple[int, int]] = {}  # (model dir, dataset) -> (tokens, index)
    bound = {name: _longest(doc, byte_bound) for name, doc in result.documents.items()}
    for arm, spec in specs.items():
        mml = spec.max_model_len
        if not mml:
            continue
        mdir = model_dir(spec)
        # The embedded model's template is ChatML, so the byte bound holds for it and,
        # when it proves a fit, spares loading the tokenizer at every workflow load.
        bound_holds = spec.model in EMBEDDED_MODELS
        for key, max_tokens in budgets:
            if max_tokens >= mml:
                result.problems.append(
                    f"{key}: {max_tokens} leaves no room for a prompt within arms.{arm}.max_model_len {mml} "
                    f"(allowed: at most {mml - 1}, less the longest prompt); every request would be refused "
                    f"with HTTP 400")
                continue
            for name, doc in result.documents.items():
                where = f"datasets[{names.index(name)}] ({name})"
                n, index = bound[name]
                if n + max_tokens <= mml and (bound_holds or mdir is None):
                    continue  # fits for certain (or, without a tokenizer, nothing more can be known here)
                tok = None
                if mdir is not None:
                    try:
                        tok = _tokenizer(mdir)
                    except Exception as exc:  # a broken tokenizer is the server's to report; say why it is unused
                        result.notes.append(f"arms.{arm}: tokenizer in {mdir} unusable here ({exc}); prompt "
                                            f"lengths bounded by bytes instead")
                if tok is not None:
                    if (str(mdir), name) not in exact:
                        exact[str(mdir), name] = _longest(doc, lambda m: chat_prompt_tokens(tok, m, kwargs))
                    n, index = exact[str(mdir), name]
                    if n + max_tokens > mml:
                        result.problems.append(
                            f"{key}: {max_tokens} does not fit arms.{arm}.max_model_len {mml} with the longest "
                            f"prompt of {where}, item {index}: {n} tokens in {spec.model}'s chat template "
                            f"(allowed: at most {mml - n})")
                elif n + max_tokens > mml:
                    result.notes.append(
                        f"{key}: {max_tokens} with the longest prompt of {where}, item {index} (at most about {n} "
                        f"tokens by its byte count; model {spec.model}'s tokenizer is not available at load) "
                        f"may not fit arms.{arm}.max_model_len {mml}; the server decides at run time")


# ------------------------------------------------------------ later stages

def check_speed(config: Mapping[str, Any], specs: Mapping[str, ArmSpec], result: CheckResult) -> None:
    """The speed section resolved (``result.speed``; left None when disabled) and its cells against each arm."""
    cfg = defaults.filled(config.get("speed"), "speed")
    if not cfg.get("enabled", True):
        return
    from pairaudit.speed import bracket as speed

    try:
        resolved = speed.resolve(cfg)
    except speed.SpeedConfigError as exc:
        result.problems.append(str(exc))
        return
    result.speed = resolved
    for i, cell in enumerate(resolved.cells):
        if cell.prompt == "short":  # at most its sentence, whatever input_len says
            continue
        for arm, spec in specs.items():
            mml = spec.max_model_len
            if mml and cell.input_len + resolved.output_len > mml:
                result.problems.append(
                    f"speed.cells[{i}].input_len: {cell.input_len} + speed.output_len {resolved.output_len} "
                    f"exceeds arms.{arm}.max_model_len {mml} (allowed: input_len at most "
                    f"{mml - resolved.output_len})")


def check_boundary(config: Mapping[str, Any], specs: Mapping[str, ArmSpec], result: CheckResult) -> None:
    """The boundary section resolved (``result.boundary``; left None when disabled) and its cases per arm."""
    cfg = defaults.filled(config.get("boundary"), "boundary")
    if not cfg.get("enabled", True):
        return
    from pairaudit.boundary import cases as boundary

    try:
        resolved = boundary.settings(cfg)
        for spec in specs.values():
            if spec.max_model_len:
                boundary.case_plan(resolved, spec.max_model_len)
        result.boundary = BoundarySettings.from_json(resolved)
    except (armspec.ConfigError, SettingsError) as exc:
        result.problems.append(str(exc))


def resolve_sections(config: Mapping[str, Any], result: CheckResult) -> None:
    """The sections that need no code beyond the schema's shapes: greedy, rules, sampling, scoring, into records."""
    try:
        result.greedy = GreedySettings.from_json(defaults.filled(config.get("greedy"), "greedy"))
        result.rules = RulesSettings.from_json(defaults.filled(config.get("rules"), "rules"))
        result.sampling = SamplingSettings.from_json(defaults.filled(config.get("sampling"), "sampling"))
        result.scoring = ScoringSettings.from_json(defaults.filled(config.get("scoring"), "scoring"))
    except SettingsError as exc:  # only a config the schema has not seen can get here
        result.problems.append(str(exc))


def audit_settings(config: Mapping[str, Any], result: CheckResult) -> AuditSettings | None:
    """Every section's record, once every check passed (else None: the problems say why)."""
    if (result.problems or result.greedy is None or result.rules is None or result.sampling is None
            or result.scoring is None):
        return None
    return AuditSettings(speed=result.speed, boundary=result.boundary, greedy=result.greedy, rules=result.rules,
                         datasets=tuple(result.datasets), sampling=result.sampling, scoring=result.scoring)


# ----------------------------------------------------------------- entries

def check_config(config: Mapping[str, Any], *, base_dir: str | os.PathLike,
                 cache_dir: str | os.PathLike | None = None) -> CheckResult:
    """Every load-time check of an already schema-validated config; problems collected, never raised."""
    base = Path(base_dir)
    result = CheckResult()
    # a registered rule without the fields its gate reads (calibration, report, deviations) is refused here
    result.problems += gates.registry_problems()
    resolve_sections(config, result)
    specs = check_arms(config, result)
    check_datasets(config, result, base_dir=base, cache_dir=Path(cache_dir) if cache_dir else base / ".cache")
    if result.rules is not None:
        # rules.quality.detect_loss_pct: a note per dataset too small to see that loss
        audit = config.get("audit")
        log = defaults.filled(config.get("calibration"), "calibration")["log"]
        result.notes += sizing.detect_loss_notes(result.rules.quality, result.selected, audit=audit,
                                                 calibration_log=log, base_dir=base)
        # quality-v2: a note per dataset too small to rule out rules.quality.margin_pct at the expected discordance
        entries = [e for e in config.get("datasets") or [] if isinstance(e, dict)]
        family = sum(1 for e in entries if isinstance(e.get("name"), str))  # quality-v2's Bonferroni family
        result.notes += sizing.margin_notes(result.rules.quality, result.selected, datasets=family, audit=audit,
                                            base_dir=base)
    check_lengths(config, specs, result)
    check_speed(config, specs, result)
    check_boundary(config, specs, result)
    result.problems += calibration.check(config)
    gpu_problems, gpu_notes = gpupool.load_check(config, specs)  # the GPU pool and each arm's gpus
    result.problems += gpu_problems
    result.notes += gpu_notes
    if "change" in config and any(p.startswith("arms.") for p in result.problems):
        result.notes.append("arms.control and arms.candidate are derived from server + change (control: every "
                            "switch at its rollback value, candidate: every switch on); fix the key there")
    result.specs = specs
    result.settings = audit_settings(config, result)
    return result


def check_window(config: Mapping[str, Any], result: CheckResult) -> None:
    """The audit's time plan on this host (``result.plan``), and with ``window_min`` set, a plan whose worst case
    exceeds the window refused, naming the phase to shrink (:mod:`pairaudit.timeplan.plan`).

    The host's history is every audit under ``results/`` relative to the working directory, as the rules'
    outputs are. Planned only once every other check passed (a config that cannot run has no plan), and only
    by the snakemake that schedules the run: a job loading the workflow mid-run would see a history its own
    run has grown, and the window was judged when the run began.
    """
    if result.settings is None or result.problems:
        return
    from pairaudit.timeplan import history, plan as timeplan

    hist = history.host_history(RESULTS, host=socket.gethostname())
    window = config.get("window_min")
    result.plan = timeplan.build_plan(result.settings, timeplan.arm_facts(result.specs), hist, audit=str(config["audit"]),
                                      sampling=config.get("sampling") or {}, window_min=window)
    problem = timeplan.window_problem(result.plan, result.settings)
    if problem:
        result.problems.append(problem)


# The promotion's text outputs, written after decision.json and before the manifest.
PROMOTION_TEXT = (".md", ".html", ".rst")


def check_promotion_outputs(root: Path) -> list[str]:
    """The promotion's report files under the audit directory ``root`` against the manifest's sha256.

    Only when decision.json still has the hash the manifest recorded: the
    reports are written after it and the manifest last, so a run interrupted
    in between leaves a decision.json the manifest does not know, and nothing
    is claimed then.  The figures are written before decision.json and are
    not compared.
    """
    mpath, dpath = root / PATHS[MANIFEST_SCHEMA], root / PATHS[DECISION_SCHEMA]
    promotion_dir = dpath.parent
    if not (mpath.is_file() and dpath.is_file()):
        return []
    try:
        listed = {Path(a["path"]).name: a["sha256"] for a in artifacts.read_json(mpath).get("artifacts", [])
                  if Path(a["path"]).parent.name == promotion_dir.name}
    except (artifacts.ArtifactError, KeyError, TypeError):
        return []  # the manifest's own problem is reported by verify_tree
    if listed.get(dpath.name) != artifacts.sha256_file(dpath):
        return []
    problems = []
    for name, recorded in sorted(listed.items()):
        p = promotion_dir / name
        if p.suffix in PROMOTION_TEXT and p.is_file() and artifacts.sha256_file(p) != recorded:
            problems.append(f"{p}: sha256 {artifacts.sha256_file(p)} does not match the {recorded} that "
                            f"{mpath} recorded when the decision was written: the file was edited after it was "
                            f"written. Refusing it; delete it so the promotion is recomputed")
    return problems


def check_results(results_dir: str | os.PathLike) -> list[str]:
    """Problems of the artifacts already written under ``results/<audit>/`` (content self-hashes, manifest)."""
    root = Path(results_dir)
    if not root.is_dir():
        return []
    # a sweep decides each candidate under candidates/<name>/ (docs/sweeps.md)
    candidates = sorted(p for p in (root / CANDIDATES_DIR).iterdir() if p.is_dir()) \
        if (root / CANDIDATES_DIR).is_dir() else []
    return artifacts.verify_tree(root) + [p for d in (root, *candidates) for p in check_promotion_outputs(d)]


def server_slots(workflow) -> int | None:
    """The invocation's ``server_slots`` resource (the machine-wide bound), None when it sets none."""
    res = getattr(workflow, "global_resources", None) or {}
    value = res.get("server_slots")
    value = getattr(value, "value", value)  # Snakemake 9 wraps each value in a Resource
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


# id(workflow) -> the settings its main Snakefile resolved (its calibration module's are the same)
_LOADED: dict[int, AuditSettings | None] = {}


def check_at_load(config: dict, workflow) -> CheckResult:
    """The Snakefile's one call: check the config and the audit's artifacts, fail naming every problem.

    Its ``settings`` are every section of the config resolved once (:mod:`pairaudit.core.settings`):
    what the rules hand their jobs.  Also hands the invocation's ``server_slots``, audit name and ``gpus``
    section to the jobs (environment variables their ``launch.Server`` reads
    for the machine-wide server slots, :mod:`pairaudit.serving.slots`, and
    the GPU pool, :mod:`pairaudit.serving.gpupool`).
    """
    base = Path(workflow.basedir)
    # The main Snakefile checks first; a later call in the same process is the
    # Snakefile loaded again as its calibration module. (Snakemake's own
    # ``workflow.modifier.is_module`` is True in the main Snakefile too once it
    # declares a module, so it cannot tell them apart.)
    module = id(workflow) in _LOADED
    if module and calibration.is_calibration(config):
        # The Snakefile's calibration module: its config is the audit's, checked a moment ago
        # by the main Snakefile, with the candidate a copy of the control; checking it again
        # would only double the load time.  Its sections are the audit's (only the arms and
        # the audit name differ), so are their records.
        result = CheckResult(problems=calibration.check(config), settings=_LOADED[id(workflow)])
    else:
        # The schema validation filled defaults in; check a copy so nothing here can change the config.
        result = check_config(copy.deepcopy(config), base_dir=base)
        _LOADED[id(workflow)] = result.settings
        if getattr(workflow, "is_main_process", True):
            check_window(config, result)
    if isinstance(config.get("audit"), str):
        # relative to the working directory, as the rules' outputs are
        result.problems += check_results(audit_dir(config["audit"]))
        if not module:  # one process, one label: the audit the invocation was asked for
            os.environ[AUDIT_ENV] = config["audit"]
    slots = server_slots(workflow)
    if slots is not None:
        os.environ[SERVER_SLOTS_ENV] = str(slots)
    for note in result.notes:
        print(f"config check: note: {note}", file=sys.stderr)
    if result.plan is not None:
        # every run shows its plan before the first server starts (written as an artifact at onstart)
        from pairaudit.timeplan import plan as timeplan

        print(timeplan.render_text(result.plan), file=sys.stderr, flush=True)
        deadline = timeplan.speed_deadline(result.plan, time.time())
        if deadline is not None:   # the jobs this snakemake starts inherit it; the speed bracket reads it
            os.environ[timeplan.DEADLINE_ENV] = f"{deadline:.3f}"
        else:
            os.environ.pop(timeplan.DEADLINE_ENV, None)
    if result.problems:
        from snakemake_interface_common.exceptions import WorkflowError

        raise WorkflowError(format_problems(result.problems))
    gpupool.export_config(config)  # the host's GPU pool, for the jobs' servers (pairaudit.serving.gpupool)
    return result


# -------------------------------------------------------------------- YAML

def yaml_problem(path: str | os.PathLike) -> str | None:
    """None when ``path`` parses as YAML (or JSON); else the parser's message naming file, line and column."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            yaml.safe_load(fh)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror}"
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = exc.problem or exc.context or "not valid YAML"
        ctx = exc.context_mark
        if exc.context and ctx is not None and ctx is not mark:
            what += f" ({exc.context} that starts at line {ctx.line + 1}, column {ctx.column + 1})"
        return f"{where}: YAML syntax error: {what}"
    except yaml.YAMLError as exc:
        return f"{path}: YAML error: {exc}"
    return None


def check_yaml_files(paths) -> None:
    """Fail naming file, line and column when a config file is not valid YAML (before Snakemake parses it).

    For the Snakefile, before its ``configfile:`` directive: Snakemake's own
    message for that file names neither the file's line nor the problem.
    """
    problems = [p for p in (yaml_problem(f) for f in paths if Path(f).is_file()) if p]
    if problems:
        from snakemake_interface_common.exceptions import WorkflowError

        raise WorkflowError(format_problems(problems))


def load_like_snakemake(workflow_config: Path, configfiles: list[Path], replace: bool) -> dict:
    """The config Snakemake builds: the workflow's file, then each ``--configfile`` merged (or replacing)."""
    import yaml
    from snakemake.utils import update_config

    problems = [p for p in (yaml_problem(f) for f in [workflow_config, *configfiles]) if p]
    if problems:
        raise ConfigCheckError(format_problems(problems))
    config = {} if (replace and configfiles) else yaml.safe_load(workflow_config.read_text()) or {}
    for f in configfiles:
        update_config(config, yaml.safe_load(Path(f).read_text()) or {})
    return config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pairaudit.configcheck",
                                 description="check a pairaudit config as the workflow does at load, naming file and "
                                             "line of YAML errors")
    ap.add_argument("--configfile", action="append", default=[], type=Path, help="as snakemake --configfile")
    ap.add_argument("--replace-workflow-config", action="store_true", help="as snakemake's flag of that name")
    ap.add_argument("--base-dir", type=Path, default=Path("."), help="the workflow directory (default: .)")
    args = ap.parse_args(argv)
    from snakemake.utils import validate
    from snakemake_interface_common.exceptions import WorkflowError

    base = args.base_dir
    try:
        config = load_like_snakemake(base / "config" / "config.yaml", args.configfile, args.replace_workflow_config)
        derived = change.derive_arms(config)  # as the Snakefile does, before the schema
        if derived:
            raise ConfigCheckError(format_problems(derived))
        validate(config, str(base / "config" / "schema.yaml"))
    except (ConfigCheckError, WorkflowError) as exc:
        print(exc, file=sys.stderr)
        return 1
    result = check_config(config, base_dir=base)
    check_window(config, result)
    if isinstance(config.get("audit"), str):
        result.problems += check_results(base / audit_dir(config["audit"]))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if result.problems:
        print(format_problems(result.problems), file=sys.stderr)
        return 1
    print("config check: OK", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def derive_at_load(config: dict) -> None:
    """The Snakefile's first call: the change form (server + change) becomes the two arms, or the workflow
    stops naming every problem (``pairaudit.plans.change.derive_arms``)."""
    problems = change.derive_arms(config)
    if problems:
        from snakemake_interface_common.exceptions import WorkflowError

        raise WorkflowError(format_problems(problems))
