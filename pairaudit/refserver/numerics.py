"""Where the reference model computes in which precision, and with which attention kernel.

One :class:`Numerics` per model says it: the model dtype plus one independent
switch per place of the forward pass (attention, MLP projections, RMSNorm, LM
head) and the ``scaled_dot_product_attention`` backend.  Each switch changes
only its own place, deterministically, so an audit (or a bisection over
switches) can attribute a change of numbers to one of them.  With every switch
at its rollback value the forward pass runs exactly the operations it ran
before the switches existed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .switches import Switches

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Numerics:
    dtype: torch.dtype = torch.float32
    lm_head_bf16: bool = False
    attn_bf16: bool = False
    mlp_bf16: bool = False
    rmsnorm_bf16: bool = False
    sdpa_backend: str = "auto"

    @classmethod
    def from_switches(cls, sw: Switches, dtype: str = "float32") -> "Numerics":
        if dtype not in DTYPES:
            raise ValueError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
        return cls(dtype=DTYPES[dtype], lm_head_bf16=sw.lm_head_bf16, attn_bf16=sw.attn_bf16, mlp_bf16=sw.mlp_bf16,
                   rmsnorm_bf16=sw.rmsnorm_bf16, sdpa_backend=sw.sdpa_backend)

    # Each place's dtype; a switch asking for the dtype the model already has changes nothing.
    @property
    def head_dtype(self) -> torch.dtype:
        return BF16 if self.lm_head_bf16 else self.dtype

    @property
    def attn_dtype(self) -> torch.dtype:
        return BF16 if self.attn_bf16 else self.dtype

    @property
    def mlp_dtype(self) -> torch.dtype:
        return BF16 if self.mlp_bf16 else self.dtype

    def describe(self) -> dict:
        """Per place, the dtype it computes in (for /version)."""
        name = {v: k for k, v in DTYPES.items()}
        return {"model": name[self.dtype], "attention": name[self.attn_dtype], "mlp": name[self.mlp_dtype],
                "rmsnorm": "bfloat16" if self.rmsnorm_bf16 else f"{name[self.dtype]} (fused, fp32 reduction)",
                "lm_head": name[self.head_dtype], "sdpa_backend": self.sdpa_backend}

    def sdpa_context(self):
        """The context the attention runs in: torch's own backend choice, or only the one asked for."""
        if self.sdpa_backend == "auto":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[self.sdpa_backend]
        return sdpa_kernel([backend])


def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in bfloat16 end to end: squares, their mean, the scaling, the weight.

    What a norm kernel that skips the fp32 upcast computes (``F.rms_norm``
    reduces in fp32 for every input dtype); ``weight`` is already bfloat16.
    """
    xb = x.to(BF16)
    ms = (xb * xb).mean(-1, keepdim=True)
    return (xb * torch.rsqrt(ms + eps) * weight).to(x.dtype)


class CastLinear:
    """A projection computed in another dtype: input cast in, output cast back to the caller's dtype."""

    def __init__(self, linear, dtype: torch.dtype):
        self.linear, self.dtype = linear, dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(self.dtype)).to(x.dtype)

