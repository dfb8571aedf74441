"""The append-only log: crash-safe lines, one writer at a time, I/O errors that name the file."""

import json
import multiprocessing
import os
import threading

import pytest

from pairaudit.core.jsonlog import AppendLog, LogBusy, LogIOError, append_record, read_log


def test_records_round_trip_in_order(tmp_path):
    p = tmp_path / "j.jsonl"
    with AppendLog(p) as log:
        for i in range(3):
            log.append({"i": i})
    assert [r["i"] for r in read_log(p)] == [0, 1, 2]


def test_a_cut_last_line_is_left_alone_and_the_next_record_starts_fresh(tmp_path):
    p = tmp_path / "j.jsonl"
    p.write_text(json.dumps({"i": 0}) + "\n" + '{"i": 1, "text": "cut sho')
    with AppendLog(p) as log:
        log.append({"i": 2})
    lines = p.read_text().splitlines()
    assert lines[1] == '{"i": 1, "text": "cut sho'  # evidence of the crash, not repaired
    assert [r["i"] for r in read_log(p)] == [0, 2]


def test_a_shared_log_repairs_a_cut_line_on_every_append(tmp_path):
    p = tmp_path / "archive.jsonl"
    append_record(p, {"i": 0})
    with open(p, "a") as f:
        f.write('{"i": 1, "cut')
    append_record(p, {"i": 2})
    assert [r["i"] for r in read_log(p)] == [0, 2]


def _hold(path, ready, release, last=None):
    with AppendLog(path, owner="holder") as log:
        ready.set()
        release.wait(30)
        if last is not None:
            log.append(last)


def _holder(path, last=None):
    """A process holding the log (appending ``last`` before it lets go), once it holds it; and its release."""
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, ready, release, last))
    holder.start()
    assert ready.wait(30)
    return holder, release


def test_a_second_writer_is_refused_by_name_and_the_lock_dies_with_its_holder(tmp_path):
    p = tmp_path / "j.jsonl"
    holder, _ = _holder(p)
    with pytest.raises(LogBusy) as err:
        AppendLog(p)
    assert str(p) in str(err.value) and f"pid {holder.pid}" in str(err.value)
    os.kill(holder.pid, 9)  # however the holder dies, the kernel releases its lock
    holder.join(30)
    with AppendLog(p) as log:
        log.append({"ok": True})
    assert read_log(p) == [{"ok": True}]


def test_a_waiting_writer_gets_the_log_when_its_holder_lets_go_and_reads_what_it_wrote(tmp_path):
    p = tmp_path / "j.jsonl"
    holder, release = _holder(p, last={"by": "holder"})
    threading.Timer(0.5, release.set).start()
    with AppendLog(p, wait=True) as log:
        assert not holder.is_alive() or release.is_set()
        assert read_log(p) == [{"by": "holder"}]  # the holder's line is there before this writer's
        log.append({"by": "waiter"})
    holder.join(30)
    assert read_log(p) == [{"by": "holder"}, {"by": "waiter"}]


def test_io_errors_name_the_file(tmp_path):
    p = tmp_path / "j.jsonl"
    log = AppendLog(p)
    log._f.close()
    log._f = open("/dev/full", "a")  # every write fails with ENOSPC, as on a full disk
    with pytest.raises(LogIOError) as err:
        log.append({"i": 0})
    assert str(p) in str(err.value) and "No space left" in str(err.value)
