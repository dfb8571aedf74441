"""The machine-wide GPU pool: each launched server gets GPUs of its own, whoever started it.

The server slots (:mod:`pairaudit.serving.slots`) bound how many servers run
on a host at once; they do not say which GPUs each one uses.  This module
does: a host declares its GPUs (the pool), an arm asks for a number of them
(``arms.<name>.gpus``), and every launched server holds one lock file per
device it uses, ``gpu-<id>.lock`` beside the slot files (same directory,
``$PAIRAUDIT_SLOTS_DIR``, default ``/tmp/pairaudit-slots``), by an exclusive
``flock`` for as long as it runs.  The kernel drops a lock when its holder
dies, however it dies, so a killed job never leaks a GPU.  The server is
started with ``CUDA_VISIBLE_DEVICES`` set to the ids it holds, and the ids
are recorded in its start facts (the launch receipt's ``run.gpus``, every
``ready`` line of ``servers/starts.jsonl``).

The pool (:func:`current_pool`), first that applies:

- inside a Slurm job (``SLURM_JOB_ID`` set) whose allocation has GPUs: the
  allocation, i.e. the entries of the ``CUDA_VISIBLE_DEVICES`` Slurm set
  (else ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``), with lock files of that
  job only (Slurm already keeps jobs apart); a Slurm job without GPUs has no
  pool, and a declared pool is ignored inside any Slurm job;
- ``$PAIRAUDIT_GPU_POOL``: ``auto`` (the GPUs this job sees: the entries of
  its ``CUDA_VISIBLE_DEVICES`` when set, else every GPU ``nvidia-smi
  --query-gpu=index,uuid`` lists), a comma list of device ids (``0,1,2,3``,
  ``GPU-<uuid>``), or ``none``.  The workflow sets it at load from the
  config's ``gpus.pool`` unless the environment already sets it
  (:func:`export_config`);
- otherwise no pool: servers are started with the job's environment as they
  always were (only GPUs an arm pins are locked, see below).

What a launched server gets (:func:`acquire_for`):

- an arm whose ``env`` sets ``CUDA_VISIBLE_DEVICES`` keeps exactly those
  devices (part of its identity) and locks them, pool or not, so two
  servers that would share a GPU never run at once;
- else, with a pool, an arm with ``gpus: N`` takes N free ids of the pool
  (waiting while fewer are free; refused at once when the pool is smaller
  than N), and an arm with ``gpus: 0`` (the default: no GPU asked) is
  started with ``CUDA_VISIBLE_DEVICES=""`` so it cannot touch a GPU another
  server holds;
- else (no pool) nothing is set and nothing locked.

The lock of an id is keyed by its GPU's UUID where ``nvidia-smi`` resolves
it (an index or a UUID prefix), so a pin by UUID and a pool by index lock the
same file; without ``nvidia-smi`` (the tests' fake ids) by the id as written.
Indices are nvidia-smi's; on a host mixing GPU models CUDA numbers devices
fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: name GPUs by UUID there.

Waiting is logged as it starts and then every ``log_every_s`` (``waiting for
2 GPU(s) for arm candidate ...: gpu 0 held by pid 4242 (audit a, arm
control, since ...)``); ``$PAIRAUDIT_GPU_WAIT_S`` (config
``gpus.wait_timeout_s``) bounds it, unset = as long as it takes.  The order
of the locks is always GPUs first, then the server slot: a process waiting
for GPUs holds no slot, so a speed bracket holding its GPUs between its
starts (:func:`reserve`) can always get a slot, and no wait can close a cycle.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, MutableMapping, TypedDict

from pairaudit.serving import slots
from pairaudit.serving.armspec import ArmSpec

POOL_ENV = "PAIRAUDIT_GPU_POOL"
WAIT_ENV = "PAIRAUDIT_GPU_WAIT_S"
VISIBLE = "CUDA_VISIBLE_DEVICES"
SLURM_GPU_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
# A device id as CUDA_VISIBLE_DEVICES takes it: an index, a GPU UUID (or a unique prefix), a MIG instance.
_ID_RE = re.compile(r"^(?:[0-9]+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+)$")
ALLOWED_IDS = "a device index (0, 1, ...), a GPU-<uuid> or a MIG-<uuid>"
_SMI_TIMEOUT_S = 20

log = logging.getLogger("pairaudit")

# lock keys this process holds now: waiting on a GPU only this process holds would never end
_HELD: set[str] = set()


class GpuPoolError(RuntimeError):
    """GPUs that cannot be had (a bad declaration, more than the pool has, a wait that timed out)."""


# ------------------------------------------------------------------ what is asked

@dataclass(frozen=True)
class GpuRequest:
    """What one arm's server asks of the pool."""
    arm: str
    count: int                              # arms.<arm>.gpus (0: no GPU asked)
    pinned: tuple[str, ...] | None          # the entries of the arm's own CUDA_VISIBLE_DEVICES; None: not pinned


def request_of(spec: ArmSpec) -> GpuRequest | None:
    """What a resolved arm spec asks (None for an attached server: started elsewhere, on GPUs of its own).

    The one place this module reads a spec: ``arm``, ``mode``, ``gpus`` and
    the ``CUDA_VISIBLE_DEVICES`` of ``env``.
    """
    if spec.mode != "launch":
        return None
    env = spec.env
    pinned = parse_ids(env[VISIBLE], f"arms.{spec.arm}.env.{VISIBLE}", strict=False) if VISIBLE in env else None
    return GpuRequest(arm=spec.arm, count=spec.gpus, pinned=pinned)


def request_problems(req: GpuRequest) -> list[str]:
    """A count that contradicts the arm's own pin (its server could only run on the pin)."""
    if req.pinned is not None and req.count and req.count != len(req.pinned):
        return [f"arms.{req.arm}.gpus: {req.count}, but env.{VISIBLE} pins {len(req.pinned)} device(s) "
                f"({','.join(req.pinned) or 'none'}); allowed: gpus equal to the number pinned, or 0"]
    return []


def parse_ids(raw: str, where: str, *, strict: bool = True) -> tuple[str, ...]:
    """The entries of a comma list of device ids; an empty value is no device.

    ``strict`` (a pool declaration) refuses anything CUDA would not take and
    any repeat; a pin (``strict=False``) is the arm's own value and is taken
    as written, blanks trimmed.
    """
    entries = tuple(e.strip() for e in str(raw).split(",")) if str(raw).strip() else ()
    if not strict:
        return tuple(e for e in entries if e)
    for e in entries:
        if not _ID_RE.match(e):
            raise GpuPoolError(f"{where}: {e!r} is not a device id (allowed: {ALLOWED_IDS}; a comma list, "
                               "'auto' or 'none')")
    dup = sorted({e for e in entries if entries.count(e) > 1})
    if dup:
        raise GpuPoolError(f"{where}: {', '.join(dup)} listed more than once (each device once)")
    return entries


# ---------------------------------------------------------------------- the pool

@dataclass(frozen=True)
class Pool:
    """The GPUs servers on this host (or in this Slurm job) share out."""
    ids: tuple[str, ...]
    source: Literal["declared", "auto", "slurm"]
    origin: str                             # where it was read, for messages and records
    directory: Path                         # where its lock files live


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


@functools.lru_cache(maxsize=4)
def _smi_table(exe: str) -> tuple[tuple[str, str], ...] | None:
    """(index, uuid) of every GPU nvidia-smi lists; None when it cannot say."""
    try:
        res = subprocess.run([exe, "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    rows = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            rows.append((parts[0], parts[1]))
    return tuple(rows)


def detect(exe: str | None = None) -> tuple[str, ...]:
    """The indices of every GPU nvidia-smi lists (``auto``); () without nvidia-smi or when it fails."""
    exe = exe or nvidia_smi()
    table = _smi_table(exe) if exe else None
    return tuple(i for i, _ in table or ())


def _uuid_of(entry: str, table: Iterable[tuple[str, str]] | None) -> str | None:
    """The UUID an index or UUID prefix names in nvidia-smi's table; None when it names none (or no table)."""
    rows = list(table or ())
    hits = [u for i, u in rows if i == entry] if entry.isdigit() else \
        [u for _, u in rows if entry.startswith("GPU-") and u.startswith(entry)]
    return hits[0] if len(hits) == 1 else None


def current_pool(environ: Mapping[str, str] | None = None) -> Pool | None:
    """The pool in force for a process with this environment (module docstring); None: no pool."""
    env = os.environ if environ is None else environ
    base = slots.slots_dir(env)
    job = env.get("SLURM_JOB_ID", "").strip()
    if job:
        if VISIBLE in env:
            where, raw = f"Slurm job {job} ({VISIBLE}={env[VISIBLE]})", env[VISIBLE]
        else:
            var = next((v for v in SLURM_GPU_VARS if env.get(v, "").strip()), None)
            if var is None:
                return None  # a job without GPUs: nothing to share out, nothing changes
            where, raw = f"Slurm job {job} ({var}={env[var]})", env[var]
        # Slurm keeps jobs' GPUs apart; the locks only keep this job's own servers apart.
        ids = parse_ids(raw, where, strict=False)
        return Pool(ids=ids, source="slurm", origin=where,
                    directory=base / f"slurm-{re.sub(r'[^A-Za-z0-9_.-]', '_', job)}")
    raw = env.get(POOL_ENV, "").strip()
    if raw in ("", "none"):
        return None
    if raw == "auto":
        if VISIBLE in env:
            return Pool(ids=parse_ids(env[VISIBLE], VISIBLE, strict=False), source="auto",
                        origin=f"auto: this job's {VISIBLE}={env[VISIBLE]}", directory=base)
        exe = nvidia_smi()
        ids = detect(exe)
        origin = "auto: nvidia-smi --query-gpu=index,uuid" if exe else "auto: no nvidia-smi on PATH (no GPU found)"
        return Pool(ids=ids, source="auto", origin=origin, directory=base)
    return Pool(ids=parse_ids(raw, POOL_ENV), source="declared", origin=f"{POOL_ENV}={raw}", directory=base)


def wait_timeout(environ: Mapping[str, str] | None = None) -> float | None:
    env = os.environ if environ is None else environ
    raw = env.get(WAIT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise GpuPoolError(f"{WAIT_ENV}={raw!r}: expected a positive number of seconds (gpus.wait_timeout_s)")
    return value


# --------------------------------------------------------------------- records

class GpuDevice(TypedDict):
    id: str                                 # as CUDA_VISIBLE_DEVICES names it
    uuid: str | None                        # nvidia-smi's UUID for it; None without nvidia-smi
    lock: str                               # the lock file held


class GpuFacts(TypedDict):
    """Which GPUs one server start ran on (``Server.facts()["gpus"]``): the receipt's ``run.gpus``, starts.jsonl."""
    source: Literal["pool", "pinned", "none", "no pool"]
    # pool: ids taken from the pool; pinned: the arm's own CUDA_VISIBLE_DEVICES; none: gpus 0 while a pool
    # is in force (started with CUDA_VISIBLE_DEVICES=""); no pool: nothing set, the job's environment as is
    asked: int                              # the arm's gpus
    cuda_visible_devices: str | None        # what the server was started with; None: not set here
    devices: list[GpuDevice]
    pool: list[str] | None
    pool_origin: str | None
    shared: bool                            # held for several starts (a speed bracket), not by this start alone
    waited_s: float


@dataclass
class GpuLease:
    """The GPUs one server start runs on; ``release`` frees them unless they belong to a reservation."""
    facts: GpuFacts
    fds: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """What the server's environment gets from the pool (a pin stays in the arm's own env)."""
        return env_of(self.facts)

    @property
    def ids(self) -> list[str]:
        return [d["id"] for d in self.facts["devices"]]

    def release(self) -> None:
        """Give the GPUs back. Idempotent; a lease without locks of its own has nothing to give."""
        fds, self.fds = self.fds, []
        for key in self.keys:
            _HELD.discard(key)
        self.keys = []
        for fd in fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def env_of(facts: GpuFacts | None) -> dict[str, str]:
    """The variables a start with these facts was given by the pool (none for a pin, no pool, attach)."""
    if facts and facts["source"] in ("pool", "none"):
        return {VISIBLE: facts["cuda_visible_devices"] or ""}
    return {}


def server_environ(gpus: GpuLease | GpuFacts | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job environment with what the pool set for a start (its lease, or its recorded facts).

    Pass it to ``speed.gpu.server_visible_devices``: with the arm's env over
    it, that is the ``CUDA_VISIBLE_DEVICES`` the server was started with.
    """
    facts = gpus.facts if isinstance(gpus, GpuLease) else gpus
    return {**(os.environ if environ is None else environ), **env_of(facts)}


def release(lease: GpuLease | None) -> None:
    if lease is not None:
        lease.release()


# ---------------------------------------------------------------------- locking

def _lock_name(key: str) -> str:
    return "gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "_", key) + ".lock"


@dataclass(frozen=True)
class _Device:
    id: str
    uuid: str | None
    path: Path

    @property
    def key(self) -> str:
        return str(self.path)


def _devices(ids: Iterable[str], directory: Path, table) -> list[_Device]:
    out = []
    for i in ids:
        uuid = _uuid_of(i, table)
        out.append(_Device(i, uuid, directory / _lock_name(uuid or i)))
    return out


def _try_lock(dev: _Device) -> int | None:
    try:
        fd = slots._open(dev.path)  # created usable by every user of the host, like a slot file
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open GPU lock file: {exc.strerror}", str(dev.path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise OSError(exc.errno, f"cannot lock GPU lock file: {exc.strerror}", str(dev.path)) from None
    return fd


def _try_take(pinned: list[_Device], pool: list[_Device], need: int, label: Mapping) -> list[tuple[_Device, int]] | None:
    """Every pinned device and ``need`` free pool devices, all held, or None with nothing held.

    All or nothing: holding part of a set while waiting for the rest would
    let two takers each hold half of what the other needs.
    """
    got: list[tuple[_Device, int]] = []
    ok = True
    for dev in pinned:
        fd = None if dev.key in _HELD else _try_lock(dev)
        if fd is None:
            ok = False
            break
        got.append((dev, fd))
    if ok and need:
        taken = {d.key for d, _ in got}
        n = 0
        for dev in pool:
            if dev.key in taken or dev.key in _HELD:
                continue
            fd = _try_lock(dev)
            if fd is not None:
                got.append((dev, fd))
                taken.add(dev.key)
                n += 1
                if n == need:
                    break
        ok = n == need
    if not ok:
        for _, fd in got:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **{k: v for k, v in label.items() if v is not None}}
    for _, fd in got:
        with contextlib.suppress(OSError):  # the holder note is for the waiters' log line only
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    return got


def _held_line(devs: Iterable[_Device]) -> str:
    parts = []
    for d in devs:
        info = slots.holder(d.path) if d.path.exists() else {}
        busy = d.key in _HELD or (_try_peek(d) is False)
        parts.append(f"gpu {d.id} " + (f"held by {slots.describe(info)}" if busy else "free"))
    return "; ".join(parts)


def _try_peek(dev: _Device) -> bool | None:
    """Whether the device is free right now (True), held (False), or unknown; never keeps a lock."""
    try:
        fd = _try_lock(dev)
    except OSError:
        return None
    if fd is None:
        return False
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return True


def _take(pinned_ids: list[str], need: int, pool: Pool | None, who: str, label: Mapping, *,
          timeout_s: float | None, poll_s: float, log_every_s: float,
          on_wait: Callable[[str], None] | None) -> tuple[list[tuple[_Device, int]], float]:
    """Hold the pinned ids and ``need`` ids of the pool, waiting as long as allowed; (held, seconds waited).

    The pinned devices come first in the result, then the pool's.
    """
    directory = pool.directory if pool is not None else slots.slots_dir()
    exe = nvidia_smi()
    table = _smi_table(exe) if exe else None
    pool_devs = _devices(pool.ids if pool else (), directory, table)
    if pool is not None and pool.source == "declared" and table is not None:
        unknown = [d.id for d in pool_devs if d.uuid is None]
        if unknown:
            known = ", ".join(f"{i} {u}" for i, u in table) or "none"
            raise GpuPoolError(f"GPU pool ({pool.origin}): {', '.join(unknown)} names no GPU of this host "
                               f"(nvidia-smi lists: {known})")
    pinned = _devices(pinned_ids, directory, table)
    if need > len(pool_devs):
        has = (f"the pool has {len(pool_devs)} ({pool.origin}: {','.join(pool.ids) or 'empty'})" if pool
               else "no GPU pool is declared")
        raise GpuPoolError(f"{who}: asks {need} GPU(s) but {has}; allowed: gpus up to the pool's size "
                           f"(declare more with gpus.pool or {POOL_ENV})")
    asked = ([f"{need} from the pool {','.join(pool.ids)} ({pool.origin})"] if pool is not None and need else []) + \
        ([f"pinned {','.join(pinned_ids)}"] if pinned_ids else [])
    slots._ensure_dir(directory)
    t0 = time.monotonic()
    last_log = None
    while True:
        got = _try_take(pinned, pool_devs, need, label)
        if got is not None:
            if last_log is not None:
                log.info("got GPU(s) %s for %s", ",".join(d.id for d, _ in got), who)
            return got, time.monotonic() - t0
        mine = [d for d in pinned if d.key in _HELD]
        pinned_keys = {p.key for p in pinned}
        others = [d for d in pool_devs if d.key not in _HELD and d.key not in pinned_keys]
        if mine or need > len(others):
            held = ", ".join(d.id for d in (mine or [d for d in pool_devs if d.key in _HELD]))
            raise GpuPoolError(f"{who}: this process already holds GPU(s) {held}, so waiting for them would never "
                               "end (a server started while another server of this process holds its GPUs)")
        waited = time.monotonic() - t0
        line = (f"GPU(s) for {who}: {' and '.join(asked)}; {_held_line([*pinned, *pool_devs])} "
                f"(locks in {directory})")
        if timeout_s is not None and waited >= timeout_s:
            raise GpuPoolError(f"timed out after {waited:.1f} s waiting for {line}; free those GPUs, declare a "
                               f"larger pool, or raise gpus.wait_timeout_s ({WAIT_ENV})")
        now = time.monotonic()
        if last_log is None or now - last_log >= log_every_s:
            log.warning("waiting for %s", line)
            if on_wait is not None:
                on_wait(f"waiting for {line}")
            last_log = now
        time.sleep(poll_s if timeout_s is None else max(0.0, min(poll_s, timeout_s - waited)))


# ------------------------------------------------------------------- acquiring

@dataclass
class Reservation:
    """GPUs held for several starts (the speed bracket): each start runs on the same ids, released once."""
    leases: dict[str, GpuLease]             # per arm: the start's view (no locks of its own)
    held: GpuLease                          # the locks

    def lease_for(self, spec: ArmSpec) -> GpuLease | None:
        req = request_of(spec)
        if req is None:
            return None
        if req.arm not in self.leases:
            raise GpuPoolError(f"arm {req.arm} has no GPUs in this reservation (reserved for "
                               f"{', '.join(self.leases) or 'no arm'})")
        return self.leases[req.arm]

    def server_environ(self, spec: ArmSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the arm's server is started with here, before the arm's own env."""
        return server_environ(self.lease_for(spec), environ)

    def release(self) -> None:
        self.held.release()

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _facts(source, asked, visible, devices, pool: Pool | None, shared: bool, waited: float) -> GpuFacts:
    return {"source": source, "asked": asked, "cuda_visible_devices": visible,
            "devices": [{"id": d.id, "uuid": d.uuid, "lock": str(d.path)} for d in devices],
            "pool": list(pool.ids) if pool else None, "pool_origin": pool.origin if pool else None,
            "shared": shared, "waited_s": round(waited, 3)}


def reserve(specs: Iterable[ArmSpec], label: Mapping | None = None, *,
            timeout_s: float | None = None, poll_s: float = 0.5, log_every_s: float = 30.0,
            on_wait: Callable[[str], None] | None = None, environ: Mapping[str, str] | None = None) -> Reservation:
    """Hold the GPUs of these arms' servers at once: every pin, and the largest count asked of the pool.

    An arm with ``gpus: N`` runs on the first N reserved pool ids, so arms
    asking the same N run on the same devices.  ``timeout_s``: default
    ``$PAIRAUDIT_GPU_WAIT_S``, unset waits as long as it takes.
    """
    return _reserve(list(specs), label, timeout_s=timeout_s, poll_s=poll_s, log_every_s=log_every_s,
                    on_wait=on_wait, environ=environ, shared=True)


def _reserve(specs: list[ArmSpec], label: Mapping | None, *, timeout_s: float | None, poll_s: float,
             log_every_s: float, on_wait: Callable[[str], None] | None, environ: Mapping[str, str] | None,
             shared: bool) -> Reservation:
    reqs = [r for r in (request_of(s) for s in specs) if r is not None]
    for r in reqs:
        probs = request_problems(r)
        if probs:
            raise GpuPoolError(probs[0])
    env = os.environ if environ is None else environ
    pool = current_pool(env)
    timeout_s = wait_timeout(env) if timeout_s is None else timeout_s
    pinned: list[str] = []
    for r in reqs:
        pinned += [i for i in r.pinned or () if i not in pinned]
    need = max((r.count for r in reqs if r.pinned is None), default=0) if pool is not None else 0
    who = f"arm{'s' if len(reqs) > 1 else ''} {', '.join(r.arm for r in reqs)}"
    label = {"audit": env.get(slots.AUDIT_ENV), **(label or {})}
    got, waited = ([], 0.0) if not (pinned or need) else _take(
        pinned, need, pool, who, label, timeout_s=timeout_s, poll_s=poll_s, log_every_s=log_every_s,
        on_wait=on_wait)
    devs = [d for d, _ in got]
    by_id = {d.id: d for d in devs[:len(pinned)]}
    from_pool = devs[len(pinned):]
    leases: dict[str, GpuLease] = {}
    for r in reqs:
        if r.pinned is not None:
            f = _facts("pinned", r.count, ",".join(r.pinned), [by_id[i] for i in r.pinned], pool, shared, waited)
        elif pool is None:
            f = _facts("no pool", r.count, None, [], None, shared, waited)
        elif r.count == 0:
            f = _facts("none", 0, "", [], pool, shared, waited)
        else:
            mine = from_pool[:r.count]
            f = _facts("pool", r.count, ",".join(d.id for d in mine), mine, pool, shared, waited)
        leases[r.arm] = GpuLease(facts=f)
    held = GpuLease(facts=_facts("pool" if need else "pinned", need, None, devs, pool, shared, waited),
                    fds=[fd for _, fd in got], keys=[d.key for d in devs])
    _HELD.update(held.keys)
    if got:
        log.info("GPU(s) for %s: %s", who, "; ".join(f"{r.arm} on {leases[r.arm].facts['cuda_visible_devices']!r}"
                                                     for r in reqs))
    return Reservation(leases=leases, held=held)


def acquire_for(spec: ArmSpec, log_path=None, *, held: Reservation | None = None) -> GpuLease | None:
    """The GPUs a launched server of ``spec`` runs on (``launch.Server.start``); None for an attached one.

    ``held``: GPUs the caller already holds for several starts (a speed
    bracket's :func:`reserve`); the start then runs on those and releases
    nothing.  Otherwise the start takes its own, released by ``release``.
    """
    if held is not None:
        return held.lease_for(spec)
    req = request_of(spec)
    if req is None:
        return None
    res = _reserve([spec], {"arm": req.arm, "log": str(log_path) if log_path else None}, timeout_s=None,
                   poll_s=0.5, log_every_s=30.0, on_wait=None, environ=None, shared=False)
    lease = res.leases[req.arm]
    # the start's own lease owns the locks: one object to release
    lease.fds, lease.keys = res.held.fds, res.held.keys
    res.held.fds, res.held.keys = [], []
    return lease


# ------------------------------------------------------------- the config key

def pool_value(value: Any, where: str = "gpus.pool") -> str | None:
    """The config's ``gpus.pool`` as ``$PAIRAUDIT_GPU_POOL`` spells it (None: no pool declared)."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip()
        if v in ("auto", "none", ""):
            return v or None
        parse_ids(v, where)
        return v
    if isinstance(value, list):
        ids = [str(v).strip() for v in value if not isinstance(v, bool)]
        if len(ids) != len(value) or not all(isinstance(v, (int, str)) for v in value):
            raise GpuPoolError(f"{where}: {value!r} must list device ids ({ALLOWED_IDS})")
        parse_ids(",".join(ids), where)
        return ",".join(ids)
    raise GpuPoolError(f"{where}: {value!r} is not 'auto', 'none' or a list of device ids ({ALLOWED_IDS})")


def load_check(config: Mapping[str, Any], specs: Mapping[str, ArmSpec],
               environ: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) of the GPU keys at load: the pool declaration, each arm's count against its pin."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    notes: list[str] = []
    section = config.get("gpus") or {}
    declared = None
    try:
        declared = pool_value(section.get("pool"))
    except GpuPoolError as exc:
        problems.append(str(exc))
    wait = section.get("wait_timeout_s")
    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait <= 0):
        problems.append(f"gpus.wait_timeout_s: {wait!r} is not a positive number of seconds (or null: no limit)")
    for spec in specs.values():
        req = request_of(spec)
        if req is not None:
            problems += request_problems(req)
    if env.get(POOL_ENV, "").strip() and declared is not None and env[POOL_ENV].strip() != declared:
        notes.append(f"gpus.pool: {declared!r} is overridden by {POOL_ENV}={env[POOL_ENV]!r} from the environment")
    asked = [r for r in (request_of(s) for s in specs.values()) if r is not None and r.count and r.pinned is None]
    if asked and declared in (None, "none") and not env.get(POOL_ENV, "").strip() and not env.get("SLURM_JOB_ID"):
        notes.append("; ".join(f"arms.{r.arm}.gpus: {r.count}" for r in asked) + ", but no GPU pool is declared "
                     f"(gpus.pool, {POOL_ENV}): on this host the server sees every GPU the job sees; on Slurm the "
                     "job's allocation is its pool")
    return problems, notes


def export_config(config: Mapping[str, Any], environ: MutableMapping[str, str] | None = None) -> None:
    """Hand the config's ``gpus`` section to the jobs (environment variables), unless the environment sets them."""
    env = os.environ if environ is None else environ
    section = config.get("gpus") or {}
    value = pool_value(section.get("pool"))
    if value is not None and not env.get(POOL_ENV, "").strip():
        env[POOL_ENV] = value
    wait = section.get("wait_timeout_s")
    if wait is not None and not env.get(WAIT_ENV, "").strip():
        env[WAIT_ENV] = str(wait)
