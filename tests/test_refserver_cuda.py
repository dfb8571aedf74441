"""The reference server on a CUDA device: the same HTTP contract, graphed decode equal to eager, each GPU switch.

Run on a GPU host with ``pytest -m gpu tests/test_refserver_cuda.py``; every
test here skips, saying why, where torch sees no CUDA device.  The embedded
model must be resolvable there (docs/reference-server.md, "What a fresh GPU
host needs").
"""

from __future__ import annotations

import math

import pytest
import torch
from refserver_fixture import RefServer

# The CPU server's contract tests, run again below against a CUDA server (this module's ``server`` fixture).
from test_refserver import (  # noqa: F401
    test_bad_requests_are_400_with_vllm_error_body,
    test_cache_salt_accepted_and_does_not_change_output,
    test_chat_completion_shape_logprobs_and_template_kwargs,
    test_completion_shape_usage_and_length_finish,
    test_concurrent_requests_batch_and_match_solo_up_to_numerics,
    test_context_limit_boundary,
    test_health_models_version,
    test_logprobs_20_with_token_ids,
    test_malformed_json_and_unknown_model,
    test_metrics_prometheus_names_move,
    test_natural_eos_ignore_eos_and_min_tokens,
    test_prompt_logprobs,
    test_seeded_sampling_repeatable_and_seed_matters,
    test_stop_string_and_stop_token_ids,
    test_stream_frames_every_event_as_its_own_http_chunk,
    test_streaming_chat,
    test_streaming_completion_with_usage,
    test_token_id_prompt_equals_text_prompt,
    test_top_k_1_is_greedy_and_min_p_1_is_greedy,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason=f"needs a CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}) "
                              "sees none"),
]
PROMPTS = ["The three primary colors are", "One, two, three,", "def add(a, b):", "Water boils at"]
STEPS = 24
MAX_LEN = 512


# --- in process: the model and the decoder ------------------------------------------
@pytest.fixture(scope="module")
def ckpt():
    from pairaudit.refserver.model import layout_cache_path
    from pairaudit.refserver.tokenizer import ChatTokenizer
    from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model

    path, ident = resolve_model(EMBEDDED_NAME)
    tok = ChatTokenizer(path)
    return path, layout_cache_path(ident["weights_sha256"]), [tok(p).input_ids for p in PROMPTS]


@pytest.fixture(autouse=True)
def ieee_fp32():
    """Every test starts and ends with IEEE fp32 matmuls (the TF32 switch is process-global)."""
    from pairaudit.refserver.cuda import set_tf32

    set_tf32(False)
    yield
    set_tf32(False)


def _model(ckpt, device="cuda", **numerics):
    from pairaudit.refserver.model import LlamaModel
    from pairaudit.refserver.numerics import Numerics

    return LlamaModel(ckpt[0], layout_cache=ckpt[1], numerics=Numerics(**numerics), device=device)


def _decoder(model, graphs: bool, metrics=None, max_num_seqs=8):
    from pairaudit.refserver.cuda import CudaDecoder

    return CudaDecoder(model, max_num_seqs=max_num_seqs, max_model_len=MAX_LEN, graphs=graphs, metrics=metrics)


def _greedy(model, decoder, prompts, steps=STEPS, forced=None):
    """Prefill each prompt (eager forward), then ``steps`` batched greedy decode steps through ``decoder``
    (None: the model's general forward, as on a CPU). Per sequence: tokens, fp32 logits [steps, vocab].
    ``forced``: per sequence the tokens to feed instead of the argmax (teacher forcing)."""
    from pairaudit.refserver.model import Segment

    caches = [decoder.new_cache() if decoder else model.new_cache(len(p) + steps) for p in prompts]
    last = []
    for c, p in zip(caches, prompts):
        last.append(model.logits(model.forward(torch.tensor(p), [Segment(c, 0, len(p))])[-1:]))
        c.length = len(p)
    logits = torch.cat(last)
    tokens, rows = [[] for _ in prompts], [[] for _ in prompts]
    for _ in range(steps):
        nxt = logits.argmax(-1).tolist()
        if forced is not None:
            nxt = [f[len(tokens[i])] for i, f in enumerate(forced)]
        for i, t in enumerate(nxt):
            tokens[i].append(t)
            rows[i].append(logits[i])
        segments = [Segment(c, c.length, 1) for c in caches]
        if decoder is None:
            logits = model.logits(model.forward(torch.tensor(nxt), segments))
        else:
            logits = decoder.decode(nxt, segments)
        for c in caches:
            c.length += 1
    if decoder is not None:
        for c in caches:
            decoder.free(c)
    return tokens, [torch.stack(r) for r in rows]


@pytest.fixture(scope="module")
def fp32(ckpt):
    return _model(ckpt)


@pytest.fixture(scope="module")
def cpu_reference(ckpt):
    """The CPU fp32 reference's greedy tokens and logits, each prompt alone."""
    model = _model(ckpt, device="cpu")
    return [_greedy(model, None, [p]) for p in ckpt[2]]


def test_cuda_decode_matches_the_cpu_reference(ckpt, fp32, cpu_reference):
    from pairaudit.refserver.metrics import Metrics

    metrics = Metrics("m")
    tokens, logits = _greedy(fp32, _decoder(fp32, graphs=True, metrics=metrics), ckpt[2])
    for i, (cpu_tokens, cpu_logits) in enumerate(cpu_reference):
        # the same model to fp32 reordering error: a wrong position, mask or cache slot is off by O(1)
        diff = (logits[i] - cpu_logits[0]).abs().max().item()
        assert diff < 1e-3, (PROMPTS[i], diff)
        assert tokens[i] == cpu_tokens[0] or _near_tie_first_difference(tokens[i], cpu_tokens[0], cpu_logits[0])
    assert metrics.counters["pairaudit:decode_graph_replays_total"] == STEPS
    assert metrics.counters["pairaudit:decode_graph_captures_total"] == 1  # batch 4, one context bucket


def _near_tie_first_difference(a, b, logits) -> bool:
    pos = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    top = logits[pos].topk(2).values
    return (top[0] - top[1]).item() < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 2, 4, 3])
def test_graphed_decode_equals_eager_decode(ckpt, dtype, batch):
    model = _model(ckpt, dtype=dtype)
    prompts = ckpt[2][:batch]
    g_tokens, g_logits = _greedy(model, _decoder(model, graphs=True), prompts)
    e_tokens, e_logits = _greedy(model, _decoder(model, graphs=False), prompts)
    if batch in (1, 2, 4):  # a captured size: the same kernels, replayed or launched
        assert g_tokens == e_tokens
        assert all(torch.equal(a, b) for a, b in zip(g_logits, e_logits))
    else:  # 3 rows replay the graph of 4 (one padding row): equal up to rounding
        tol = 1e-4 if dtype == torch.float32 else 0.1
        for a, b in zip(g_logits, e_logits):
            assert (a - b).abs().max().item() < tol


def test_slots_are_reused_and_padding_never_touches_a_live_cache(ckpt, fp32):
    decoder = _decoder(fp32, graphs=True, max_num_seqs=4)
    first = _greedy(fp32, decoder, ckpt[2][:3])  # 3 rows: the padding row writes the spare slot
    assert sorted(decoder.free_slots) == [0, 1, 2, 3]
    again = _greedy(fp32, decoder, ckpt[2][:3])  # the same slots again, over the first run's stale keys
    assert first[0] == again[0] and all(torch.equal(a, b) for a, b in zip(first[1], again[1]))


def test_chunked_prefill_and_verify_rows_match_one_prefill(ckpt):
    from pairaudit.refserver.model import Segment

    for numerics, tol in (({}, 1e-3), ({"dtype": torch.bfloat16, "sdpa_backend": "flash"}, 0.25)):
        model = _model(ckpt, **numerics)
        decoder = _decoder(model, graphs=False)
        ids = ckpt[2][0] + ckpt[2][1] + ckpt[2][2]
        whole = decoder.new_cache()
        full = model.logits(model.forward(torch.tensor(ids), [Segment(whole, 0, len(ids))]))
        parts, got = decoder.new_cache(), []
        cuts = [0, 5, 6, len(ids)]  # later chunks attend through a bottom-right causal mask
        for a, b in zip(cuts, cuts[1:]):
            got.append(model.logits(model.forward(torch.tensor(ids[a:b]), [Segment(parts, a, b - a)])))
        got = torch.cat(got)
        assert (got - full).abs().max().item() < tol, numerics
        assert (got.argmax(-1) == full.argmax(-1)).float().mean().item() > 0.9


def _kernels(fn) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name.lower() for e in prof.events() if e.device_type.name == "CUDA"}


@pytest.mark.parametrize("backend, expect, refuse", [
    ("flash", "flash_fwd", ("fmha_cutlass",)),
    ("efficient", "fmha_cutlass", ("flash_fwd",)),
    ("math", "softmax", ("flash_fwd", "fmha_cutlass")),
])
def test_sdpa_backend_switch_runs_that_kernel(ckpt, backend, expect, refuse):
    from pairaudit.refserver.model import Segment

    model = _model(ckpt, dtype=torch.bfloat16, sdpa_backend=backend)
    decoder = _decoder(model, graphs=False)
    cache = decoder.new_cache()
    ids = ckpt[2][0]
    prefill = _kernels(lambda: model.forward(torch.tensor(ids), [Segment(cache, 0, len(ids))]))
    cache.length = len(ids)
    decode = _kernels(lambda: decoder.decode([42], [Segment(cache, cache.length, 1)]))
    for where, names in (("prefill", prefill), ("decode", decode)):
        assert any(expect in n for n in names), (where, sorted(names))
        assert not any(r in n for n in names for r in refuse), (where, sorted(names))


def test_sdpa_backends_agree_to_rounding_and_differ_in_bits(ckpt):
    out, forced = {}, None
    for backend in ("math", "efficient", "flash"):  # all fed the math run's tokens: only the kernel differs
        model = _model(ckpt, dtype=torch.bfloat16, sdpa_backend=backend)
        tokens, out[backend] = _greedy(model, _decoder(model, graphs=True), ckpt[2][:2], steps=8, forced=forced)
        forced = forced or tokens
    for backend in ("efficient", "flash"):
        diffs = [(a - b).abs().max().item() for a, b in zip(out[backend], out["math"])]
        assert max(diffs) < 1.0, (backend, diffs)  # bf16 rounding through 30 layers; a wrong mask is >> 1
    assert any(not torch.equal(a, b) for a, b in zip(out["flash"], out["math"]))


def test_tf32_switch_changes_fp32_matmuls_and_rolls_back(ckpt, fp32):
    from pairaudit.refserver.cuda import set_tf32, tf32_enabled

    decoder = _decoder(fp32, graphs=False)
    ieee = _greedy(fp32, decoder, ckpt[2][:2], steps=4)[1]
    set_tf32(True)
    assert tf32_enabled()
    tf32 = _greedy(fp32, decoder, ckpt[2][:2], steps=4)[1]
    set_tf32(False)
    back = _greedy(fp32, decoder, ckpt[2][:2], steps=4)[1]
    assert all(torch.equal(a, b) for a, b in zip(ieee, back))
    diff = max((a - b).abs().max().item() for a, b in zip(ieee, tf32))
    assert 1e-4 < diff < 1.0, diff  # TF32 keeps 10 mantissa bits: moved, by rounding only


def _on_bf16_grid(logits: torch.Tensor) -> bool:
    return torch.equal(logits, logits.to(torch.bfloat16).float())


def test_bf16_head_gives_real_bf16_logits(ckpt, fp32):
    from pairaudit.refserver.model import Segment

    model = _model(ckpt, lm_head_bf16=True)
    assert model.head.w.dtype == torch.bfloat16 and model.head.w.is_cuda
    cache = model.new_cache(16)
    hidden = model.forward(torch.tensor(ckpt[2][0]), [Segment(cache, 0, len(ckpt[2][0]))])
    assert model.head_logits(hidden).dtype == torch.bfloat16  # computed in bf16 on the GPU, not rounded after
    assert _on_bf16_grid(model.logits(hidden)) and not _on_bf16_grid(fp32.logits(hidden))
    decoded = _greedy(model, _decoder(model, graphs=True), ckpt[2][:2], steps=4)[1]
    assert all(_on_bf16_grid(rows) for rows in decoded)


@pytest.mark.parametrize("switch", ["attn_bf16", "mlp_bf16", "rmsnorm_bf16", "lm_head_bf16"])
def test_numeric_switches_move_cuda_logits_deterministically(ckpt, fp32, switch):
    tokens, base = _greedy(fp32, _decoder(fp32, graphs=True), ckpt[2][:2], steps=6)
    model = _model(ckpt, **{switch: True})
    decoder = _decoder(model, graphs=True)
    # fed the reference run's tokens: a flipped argmax would compare different contexts
    a = _greedy(model, decoder, ckpt[2][:2], steps=6, forced=tokens)[1]
    b = _greedy(model, decoder, ckpt[2][:2], steps=6, forced=tokens)[1]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    diff = max((x - y).abs().max().item() for x, y in zip(a, base))
    assert 0 < diff < 5, diff


# --- over HTTP -------------------------------------------------------------------------
def _server(request, tmp_path_factory, env=None, extra=()):
    server = RefServer(env, max_model_len=MAX_LEN, extra_args=("--device", "cuda", *extra),
                       log_dir=tmp_path_factory.mktemp("logs"))
    request.addfinalizer(server.stop)
    return server


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """The CUDA server at its defaults (float32, CUDA graphs on): the contract tests imported above run on it."""
    return _server(request, tmp_path_factory)


@pytest.fixture(scope="module")
def eager_server(request, tmp_path_factory):
    return _server(request, tmp_path_factory, {"PAIRAUDIT_REF_CUDA_GRAPHS": "0"})


def test_version_says_torch_cuda_and_device(server):
    info = server.get("/version").json()["pairaudit"]
    assert info["device"] == "cuda" and info["cuda"] == torch.version.cuda and info["torch"] == torch.__version__
    assert info["device_name"] == torch.cuda.get_device_name()
    assert info["decode"]["mode"] == "cuda_graphs" and info["decode"]["graph_batch_sizes"] == [1, 2, 4, 8]
    assert info["switches"]["PAIRAUDIT_REF_CUDA_GRAPHS"] == "1" and info["tf32_matmul"] is False


def test_graphed_server_replays_graphs_and_answers_as_the_eager_one(server, eager_server):
    body = dict(prompt=PROMPTS[0], max_tokens=32, temperature=0, logprobs=5, return_tokens_as_token_ids=True,
                ignore_eos=True)
    before = server.metric("pairaudit:decode_graph_replays_total")
    graphed = server.completion(**body)["choices"][0]["logprobs"]
    assert server.metric("pairaudit:decode_graph_replays_total") - before >= 30
    eager = eager_server.completion(**body)["choices"][0]["logprobs"]
    assert eager_server.metric("pairaudit:decode_graph_replays_total") == 0
    assert eager_server.get("/version").json()["pairaudit"]["decode"]["mode"] == "eager"
    # batch 1 is a captured size: the same kernels, so the same tokens and the same logprobs, bit for bit
    assert graphed["tokens"] == eager["tokens"]
    assert graphed["token_logprobs"] == eager["token_logprobs"]


def test_bf16_server_with_flash_attention(request, tmp_path_factory):
    server = _server(request, tmp_path_factory, {"PAIRAUDIT_REF_SDPA_BACKEND": "flash"}, ("--dtype", "bfloat16"))
    info = server.get("/version").json()["pairaudit"]
    assert info["dtype"] == "bfloat16" and info["numerics"]["sdpa_backend"] == "flash"
    out = server.completion(prompt=PROMPTS[1], max_tokens=8, temperature=0, logprobs=20,
                            return_tokens_as_token_ids=True)
    top = out["choices"][0]["logprobs"]["top_logprobs"][0]
    assert len(top) >= 20 and all(v <= 0 for v in top.values())
    assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-3
