"""bench/gpu/vllm_noise.py: one start per variant, many repeats of every speed cell, and what each repeat ran beside.

The summary's arithmetic on built series; then the script itself against the embedded reference server (the same
launch and workload code drives vLLM on a GPU), where a variant's variable must reach the server it starts.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "gpu" / "vllm_noise.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("vllm_noise", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Sampler:
    """Stands in for nvidia-smi: a fixed SM clock per repeat window."""

    def __init__(self, clocks):
        self.clocks = clocks

    def window(self, t0, t1):
        return {"sm_mhz": self.clocks[int(t0)], "util_pct": 50.0}


def test_the_summary_pools_three_repeats_and_reads_the_clock_beside_each():
    bench = load_bench()
    rates = [100.0, 80.0, 120.0, 100.0, 80.0, 120.0]
    slow = [90.0, 70.0, 110.0, 90.0, 70.0, 110.0]
    result = {"a": {"pooled": [{"pooled_rate_tps": r} for r in rates]},
              "b": {"pooled": [{"pooled_rate_tps": r} for r in slow]}}
    records = [{"cell": c, "tpot_s": t, "itl_s": [t, 2 * t]} for c, t in (("a", 0.01), ("a", 0.02), ("b", 0.01))]
    windows = {(c, r): (r, r + 0.5) for c in "ab" for r in range(6)}
    out = bench.summarise(result, records, windows, Sampler([1980 - 10 * r for r in range(6)]))
    a = out["a"]
    assert a["per_repeat_pct"] == pytest.approx(100 * 17.888543819998318 / 100)
    assert a["per_3_repeats_pct"] == 0.0                       # both triples average 100: the spells cancel
    assert a["stream_tpot_pct"] == pytest.approx(100 * 0.007071067811865475 / 0.015)
    assert a["itl_ms_median"] == pytest.approx(20.0) and a["itl_ms_p99"] == pytest.approx(39.4)
    assert a["sm_mhz"] == [1980, 1970, 1960, 1950, 1940, 1930]
    assert out["_cells_move_together"] == pytest.approx(1.0)   # the slow cell moved with the fast one
    assert bench.cv_pct([5.0]) is None and bench.corr([1, 2], [3, 4]) is None
    assert bench.corr([1, 2, 3], [5, 5, 5]) is None            # a flat clock says nothing of the rate


def test_the_cores_split_between_client_and_server():
    bench = load_bench()
    smt = {c: (c % 4, c % 4 + 4) for c in range(8)}        # 4 physical cores, siblings c and c+4
    client, server = bench.split_cores(list(range(8)), smt, phys=True)
    assert client == {0, 4} and server == {1, 2, 3}          # no server thread shares a core with another
    client, server = bench.split_cores(list(range(8)), smt, phys=False)
    assert client == {0, 1} and server == {2, 3, 4, 5, 6, 7}
    flat = {c: (c,) for c in range(4)}                       # no SMT: phys takes two whole cores for the client
    assert bench.split_cores([0, 1, 2, 3], flat, phys=True) == ({0, 1}, {2, 3})
    assert bench.split_cores([0, 1, 2], flat, phys=True) is None
    assert bench.split_cores([0, 1, 2], flat, phys=False) is None


def test_the_summary_puts_the_busiest_thread_beside_each_repeat():
    bench = load_bench()
    rates = [100.0, 80.0, 100.0, 80.0]
    result = {"a": {"pooled": [{"pooled_rate_tps": r} for r in rates]}}
    records = [{"cell": "a", "stream": 0, "tpot_s": 0.01, "wave_host_cpu": {"busy_pct": 9.0, "steal_pct": 0.5}}]
    windows = {("a", r): (r, r + 0.5) for r in range(4)}

    def host(t0, t1):   # the slow repeats are the ones whose loop shared its core
        return {"top": "loop (1/1)", "top_share": 0.9, "top_moves": 0, "top_wait_ms": 1.0, "top_mhz": None,
                "shared_core_pct": 80.0 if int(t0) % 2 else 0.0, "busy_threads": 2.0}

    a = bench.summarise(result, records, windows, Sampler([1980] * 4), host=host)["a"]
    assert a["shared_core_pct"] == [0.0, 80.0, 0.0, 80.0] and a["top_thread"] == ["loop (1/1)"]
    assert a["corr_rate_shared_core_pct"] == pytest.approx(-1.0)
    assert a["corr_rate_top_share"] is None and a["corr_rate_top_mhz"] is None   # flat or unknown: no correlation
    assert a["host_steal_pct"] == [0.5]


@pytest.mark.server
def test_each_variant_is_one_start_and_its_variable_reaches_the_server(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["speed"].update(cells=[{"name": "short-c1", "prompt": "short", "input_len": 32, "concurrency": 1,
                                "decide": True}],
                        output_len=16, repeat_s=None)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "noise.jsonl"
    proc = subprocess.run([sys.executable, str(BENCH), str(config), "--repeats", "3", "--variant", "as-is",
                           "--variant", "PAIRAUDIT_REF_STEP_DELAY_US=40000", "--out", str(out),
                           "--logs", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["as-is", "PAIRAUDIT_REF_STEP_DELAY_US=40000"]
    for r in rows:
        assert "error" not in r, r.get("error")
        cell = r["cells"]["short-c1"]
        assert len(cell["rates"]) == 3 and all(x > 0 for x in cell["rates"])
        assert cell["per_repeat_pct"] is not None and cell["per_3_repeats_pct"] is None   # one triple: no spread
        assert r["gpu_samples"] == 0 and cell["sm_mhz"] == [None] * 3                     # no nvidia-smi here
        assert r["breakdown"]["steps"]["healthy"] > 0
        assert r["thread_samples"] > 0 and len(cell["shared_core_pct"]) == 3
        # the sampler, a process of its own, saw a busiest thread in every repeat
        assert all(t is not None for t in cell["top_share"]), cell
    # the variant's variable reached its server, and only its server (each server logs the switches it runs with)
    logs = tmp_path / "logs"
    assert "'PAIRAUDIT_REF_STEP_DELAY_US': '40000'" in (logs / "PAIRAUDIT_REF_STEP_DELAY_US-40000.log").read_text()
    assert "'PAIRAUDIT_REF_STEP_DELAY_US': '0'" in (logs / "as-is.log").read_text()
    assert "per repeat" in proc.stdout
