"""Split-KV (Flash-Decoding) attention for any queries against any keys (chapter 14).

``splitkv_attention(q, k, v)`` is :func:`flashtext.kernels.decode.flash_decode` on a dense
"cache" that every sequence fills: keys are split into ``num_splits`` chunks, launch 1 runs the
FlashAttention-2 inner loop over one chunk and writes a *normalised* partial output and the
natural-log log-sum-exp of its scores (float32), and launch 2 combines the partials,
out = sum_s exp(lse_s - lse) o_s with lse = logsumexp_s lse_s (the same combine as
:func:`flashtext.online.combine_partials`). Inference only.
"""

from __future__ import annotations

import numbers

import torch

from flashtext.kernels.checks import check_scale
from flashtext.kernels.decode import decode_partials, flash_decode

__all__ = ["splitkv_attention", "splitkv_partials"]


def _validate(q, k, v, causal, scale) -> float:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be (batch, heads, N, d), got shape {tuple(t.shape)}")
    if q.shape[:2] != k.shape[:2] or k.shape != v.shape:
        raise ValueError(f"expected q (B, H, Nq, d) and k, v (B, H, Nk, d) with the same B, H "
                         f"and k.shape == v.shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] < 1:
        raise ValueError(f"q and k must share a head dimension of at least 1, got "
                         f"{q.shape[-1]} and {k.shape[-1]}")
    if q.shape[2] < 1 or k.shape[2] < 1:
        raise ValueError(f"need at least one query and one key, got Nq={q.shape[2]}, "
                         f"Nk={k.shape[2]}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    return check_scale(scale, q.shape[-1], name="scale")


def _seqlens(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)


def splitkv_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int,
                     causal: bool = False, scale: float | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 1 only: per-split normalised outputs (B, H, S, Nq, d) and lses (B, H, S, Nq),
    float32 (for checking a chunk against :func:`flashtext.splitkv.partial_attention`)."""
    scale = _validate(q, k, v, causal, scale)
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral) \
            or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer, got {num_splits!r}")
    return decode_partials(q, k, v, _seqlens(q, k), num_splits, sm_scale=scale, causal=causal,
                           check_inputs=False)


def splitkv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: float | None = None, num_splits: int | None = None,
                      return_lse: bool = False):
    """Attention by Flash-Decoding: split the keys, attend per chunk, combine by lse.

    q is (B, H, Nq, d) (decode: Nq = 1), k and v are (B, H, Nk, d); fp16/fp32 everywhere,
    bf16 on a GPU only. Causal masks are bottom-right aligned (the decode convention: the new
    token sees the whole cache). ``num_splits=None`` picks the count for this GPU's SM count
    (132, the H100/H200 value, on the CPU). Returns out (B, H, Nq, d) in q's dtype, and lse
    (B, H, Nq) float32 (natural log) if asked. Inference only: inputs that require grad are
    refused."""
    scale = _validate(q, k, v, causal, scale)
    # every "sequence" is the whole of k (no host check needed); Nq > Nk is allowed here: with
    # a causal mask the first Nq - Nk queries see no key (O = 0, lse = -inf)
    return flash_decode(q, k, v, _seqlens(q, k), sm_scale=scale, num_splits=num_splits,
                        causal=causal, return_lse=return_lse, check_inputs=False)
