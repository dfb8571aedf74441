"""The reference server's numeric switches on a CPU: each moves the logits, in its own place, deterministically.

And with every switch at its rollback value the forward pass computes what it
computed before the switches existed, bit for bit: that forward is kept below
verbatim (``_forward_before_switches``) and compared with ``torch.equal``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pairaudit.plans import change
from pairaudit.refserver import switches as sw
from pairaudit.refserver.numerics import Numerics, rms_norm_bf16
from pairaudit.refserver.switches import Switches

REPO = Path(__file__).resolve().parents[1]


# --- the switch table ----------------------------------------------------------
def test_every_switch_is_documented_with_its_rollback_value():
    doc = (REPO / "docs" / "reference-server.md").read_text()
    for name, s in sw.SWITCHES.items():
        rows = [line for line in doc.splitlines() if line.startswith(f"| `{name}")]
        assert rows, f"{name} has no row in the switch table of docs/reference-server.md"
        rollback = rows[0].split("|")[2].strip()
        written = f"`{s.rollback:g}`" if isinstance(s.rollback, float) else f"`{s.rollback}`"
        assert rollback == written, (name, rollback, written)


def test_defaults_rollback_and_round_trip():
    assert Switches.from_env({}) == Switches()
    back = Switches.rollback()
    # the one switch whose default is not its rollback value: graphs on by default, eager to roll back
    assert Switches().cuda_graphs and not back.cuda_graphs
    assert replace(back, cuda_graphs=True) == Switches()
    changed = Switches(attn_bf16=True, mlp_bf16=True, rmsnorm_bf16=True, sdpa_backend="flash", tf32=True,
                       cuda_graphs=False, lm_head_bf16=True, spec_ngram=3, fault_noise=0.5)
    assert Switches.from_env(changed.as_env()) == changed
    assert list(changed.as_env()) == list(sw.SWITCHES)
    assert set(sw.NUMERIC) == {"PAIRAUDIT_REF_LM_HEAD_BF16", "PAIRAUDIT_REF_ATTN_BF16", "PAIRAUDIT_REF_MLP_BF16",
                               "PAIRAUDIT_REF_RMSNORM_BF16", "PAIRAUDIT_REF_SDPA_BACKEND", "PAIRAUDIT_REF_TF32"}


@pytest.mark.parametrize("name, raw, needle", [
    ("PAIRAUDIT_REF_ATTN_BF16", "2", "must be 0 or 1"),
    ("PAIRAUDIT_REF_CUDA_GRAPHS", "yes", "expected int"),
    ("PAIRAUDIT_REF_SDPA_BACKEND", "Flash", "one of auto, math, flash, efficient"),
    ("PAIRAUDIT_REF_SDPA_BACKEND", "cudnn", "one of auto, math, flash, efficient"),
    ("PAIRAUDIT_REF_TF32", "-1", "must be >= 0"),
])
def test_bad_values_name_the_switch_and_what_is_allowed(name, raw, needle):
    problems = sw.check_env({name: raw})
    assert len(problems) == 1 and problems[0].startswith(f"{name}={raw!r}") and needle in problems[0]
    with pytest.raises(ValueError, match=re.escape(needle)):
        Switches.from_env({name: raw})


def test_device_fit_known_answers():
    assert Switches().device_problems("cpu", "float32") == []
    assert Switches().device_problems("cuda", "float32") == []
    assert any("TF32" in p for p in Switches(tf32=True).device_problems("cpu", "float32"))
    assert Switches(tf32=True).device_problems("cuda", "float32") == []
    assert any("CUDA only" in p for p in Switches(sdpa_backend="efficient").device_problems("cpu", "float32"))
    flash = Switches(sdpa_backend="flash")
    assert flash.device_problems("cpu", "float32") == []  # the CPU has a float32 flash kernel
    assert any("no float32 kernel" in p for p in flash.device_problems("cuda", "float32"))
    assert flash.device_problems("cuda", "bfloat16") == []
    assert replace(flash, attn_bf16=True).device_problems("cuda", "float32") == []


def test_check_arm_reads_device_and_dtype_from_the_command():
    cmd = ["python", "-m", "pairaudit.refserver", "--port", "{port}"]
    assert sw.check_arm({"PAIRAUDIT_REF_TF32": "1"}, cmd) == []  # device auto: known only at start
    assert sw.check_arm({"PAIRAUDIT_REF_TF32": "1"}, [*cmd, "--device", "cuda"]) == []
    [p] = sw.check_arm({"PAIRAUDIT_REF_TF32": "1"}, [*cmd, "--device=cpu"])
    assert p.startswith("PAIRAUDIT_REF_TF32=1")
    [p] = sw.check_arm({"PAIRAUDIT_REF_SDPA_BACKEND": "flash"}, [*cmd, "--device", "cuda"])
    assert "no float32 kernel" in p
    assert sw.check_arm({"PAIRAUDIT_REF_SDPA_BACKEND": "flash"}, [*cmd, "--device", "cuda", "--dtype", "bfloat16"]) == []
    [p] = sw.check_arm({}, [*cmd, "--dtype", "fp8"])
    assert p.startswith("--dtype fp8") and "float32, bfloat16, float16" in p
    # a bad value is reported as such, before any device reasoning
    [p] = sw.check_arm({"PAIRAUDIT_REF_MLP_BF16": "on"}, [*cmd, "--device", "cpu"])
    assert p.startswith("PAIRAUDIT_REF_MLP_BF16='on'")


def test_the_config_check_refuses_what_an_arm_s_device_cannot_run():
    import copy

    import yaml

    from pairaudit import configcheck

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    change.derive_arms(cfg)  # the change form becomes the two arms, as at load
    result = configcheck.CheckResult()
    configcheck.check_arms(cfg, result)
    assert result.problems == []
    bad = copy.deepcopy(cfg)
    bad["arms"]["control"]["command"] += ["--device", "cpu"]
    bad["arms"]["control"]["env"] = {**(bad["arms"]["control"].get("env") or {}), "PAIRAUDIT_REF_TF32": "1"}
    bad["arms"]["candidate"]["command"] += ["--dtype", "fp8"]
    result = configcheck.CheckResult()
    configcheck.check_arms(bad, result)
    assert result.problems == [
        "arms.control.env.PAIRAUDIT_REF_TF32=1: TF32 is a mode of CUDA matmuls; a CPU server has none "
        "(allowed on --device cpu: 0)",
        "arms.candidate.command: --dtype fp8: expected one of float32, bfloat16, float16"]


def test_rms_norm_bf16_is_an_rms_norm_rounded_to_bf16():
    torch.manual_seed(0)
    x = torch.randn(3, 576) * 4
    w = (1 + 0.1 * torch.randn(576)).to(torch.bfloat16)
    ref = F.rms_norm(x, (576,), w.float(), 1e-5)
    got = rms_norm_bf16(x, w, 1e-5)
    assert got.dtype == torch.float32 and not torch.equal(got, ref)
    assert torch.allclose(got, ref, rtol=2**-6, atol=2**-6)  # a few bf16 roundings apart, no more


# --- the real model ------------------------------------------------------------
PROMPT = "The three primary colors are red, yellow and"
STEPS = 3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core host a 2-thread OpenMP region waits at every barrier (5x slower here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpt():
    from pairaudit.refserver.model import layout_cache_path
    from pairaudit.refserver.tokenizer import ChatTokenizer
    from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model

    path, ident = resolve_model(EMBEDDED_NAME)
    return path, layout_cache_path(ident["weights_sha256"]), ChatTokenizer(path)(PROMPT).input_ids


_MODELS: dict = {}


def _model(ckpt, keep=True, **kw):
    from pairaudit.refserver.model import LlamaModel

    key = tuple(sorted(kw.items()))
    if key in _MODELS:
        return _MODELS[key]
    # every instance maps the same kept layout (milliseconds); bf16 copies of weights are its own
    model = LlamaModel(ckpt[0], layout_cache=ckpt[1], numerics=Numerics(**kw))
    if keep:
        _MODELS[key] = model
    return model


def _run(model, ids, forward=None):
    """Hidden states and logits of a prefill in two chunks (the second at an offset: a masked SDPA) and
    STEPS one-token decodes (the single-row attention path)."""
    from pairaudit.refserver.model import Segment

    forward = forward or model.forward
    logits = model.logits if forward == model.forward else (lambda h: model.head(h))
    cache = model.new_cache(4)  # small: the cache grows on the way
    cut = len(ids) // 2
    hidden = [forward(torch.tensor(ids[:cut]), [Segment(cache, 0, cut)])]
    cache.length = cut
    hidden.append(forward(torch.tensor(ids[cut:]), [Segment(cache, cut, len(ids) - cut)]))
    cache.length = len(ids)
    for step in range(STEPS):
        hidden.append(forward(torch.tensor([ids[step]]), [Segment(cache, cache.length, 1)]))
        cache.length += 1
    hidden = torch.cat(hidden)
    return hidden, logits(hidden)


def _forward_before_switches(model, tokens, segments):
    """The forward pass as it was before devices, dtypes and numeric switches (kept verbatim as the reference)."""
    cfg = model.cfg
    heads, kvh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    qd, kd = heads * hd, kvh * hd
    half = hd // 2

    def rms(x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, cfg.eps)

    with torch.inference_mode():
        if len(segments) == 1:
            s = segments[0]
            positions = slice(s.start, s.start + s.n)
        else:
            positions = torch.cat([torch.arange(s.start, s.start + s.n) for s in segments])
        cos = model.cos[positions][:, None, :]
        sin = model.sin_signed[positions][:, None, :]
        plan = []
        off = 0
        for s in segments:
            s.cache.reserve(s.start + s.n)
            end = s.start + s.n
            mask = None
            if s.n > 1 and s.start > 0:
                mask = torch.arange(end)[None, :] <= torch.arange(s.start, end)[:, None]
            plan.append((s, off, off + s.n, end, mask))
            off += s.n
        T = off
        x = model.embed[tokens]
        for li, layer in enumerate(model.layers):
            qkv = layer.qkv(rms(x, layer.in_norm))
            qk = qkv[:, : qd + kd].view(T, heads + kvh, hd)
            qk = qk * cos + qk.roll(half, -1) * sin
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, qd + kd :].view(T, kvh, hd)
            outs = []
            for s, a, b, end, mask in plan:
                kc, vc = s.cache.k[li], s.cache.v[li]
                kc[s.start : end] = k[a:b]
                vc[s.start : end] = v[a:b]
                if s.n == 1:
                    qs = q[a].view(kvh, heads // kvh, hd)
                    scores = torch.bmm(qs, kc[:end].permute(1, 2, 0)).mul_(model.scale)
                    o = torch.bmm(scores.softmax(-1), vc[:end].transpose(0, 1))
                    outs.append(o.view(1, qd))
                else:
                    o = F.scaled_dot_product_attention(
                        q[a:b].transpose(0, 1).unsqueeze(0),
                        kc[:end].transpose(0, 1).unsqueeze(0),
                        vc[:end].transpose(0, 1).unsqueeze(0),
                        attn_mask=mask,
                        is_causal=mask is None,
                        enable_gqa=True,
                    )
                    outs.append(o[0].transpose(0, 1).reshape(s.n, qd))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
            x = x + layer.o(attn)
            gu = layer.gate_up(rms(x, layer.post_norm))
            inter = gu.shape[-1] // 2
            x = x + layer.down(F.silu(gu[:, :inter]) * gu[:, inter:])
        return rms(x, model.norm)


def test_rollback_values_compute_bit_for_bit_what_the_forward_computed_before_the_switches(ckpt):
    model = _model(ckpt)
    hidden, logits = _run(model, ckpt[2])
    old_hidden, old_logits = _run(model, ckpt[2], forward=lambda t, s: _forward_before_switches(model, t, s))
    assert torch.equal(hidden, old_hidden) and torch.equal(logits, old_logits)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"


# each switch: where it acts (True: the hidden states move; the LM head acts after them)
PLACES = {
    "attn_bf16": ({"attn_bf16": True}, True),
    "mlp_bf16": ({"mlp_bf16": True}, True),
    "rmsnorm_bf16": ({"rmsnorm_bf16": True}, True),
    "lm_head_bf16": ({"lm_head_bf16": True}, False),
    "sdpa_math": ({"sdpa_backend": "math"}, True),
    "sdpa_flash": ({"sdpa_backend": "flash"}, True),
}


@pytest.mark.parametrize("name", list(PLACES))
def test_each_switch_moves_the_logits_in_its_own_place_deterministically(ckpt, name):
    kw, moves_hidden = PLACES[name]
    base_hidden, base = _run(_model(ckpt), ckpt[2])
    hidden, logits = _run(_model(ckpt, **kw), ckpt[2])
    again_hidden, again = _run(_model(ckpt, **kw), ckpt[2])
    assert torch.equal(hidden, again_hidden) and torch.equal(logits, again)  # deterministic
    assert not torch.equal(logits, base)
    assert torch.equal(hidden, base_hidden) != moves_hidden
    diff = (logits - base).abs().max().item()
    # the same model in another precision: moved, but by rounding, not by a broken pass (that moves logits by >> 5)
    assert 0 < diff < 5, diff
    if name.startswith("sdpa"):  # only the order of an fp32 reduction changes
        assert diff < 1e-3
    if name == "lm_head_bf16":
        assert torch.equal(logits, logits.to(torch.bfloat16).float())


def test_the_switches_are_independent(ckpt):
    """Each switch still changes the logits with all the others on: none of them hides or undoes another."""
    everything = {"attn_bf16": True, "mlp_bf16": True, "rmsnorm_bf16": True, "lm_head_bf16": True,
                  "sdpa_backend": "math"}
    _, all_on = _run(_model(ckpt, keep=False, **everything), ckpt[2])
    for key in everything:
        rest = {k: v for k, v in everything.items() if k != key}
        _, without = _run(_model(ckpt, keep=False, **rest), ckpt[2])
        assert not torch.equal(all_on, without), f"{key} changes nothing once the other switches are on"


def test_model_dtypes_on_cpu(ckpt):
    _, base = _run(_model(ckpt), ckpt[2])
    for dtype in (torch.bfloat16, torch.float16):
        model = _model(ckpt, dtype=dtype)
        assert model.embed.dtype == dtype and model.new_cache(2).k[0].dtype == dtype
        hidden, logits = _run(model, ckpt[2])
        assert hidden.dtype == dtype and logits.dtype == torch.float32
        assert 0 < (logits - base).abs().max().item() < 5
    # a bfloat16 model already has a bfloat16 head: the switch asks for what is there
    _, bf16 = _run(_model(ckpt, dtype=torch.bfloat16), ckpt[2])
    _, bf16_head = _run(_model(ckpt, dtype=torch.bfloat16, lm_head_bf16=True), ckpt[2])
    assert torch.equal(bf16, bf16_head)


# --- the server ----------------------------------------------------------------
@pytest.mark.server
def test_server_reports_device_numerics_and_refuses_switches_the_device_cannot_run(tmp_path):
    import subprocess
    import sys

    from refserver_fixture import RefServer

    bad = subprocess.run([sys.executable, "-m", "pairaudit.refserver", "--device", "cpu", "--port", "1"],
                         env={**__import__("os").environ, "PAIRAUDIT_REF_TF32": "1"}, capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 1 and "PAIRAUDIT_REF_TF32=1: TF32 is a mode of CUDA matmuls" in bad.stderr
    if not torch.cuda.is_available():
        bad = subprocess.run([sys.executable, "-m", "pairaudit.refserver", "--device", "cuda", "--port", "1"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
        assert bad.returncode == 1 and "--device cuda: torch" in bad.stderr and "sees no CUDA device" in bad.stderr

    server = RefServer({"PAIRAUDIT_REF_MLP_BF16": "1", "PAIRAUDIT_REF_SDPA_BACKEND": "math"}, max_model_len=256,
                       extra_args=("--device", "cpu", "--threads", "1"), log_dir=tmp_path)
    try:
        info = server.get("/version").json()["pairaudit"]
        assert info["device"] == "cpu" and info["torch"] == torch.__version__ and "cuda" in info
        assert info["device_name"] and info["dtype"] == "float32"
        assert info["switches"]["PAIRAUDIT_REF_MLP_BF16"] == "1"
        assert info["switches"]["PAIRAUDIT_REF_SDPA_BACKEND"] == "math"
        assert info["switches"]["PAIRAUDIT_REF_CUDA_GRAPHS"] == "1"  # accepted on a CPU, and not applicable there
        assert info["decode"]["mode"] == "eager" and info["decode"]["graph_batch_sizes"] == []
        assert info["numerics"]["mlp"] == "bfloat16" and info["numerics"]["attention"] == "float32"
        out = server.completion(prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1)
        assert out["usage"]["completion_tokens"] == 4
        assert server.metric("pairaudit:decode_graph_replays_total") == 0
    finally:
        server.stop()
