"""Where a server's threads ran while it was measured: each thread's CPU, CPU time and run-queue wait, sampled
from ``/proc`` at a fixed interval, beside the host's core topology and each CPU's clock.

A decode loop bound by its host (a small model at batch 1) runs as fast as the core under its busiest thread.
A sibling hyperthread busy on the same physical core, a core clocked down, a thread moved from core to core
or left waiting on a run queue slows it for as long as that lasts. ``window`` says which of those happened
between two times; the noise bench (``bench/gpu/vllm_noise.py``) puts it beside each repeat's rate.

The sampler runs as a process of its own (``python -m pairaudit.speed.hostthreads ROOT_PID OUT``), so that
reading ``/proc`` takes no time from the client whose streams are being timed.  It follows ``ROOT_PID`` and
every process under it (the client, the server it launched, the server's engine process) and writes one
JSON line a sample.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SYS_CPU = Path("/sys/devices/system/cpu")
BUSY_SHARE = 0.3   # a thread on a CPU at least this share of an interval counts as busy in it


@dataclass(frozen=True)
class ThreadSample:
    """One thread at one instant: the CPU it last ran on and its cumulative CPU and run-queue time."""

    pid: int
    tid: int
    name: str
    cpu: int
    run_ns: int     # time on a CPU (schedstat), nanoseconds
    wait_ns: int    # time runnable but waiting for a CPU (schedstat), nanoseconds


def parse_stat(text: str) -> tuple[str, int]:
    """``/proc/PID/task/TID/stat`` -> (the thread's name, the CPU it last ran on). The name may hold spaces and
    parentheses, so the fields are counted from the last ``)``."""
    name = text[text.index("(") + 1:text.rindex(")")]
    rest = text[text.rindex(")") + 2:].split()
    return name, int(rest[36])        # field 39 (processor); rest starts at field 3


def parse_schedstat(text: str) -> tuple[int, int]:
    """``/proc/PID/task/TID/schedstat`` -> (ns on a CPU, ns waiting on a run queue)."""
    run, wait = text.split()[:2]
    return int(run), int(wait)


def read_threads(pids: list[int], proc: Path = Path("/proc")) -> list[ThreadSample]:
    out = []
    for pid in pids:
        try:
            tids = os.listdir(proc / str(pid) / "task")
        except OSError:
            continue                  # the process ended between listing and reading
        for tid in tids:
            task = proc / str(pid) / "task" / tid
            try:
                name, cpu = parse_stat((task / "stat").read_text())
                run, wait = parse_schedstat((task / "schedstat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            out.append(ThreadSample(pid, int(tid), name, cpu, run, wait))
    return out


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's CPU list format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def core_of(sysfs: Path = SYS_CPU) -> dict[int, tuple[int, ...]]:
    """Each CPU -> the CPUs of its physical core (itself alone where the topology cannot be read)."""
    out: dict[int, tuple[int, ...]] = {}
    for d in sorted(sysfs.glob("cpu[0-9]*")):
        cpu = int(d.name[3:])
        try:
            out[cpu] = tuple(parse_cpu_list((d / "topology" / "thread_siblings_list").read_text()))
        except (OSError, ValueError):
            out[cpu] = (cpu,)
    return out


def one_per_core(cpus: list[int], cores: dict[int, tuple[int, ...]]) -> list[int]:
    """The first of ``cpus`` on each physical core: a set on which no two threads share a core."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for cpu in sorted(cpus):
        core = cores.get(cpu, (cpu,))
        if core not in seen:
            seen.add(core)
            out.append(cpu)
    return out


def cpu_mhz(sysfs: Path = SYS_CPU, cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[int, float]:
    """Each CPU's current clock in MHz: cpufreq's ``scaling_cur_freq`` where the kernel has it, else
    ``/proc/cpuinfo`` (on many virtual machines a fixed figure, which then says nothing)."""
    out: dict[int, float] = {}
    for f in sysfs.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            out[int(f.parent.parent.name[3:])] = int(f.read_text()) / 1000.0
        except (OSError, ValueError):
            continue
    if out:
        return out
    cpu = None
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "processor":
                cpu = int(val)
            elif key == "cpu MHz" and cpu is not None:
                out[cpu] = float(val)
    except (OSError, ValueError):
        return {}
    return out


def host_topology(sysfs: Path = SYS_CPU) -> dict:
    """What the host's cores are: how many logical CPUs and physical cores, SMT, the frequency governor."""
    cores = core_of(sysfs)

    def read(p: Path) -> str | None:
        try:
            return p.read_text().strip()
        except OSError:
            return None

    return {"cpus": len(cores), "physical_cores": len(set(cores.values())),
            "smt_active": read(sysfs / "smt" / "active"),
            "governor": read(sysfs / "cpu0" / "cpufreq" / "scaling_governor"),
            "clock_source": "cpufreq" if any(sysfs.glob("cpu[0-9]*/cpufreq/scaling_cur_freq")) else "cpuinfo"}


def tree(root: int) -> list[int]:
    """``root`` and every process under it, alive now."""
    try:
        p = psutil.Process(root)
        return [root] + [c.pid for c in p.children(recursive=True)]
    except psutil.Error:
        return []


def sample(root: int, exclude: int, seen: dict) -> dict:
    """One sample: the threads that ran or waited since the last (``seen`` holds each thread's last times; a
    thread left out did neither, so its times are the ones last written)."""
    threads = []
    for s in read_threads([p for p in tree(root) if p != exclude]):
        if seen.get((s.pid, s.tid)) != (s.run_ns, s.wait_ns):
            seen[(s.pid, s.tid)] = (s.run_ns, s.wait_ns)
            threads.append([s.pid, s.tid, s.name, s.cpu, s.run_ns, s.wait_ns])
    return {"t": time.time(), "mhz": cpu_mhz(), "threads": threads}


def run(root: int, out: Path, interval_s: float) -> None:
    """Sample until ``root`` ends or this process is terminated, one JSON line a sample."""
    me = os.getpid()
    seen: dict = {}
    with open(out, "a", encoding="utf-8") as fh:
        while psutil.pid_exists(root):
            t0 = time.monotonic()
            fh.write(json.dumps(sample(root, me, seen)) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0)))


def load(path: Path) -> list[dict]:
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue                  # a line cut short when the sampler was stopped
    return rows


def window(rows: list[dict], t0: float, t1: float, cores: dict[int, tuple[int, ...]]) -> dict | None:
    """What the busiest thread of ``[t0, t1]`` went through: its share of a CPU, the CPUs it ran on and how often
    it moved, its run-queue wait, the clock of its CPU, and how often another busy thread sat on its physical
    core. None where fewer than two samples fall in the window."""
    intervals = []    # per consecutive pair of samples in the window: {(pid, tid): (name, cpu, busy share, wait ms)}
    last: dict = {}   # each thread's latest written times (a sample leaves out the threads that did not change)
    prev_t = None
    for row in rows:
        now = {}
        inside = t0 <= row["t"] <= t1
        dt_ns = (row["t"] - prev_t) * 1e9 if inside and prev_t is not None else 0.0
        for pid, tid, name, cpu, run_ns, wait_ns in row["threads"]:
            before = last.get((pid, tid))
            last[(pid, tid)] = (run_ns, wait_ns)
            if before is not None and dt_ns > 0:
                now[(pid, tid)] = (name, cpu, (run_ns - before[0]) / dt_ns, (wait_ns - before[1]) / 1e6, row["mhz"])
        if dt_ns > 0:
            intervals.append(now)
        prev_t = row["t"] if inside else None
    if not intervals:
        return None
    totals: dict[tuple[int, int], float] = {}
    for now in intervals:
        for key, (_, _, share, _, _) in now.items():
            totals[key] = totals.get(key, 0.0) + share
    top = max(totals, key=lambda k: totals[k])
    cpus, waits, clocks, shared, busy_counts = [], [], [], 0, []
    name = ""
    for now in intervals:
        busy = {k: v for k, v in now.items() if v[2] >= BUSY_SHARE}
        busy_counts.append(len(busy))
        if top not in now:
            continue
        name, cpu, _, wait_ms, mhz = now[top]
        cpus.append(cpu)
        waits.append(wait_ms)
        clock = mhz.get(str(cpu), mhz.get(cpu))   # JSON made the CPU keys strings
        if clock is not None:
            clocks.append(clock)
        core = set(cores.get(cpu, (cpu,)))
        if any(v[1] in core for k, v in busy.items() if k != top):
            shared += 1
    return {"top": f"{name} ({top[0]}/{top[1]})", "top_share": round(totals[top] / len(intervals), 3),
            "top_cpus": sorted(set(cpus)), "top_moves": sum(1 for x, y in zip(cpus, cpus[1:]) if x != y),
            "top_wait_ms": round(sum(waits), 1), "top_mhz": round(statistics.fmean(clocks), 1) if clocks else None,
            "shared_core_pct": round(100.0 * shared / len(cpus), 1) if cpus else None,
            "busy_threads": round(statistics.fmean(busy_counts), 2), "intervals": len(intervals)}


if __name__ == "__main__":
    run(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.1)
