"""pairaudit.speed.hostthreads: where a server's threads ran, read from /proc, and what a window of samples says.

The parsers on the kernel's own formats; the window's arithmetic on built samples, each built to show one
thing (a shared physical core, a move, a run-queue wait); then the sampler on this host against a busy process.
"""

import os
import subprocess
import sys
import time

import pytest

from pairaudit.speed import hostthreads as ht


def test_a_thread_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    fields = " ".join(str(i) for i in range(3, 53))      # fields 3..52: field 39 holds "39"
    name, cpu = ht.parse_stat(f"4242 (VLLM::Engine (x) 1) {fields}")
    assert name == "VLLM::Engine (x) 1" and cpu == 39
    assert ht.parse_schedstat("123456 789 10\n") == (123456, 789)


def test_the_kernels_cpu_lists_and_one_cpu_per_physical_core():
    assert ht.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert ht.parse_cpu_list("5") == [5]
    cores = {c: (c % 4, c % 4 + 4) for c in range(8)}   # 4 physical cores, siblings c and c+4
    assert ht.one_per_core([0, 1, 2, 3, 4, 5, 6, 7], cores) == [0, 1, 2, 3]
    assert ht.one_per_core([4, 1, 5], cores) == [1, 4]


def test_the_topology_and_clocks_read_from_a_sysfs_tree(tmp_path):
    for cpu, sib in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(sib + "\n")
    (tmp_path / "smt").mkdir()
    (tmp_path / "smt" / "active").write_text("1\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 2400.5\n\nprocessor\t: 1\ncpu MHz\t\t: 3100.0\n")
    assert ht.core_of(tmp_path)[2] == (0, 2)
    assert ht.host_topology(tmp_path) == {"cpus": 4, "physical_cores": 2, "smt_active": "1", "governor": None,
                                          "clock_source": "cpuinfo"}
    assert ht.cpu_mhz(tmp_path, cpuinfo) == {0: 2400.5, 1: 3100.0}
    freq = tmp_path / "cpu1" / "cpufreq"
    freq.mkdir()
    (freq / "scaling_cur_freq").write_text("1800000\n")     # kHz: cpufreq wins where the kernel has it
    assert ht.cpu_mhz(tmp_path, cpuinfo) == {1: 1800.0}


def rows_of(steps):
    """Samples 100 ms apart. Each step: {tid: (cpu, busy share of the interval before it, wait ms)}; run and wait
    times accumulate as the kernel's do. Thread 1 is the engine's loop, 2 and 3 others."""
    run = {1: 0, 2: 0, 3: 0}
    wait = {1: 0, 2: 0, 3: 0}
    rows = []
    for k, step in enumerate(steps):
        threads = []
        for tid, (cpu, share, wait_ms) in step.items():
            run[tid] += int(share * 1e8)
            wait[tid] += int(wait_ms * 1e6)
            threads.append([10, tid, f"t{tid}", cpu, run[tid], wait[tid]])
        rows.append({"t": 100.0 + 0.1 * k, "mhz": {"0": 3000.0, "1": 3000.0, "2": 2000.0, "3": 3000.0},
                     "threads": threads})
    return rows


CORES = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}   # two physical cores, hyperthreads 0+2 and 1+3


def test_a_busy_sibling_on_the_loops_physical_core_is_counted_and_a_quiet_one_is_not():
    alone = rows_of([{1: (0, 0.9, 0), 2: (1, 0.8, 0), 3: (2, 0.0, 0)}] * 5)
    w = ht.window(alone, 0, 1000, CORES)
    assert w["top"] == "t1 (10/1)" and w["top_share"] == pytest.approx(0.9)
    assert w["shared_core_pct"] == 0.0 and w["busy_threads"] == 2.0     # thread 2 is busy on the other core
    shared = rows_of([{1: (0, 0.9, 0), 2: (2, 0.8, 0), 3: (1, 0.0, 0)}] * 5)
    assert ht.window(shared, 0, 1000, CORES)["shared_core_pct"] == 100.0   # thread 2 on cpu 2: cpu 0's sibling


def test_moves_waits_and_the_clock_under_the_busiest_thread():
    rows = rows_of([{1: (0, 0.9, 0), 2: (1, 0.1, 0)}, {1: (0, 0.9, 5), 2: (1, 0.1, 0)},
                    {1: (2, 0.9, 5), 2: (1, 0.1, 0)}, {1: (0, 0.9, 0), 2: (1, 0.1, 0)}])
    w = ht.window(rows, 0, 1000, CORES)
    assert w["top_cpus"] == [0, 2] and w["top_moves"] == 2            # 0 -> 2 -> 0
    assert w["top_wait_ms"] == pytest.approx(10.0)
    assert w["top_mhz"] == pytest.approx((3000 + 2000 + 3000) / 3, abs=0.05)   # cpu 2 runs at 2000 MHz here
    assert w["intervals"] == 3
    assert ht.window(rows, 100.05, 100.12, CORES) is None            # one sample in it: no interval


def test_the_sampler_follows_a_process_it_did_not_start_and_sees_it_busy(tmp_path):
    out = tmp_path / "threads.jsonl"
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 2: pass"])
    sampler = subprocess.Popen([sys.executable, "-m", "pairaudit.speed.hostthreads", str(os.getpid()), str(out),
                                "0.1"])
    t0 = time.time()
    busy.wait()
    t1 = time.time()
    sampler.terminate()
    sampler.wait(timeout=10)
    rows = ht.load(out)
    assert all(sampler.pid not in {t[0] for t in r["threads"]} for r in rows)   # it leaves itself out
    w = ht.window(rows, t0, t1, ht.core_of())
    assert w is not None and w["top"].endswith(f"({busy.pid}/{busy.pid})")
    assert w["top_share"] > 0.5


def test_a_thread_left_out_of_samples_where_it_did_not_run_is_read_from_its_last_written_times():
    rows = rows_of([{1: (0, 0.9, 0), 2: (2, 0.0, 0)}] * 4)
    for row in rows[1:3]:                                  # thread 2 did not run: the sampler left it out
        row["threads"] = [t for t in row["threads"] if t[1] != 2]
    rows[3]["threads"][1][4] += int(0.5e8)                # then ran half of the last interval, on cpu 2
    w = ht.window(rows, 0, 1000, CORES)
    assert w["busy_threads"] == pytest.approx((1 + 1 + 2) / 3, abs=0.01)
    assert w["shared_core_pct"] == pytest.approx(100 / 3, abs=0.1)   # only in that interval, beside cpu 0
    assert ht.window(rows, 100.15, 1000, CORES)["intervals"] == 1     # the samples before a window are its baseline
