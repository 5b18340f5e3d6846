"""Split-KV attention (Flash-Decoding): split the *keys* across programs, merge afterwards.

FlashAttention-2 parallelises over batch x heads x blocks of queries. At decode time there is
one query per sequence, so a batch of 1 with H heads launches only H programs, and an H200 has
132 SMs: most of the chip waits while a few SMs stream the whole KV cache. Flash-Decoding
(PyTorch blog, "Flash-Decoding for long-context inference", 2023) adds a split axis: each
program attends to one chunk of the keys and writes a *normalised* partial output and the
log-sum-exp (lse) of its scores; a second, tiny step combines the partials with
:func:`flashtext.online.combine_partials` (the merge of chapter 3, in lse form).

This module is the float64 NumPy version (exact, for teaching and checking) plus the occupancy
arithmetic. The Triton kernel lives in :mod:`flashtext.kernels.splitkv`.
"""

from __future__ import annotations

import math

import numpy as np

from flashtext import reference
from flashtext.online import AttentionState, combine_partials

__all__ = [
    "busy_sms",
    "choose_num_splits",
    "num_programs",
    "partial_attention",
    "split_bounds",
    "split_attention",
    "wave_efficiency",
]


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def split_bounds(n_k: int, num_splits: int) -> list[tuple[int, int]]:
    """Key ranges [start, stop) of ``num_splits`` chunks covering 0..n_k.

    Every chunk but the last has ceil(n_k / num_splits) keys; with more splits than keys the
    trailing chunks are empty (they contribute lse = -inf and nothing else).
    """
    if isinstance(n_k, bool) or not isinstance(n_k, (int, np.integer)) or n_k < 0:
        raise ValueError(f"n_k must be a non-negative integer, got {n_k!r}")
    num_splits = _positive_int(num_splits, "num_splits")
    chunk = max(1, math.ceil(n_k / num_splits))
    return [(min(s * chunk, n_k), min((s + 1) * chunk, n_k)) for s in range(num_splits)]


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = reference._f64(q), reference._f64(k), reference._f64(v)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"q, k, v must be (..., N, d); got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys, got {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dimension, got {q.shape}, {k.shape}")
    return q, k, v


def partial_attention(q, k, v, start: int, stop: int, causal: bool = False,
                      scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What one split-KV program computes: attention of every query over keys [start, stop)
    only, as a normalised output (..., Nq, d) and its log-sum-exp (..., Nq).

    The causal mask uses *global* key positions (bottom-right aligned, like
    :func:`flashtext.reference.causal_mask`), so a chunk never sees keys its queries may not.
    Rows that see no key in the chunk get output 0 and lse -inf.
    """
    q, k, v = _check_qkv(q, k, v)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if not (0 <= start <= stop <= n_k):
        raise ValueError(f"need 0 <= start <= stop <= n_k={n_k}, got start={start}, stop={stop}")
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    s = scale * (q @ np.swapaxes(k[..., start:stop, :], -1, -2))
    if causal:
        visible = reference.causal_mask(n_q, n_k)[:, start:stop]
        s = np.where(visible, s, -np.inf)
    state = AttentionState.from_block(s, v[..., start:stop, :])
    return state.output(), state.lse()


def split_attention(q, k, v, num_splits: int, causal: bool = False,
                      scale: float | None = None, return_lse: bool = False,
                      return_partials: bool = False):
    """Attention computed as Flash-Decoding does: ``num_splits`` partial results over disjoint
    key chunks, combined by their log-sum-exps. Exact (float64): equals
    :func:`flashtext.reference.attention` to rounding.

    Returns ``out``, or ``(out, lse)``; with ``return_partials`` also the stacked partial
    outputs (S, ..., Nq, d) and lses (S, ..., Nq) before the combine.
    """
    q, k, v = _check_qkv(q, k, v)
    bounds = split_bounds(k.shape[-2], num_splits)
    parts = [partial_attention(q, k, v, a, b, causal, scale) for a, b in bounds]
    outputs = np.stack([p[0] for p in parts])
    lses = np.stack([p[1] for p in parts])
    out, lse = combine_partials(outputs, lses)
    result = (out, lse) if return_lse else (out,)
    if return_partials:
        result += (outputs, lses)
    return result[0] if len(result) == 1 else result


# ------------------------------------------------------------------------------ occupancy

def num_programs(batch: int, heads: int, n_q: int, block_m: int, num_splits: int = 1) -> int:
    """Programs (thread blocks) a forward launch creates: batch x heads x query blocks x splits."""
    for value, name in ((batch, "batch"), (heads, "heads"), (n_q, "n_q"), (block_m, "block_m"),
                        (num_splits, "num_splits")):
        _positive_int(value, name)
    return batch * heads * math.ceil(n_q / block_m) * num_splits


def busy_sms(programs: int, sms: int = 132) -> int:
    """SMs with work in the first wave, one program per SM (a program of a long decode is long
    enough that an SM holding it stays busy the whole time)."""
    return min(_positive_int(programs, "programs"), _positive_int(sms, "sms"))


def wave_efficiency(programs: int, sms: int = 132) -> float:
    """waves / ceil(waves) with waves = programs / sms: the fraction of SM-time doing work when
    equal programs run in whole waves (1.0 = no SM idles in the last wave)."""
    waves = _positive_int(programs, "programs") / _positive_int(sms, "sms")
    return waves / math.ceil(waves)


def choose_num_splits(batch: int, heads: int, n_q: int, n_k: int, sms: int = 132,
                      block_m: int = 16, block_n: int = 64, max_splits: int = 128) -> int:
    """How many key splits to launch, by the rule flash-attention's ``num_splits_heuristic``
    follows (csrc/flash_attn/flash_api.cpp): no split when the launch already nearly fills the
    SMs (>= 80%); otherwise the fewest splits whose wave efficiency is within 85% of the best
    (more splits than needed only add partial outputs to write and combine). A split must hold
    at least one block of keys, and split counts that give the same chunk size are skipped.
    """
    base = num_programs(batch, heads, n_q, block_m)
    _positive_int(n_k, "n_k")
    if base >= 0.8 * sms:
        return 1
    n_blocks = math.ceil(n_k / _positive_int(block_n, "block_n"))
    limit = min(_positive_int(max_splits, "max_splits"), sms, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))

    eff = {s: wave_efficiency(base * s, sms) for s in range(1, limit + 1) if eligible(s)}
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= 0.85 * best)
