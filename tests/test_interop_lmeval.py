"""pairaudit.interop.lmeval: the export of an audit's answers as lm-eval sample logs, and their pairing back.

The audit is built through the real stages (dataset document, sampled records,
score_stage, paired_stage); the export is read back by the importer, and the
pairing must give the paired stage's own table.
"""

import json
from pathlib import Path

import pytest

from pairaudit.cli import main
from pairaudit.core import artifacts, defaults
from pairaudit.core.settings import QualitySettings
from pairaudit.interop import lmeval
from pairaudit.plans.requests import body_sha256
from pairaudit.quality import stage as quality_stage

REAL = Path(__file__).resolve().parent / "data" / "lmeval" / "arith_tiny" / "control"

QUESTIONS = {0: ("Ann has 2 apples and gets 3 more. How many?", "5"),
             1: ("Bob reads 4 pages a day for 3 days. How many pages?", "12"),
             2: ("A box holds 10 pens; 3 are taken. How many remain?", "7"),
             3: ("Two bags of 6 marbles each. How many marbles?", "12"),
             4: ("Cal has 9 cards and gives away 4. How many are left?", "5"),
             5: ("Dee buys 3 packs of 4 pens. How many pens?", "12")}
CONTROL = {0: "2 + 3 = 5\n#### 5", 1: "4 * 3 = 12\n#### 12", 2: "10 - 3 = 7\n#### 7", 3: "6 + 6\n#### 11",
           4: "9 - 4\n#### 5", 5: "3 * 4 = 12, so 12"}
CANDIDATE = {0: "#### 5", 1: "4 * 3 = 13\n#### 13", 2: "#### 6", 3: "6 + 6\n#### 12",
             4: "9 - 4 = 5.0\n#### 5.0", 5: "3 * 4 = 12, so 12"}


def build_audit(root: Path, *, cut: dict | None = None) -> dict:
    """The audit's artifacts; ``cut``: arm -> an index whose answer ran into max_tokens."""
    items = [{"index": i, "id": f"g{i}", "format": "gsm8k", "question": q,
              "reference": {"answer": a, "solution": f"...\n#### {a}"},
              "messages": [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": f"{q}\n\nAnswer with `#### <number>`."}]}
             for i, (q, a) in QUESTIONS.items()]
    ds_path = root / "datasets" / "hand.json"
    artifacts.write_json(ds_path, {"schema": "pairaudit.dataset/v1", "name": "hand", "format": "gsm8k",
                                   "prompt_template": "brief", "source": {"kind": "local", "path": "hand.jsonl",
                                                                          "rows": 6, "sha256": "0" * 64},
                                   "select": {"count": "all"}, "indices": list(QUESTIONS), "items": items})
    paths = {"dataset": str(ds_path), "sampled": {}, "scores": {}}
    for arm, texts in (("control", CONTROL), ("candidate", CANDIDATE)):
        recs = []
        for it in items:
            body = {"model": f"model-{arm}", "messages": it["messages"], "temperature": 0.7, "top_p": 0.8,
                    "top_k": 20, "min_p": 0.0, "max_tokens": 64, "seed": 100 + it["index"],
                    "cache_salt": f"salt{it['index']}"}
            finish = "length" if (cut or {}).get(arm) == it["index"] else "stop"
            recs.append({"index": it["index"], "attempt": 1, "body": body, "body_sha256": body_sha256(body),
                         "status": 200, "error": None, "finish_reason": finish, "prior_attempts": [],
                         "response": {"choices": [{"index": 0, "finish_reason": finish,
                                                   "message": {"role": "assistant", "content": texts[it["index"]]}}]}})
        sp = root / "sampled" / "hand" / f"{arm}.jsonl"
        artifacts.write_jsonl(sp, {"schema": "pairaudit.sampled/v1", "dataset": "hand", "arm": arm, "n": len(recs),
                                   "provenance": artifacts.provenance([ds_path], {})}, recs)
        cp = root / "scores" / "hand" / f"{arm}.jsonl"
        quality_stage.score_stage(dataset_path=str(ds_path), sampled_path=str(sp), out_path=str(cp), sandbox_limits={})
        paths["sampled"][arm], paths["scores"][arm] = str(sp), str(cp)
    paths["paired"] = quality_stage.paired_stage(dataset_path=str(ds_path), sampled_paths=paths["sampled"],
                                          score_paths=paths["scores"], out_path=str(root / "paired" / "hand.json"),
                                          quality=QualitySettings.from_json(defaults.filled({"max_net_loss": 0, "alpha": 0.05}, "rules", "quality")))
    return paths


@pytest.fixture
def audit(tmp_path):
    root = tmp_path / "results" / "demo"
    paths = build_audit(root)
    exported = lmeval.export_audit(root)
    return root, paths, exported


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_export_writes_lm_evals_fields_beside_the_artifacts(audit):
    root, paths, exported = audit
    for arm in ("control", "candidate"):
        ex = exported[arm]
        assert Path(ex.samples["hand"]) == root / "exports" / "lm-eval" / arm / "samples_hand.jsonl"
        got = lines(ex.samples["hand"])
        assert [s["filter"] for s in got] == ["strict-match"] * 6 + ["flexible-extract"] * 6
        _, scores = artifacts.read_jsonl(paths["scores"][arm])
        by = {s["index"]: s for s in scores}
        for s in got:
            assert set(lmeval.REQUIRED) <= set(s) and s["metrics"] == ["exact_match"]
            assert s["arguments"]["gen_args_0"]["arg_1"]["seed"] == 100 + s["doc_id"]
            assert "model" not in s["arguments"]["gen_args_0"]["arg_1"]
            assert s["prompt_hash"] == lmeval.hash_string(s["arguments"]["gen_args_0"]["arg_0"])
            assert s["doc_hash"] == lmeval.doc_hash(s["doc"]) and "messages" not in s["doc"]
            sc = by[s["doc_id"]]
            assert s["resps"] == [[sc["text"]]]
            if s["filter"] == "strict-match":
                assert s["exact_match"] == (1.0 if sc["correct"] else 0.0)
                assert s["filtered_resps"] == [sc["extracted"] if sc["extracted"] is not None else "[invalid]"]
                assert s["pairaudit"]["lm_eval_exact_match"] == sc["lm_eval_exact_match"]
            else:
                assert s["exact_match"] == (1.0 if sc["flexible"]["correct"] else 0.0)
        res = json.loads(Path(ex.results).read_text())
        # every key lm-eval 0.4.13 writes into results_<timestamp>.json (the real one in tests/data/lmeval)
        real = json.loads(next(REAL.glob("results_*.json")).read_text())
        assert set(real) <= set(res), set(real) - set(res)
        assert set(real["results"]["arith_tiny"]) - {"exact_match,flexible-extract",
                                                     "exact_match_stderr,flexible-extract"} \
            <= set(res["results"]["hand"]) | {"exact_match,strict-match"}
        acc = sum(1.0 for s in scores if s["correct"]) / 6
        assert res["results"]["hand"]["exact_match,strict-match"] == pytest.approx(acc)
        assert res["n-samples"]["hand"] == {"original": 6, "effective": 6}
        assert res["task_hashes"]["hand"] == lmeval.task_hash(got)
        assert set(res["pairaudit"]["consumed"]) == {paths["dataset"], paths["sampled"][arm], paths["scores"][arm]}
    # the numeric-vs-string case: "#### 5.0" is right for pairaudit, wrong for lm-eval's string comparison
    cand = {s["doc_id"]: s for s in lines(exported["candidate"].samples["hand"]) if s["filter"] == "strict-match"}
    assert cand[4]["exact_match"] == 1.0 and cand[4]["pairaudit"]["lm_eval_exact_match"] is False
    # the exports are not artifacts: the load check's tree walk does not trip over them
    assert artifacts.verify_tree(root) == []


def test_pairing_the_export_gives_the_paired_stages_table(audit):
    root, paths, exported = audit
    res = lmeval.pair_logs(exported["control"].samples["hand"], exported["candidate"].samples["hand"])
    stage = paths["paired"]
    for key in ("n", "indices", "control_only", "candidate_only", "both_correct", "neither_correct", "net",
                "control_correct", "candidate_correct", "exact_text_matches"):
        assert res.table[key] == stage["table"][key], key
    assert res.table["control_only"] == [1, 2] and res.table["candidate_only"] == [3]
    # 6 items cannot rule out quality-v2's margin, in the stage as in pair, by the same arithmetic
    assert res.quality["verdict"] == stage["quality"]["verdict"] == "INCONCLUSIVE"
    assert res.quality["loss_bound"] == stage["quality"]["loss_bound"]
    assert res.quality["needed"] == stage["quality"]["needed"]
    assert res.quality["mcnemar_p"] == pytest.approx(stage["quality"]["mcnemar_p"])
    assert res.quality["mde"] == stage["quality"]["mde"]
    assert res.bootstrap == stage["bootstrap"]
    assert res.table["natural_finish"] == stage["table"]["natural_finish"] and res.not_checked == []


def test_pairing_the_export_keeps_the_natural_finish_clause(tmp_path):
    """A cut answer makes the paired stage INVALID; the export carries its finish reason, so pair agrees."""
    root = tmp_path / "results" / "demo"
    paths = build_audit(root, cut={"candidate": 2})
    assert paths["paired"]["quality"]["verdict"] == "INVALID"
    ex = lmeval.export_audit(root)
    res = lmeval.pair_logs(ex["control"].samples["hand"], ex["candidate"].samples["hand"])
    assert res.quality["verdict"] == "INVALID" and res.table["unnatural_finish_indices"]["candidate"] == [2]
    # without pairaudit's extra key (lm-eval's own logs have none), the clause cannot be applied, and it says so
    for arm in ("control", "candidate"):
        rewrite(ex[arm].samples["hand"], lambda s: {k: v for k, v in s.items() if k != "pairaudit"})
    res = lmeval.pair_logs(ex["control"].samples["hand"], ex["candidate"].samples["hand"])
    assert res.quality["verdict"] == "INCONCLUSIVE" and "natural finish" in res.not_checked[0]
    assert res.table["natural_finish"] == {"control": None, "candidate": None}


def test_pair_command_on_the_export(audit, capsys):
    _, _, exported = audit
    code = main(["pair", exported["control"].samples["hand"], exported["candidate"].samples["hand"]])
    out = capsys.readouterr().out
    assert code == 4  # INCONCLUSIVE: 6 items cannot rule out the margin
    assert "control right                     2                 2" in out
    assert "control wrong                     1                 1" in out
    assert "quality-v2: INCONCLUSIVE" in out and "exact McNemar p = 1" in out and "about" in out
    # quality-v1 stays selectable
    assert main(["pair", exported["control"].samples["hand"], exported["candidate"].samples["hand"],
                 "--rule", "quality-v1"]) == 3
    assert "quality-v1: HOLD" in capsys.readouterr().out
    assert main(["pair", exported["control"].samples["hand"], exported["candidate"].samples["hand"],
                 "--filter", "flexible-extract", "--json"]) in (0, 1, 3, 4)
    doc = json.loads(capsys.readouterr().out)
    assert doc["control"]["filter"] == "flexible-extract" and doc["table"]["n"] == 6


# ------------------------------------------------------------------ refusals

def rewrite(path, fn):
    out = []
    for s in lines(path):
        s = fn(s)
        if s is not None:
            out.append(json.dumps(s, ensure_ascii=False))
    Path(path).write_text("\n".join(out) + "\n")


def test_refuses_documents_only_in_one_log(audit):
    _, _, ex = audit
    rewrite(ex["candidate"].samples["hand"], lambda s: None if s["doc_id"] in (2, 5) else s)
    with pytest.raises(lmeval.LmEvalLogError, match=r"doc_ids only in .*control.*: \[2, 5\]"):
        lmeval.pair_logs(ex["control"].samples["hand"], ex["candidate"].samples["hand"])


def test_refuses_a_different_prompt_naming_the_doc(audit, capsys):
    _, _, ex = audit

    def other_prompt(s):
        if s["doc_id"] == 3:   # a self-consistent log whose prompt for doc 3 differs
            s["arguments"]["gen_args_0"]["arg_0"] = s["arguments"]["gen_args_0"]["arg_0"].replace("marbles", "balls")
            s["prompt_hash"] = lmeval.hash_string(s["arguments"]["gen_args_0"]["arg_0"])
        return s

    rewrite(ex["candidate"].samples["hand"], other_prompt)
    with pytest.raises(lmeval.LmEvalLogError, match=r"the prompt differs \(prompt_hash\) at doc_ids \[3\]"):
        lmeval.pair_logs(ex["control"].samples["hand"], ex["candidate"].samples["hand"])
    assert main(["pair", ex["control"].samples["hand"], ex["candidate"].samples["hand"]]) == 2
    assert "prompt differs" in capsys.readouterr().err


def test_refuses_a_different_document_and_generation_arguments(audit):
    _, _, ex = audit

    def edit(s):
        if s["doc_id"] == 1:
            s["doc"]["question"] += " Exactly."
            s["doc_hash"] = lmeval.doc_hash(s["doc"])
        if s["doc_id"] == 4:
            s["arguments"]["gen_args_0"]["arg_1"]["temperature"] = 0.0
        return s

    rewrite(ex["candidate"].samples["hand"], edit)
    with pytest.raises(lmeval.LmEvalLogError) as err:
        lmeval.pair_logs(ex["control"].samples["hand"], ex["candidate"].samples["hand"])
    assert "the document differs (doc_hash) at doc_ids [1]" in str(err.value)
    assert "the request arguments differ (generation kwargs or a later request) at doc_ids [4]" in str(err.value)


def test_refuses_a_log_whose_hashes_do_not_match_its_content(audit):
    _, _, ex = audit
    rewrite(ex["control"].samples["hand"], lambda s: {**s, "target": "99"} if s["doc_id"] == 0 else s)
    with pytest.raises(lmeval.LmEvalLogError, match=r"target_hash does not match the logged target: .* doc_ids 0"):
        lmeval.read_log(ex["control"].samples["hand"])


def test_refuses_a_metric_that_is_not_zero_one_and_a_missing_filter(audit):
    _, _, ex = audit
    rewrite(ex["candidate"].samples["hand"], lambda s: {**s, "exact_match": 0.5} if s["doc_id"] == 2 else s)
    with pytest.raises(lmeval.LmEvalLogError, match=r"metric 'exact_match' is not 0/1 .* candidate at doc_ids \[2\]"):
        lmeval.pair_logs(ex["control"].samples["hand"], ex["candidate"].samples["hand"])
    with pytest.raises(lmeval.LmEvalLogError, match=r"no lines of filter 'none' \(the log holds \['strict-match', "
                                                    r"'flexible-extract'\]\)"):
        lmeval.read_log(ex["control"].samples["hand"], filter="none")
    with pytest.raises(lmeval.LmEvalLogError, match=r"no metric 'acc'"):
        lmeval.read_log(ex["control"].samples["hand"], metric="acc")


def test_refuses_malformed_lines(tmp_path):
    p = tmp_path / "samples_x_2026-01-01T00-00-00.000000.jsonl"
    p.write_text('{"doc_id": 0}\n')
    with pytest.raises(lmeval.LmEvalLogError, match=r":1: missing field\(s\) doc, target, arguments"):
        lmeval.read_log(p)
    p.write_text("not json\n")
    with pytest.raises(lmeval.LmEvalLogError, match=":1: not a JSON line"):
        lmeval.read_log(p)


def test_export_refuses_an_edited_score_file(tmp_path):
    root = tmp_path / "results" / "demo"
    paths = build_audit(root)
    p = Path(paths["scores"]["candidate"])
    p.write_text(p.read_text().replace('"correct": false', '"correct": true', 1))
    with pytest.raises(artifacts.ArtifactError, match="does not match the content_sha256"):
        lmeval.export_audit(root)


def test_export_refuses_a_score_file_made_from_other_answers(tmp_path):
    """The chain is checked: a sampled file rewritten (validly) after it was scored is refused."""
    root = tmp_path / "results" / "demo"
    paths = build_audit(root)
    header, recs = artifacts.read_jsonl(paths["sampled"]["control"])
    recs[0]["response"]["choices"][0]["message"]["content"] = "#### 6"
    artifacts.write_jsonl(paths["sampled"]["control"], header, recs)
    with pytest.raises(artifacts.ArtifactError, match="changed since it was consumed"):
        lmeval.export_audit(root.resolve())


# ---------------------------------------------------------------- against lm-eval's own source

def _lm_eval_source() -> Path:
    """lm-eval's package folder in .venv-vllm (install.sh --vllm puts its source there, never imported)."""
    import subprocess

    from vllm_fixture import vllm_python_or_skip

    probe = ("import importlib.util as u, importlib.metadata as m; s = u.find_spec('lm_eval'); "
             "print(m.version('lm_eval') if s else '', s.origin if s else '')")
    out = subprocess.run([vllm_python_or_skip(), "-c", probe], capture_output=True, text=True, check=True)
    version, _, origin = out.stdout.strip().partition(" ")
    if not origin:
        pytest.fail("lm-eval's source is missing from .venv-vllm: ./install.sh --vllm installs it")
    assert version == "0.4.13", f"the export is written against lm-eval 0.4.13, .venv-vllm holds {version}"
    return Path(origin).parent


def sample_keys_in(evaluator_py: str) -> set[str]:
    """The keys of the dict lm-eval's evaluator builds per logged sample (the one holding doc_id and doc_hash)."""
    import ast

    for node in ast.walk(ast.parse(evaluator_py)):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if {"doc_id", "doc_hash", "prompt_hash"} <= keys:
                return keys
    return set()


def test_the_sample_key_reader_finds_the_dict_and_nothing_else():
    src = 'a = {"doc_id": 1, "doc_hash": 2}\nb = {"doc_id": 1, "doc_hash": 2, "prompt_hash": 3, "resps": 4}\n'
    assert sample_keys_in(src) == {"doc_id", "doc_hash", "prompt_hash", "resps"}
    assert sample_keys_in('x = {"doc_id": 1}\n') == set()


@pytest.mark.vllm
def test_the_export_has_every_field_the_installed_lm_evals_evaluator_writes(audit):
    import ast

    src = _lm_eval_source()
    written = sample_keys_in((src / "evaluator.py").read_text())
    assert written == set(lmeval.REQUIRED), written ^ set(lmeval.REQUIRED)
    root, _, exported = audit
    for arm in ("control", "candidate"):
        for line in lines(exported[arm].samples["hand"]):
            # lm-eval's keys, then each metric by name (example.update(metrics)), then pairaudit's own
            assert set(line) == written | set(line["metrics"]) | {"pairaudit"}, set(line) ^ written
    # its hash_string, run as written there, gives the export's hashes
    utils = ast.parse((src / "utils.py").read_text())
    fn = next(n for n in utils.body if isinstance(n, ast.FunctionDef) and n.name == "hash_string")
    scope: dict = {"hashlib": __import__("hashlib")}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "lm_eval/utils.py", "exec"), scope)
    for text in ("", "2 + 3 = 5\n#### 5", "ünïcode ✓"):
        assert scope["hash_string"](text) == lmeval.hash_string(text)
