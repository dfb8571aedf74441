"""pairaudit.core.artifacts: JSON/JSONL artifacts that say what they consumed, and the checks on them."""

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import stat

import pytest

from pairaudit.core import artifacts
from pairaudit.core.artifacts import ArtifactError

# ---------------------------------------------------------------- JSON / JSONL round trips

def test_json_round_trip(tmp_path):
    doc = {"schema": "pairaudit.x/v1", "text": "café ×÷ 😀", "n": 3, "nested": {"a": [1, 2.5, None, True]}}
    path = tmp_path / "sub" / "doc.json"  # parent created on write
    artifacts.write_json(path, doc)
    assert artifacts.read_json(path) == doc
    # no temp file left behind by the atomic write
    assert [p.name for p in path.parent.iterdir()] == ["doc.json"]


def test_read_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": ')
    with pytest.raises(ArtifactError, match=re.escape(str(bad))):
        artifacts.read_json(bad)
    missing = tmp_path / "missing.json"
    with pytest.raises(ArtifactError, match=re.escape(str(missing))):
        artifacts.read_json(missing)


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    header = {"schema": "pairaudit.t/v1", "n": 2}
    records = [{"index": 0, "text": "é"}, {"index": 1, "text": None}]
    artifacts.write_jsonl(path, header, records)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "header"
    assert [json.loads(ln)["kind"] for ln in lines[1:]] == ["record", "record"]
    h, recs = artifacts.read_jsonl(path)
    assert h == header  # "kind" is stripped on read
    assert recs == records


def test_jsonl_empty_records(tmp_path):
    path = tmp_path / "t.jsonl"
    artifacts.write_jsonl(path, {"schema": "s"}, [])
    assert artifacts.read_jsonl(path) == ({"schema": "s"}, [])


def test_jsonl_header_required(tmp_path):
    path = tmp_path / "noheader.jsonl"
    path.write_text('{"kind": "record", "index": 0}\n')
    with pytest.raises(ArtifactError, match="no header line") as ei:
        artifacts.read_jsonl(path)
    assert str(path) in str(ei.value)


def test_jsonl_header_must_be_first_line(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text('{"kind": "record", "index": 0}\n{"kind": "header", "schema": "s"}\n')
    with pytest.raises(ArtifactError, match=re.escape(f"{path}:2: unexpected line kind 'header'")):
        artifacts.read_jsonl(path)


def test_jsonl_unknown_kind_names_line(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_text('{"kind": "header", "schema": "s"}\n{"index": 0}\n')
    with pytest.raises(ArtifactError, match=re.escape(f"{path}:2: unexpected line kind None")):
        artifacts.read_jsonl(path)


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "header", "schema": "s"}\n{"kind": "record", "index": 0}\n'
                    '{"kind": "record", "ind\n{"kind": "record", "index": 2}\n')
    with pytest.raises(ArtifactError) as ei:
        artifacts.read_jsonl(path)
    assert f"{path}:3:" in str(ei.value)


def test_jsonl_non_object_line_is_an_artifact_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "header", "schema": "s"}\n[1, 2]\n')
    with pytest.raises(ArtifactError, match=re.escape(f"{path}:2:")):
        artifacts.read_jsonl(path)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="nope.jsonl"):
        artifacts.read_jsonl(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------- provenance and checks

def _inputs(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n')
    b.write_bytes(b"line one\nline two \xc3\xa9\n")
    return a, b


def test_provenance_records_sha256_of_each_input(tmp_path):
    a, b = _inputs(tmp_path)
    prov = artifacts.provenance([a, str(b)], {"k": [1, 2]})
    assert prov["consumed"] == {str(a): hashlib.sha256(a.read_bytes()).hexdigest(),
                                str(b): hashlib.sha256(b.read_bytes()).hexdigest()}
    assert prov["params"] == {"k": [1, 2]}
    assert prov["code_version"] == artifacts.code_version()
    created = dt.datetime.fromisoformat(prov["created_at"])
    assert created.tzinfo is not None and created.utcoffset() == dt.timedelta(0)
    assert artifacts.provenance([])["params"] == {}


def test_check_consumed_passes_on_unchanged_input_and_touch(tmp_path):
    a, b = _inputs(tmp_path)
    doc = {"provenance": artifacts.provenance([a, b])}
    artifacts.check_consumed(doc, [a, b], where="out.json")
    st = a.stat()
    os.utime(a, (st.st_atime + 100, st.st_mtime + 100))  # a touch is not a change
    artifacts.check_consumed(doc, [a, b], where="out.json")


def test_check_consumed_raises_naming_the_changed_file(tmp_path):
    a, b = _inputs(tmp_path)
    doc = {"provenance": artifacts.provenance([a, b])}
    b.write_bytes(b.read_bytes() + b"edited\n")
    with pytest.raises(ArtifactError) as ei:
        artifacts.check_consumed(doc, [a, b], where="results/out.json")
    msg = str(ei.value)
    assert str(b) in msg and "results/out.json" in msg and "changed" in msg
    assert str(a) not in msg.replace(str(b), "")  # the unchanged input is not blamed


def test_check_consumed_ignores_inputs_the_doc_did_not_record(tmp_path):
    a, b = _inputs(tmp_path)
    doc = {"provenance": artifacts.provenance([a])}
    b.write_text("anything")
    artifacts.check_consumed(doc, [a, b], where="x")  # b was never consumed by doc
    artifacts.check_consumed({}, [a, b], where="x")  # no provenance at all: nothing to compare


def test_check_schema(tmp_path):
    doc = {"schema": "pairaudit.scores/v1", "n": 1}
    assert artifacts.check_schema(doc, "pairaudit.scores/v1", "p.jsonl") is doc
    with pytest.raises(ArtifactError) as ei:
        artifacts.check_schema(doc, "pairaudit.sampled/v1", "some/p.jsonl")
    msg = str(ei.value)
    assert "some/p.jsonl" in msg and "pairaudit.scores/v1" in msg and "pairaudit.sampled/v1" in msg
    with pytest.raises(ArtifactError, match="None"):
        artifacts.check_schema({}, "pairaudit.sampled/v1", "p")


def test_hash_helpers(tmp_path):
    assert artifacts.sha256_text("abc") == hashlib.sha256(b"abc").hexdigest()
    # key order does not change an object's hash; a value does
    assert artifacts.sha256_json({"a": 1, "b": 2}) == artifacts.sha256_json({"b": 2, "a": 1})
    assert artifacts.sha256_json({"a": 1}) != artifacts.sha256_json({"a": 2})
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * (1 << 20) + 17))  # more than one read block
    assert artifacts.sha256_file(big) == hashlib.sha256(big.read_bytes()).hexdigest()


# ---------------------------------------------------------------- code version

def test_code_version_follows_content_not_mtime(tmp_path, monkeypatch):
    pkg = tmp_path / "pairaudit"
    shutil.copytree(artifacts.PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(artifacts, "PACKAGE_DIR", pkg)
    v0 = artifacts.code_version()
    assert len(v0) == 64

    target = pkg / "core" / "stats.py"
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns + 10**10, st.st_mtime_ns + 10**10))  # touch
    assert artifacts.code_version() == v0

    original = target.read_bytes()
    target.write_bytes(original + b"\n# a real change\n")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime as before the edit
    assert target.stat().st_mtime_ns == st.st_mtime_ns
    v1 = artifacts.code_version()
    assert v1 != v0

    target.write_bytes(original)
    assert artifacts.code_version() == v0

    (pkg / "refserver" / "extra.py").write_text("X = 1\n")  # a new source file counts too
    assert artifacts.code_version() != v0


def test_artifacts_get_the_usual_file_mode_not_mkstemps_0600(tmp_path):
    p = tmp_path / "a.json"
    artifacts.write_json(p, {"x": 1})
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~artifacts._UMASK


# ---------------------------------------------------------------- content self-hash

def test_writers_record_a_self_hash_that_readers_verify(tmp_path):
    doc = {"schema": "s", "by_index": {3: "a", 10: "b"}, "pair": (1, 2), "x": 0.1 + 0.2}
    p = tmp_path / "d.json"
    artifacts.write_json(p, doc)
    raw = json.loads(p.read_text())
    body = {k: v for k, v in raw.items() if k != artifacts.CONTENT_KEY}
    # the hash is over what a reader sees (int keys become strings, tuples lists), canonical form
    assert raw[artifacts.CONTENT_KEY] == hashlib.sha256(artifacts.canonical_json(body).encode()).hexdigest()
    assert artifacts.read_json(p) == {"schema": "s", "by_index": {"3": "a", "10": "b"}, "pair": [1, 2],
                                      "x": 0.1 + 0.2}
    t = tmp_path / "t.jsonl"
    artifacts.write_jsonl(t, {"schema": "s"}, [{"index": 0, "v": 1.5}, {"index": 1, "v": None}])
    head = json.loads(t.read_text().splitlines()[0])
    assert head[artifacts.CONTENT_KEY] == artifacts.content_sha256_table(
        {"schema": "s"}, [{"index": 0, "v": 1.5}, {"index": 1, "v": None}])
    # rewriting what was read gives the same bytes: the hash is not hashed into itself
    before = p.read_bytes()
    artifacts.write_json(p, artifacts.read_json(p))
    assert p.read_bytes() == before


@pytest.mark.parametrize("edit", ["value", "record-dropped", "record-order"])
def test_an_edited_table_is_refused_naming_file_and_both_hashes(tmp_path, edit):
    t = tmp_path / "scores.jsonl"
    artifacts.write_jsonl(t, {"schema": "s"}, [{"index": 0, "correct": True}, {"index": 1, "correct": False}])
    lines = t.read_text().splitlines()
    recorded = json.loads(lines[0])[artifacts.CONTENT_KEY]
    if edit == "value":
        lines[2] = lines[2].replace("false", "true")
    elif edit == "record-dropped":
        del lines[2]
    else:
        lines[1], lines[2] = lines[2], lines[1]
    t.write_text("\n".join(lines) + "\n")
    with pytest.raises(ArtifactError) as ei:
        artifacts.read_jsonl(t)
    msg = str(ei.value)
    assert msg.startswith(f"{t}: content sha256 ") and recorded in msg and "edited after it was written" in msg
    header, records = artifacts.read_jsonl(t, verify=False)  # an explicit opt-out still reads it
    assert header == {"schema": "s"}


def test_a_hand_written_artifact_without_a_hash_is_refused(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"schema": "s"}')
    with pytest.raises(ArtifactError, match=re.escape(f"{p}: carries no content_sha256")):
        artifacts.read_json(p)
    with pytest.raises(ArtifactError, match="must be an object"):
        (tmp_path / "l.json").write_text("[1]")
        artifacts.read_json(tmp_path / "l.json")


# ---------------------------------------------------------------- I/O errors name the file

def test_named_io_adds_the_file_to_an_error_that_names_none(tmp_path):
    journal = tmp_path / "journal" / "sampled.jsonl"
    with pytest.raises(OSError) as ei:
        with artifacts.named_io(journal):
            with open("/dev/full", "w") as f:  # a real ENOSPC, as a full disk gives while journaling
                f.write("x" * 10)
                f.flush()
    assert ei.value.errno == 28 and ei.value.filename == str(journal)
    assert str(journal) in str(ei.value) and "No space left on device" in str(ei.value)
    with pytest.raises(FileNotFoundError) as ei:  # an error that already names its file keeps that name
        with artifacts.named_io(journal):
            open(tmp_path / "nope")
    assert ei.value.filename == str(tmp_path / "nope")


FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, {root!r})
from pairaudit.core import artifacts
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the disk is full after 4 KiB
try:
    artifacts.write_json(sys.argv[1], {{"schema": "s", "blob": "x" * 100000}})
except OSError as exc:
    print(exc)
"""


def test_a_write_that_runs_out_of_space_names_the_artifact_and_leaves_no_temp_file(tmp_path):
    import subprocess
    import sys

    target = tmp_path / "out" / "big.json"
    root = str(artifacts.PACKAGE_DIR.parent)
    res = subprocess.run([sys.executable, "-c", FULL_DISK.format(root=root), str(target)], capture_output=True,
                         text=True, timeout=60)
    assert str(target) in res.stdout and "File too large" in res.stdout, res.stdout + res.stderr
    assert not target.exists() and list(target.parent.iterdir()) == []
