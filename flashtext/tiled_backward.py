"""The FlashAttention backward pass in NumPy (chapter 8), with the kernel's names.

For O = P V, P = softmax(S), S = sm_scale * Q K^T and an upstream gradient dO:

    dV = P^T dO        dP = dO V^T        dS = P * (dP - delta),  delta = rowsum(dO * O)
    dQ = sm_scale * dS K                  dK = sm_scale * dS^T Q

``delta`` (D in the papers) is one number per query row, D in R^N: D_i = dO_i . O_i is a dot
product of two rows of length d, so the shapes settle it. FA2's paper types it R^d, a typo (a
reader's report, flash-attention #2555, is open with no maintainer reply; the math needs none).
rowsum(dO * O) equals rowsum(P * dP) (because O = P V) but reads d numbers per row instead of N.

The forward saved only ``lse`` (L = m + log l, natural log). The backward rebuilds each tile of
P from Q, K and lse: P = exp(S - lse). Subtracting lse (not the row max) gives the *normalised*
probabilities in one step, since exp(S - m - log l) = exp(S - m) / l (flash-attention #1012).

:func:`flash2_backward` loops like FA2's dK/dV kernel: one K/V block per outer step
(``start_n``), an inner loop over query blocks (``start_m``) that accumulates dK and dV on chip,
while dQ is accumulated across outer steps (a GPU does that with atomics or a second pass).
The body of the inner loop is :func:`bwd_block`; :func:`tiled_backward` runs any such body.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from flashtext.fa2 import (
    FULL,
    MASKED,
    BlockCounts,
    _check_block_sizes,
    _check_qkv,
    block_kind,
    causal_offset,
    flash2_forward,
)
from flashtext.reference import Align, _f64, default_scale

__all__ = [
    "NumpyAttentionFunction",
    "attention_delta",
    "bwd_block",
    "flash2_backward",
    "numpy_attention",
    "peak_bytes",
    "tiled_backward",
]

BlockStep = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]


def attention_delta(o, do) -> np.ndarray:
    """delta = rowsum(dO * O): shape (..., N), one number per query row."""
    o, do = _f64(o), _f64(do)
    if o.shape != do.shape:
        raise ValueError(f"o and do must have the same shape, got {o.shape} and {do.shape}")
    return np.sum(do * o, axis=-1)


def bwd_block(q_blk, k_blk, v_blk, do_blk, lse_blk, delta_blk, mask, sm_scale: float):
    """One inner step: the contributions of one (query block, key block) tile.

    Returns (dk, dv, dq) for this tile: dk, dv of shape (BLOCK_N, d), dq of shape (BLOCK_M, d).
    ``mask`` is None (a full tile) or a boolean (BLOCK_M, BLOCK_N) array, True where the query
    may see the key.
    """
    s = (q_blk @ k_blk.T) * sm_scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    # rebuild P from the saved lse; a row that saw no key has lse = -inf and P = 0
    p = np.exp(s - np.where(np.isneginf(lse_blk), np.inf, lse_blk)[:, None])
    dv = p.T @ do_blk
    dp = do_blk @ v_blk.T
    ds = p * (dp - delta_blk[:, None])
    dk = (ds.T @ q_blk) * sm_scale
    dq = (ds @ k_blk) * sm_scale
    return dk, dv, dq


def tiled_backward(step: BlockStep, q, k, v, do, lse, delta, causal: bool = False,
                   sm_scale: float | None = None, align: Align = "bottom_right",
                   BLOCK_M: int = 64, BLOCK_N: int = 64,  # noqa: N803 (the kernel's names)
                   counts: BlockCounts | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drive ``step`` (a function like :func:`bwd_block`) over the tiles of one head.

    q, do: (Nq, d); k: (Nk, d); v: (Nk, dv); lse, delta: (Nq,). Outer loop over K/V blocks,
    inner loop over query blocks, causal tiles above the diagonal skipped.
    """
    n_q, n_k = q.shape[0], k.shape[0]
    offset = causal_offset(n_q, n_k, align)
    sm_scale = default_scale(q.shape[1]) if sm_scale is None else float(sm_scale)
    dq = np.zeros_like(q)
    dk = np.empty_like(k)
    dv = np.empty_like(v)
    n_q_blocks = -(-n_q // BLOCK_M)
    for start_n in range(0, n_k, BLOCK_N):                 # one program per K/V block
        end_n = min(start_n + BLOCK_N, n_k)
        k_blk, v_blk = k[start_n:end_n], v[start_n:end_n]  # loaded once, stay on chip
        dk_acc = np.zeros_like(k_blk)
        dv_acc = np.zeros_like(v_blk)
        # causal: query rows before start_n - offset see none of these keys
        first_row = max(0, start_n - offset) if causal else 0
        lo = first_row // BLOCK_M * BLOCK_M
        starts = range(lo, n_q, BLOCK_M) if first_row < n_q else range(0)
        for start_m in starts:
            end_m = min(start_m + BLOCK_M, n_q)
            kind = block_kind(start_m, end_m, start_n, end_n, offset) if causal else FULL
            if counts is not None:
                counts.add(kind, end_m - start_m, end_n - start_n)
            mask = None
            if kind == MASKED:
                offs_m = np.arange(start_m, end_m)
                offs_n = np.arange(start_n, end_n)
                mask = offs_n[None, :] <= offs_m[:, None] + offset
            dk_blk, dv_blk, dq_blk = step(q[start_m:end_m], k_blk, v_blk, do[start_m:end_m],
                                          lse[start_m:end_m], delta[start_m:end_m], mask,
                                          sm_scale)
            dk_acc += dk_blk
            dv_acc += dv_blk
            dq[start_m:end_m] += dq_blk                    # accumulated across outer steps
        if counts is not None:
            counts.skipped += n_q_blocks - len(starts)
        dk[start_n:end_n] = dk_acc
        dv[start_n:end_n] = dv_acc
    return dq, dk, dv


def flash2_backward(q, k, v, o, lse, do, causal: bool = False, sm_scale: float | None = None,
                    align: Align = "bottom_right", BLOCK_M: int = 64,  # noqa: N803
                    BLOCK_N: int = 64,  # noqa: N803
                    counts: BlockCounts | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of sum(O * dO), from the saved O and lse. Shapes as the forward."""
    q, k, v = _check_qkv(q, k, v)
    o, lse, do = _f64(o), _f64(lse), _f64(do)
    if do.shape != q.shape[:-1] + v.shape[-1:] or o.shape != do.shape:
        raise ValueError(f"o and do must have shape {q.shape[:-1] + v.shape[-1:]}, got "
                         f"o {o.shape}, do {do.shape}")
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape {q.shape[:-1]}, got {lse.shape}")
    _check_block_sizes(BLOCK_M, BLOCK_N)
    delta = attention_delta(o, do)                         # the preprocessing pass
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    for head in np.ndindex(q.shape[:-2]):
        dq[head], dk[head], dv[head] = tiled_backward(
            bwd_block, q[head], k[head], v[head], do[head], lse[head], delta[head], causal,
            sm_scale, align, BLOCK_M, BLOCK_N, counts)
    return dq, dk, dv


def peak_bytes(fn: Callable[..., Any], *args, **kwargs) -> int:
    """Peak bytes allocated (NumPy arrays included) while ``fn(*args, **kwargs)`` runs."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn(*args, **kwargs)
    peak = tracemalloc.get_traced_memory()[1] - base
    if not was_tracing:
        tracemalloc.stop()
    return peak


# ---------------------------------------------------------------- plugged into torch.autograd

class NumpyAttentionFunction(torch.autograd.Function):
    """The NumPy forward and backward as a torch.autograd.Function, so torch.autograd.gradcheck
    can compare the tiled backward with finite differences. It saves q, k, v, o and lse, never
    the N x N probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None, align="bottom_right",
                BLOCK_M=16, BLOCK_N=16):  # noqa: N803
        o, lse = flash2_forward(q, k, v, causal, sm_scale, align, BLOCK_M, BLOCK_N)
        o_t = torch.from_numpy(o).to(q.dtype)
        ctx.save_for_backward(q, k, v, o_t, torch.from_numpy(lse))
        ctx.args = (causal, sm_scale, align, BLOCK_M, BLOCK_N)
        return o_t

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, sm_scale, align, bm, bn = ctx.args
        grads = flash2_backward(q, k, v, o, lse, do, causal, sm_scale, align, bm, bn)
        return (*(torch.from_numpy(g).to(q.dtype) for g in grads), None, None, None, None, None)


def numpy_attention(q, k, v, causal: bool = False, sm_scale: float | None = None,
                          align: Align = "bottom_right", BLOCK_M: int = 16,  # noqa: N803
                          BLOCK_N: int = 16):  # noqa: N803
    """Differentiable attention for torch tensors, computed by the NumPy FA2 forward/backward."""
    return NumpyAttentionFunction.apply(q, k, v, causal, sm_scale, align, BLOCK_M, BLOCK_N)
