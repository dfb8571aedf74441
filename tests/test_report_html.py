"""The audit ends with Snakemake's HTML report, rendered in a real headless Chromium.

The tiny audit (two generated datasets, identical fp32 arms; conftest.tiny_audit,
which test_workflow.py checks) runs in a scratch copy of the project; the
promotion job runs again (a repeated sweep), then
``snakemake --report results/report.html`` builds the report, Debian's
``chromium`` renders it, and the test reads the DOM it produced. The
screenshot is kept in the checkout's ``results/report-screenshot.png``.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_workflow import REPO, snake

pytestmark = pytest.mark.workflow

SCREENSHOT = REPO / "results" / "report-screenshot.png"
FIGURES = ("decision.html", "paired.png", "divergence.png", "boundary.html", "speed.png", "control_archive.png")


def chromium_binary() -> str:
    """Debian's chromium; installed with apt-get when missing and we are root, else the test skips."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and installing it needs root with apt-get "
                    "(apt-get install chromium)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        proc = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env,
                              capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"apt-get could not install chromium: {proc.stderr[-500:]}")
    return found


def report_results(text: str) -> dict:
    """The report's embedded results (``var results = {...}`` in ``<script id="results">``)."""
    m = re.search(r'<script id="results">\s*var results = ', text)
    assert m, "no results block in the report"
    return json.JSONDecoder().raw_decode(text, m.end())[0]


def chromium(binary: str, profile: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    # A fresh profile and no background traffic: the report is a local,
    # self-contained file and the render must not depend on the network.
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
             "--window-size=1400,1100"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def audited(tiny_audit):
    project, _ = tiny_audit
    # The same sweep decided again: the ledger must keep both decisions.
    snake(project, "promotion", "--forcerun", "promotion")
    snake(project, "--report", "results/report.html", timeout=600)
    return project


def test_ledger_keeps_every_decision_and_the_report_lists_earlier_ones(audited):
    res = audited / "results"
    lines = [json.loads(x) for x in (res / "ledger.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    first, second = lines
    cand = json.loads((res / "tiny" / "launch" / "candidate.json").read_text())
    for e in lines:
        assert e["schema"] == "pairaudit.ledger/v1" and e["audit"] == "tiny"
        assert e["candidate"]["spec_sha256"] == cand["spec_sha256"]
        assert re.fullmatch(r"[0-9a-f]{64}", e["config_sha256"])
        assert e["inputs"] and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in e["inputs"].values())
        assert e["decision"] == "INCONCLUSIVE" or e["not_evaluated"] == []
    assert first["config_sha256"] == second["config_sha256"] and first["time"] <= second["time"]
    md = (res / "tiny" / "promotion" / "report.md").read_text()
    assert "1 earlier decision(s) for candidate spec" in md


def test_long_stages_log_progress(audited):
    logs = audited / "results" / "tiny" / "logs"
    line = r"{what} arith/{arm}: (\d+)/(\d+) \(\d+ %\), [0-9.e+-]+/s, ETA (\S+)"
    # each arm's answers phase logs them: its sampled runs, then its greedy runs
    for what in ("sampled", "greedy"):
        for arm in ("control", "candidate"):
            log = logs / "answers" / f"{arm}.log"
            text = log.read_text()
            found = re.findall(line.format(what=what, arm=arm), text)
            assert found, f"no progress line for {what} arith/{arm} in {log}:\n{text[-1500:]}"
            done, total, _ = found[-1]
            assert done == total and int(total) >= 2


def test_report_renders_in_chromium_with_decision_and_figures(audited, tmp_path):
    binary = chromium_binary()
    report = audited / "results" / "report.html"
    assert report.stat().st_size > 10_000
    decision = json.loads((audited / "results" / "tiny" / "promotion" / "decision.json").read_text())
    verdict = decision["decision"]

    proc = chromium(binary, tmp_path / "profile-dom", "--dump-dom", report.as_uri())
    assert proc.returncode == 0 and "<body" in proc.stdout, proc.stderr[-2000:]
    dom = html.unescape(proc.stdout)
    # The front page (report/workflow.rst, rendered by the report's own JS):
    # the verdict as a banner, one row per gate, the paired table per dataset.
    assert f"Decision: {verdict}" in dom and "pairaudit-decision" in dom
    text = re.sub(r"<[^>]+>", " ", dom)
    for name, gate in decision["gates"].items():
        verdict_shown = "not evaluated" if gate is None else gate["verdict"]
        assert re.search(rf"{re.escape(name)}\s+{re.escape(verdict_shown)}", text), (name, verdict_shown)
    assert "-> PROMOTE" not in text  # a gate's own verdict is never shown as a decision
    for ds, row in decision["datasets"].items():
        assert re.search(rf"{ds}\s+{row['control_correct']}/{row['n']}\s+{row['candidate_correct']}/{row['n']}",
                         text), ds
    # The rendered menu lists every category.
    for name in ("1. Decision", "2. Quality", "3. Greedy divergence", "4. Boundary", "5. Speed"):
        assert name in dom, f"category {name!r} missing from the rendered report"
    # Every figure and HTML item is embedded byte for byte, with its caption.
    embedded = report_results(report.read_text())
    for name in FIGURES:
        key = f"results/tiny/promotion/{name}"
        assert key in embedded, f"{name} is not in the report"
        entry = embedded[key]
        head, data = entry["data_uri"].split(",", 1)
        assert head.startswith("data:image/png" if name.endswith(".png") else "data:text/html")
        assert base64.b64decode(data) == (audited / key).read_bytes()
        assert len(entry["caption"]) > 200  # the .rst caption saying how to read it

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shot = tmp_path / "report.png"
    proc = chromium(binary, tmp_path / "profile-shot", f"--screenshot={shot}", report.as_uri())
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a blank page is a few kB
    shutil.copy2(shot, SCREENSHOT)
