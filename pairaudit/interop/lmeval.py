"""lm-eval-harness sample logs: pairaudit's answers written as them, and two of lm-eval's own read and paired.

The format is lm-eval's ``--log_samples`` output as lm-eval 0.4.13 writes it
(``lm_eval/evaluator.py``, ``evaluate()``: the per-sample dict;
``lm_eval/loggers/evaluation_tracker.py``, ``save_results_samples`` and
``save_results_aggregated``: how it is written). One JSON line per document
and filter, all documents of the first filter first::

    {"doc_id": int,                 # the document's position in the task's split (the pairing key)
     "doc": {...},                  # the dataset row
     "target": str,                 # str(doc_to_target(doc))
     "arguments": {"gen_args_0": {"arg_0": <prompt>, "arg_1": <generation kwargs>}, ...},  # one per request
     "resps": [[str, ...], ...],    # per request, the model's raw responses (str() of each)
     "filtered_resps": [...],       # per request, what the filter kept
     "filter": str,                 # e.g. "strict-match", "flexible-extract", "none"
     "metrics": [str, ...],         # the metric names of this line
     "doc_hash": sha256(json.dumps(doc, indent=2, ensure_ascii=False)),
     "prompt_hash": sha256(<prompt of the first request>),
     "target_hash": sha256(str(target)),
     "<metric>": value, ...}        # e.g. "exact_match": 1.0

Export (``export_dataset_arm``, ``export_audit``): per dataset and arm, under
``results/<audit>/exports/lm-eval/<arm>/``, beside the primary artifacts and
never replacing them: ``samples_<dataset>.jsonl`` in that format and one
``results.json`` shaped like lm-eval's ``results_<timestamp>.json``
(``results``, ``group_subtasks``, ``configs``, ``versions``, ``n-shot``,
``higher_is_better``, ``n-samples``, ``config``, ``task_hashes``, ...). The
mapping:

* ``doc_id`` = the item's ``index`` (its position in the source, pairaudit's
  pairing key); ``doc`` = the dataset item without its chat ``messages``;
* ``arguments.gen_args_0.arg_0`` = the chat messages as the JSON string lm-eval
  hashes for a chat API model (``JsonChatStr``); ``arg_1`` = the request body
  as sent, less ``model`` and ``messages`` (every sampling field, the seed,
  the cache salt);
* ``resps`` = ``[[text]]`` (the answer scored; ``""`` when there was none);
  ``filtered_resps`` = ``[extracted]`` (``"[invalid]"``, lm-eval's regex
  filter's fallback, when nothing was extracted);
* ``filter`` ``strict-match`` with ``exact_match`` = pairaudit's primary
  verdict (1.0 / 0.0), the score the audit decided on; gsm8k also gets the
  ``flexible-extract`` lines (the last number, as lm-eval's gsm8k task);
* ``target`` = the gold answer the scorer compared with (the tests for code);
* an extra key ``pairaudit`` per line: index, id, arm, the score record's
  ``correct``, ``method``, ``reason``, ``answered``, ``finish_reason`` and the
  request's ``body_sha256``; and, for gsm8k, ``lm_eval_exact_match``, lm-eval's
  string comparison of the same extraction (``#### 72.0`` against 72 is right
  for pairaudit, wrong for lm-eval).

Import (``read_log``, ``pair_logs``): two logs of the same task, paired by
``doc_id`` on one filter and one 0/1 metric. Each log's hashes are checked
against its own content, and the two logs must hold the same documents with
the same prompts, targets and generation arguments: anything else is
refused naming the doc_ids and what differs. The pairing then runs
``stats.paired_table``, ``gates.quality_v1`` and ``stats.paired_bootstrap_ci``:
the code the audit's paired stage runs (quality-v2 by default; quality-v1
selectable). Before that, the two runs must be a pair: not one run given
twice, and the settings their ``results_*.json`` record (model arguments,
the API and harness seeds, generation settings, task versions) equal in
everything but the fields declared as the change (``check_same_run``).
lm-eval logs no finish reason, so the natural-finish clause cannot be applied; the result says so
(``not_checked``). pairaudit's own exports carry each answer's finish reason
and whether there was one (the ``pairaudit`` key): paired, they get every
clause, and so the paired stage's verdict, INVALID included.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TypedDict

from pairaudit import gates
from pairaudit.core import artifacts, stats
from pairaudit.core.contracts import (ARMS, CANDIDATES_DIR, DATASET_SCHEMA, EXPORTS_LMEVAL, PATHS, SAMPLED_SCHEMA, SCORES_SCHEMA,
                                      PairedTable, PairingFacts, ScoreRecord)
from pairaudit.formats import registry

LM_EVAL_VERSION = "0.4.13"  # the release whose writer this module follows (docs/interop.md)
PRIMARY_FILTER = "strict-match"
FLEXIBLE_FILTER = "flexible-extract"
METRIC = "exact_match"
INVALID = "[invalid]"  # lm-eval's RegexFilter fallback when nothing matched
EXPORT_DIR = PATHS[EXPORTS_LMEVAL]
_SAMPLES_NAME = re.compile(r"^samples_(?P<task>.+?)(?:_(?P<stamp>\d{4}-\d{2}-\d{2}T[0-9.\-]+))?\.jsonl$")


class LmEvalLogError(ValueError):
    """An lm-eval sample log that cannot be read or paired; the message names the file, doc_ids and fields."""


class LmEvalSample(TypedDict, total=False):
    """One line of ``samples_<task>_<timestamp>.jsonl`` (module docstring); metric values ride as extra keys."""
    doc_id: int
    doc: Any
    target: str
    arguments: dict
    resps: list
    filtered_resps: list
    filter: str
    metrics: list[str]
    doc_hash: str
    prompt_hash: str
    target_hash: str
    pairaudit: dict


def hash_string(text: str) -> str:
    """lm-eval's ``utils.hash_string``: sha256 of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def doc_hash(doc: Any) -> str:
    # evaluator.py: hash_string(json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False))
    return hash_string(json.dumps(doc, indent=2, default=str, ensure_ascii=False))


# ------------------------------------------------------------------ export

def _arguments(body: Mapping[str, Any]) -> tuple[str, dict]:
    prompt = json.dumps(body.get("messages"), ensure_ascii=False)
    gen = {k: v for k, v in body.items() if k not in ("model", "messages")}
    return prompt, gen


def _target(item: Mapping[str, Any], score: Mapping[str, Any]) -> str:
    # the format says what its target is: the gold answer, or the tests for code
    return registry.get(item.get("format"), "item format").lmeval_target(item, score)


def _line(item: Mapping[str, Any], rec: Mapping[str, Any], score: Mapping[str, Any], *, arm: str, filt: str,
          extracted: Any, correct: bool) -> LmEvalSample:
    body = rec.get("body") or {}
    prompt, gen = _arguments(body)
    doc = {k: v for k, v in item.items() if k != "messages"}
    target = _target(item, score)
    text = score.get("text")
    extra = {"index": item["index"], "id": item.get("id"), "arm": arm, "correct": bool(score.get("correct")),
             "method": score.get("method"), "reason": score.get("reason"), "answered": bool(score.get("answered")),
             "finish_reason": score.get("finish_reason"), "body_sha256": rec.get("body_sha256")}
    if "lm_eval_exact_match" in score:
        extra["lm_eval_exact_match"] = bool(score["lm_eval_exact_match"])
    sample: LmEvalSample = {
        "doc_id": int(item["index"]), "doc": doc, "target": target,
        "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": gen}},
        "resps": [["" if text is None else str(text)]],
        "filtered_resps": [INVALID if extracted is None else str(extracted)],
        "filter": filt, "metrics": [METRIC],
        "doc_hash": doc_hash(doc), "prompt_hash": hash_string(prompt), "target_hash": hash_string(target),
        "pairaudit": extra,
    }
    sample[METRIC] = 1.0 if correct else 0.0  # type: ignore[literal-required]
    return sample


def _check_chain(doc: Mapping[str, Any], inputs: Sequence[str], *, where: str) -> None:
    """artifacts.check_consumed, with the recorded paths resolved: an export may name them absolutely."""
    recorded = (doc.get("provenance") or {}).get("consumed") or {}
    by_real = {str(Path(k).resolve()): v for k, v in recorded.items()}
    for p in inputs:
        want = by_real.get(str(Path(p).resolve()))
        if want is not None and artifacts.sha256_file(p) != want:
            raise artifacts.ArtifactError(f"{where}: {p} changed since it was consumed (sha256 "
                                          f"{artifacts.sha256_file(p)[:12]}... != recorded {want[:12]}...)")


def _read_arm(dataset: Mapping[str, Any], dataset_path: str, sampled_path: str, score_path: str,
              arm: str) -> tuple[dict, list[dict], list[dict]]:
    s_header, sampled = artifacts.read_jsonl(sampled_path)
    c_header, scores = artifacts.read_jsonl(score_path)
    artifacts.check_schema(s_header, SAMPLED_SCHEMA, sampled_path)
    artifacts.check_schema(c_header, SCORES_SCHEMA, score_path)
    _check_chain(s_header, [dataset_path], where=sampled_path)
    _check_chain(c_header, [dataset_path, sampled_path], where=score_path)
    for path, h in ((sampled_path, s_header), (score_path, c_header)):
        if h.get("arm") != arm or h.get("dataset") != dataset["name"]:
            raise artifacts.ArtifactError(f"{path}: holds dataset {h.get('dataset')!r} arm {h.get('arm')!r}, "
                                          f"expected {dataset['name']!r} {arm!r}")
    return c_header, sampled, scores


def samples_for(dataset: Mapping[str, Any], sampled: Sequence[Mapping[str, Any]],
                scores: Sequence[Mapping[str, Any]], *, arm: str) -> list[LmEvalSample]:
    """lm-eval sample lines of one dataset and arm: every item, primary filter first (gsm8k: then flexible)."""
    items = {it["index"]: it for it in dataset["items"]}
    recs = {r["index"]: r for r in sampled}
    missing = sorted(set(items) - {s["index"] for s in scores})
    if missing or sorted(recs) != sorted(s["index"] for s in scores):
        raise artifacts.ArtifactError(f"dataset {dataset['name']!r} arm {arm}: scores and sampled records do not "
                                      f"cover the same items (no score for indices {missing})")
    order = [s for s in sorted(scores, key=lambda s: s["index"])]
    lines = [_line(items[s["index"]], recs[s["index"]], s, arm=arm, filt=PRIMARY_FILTER,
                   extracted=s.get("extracted"), correct=bool(s.get("correct"))) for s in order]
    # a format's further filters (gsm8k's flexible-extract): each a score record key holding its reading
    for extra in registry.get(dataset.get("format"), "dataset format").lmeval_filters:
        for s in order:
            got = s.get(extra.score_key) or {}
            lines.append(_line(items[s["index"]], recs[s["index"]], s, arm=arm, filt=extra.name,
                               extracted=got.get("extracted"), correct=bool(got.get("correct"))))
    return lines


def _mean_stderr(values: Sequence[float]) -> float | str:
    # lm-eval's mean_stderr: sample standard deviation / sqrt(n); "N/A" for fewer than two values
    n = len(values)
    if n < 2:
        return "N/A"
    mu = sum(values) / n
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1)) / math.sqrt(n)


def task_hash(lines: Sequence[LmEvalSample]) -> str:
    # evaluation_tracker.save_results_aggregated: hash of the concatenated doc, prompt and target hashes
    return hash_string("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in lines))


def _n_shot(dataset: Mapping[str, Any]) -> int:
    item = (dataset.get("items") or [{}])[0]
    # the "shots" template puts worked exchanges before the question as earlier chat turns
    return sum(1 for m in item.get("messages") or [] if m.get("role") == "assistant")


def task_entry(dataset: Mapping[str, Any], lines: Sequence[LmEvalSample]) -> dict:
    """One task's ``results``, ``configs``, ``n-samples`` ... entries of results.json."""
    name = dataset["name"]
    by_filter: dict[str, list[float]] = {}
    for s in lines:
        by_filter.setdefault(s["filter"], []).append(float(s[METRIC]))  # type: ignore[literal-required]
    result: dict[str, Any] = {"name": name, "alias": name, "sample_len": len(by_filter.get(PRIMARY_FILTER, []))}
    for filt, vals in by_filter.items():
        result[f"{METRIC},{filt}"] = sum(vals) / len(vals) if vals else None
        result[f"{METRIC}_stderr,{filt}"] = _mean_stderr(vals)
    gen = lines[0]["arguments"]["gen_args_0"]["arg_1"] if lines else {}
    source = dataset.get("source") or {}
    config = {"task": name, "dataset_path": source.get("path") or source.get("kind"),
              "test_split": "pairaudit selection", "output_type": "generate_until",
              "doc_to_text": f"pairaudit template {dataset.get('prompt_template')!r} (chat messages)",
              "doc_to_target": "the reference answer",
              "num_fewshot": _n_shot(dataset),
              "metric_list": [{"metric": METRIC, "aggregation": "mean", "higher_is_better": True}],
              "filter_list": [{"name": f} for f in by_filter],
              "generation_kwargs": {k: v for k, v in gen.items() if k not in ("seed", "cache_salt")},
              "repeats": 1, "metadata": {"version": 1.0, "pairaudit_format": dataset.get("format"),
                                         "pairaudit_select": dataset.get("select"),
                                         "source_sha256": source.get("sha256")}}
    n = len(by_filter.get(PRIMARY_FILTER, []))
    messages = (dataset.get("items") or [{}])[0].get("messages") or []
    system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
    return {"results": result, "config": config, "version": 1.0, "n_shot": _n_shot(dataset),
            "n_samples": {"original": source.get("rows"), "effective": n},
            "task_hash": task_hash(lines), "system": system}


def results_doc(entries: Mapping[str, dict], *, arm: str, model: str | None, created_at: str | None,
                consumed: Mapping[str, str], audit: str | None) -> dict:
    """results.json in lm-eval's shape (``_to_eval_results`` + ``save_results_aggregated``'s additions).

    The keys are those lm-eval 0.4.13 writes; what only an lm-eval run has
    (its environment, versions, timings) is null.
    """
    stamp = _dt.datetime.fromisoformat(created_at) if created_at else None
    names = sorted(entries)
    systems = {entries[t]["system"] for t in names}
    system = systems.pop() if len(systems) == 1 else None
    return {
        "results": {t: entries[t]["results"] for t in names},
        "group_subtasks": {},
        "configs": {t: entries[t]["config"] for t in names},
        "versions": {t: entries[t]["version"] for t in names},
        "n-shot": {t: entries[t]["n_shot"] for t in names},
        "higher_is_better": {t: {METRIC: True} for t in names},
        "n-samples": {t: entries[t]["n_samples"] for t in names},
        "config": {"model": "pairaudit", "model_args": {"arm": arm, "model": model}, "batch_size": None,
                   "batch_sizes": [], "device": None, "use_cache": None, "limit": None, "bootstrap_iters": 0,
                   "gen_kwargs": {}, "random_seed": None, "numpy_seed": None, "torch_seed": None,
                   "fewshot_seed": None},
        "git_hash": None,
        "date": stamp.timestamp() if stamp else None,
        "pretty_env_info": None, "transformers_version": None, "lm_eval_version": None, "upper_git_hash": None,
        "task_hashes": {t: entries[t]["task_hash"] for t in names},
        "model_source": "pairaudit",
        "model_name": model,
        "model_name_sanitized": re.sub(r"[\"<>:/|\\?*\[\]]+", "__", model or ""),
        "system_instruction": system,
        "system_instruction_sha": hash_string(system) if system else None,
        "fewshot_as_multiturn": any(entries[t]["n_shot"] for t in names) or None,
        "chat_template": None, "chat_template_sha": None,
        "total_evaluation_time_seconds": None,
        "pairaudit": {"audit": audit, "arm": arm, "exported_by": "pairaudit.interop.lmeval",
                      "lm_eval_format": LM_EVAL_VERSION, "consumed": dict(consumed),
                      "note": "exact_match is pairaudit's primary verdict per item (strict-match); see "
                              "docs/interop.md"},
    }


def _write_lines(path: Path, lines: Sequence[Mapping[str, Any]]) -> None:
    with artifacts.named_io(path), artifacts.atomic_file(path) as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    with artifacts.named_io(path), artifacts.atomic_file(path) as f:
        f.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class ExportedArm:
    """What export_arm wrote for one arm."""
    arm: str
    samples: dict[str, str]      # dataset -> samples_<dataset>.jsonl
    results: str                 # results.json


def export_arm(*, arm: str, dataset_paths: Mapping[str, str], sampled_paths: Mapping[str, str],
               score_paths: Mapping[str, str], out_dir: str | os.PathLike, audit: str | None = None,
               model: str | None = None) -> ExportedArm:
    """One arm's sample logs (every dataset) and results.json under ``out_dir`` (read, checked, never changed)."""
    out = Path(out_dir)
    entries: dict[str, dict] = {}
    written: dict[str, str] = {}
    consumed: dict[str, str] = {}
    created: list[str] = []
    for name in sorted(dataset_paths):
        dpath, spath, cpath = dataset_paths[name], sampled_paths[name], score_paths[name]
        dataset = artifacts.check_schema(artifacts.read_json(dpath), DATASET_SCHEMA, dpath)
        if dataset.get("name") != name:
            raise artifacts.ArtifactError(f"{dpath}: holds dataset {dataset.get('name')!r}, expected {name!r}")
        header, sampled, scores = _read_arm(dataset, dpath, spath, cpath, arm)
        lines = samples_for(dataset, sampled, scores, arm=arm)
        target = out / f"samples_{name}.jsonl"
        _write_lines(target, lines)
        written[name] = str(target)
        entries[name] = task_entry(dataset, lines)
        consumed.update({p: artifacts.sha256_file(p) for p in (dpath, spath, cpath)})
        created.append((header.get("provenance") or {}).get("created_at") or "")
    res_path = out / "results.json"
    _write_json(res_path, results_doc(entries, arm=arm, model=model, created_at=max(created) if created else None,
                                      consumed=consumed, audit=audit))
    return ExportedArm(arm=arm, samples=written, results=str(res_path))


def export_audit(audit_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> dict[str, ExportedArm]:
    """Every dataset and arm of a finished audit directory (``results/<audit>``), found by its scores.

    The arms are the control and the candidate, or in a sweep the control and every candidate whose
    scores are there (``scores/<dataset>/<arm>.jsonl``, by the arm's name; docs/sweeps.md).
    """
    root = Path(audit_dir)
    names = sorted(p.name for p in (root / "scores").iterdir() if p.is_dir()) if (root / "scores").is_dir() else []
    if not names:
        raise artifacts.ArtifactError(f"{root}: no scores/<dataset>/ directories: the audit has not scored anything")
    out = Path(out_dir) if out_dir is not None else root / EXPORT_DIR
    arms = list(ARMS)
    if (root / CANDIDATES_DIR).is_dir():
        arms = [ARMS[0], *sorted({p.stem for p in (root / "scores" / names[0]).glob("*.jsonl")} - {ARMS[0]})]
    result = {}
    for arm in arms:
        model = None
        launch = root / "launch" / f"{arm}.json"
        if launch.is_file():
            model = artifacts.read_json(launch).get("served_model_name")
        result[arm] = export_arm(
            arm=arm, dataset_paths={n: str(root / "datasets" / f"{n}.json") for n in names},
            sampled_paths={n: str(root / "sampled" / n / f"{arm}.jsonl") for n in names},
            score_paths={n: str(root / "scores" / n / f"{arm}.jsonl") for n in names},
            out_dir=out / arm, audit=root.name, model=model)
    return result


# ------------------------------------------------------------------ import

class AnswerFacts(TypedDict):
    """What pairaudit's own export adds to a sample log line: whether the item had an answer, and how it ended."""
    answered: bool
    finish_reason: str | None


@dataclass(frozen=True)
class LoggedDoc:
    """One document of one filter in an lm-eval sample log."""
    doc_id: int
    line: int
    value: Any                 # the metric's value on this line
    response: str | None       # resps[0][0]
    doc_hash: str
    prompt_hash: str
    target_hash: str
    arguments_sha256: str      # sha256 of the canonical JSON of every request's arguments
    generation: Any            # gen_args_0.arg_1 (the generation kwargs)
    answer_facts: AnswerFacts | None = None   # pairaudit's export only: {"answered", "finish_reason"} of the item


@dataclass(frozen=True)
class SampleLog:
    """One lm-eval sample log, read on one filter and metric."""
    path: str
    sha256: str
    task: str | None
    filter: str
    metric: str
    filters: list[str]
    docs: dict[int, LoggedDoc]


def _prompt_text(arg0: Any) -> str | None:
    # a chat API model's prompt is a JsonChatStr (a NamedTuple of one string), which json writes as [str]
    if isinstance(arg0, str):
        return arg0
    if isinstance(arg0, list) and len(arg0) == 1 and isinstance(arg0[0], str):
        return arg0[0]
    return None


def _raw_lines(path: Path) -> list[tuple[int, dict]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise LmEvalLogError(f"{path}:{n}: not a JSON line: {exc}") from None
                if not isinstance(obj, dict):
                    raise LmEvalLogError(f"{path}:{n}: a sample line must be a JSON object")
                out.append((n, obj))
    except OSError as exc:
        raise LmEvalLogError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not out:
        raise LmEvalLogError(f"{path}: no sample lines")
    return out


REQUIRED = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash",
            "prompt_hash", "target_hash")


def _bad(path: Path, what: str, ids: Sequence[Any]) -> str:
    ids = sorted(ids)
    shown = ", ".join(map(str, ids[:20])) + (f" ... ({len(ids)} in all)" if len(ids) > 20 else "")
    return f"{path}: {what} at doc_ids {shown}"


def read_log(path: str | os.PathLike, *, metric: str = METRIC, filter: str | None = None) -> SampleLog:
    """Read one sample log on one filter; its hashes are checked against its content (module docstring).

    ``filter`` None: the log's only filter, or ``strict-match`` when it has
    several and that is one of them; otherwise it must be named.
    """
    p = Path(path)
    lines = _raw_lines(p)
    for n, obj in lines:
        missing = [k for k in REQUIRED if k not in obj]
        if missing:
            raise LmEvalLogError(f"{p}:{n}: missing field(s) {', '.join(missing)} (an lm-eval --log_samples line "
                                 f"has {', '.join(REQUIRED)})")
    filters = list(dict.fromkeys(str(obj["filter"]) for _, obj in lines))
    if filter is None:
        if len(filters) == 1:
            filter = filters[0]
        elif PRIMARY_FILTER in filters:
            filter = PRIMARY_FILTER
        else:
            raise LmEvalLogError(f"{p}: holds filters {filters}; name one (--filter)")
    elif filter not in filters:
        raise LmEvalLogError(f"{p}: no lines of filter {filter!r} (the log holds {filters})")
    docs: dict[int, LoggedDoc] = {}
    dup, no_metric, bad_prompt, bad_doc, bad_target = [], [], [], [], []
    for n, obj in lines:
        if obj["filter"] != filter:
            continue
        did = obj["doc_id"]
        if isinstance(did, bool) or not isinstance(did, int):
            raise LmEvalLogError(f"{p}:{n}: doc_id must be an integer, got {did!r}")
        if did in docs:
            dup.append(did)
            continue
        if metric not in obj or metric not in (obj.get("metrics") or []):
            no_metric.append(did)
            continue
        args = obj["arguments"]
        first = args.get("gen_args_0") if isinstance(args, dict) else None
        prompt = _prompt_text(first.get("arg_0")) if isinstance(first, dict) else None
        if prompt is None or hash_string(prompt) != obj["prompt_hash"]:
            bad_prompt.append(did)
        if doc_hash(obj["doc"]) != obj["doc_hash"]:
            bad_doc.append(did)
        if hash_string(str(obj["target"])) != obj["target_hash"]:
            bad_target.append(did)
        resps = obj["resps"]
        response = resps[0][0] if resps and isinstance(resps[0], list) and resps[0] else None
        extra = obj.get("pairaudit")
        facts: AnswerFacts | None = None
        if isinstance(extra, dict) and isinstance(extra.get("answered"), bool):
            facts = {"answered": extra["answered"], "finish_reason": extra.get("finish_reason")}
        docs[did] = LoggedDoc(doc_id=did, line=n, value=obj[metric],
                              response=response if isinstance(response, str) else None,
                              doc_hash=obj["doc_hash"], prompt_hash=obj["prompt_hash"], target_hash=obj["target_hash"],
                              arguments_sha256=artifacts.sha256_json(args),
                              generation=first.get("arg_1") if isinstance(first, dict) else None, answer_facts=facts)
    problems = []
    if dup:
        problems.append(_bad(p, f"filter {filter!r} has more than one line", dup))
    if no_metric:
        problems.append(_bad(p, f"no metric {metric!r} (lines of filter {filter!r})", no_metric))
    for ids, what in ((bad_prompt, "prompt_hash does not match the logged prompt (arguments.gen_args_0.arg_0)"),
                      (bad_doc, "doc_hash does not match the logged doc"),
                      (bad_target, "target_hash does not match the logged target")):
        if ids:
            problems.append(_bad(p, what + ": the log was edited, or not written by lm-eval", ids))
    if problems:
        raise LmEvalLogError("\n".join(problems))
    m = _SAMPLES_NAME.match(p.name)
    return SampleLog(path=str(p), sha256=artifacts.sha256_file(p), task=m.group("task") if m else None,
                     filter=filter, metric=metric, filters=filters, docs=docs)


def _binary(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    return None


@dataclass
class PairedLogs:
    """Two sample logs paired by doc_id, with the quality rule's verdict (``pair_logs``)."""
    control: SampleLog
    candidate: SampleLog
    table: PairedTable
    quality: dict
    bootstrap: dict | None
    not_checked: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        def log(s: SampleLog) -> dict:
            return {"path": s.path, "sha256": s.sha256, "task": s.task, "filter": s.filter, "metric": s.metric,
                    "filters": s.filters, "n": len(s.docs)}

        return {"control": log(self.control), "candidate": log(self.candidate), "table": self.table,
                "quality": self.quality, "bootstrap": self.bootstrap, "not_checked": self.not_checked}


def check_same_documents(control: SampleLog, candidate: SampleLog) -> None:
    """Refuse two logs that do not hold the same documents, prompts, targets and generation arguments."""
    c, k = control.docs, candidate.docs
    problems = []
    if control.task and candidate.task and control.task != candidate.task:
        problems.append(f"the logs are of different tasks: {control.task!r} ({control.path}) and "
                        f"{candidate.task!r} ({candidate.path})")
    only_c, only_k = sorted(set(c) - set(k)), sorted(set(k) - set(c))
    if only_c:
        problems.append(f"doc_ids only in {control.path}: {only_c}")
    if only_k:
        problems.append(f"doc_ids only in {candidate.path}: {only_k}")
    both = sorted(set(c) & set(k))
    for attr, what in (("doc_hash", "the document differs (doc_hash)"),
                       ("prompt_hash", "the prompt differs (prompt_hash)"),
                       ("target_hash", "the target differs (target_hash)"),
                       ("arguments_sha256", "the request arguments differ (generation kwargs or a later request)")):
        diff = [d for d in both if getattr(c[d], attr) != getattr(k[d], attr)]
        if diff:
            problems.append(f"{what} at doc_ids {diff}")
    if problems:
        raise LmEvalLogError(f"cannot pair {control.path} with {candidate.path}:\n  - " + "\n  - ".join(problems))


def pair_logs(control_path: str | os.PathLike, candidate_path: str | os.PathLike, *, metric: str = METRIC,
              filter: str | None = None, rule: str = "quality-v2", margin_pct: float | None = None,
              level: float | None = None, max_net_loss: int = 0, alpha: float = 0.05, n_boot: int = 2000,
              seed: int = 0, change: Sequence[str] = ()) -> PairedLogs:
    """Pair two lm-eval sample logs by doc_id and apply the quality rule (module docstring).

    First the two runs must be a pair: not one run given twice, and the
    settings their ``results_*.json`` record (``check_same_run``) equal in
    everything but the fields named in ``change``.
    """
    check_not_one_run(control_path, candidate_path)
    control = read_log(control_path, metric=metric, filter=filter)
    candidate = read_log(candidate_path, metric=metric, filter=control.filter if filter is None else filter)
    settings = check_same_run(control_path, candidate_path, change=change)
    check_same_documents(control, candidate)
    nonbinary = {arm: [d for d, x in log.docs.items() if _binary(x.value) is None]
                 for arm, log in (("control", control), ("candidate", candidate))}
    if any(nonbinary.values()):
        raise LmEvalLogError(f"metric {metric!r} is not 0/1 (McNemar pairs right/wrong items): "
                             + "; ".join(f"{arm} at doc_ids {ids}" for arm, ids in nonbinary.items() if ids))
    # pairaudit's own export carries each answer's finish reason and whether there was one: then every
    # clause of quality-v1 applies, as in the audit; lm-eval's logs have neither
    own = all(x.answer_facts is not None for log in (control, candidate) for x in log.docs.values())
    scores: dict[str, list[ScoreRecord]] = {}
    records: dict[str, list[PairingFacts]] = {}
    lm_eval_facts: AnswerFacts = {"answered": True, "finish_reason": None}
    for arm, log in (("control", control), ("candidate", candidate)):
        scores[arm] = []
        for d, x in sorted(log.docs.items()):
            facts = x.answer_facts if own and x.answer_facts is not None else lm_eval_facts
            # every value is 0/1 (checked above), so _binary gives a bool
            scores[arm].append({"index": d, "correct": bool(_binary(x.value)), "text": x.response,
                                "answered": facts["answered"], "finish_reason": facts["finish_reason"]})
        # identical prompts and arguments were checked above: the request is the same on both sides
        records[arm] = [{"index": d, "body_sha256": x.arguments_sha256, "error": None}
                        for d, x in sorted(log.docs.items())]
    table = stats.paired_table(scores["control"], scores["candidate"], records["control"], records["candidate"])
    not_checked = []
    if not own:
        # lm-eval records no finish reason: the natural-finish clause cannot be applied, and is not faked
        table["natural_finish"] = {a: None for a in ARMS}
        table["unnatural_finish_indices"] = {a: [] for a in ARMS}
        not_checked.append("natural finish: lm-eval's sample logs record no finish reason, so the quality rule's clause "
                           "that every answer ended by itself (finish_reason 'stop') is not applied")
    params: dict[str, Any] = {"max_net_loss": max_net_loss, "alpha": alpha}
    if margin_pct is not None:
        params["margin_pct"] = margin_pct
    if level is not None:
        params["level"] = level
    quality = gates.apply_quality(rule, table, params, datasets=1)
    order = table["indices"]
    by = {arm: {r["index"]: r["correct"] for r in scores[arm]} for arm in ARMS}
    boot = (stats.paired_bootstrap_ci([by["control"][i] for i in order], [by["candidate"][i] for i in order],
                                      n_boot=n_boot, seed=seed) if order else None)
    not_checked += settings
    return PairedLogs(control=control, candidate=candidate, table=table, quality=quality, bootstrap=boot,
                      not_checked=not_checked)


# ------------------------------------------------------------------ is it a pair?

# What two runs of the same evaluation may differ in without being different evaluations: when and
# where they ran, how long they took, and what they found (the samples are compared on their own).
RUN_BOOKKEEPING = ("date", "total_evaluation_time_seconds", "pretty_env_info", "git_hash", "upper_git_hash",
                   "transformers_version", "results", "n-samples", "higher_is_better", "group_subtasks",
                   "pairaudit", "config.device", "config.batch_sizes", "config.bootstrap_iters", "config.use_cache")


def results_path(samples_path: str | os.PathLike) -> Path | None:
    """The ``results_<timestamp>.json`` lm-eval wrote beside ``samples_<task>_<timestamp>.jsonl`` (the same
    timestamp), or the ``results.json`` beside a pairaudit export; else the directory's only results file."""
    p = Path(samples_path)
    m = _SAMPLES_NAME.match(p.name)
    if m and m.group("stamp"):
        same = p.parent / f"results_{m.group('stamp')}.json"
        if same.is_file():
            return same
    if (p.parent / "results.json").is_file():
        return p.parent / "results.json"
    found = sorted(p.parent.glob("results_*.json"))
    return found[0] if len(found) == 1 else None


def _kv(value: Any) -> Any:
    """model_args / gen_kwargs as lm-eval records them: a dict, or the command line's "k=v,k=v" string."""
    if isinstance(value, str) and "=" in value:
        return dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    return value


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def run_settings(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting a results_*.json records, flattened to dotted fields (``model_args.seed``,
    ``configs.<task>.generation_kwargs.temperature``, ``versions.<task>``, ``random_seed`` ...), less
    ``RUN_BOOKKEEPING`` and each task config's ``metadata.config_source`` (the task file's path)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "config" and isinstance(value, dict):
            for k, v in value.items():
                _flat(k, _kv(v) if k in ("model_args", "gen_kwargs") else v, out)
        else:
            _flat(key, value, out)
    skip = set(RUN_BOOKKEEPING)
    return {k: v for k, v in out.items() if k not in skip and not any(k.startswith(s + ".") for s in skip)
            and not k.endswith(".metadata.config_source")}


def _declared(field_name: str, change: Sequence[str]) -> bool:
    """A field the declared change covers: itself or below it, or a task config's metadata copy of a model
    argument (lm-eval copies model_args into each task's ``metadata``)."""
    for c in change:
        if field_name == c or field_name.startswith(c + "."):
            return True
        if c.startswith("model_args.") and re.fullmatch(rf"configs\.[^.]+\.metadata\.{re.escape(c[11:])}",
                                                         field_name):
            return True
    return False


def check_not_one_run(control_path: str | os.PathLike, candidate_path: str | os.PathLike) -> None:
    """Refuse one run given as both arms: the same file, or the same samples and the same results."""
    a, b = Path(control_path), Path(candidate_path)
    same_file = a.resolve() == b.resolve()
    if not same_file and a.is_file() and b.is_file() and artifacts.sha256_file(a) == artifacts.sha256_file(b):
        ra, rb = results_path(a), results_path(b)
        same_file = ra is None or rb is None or artifacts.sha256_file(ra) == artifacts.sha256_file(rb)
    if same_file:
        raise LmEvalLogError(f"{a} and {b} are one run, not a pair: pairing a run with itself compares nothing "
                             "(give the control's and the candidate's logs)")


def check_same_run(control_path: str | os.PathLike, candidate_path: str | os.PathLike, *,
                   change: Sequence[str] = ()) -> list[str]:
    """Refuse two runs whose recorded settings differ in anything but the declared ``change`` fields.

    lm-eval records the model arguments (the API seed among them), the
    generation settings, the seeds and the task versions in
    ``results_*.json`` beside the samples, not in the samples: both files are
    read (``results_path``) and compared field by field (``run_settings``).
    Two pairaudit exports differ in ``model_args.arm`` by construction (the
    audit checked that their request bodies are the same). Returns what was
    not checked (a declared change that does not differ is not an error: the
    change may be the server's, which the log cannot see).
    """
    paths = {arm: results_path(p) for arm, p in (("control", control_path), ("candidate", candidate_path))}
    missing = [f"{arm}: no results_<timestamp>.json beside {p}" for arm, p in
               (("control", control_path), ("candidate", candidate_path)) if paths[arm] is None]
    if missing:
        raise LmEvalLogError("cannot tell whether the runs are a pair: lm-eval records the seeds, model arguments "
                             "and generation settings in the results file beside the samples; " + "; ".join(missing))
    docs = {}
    for arm, p in paths.items():
        try:
            docs[arm] = json.loads(Path(str(p)).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LmEvalLogError(f"{p}: cannot read the run's results file: {exc}") from None
        if not isinstance(docs[arm], dict):
            raise LmEvalLogError(f"{p}: a results file is a JSON object")
    own = all(isinstance(d.get("pairaudit"), dict) for d in docs.values())
    declared = list(change) + (["model_args.arm"] if own else [])
    c, k = run_settings(docs["control"]), run_settings(docs["candidate"])
    diff = sorted(f for f in set(c) | set(k) if c.get(f, "<absent>") != k.get(f, "<absent>")
                  and not _declared(f, declared))
    if diff:
        shown = "; ".join(f"{f}: control {c.get(f, '<absent>')!r}, candidate {k.get(f, '<absent>')!r}"
                          for f in diff[:20])
        raise LmEvalLogError(
            f"not a pair: the runs' settings differ in {', '.join(diff[:20])}"
            + (f" ... ({len(diff)} fields)" if len(diff) > 20 else "") + f" ({shown}). Only the change under audit "
            "may differ: declare it with --change FIELD (e.g. --change model_args.base_url), or run both arms with "
            f"the same settings ({paths['control']}, {paths['candidate']})")
    quiet = [f for f in change if not any(_declared(x, [f]) and c.get(x) != k.get(x) for x in set(c) | set(k))]
    return ([f"declared change {', '.join(quiet)}: the same in both results files (a server-side change the log "
             "cannot see)"] if quiet else [])
