"""Decoding against a KV cache: Flash-Decoding (split the keys, merge by log-sum-exp) in Triton,
for a dense cache or a paged one, with grouped-query attention.

A decode step has a handful of new query tokens per sequence and a long cache: one program per
(sequence, head) would leave most SMs idle and read the cache at a fraction of the bandwidth.
So the cache is split into chunks (:func:`flashtext.splitkv.choose_num_splits` picks how many),
launch 1 (``_decode_partial``) runs the online softmax over one chunk and writes a normalised
partial output with its lse, and launch 2 (``_decode_combine``) merges the partials exactly as
chapter 3's block merge does. With one split, launch 1 writes the output directly.

Grouped heads share one read of the cache: a program takes a K/V head and stacks the
``GROUP = H / H_kv`` query heads that use it (times the new tokens) as the rows of its Q tile,
so every K/V byte is read once per step, not once per query head.

Paged cache (vLLM-style): the cache is ``(num_blocks, H_kv, block_size, d)`` and
``block_table[b, i]`` names the physical block holding sequence b's keys
``[i * block_size, (i + 1) * block_size)``; the kernel gathers each key row through the table.
"""

from __future__ import annotations

import functools
import numbers

import torch
import triton
import triton.language as tl

from flashtext import _boot
from flashtext.fa2 import LN2, LOG2E
from flashtext.kernels import fastpath
from flashtext.kernels.checks import check_device, check_scale
from flashtext.kernels.config import MAX_HEAD_DIM, block_d
from flashtext.kernels.forward import input_precision
from flashtext.splitkv import choose_num_splits

_LN2 = tl.constexpr(LN2)


@triton.jit(do_not_specialize=["N_NEW", "CHUNK"])
def _decode_partial(Q, K, V, OUT, LSE, SEQLENS, BLOCK_TABLE, qk_scale,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_ob, stride_oh, stride_os, stride_om, stride_od,
                    stride_lb, stride_lh, stride_ls, stride_bt,
                    H_KV, GROUP, N_NEW, CHUNK, PAGE_SIZE,
                    CAUSAL: tl.constexpr, PAGED: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    INPUT_PRECISION: tl.constexpr):
    # grid = (splits, batch * K/V heads, row blocks); rows = (query head in group, new token)
    split = tl.program_id(0)
    off_b = tl.program_id(1) // H_KV
    off_kh = tl.program_id(1) % H_KV
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * N_NEW
    head = off_kh * GROUP + rows // N_NEW
    token = rows % N_NEW
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    seqlen = tl.load(SEQLENS + off_b)
    position = seqlen - N_NEW + token  # where each new token sits in its sequence
    q = tl.load(Q + off_b.to(tl.int64) * stride_qb + head[:, None].to(tl.int64) * stride_qh
                + token[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    start = split * CHUNK
    stop = tl.minimum(start + CHUNK, seqlen)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    K += off_kh.to(tl.int64) * stride_kh
    V += off_kh.to(tl.int64) * stride_vh
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        key_ok = offs_n < stop
        if PAGED:  # logical key -> (physical block, slot) through the block table
            block = tl.load(BLOCK_TABLE + off_b.to(tl.int64) * stride_bt + offs_n // PAGE_SIZE,
                            mask=key_ok, other=0)
            k_row = block.to(tl.int64) * stride_kb + (offs_n % PAGE_SIZE) * stride_kn
            v_row = block.to(tl.int64) * stride_vb + (offs_n % PAGE_SIZE) * stride_vn
        else:
            k_row = off_b.to(tl.int64) * stride_kb + offs_n.to(tl.int64) * stride_kn
            v_row = off_b.to(tl.int64) * stride_vb + offs_n.to(tl.int64) * stride_vn
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(K + k_row[:, None] + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        seen = key_ok[None, :]
        if CAUSAL:  # the new tokens see the cache and each other up to themselves
            seen = seen & (offs_n[None, :] <= position[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet: p = 0
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + v_row[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    seen_any = l_i > 0
    out = acc / tl.where(seen_any, l_i, 1.0)[:, None]
    lse = tl.where(seen_any, (m_i + tl.math.log2(tl.where(seen_any, l_i, 1.0))) * _LN2,
                   float("-inf"))
    o_ptrs = (OUT + off_b.to(tl.int64) * stride_ob + head[:, None].to(tl.int64) * stride_oh
              + split * stride_os + token[:, None] * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + off_b.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh
             + split * stride_ls + token, lse, mask=row_ok)


@triton.jit
def _decode_combine(O_PART, L_PART, OUT, LSE, SPLITS, H, N_NEW,
                    stride_pb, stride_ph, stride_ps, stride_pm,
                    stride_ob, stride_oh, stride_om, stride_od,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """out = sum_s exp(lse_s - lse) o_s with lse = logsumexp_s lse_s (chapter 3's merge)."""
    token = tl.program_id(0)
    off_b = tl.program_id(1) // H
    off_h = tl.program_id(1) % H
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < SPLITS
    d_ok = offs_d < HEAD_DIM
    base = off_b.to(tl.int64) * stride_pb + off_h.to(tl.int64) * stride_ph + token * stride_pm
    lse = tl.load(L_PART + (off_b * H + off_h).to(tl.int64) * SPLITS * N_NEW
                  + offs_s * N_NEW + token, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m_safe)  # 0 for a split that saw no key
    total = tl.sum(w, 0)
    o = tl.load(O_PART + base + offs_s[:, None] * stride_ps + offs_d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    safe_total = tl.where(total > 0, total, 1.0)
    out = tl.sum(w[:, None] * o, 0) / safe_total
    tl.store(OUT + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
             + token * stride_om + offs_d * stride_od, out.to(OUT.dtype.element_ty), mask=d_ok)
    tl.store(LSE + (off_b * H + off_h).to(tl.int64) * N_NEW + token,
             tl.where(total > 0, m + tl.log(safe_total), float("-inf")))


def _blocks(head_dim: int, rows: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a decode launch."""
    block_m = max(16, triton.next_power_of_2(min(rows, 64)))
    if _boot.INTERPRETING:
        return block_m, 32, 1, 1
    return block_m, (64 if block_d(head_dim) >= 128 else 128), 4, 3


def _check_int_tensor(name: str, t, dims: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims:
        got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) \
            else type(t).__name__
        raise ValueError(f"{name} must be a torch.int32 tensor of shape {layout}, got {got}")


def _validate(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, num_splits,
              causal, check_inputs) -> tuple[float, int]:
    for name, t, layout in (("q", q, "(batch, heads, N_new, head_dim)"),
                            ("k_cache", k_cache, "(batch, heads_kv, N_max, head_dim) or paged "
                             "(num_blocks, heads_kv, block_size, head_dim)"),
                            ("v_cache", v_cache, "like k_cache")):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D torch.Tensor {layout}, got {got}")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"{name} has dtype {t.dtype}; expected float16, bfloat16 or "
                             "float32")
        if t.requires_grad:
            raise ValueError(f"{name} requires grad, but flash_decode is inference-only (no "
                             "backward): call it under torch.no_grad() or on detached tensors")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    check_device({"q": q, "k_cache": k_cache, "v_cache": v_cache})
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    batch, heads, n_new, d = q.shape
    h_kv = k_cache.shape[1]
    if k_cache.shape[-1] != d or not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q and the caches must share head_dim (last dim, 1 to "
                         f"{MAX_HEAD_DIM}), got q {d} and k_cache {k_cache.shape[-1]}")
    if n_new < 1:
        raise ValueError(f"q must hold at least one new token (dim 2), got {n_new}")
    if h_kv == 0 or heads % h_kv:
        raise ValueError(f"q's heads ({heads}) must be a multiple of the caches' heads "
                         f"({h_kv}, dim 1)")
    _check_int_tensor("cache_seqlens", cache_seqlens, 1, f"({batch},)")
    if cache_seqlens.shape[0] != batch or cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens must have one entry per sequence ({batch}) on q's "
                         f"device {q.device}, got shape {tuple(cache_seqlens.shape)} on "
                         f"{cache_seqlens.device}")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"a dense k_cache has one row per sequence: expected dim 0 = "
                             f"{batch} (q's batch), got {k_cache.shape[0]} (pass block_table "
                             "for a paged cache)")
        capacity = k_cache.shape[2]
    else:
        _check_int_tensor("block_table", block_table, 2, f"({batch}, max_blocks)")
        if block_table.shape[0] != batch or block_table.device != q.device:
            raise ValueError(f"block_table must have one row per sequence ({batch}) on q's "
                             f"device, got shape {tuple(block_table.shape)} on "
                             f"{block_table.device}")
        capacity = block_table.shape[1] * k_cache.shape[2]
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(
            num_splits, numbers.Integral) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    if check_inputs and q.device.type != "meta":
        lengths = cache_seqlens.tolist()
        bad = [(b, n) for b, n in enumerate(lengths) if not n_new <= n <= capacity]
        if bad:
            b, n = bad[0]
            raise ValueError(f"cache_seqlens[{b}] = {n}: each sequence's length (new tokens "
                             f"included) must be between N_new = {n_new} and the cache's "
                             f"capacity {capacity}")
        if block_table is not None:
            size = k_cache.shape[2]
            table = block_table.tolist()
            for b, n in enumerate(lengths):
                used = table[b][: -(-n // size)]
                wrong = [x for x in used if not 0 <= x < k_cache.shape[0]]
                if wrong:
                    raise ValueError(f"block_table[{b}] names block {wrong[0]}, outside the "
                                     f"cache's {k_cache.shape[0]} blocks")
    return check_scale(sm_scale, d), capacity


def flash_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cache_seqlens: torch.Tensor, block_table: torch.Tensor | None = None,
                 sm_scale: float | None = None, num_splits: int | None = None,
                 causal: bool = True, return_lse: bool = False, check_inputs: bool = True):
    """Attention of new tokens against a KV cache (flash-attn's ``flash_attn_with_kvcache``
    without the cache update), inference only.

    q (batch, heads, N_new, d): the N_new newest tokens of each sequence, causal among
    themselves (``causal=False``: every query sees the whole sequence). The cache is dense,
    (batch, heads_kv, N_max, d), or paged, (num_blocks, heads_kv, block_size, d) with
    ``block_table`` (batch, max_blocks) int32. ``cache_seqlens`` (batch,) int32 is each
    sequence's length including the new tokens (so its new tokens sit at positions
    ``cache_seqlens[b] - N_new ...``). Grouped-query attention: heads a multiple of heads_kv.
    ``num_splits=None`` picks the key split from the shapes and the GPU's SM count.
    ``check_inputs`` reads ``cache_seqlens`` and ``block_table`` on the host to check their
    values (one device synchronisation); pass False inside a CUDA graph or a serving loop that
    already checked them. Returns O (batch, heads, N_new, d) in q's dtype (and lse (batch,
    heads, N_new) float32, natural log, with ``return_lse``)."""
    scale, capacity = _validate(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale,
                                num_splits, causal, check_inputs)
    batch, heads, n_new, d = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, n_new), dtype=torch.float32, device=q.device)
    if out.is_meta or out.numel() == 0:
        return (out, lse) if return_lse else out
    if num_splits is None:
        num_splits = default_splits(q, k_cache.shape[1], capacity)
    if num_splits == 1:  # one chunk: the partial is the answer, written in place
        _launch_partials(q, k_cache, v_cache, cache_seqlens, block_table, scale, 1, causal,
                         capacity, out, lse)
        return (out, lse) if return_lse else out
    o_part, l_part = _launch_partials(q, k_cache, v_cache, cache_seqlens, block_table, scale,
                                      num_splits, causal, capacity)
    fastpath.launch(_decode_combine, (n_new, batch * heads),
                    (o_part, l_part, out, lse, num_splits, heads, n_new, *o_part.stride()[:4],
                     *out.stride()),
                    dict(HEAD_DIM=d, BLOCK_D=block_d(d),
                         BLOCK_S=max(2, triton.next_power_of_2(num_splits))), num_warps=4)
    return (out, lse) if return_lse else out


def default_splits(q: torch.Tensor, h_kv: int, n_k: int) -> int:
    """The key split :func:`flash_decode` uses for ``q`` against ``n_k`` keys of ``h_kv`` heads:
    enough programs to fill the GPU (two per SM fit at these tile sizes)."""
    batch, heads, n_new, d = q.shape
    block_m, block_n, _, _ = _blocks(d, heads // h_kv * n_new)
    rows = triton.cdiv(heads // h_kv * n_new, block_m) * block_m
    sms = _sm_count(q.device.index) if q.is_cuda else 132
    return _splits_for(batch, h_kv, rows, n_k, 2 * sms, block_m, block_n)


# A decode step is a few microseconds of GPU work at batch 1, so its host time is its time: the
# device's SM count and the split rule's answer (a Python loop over split counts, tens of
# microseconds) are worked out once per shape, not at every step.
@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=4096)
def _splits_for(batch: int, h_kv: int, rows: int, n_k: int, sms: int, block_m: int,
                block_n: int) -> int:
    return choose_num_splits(batch, h_kv, rows, n_k, sms=sms, block_m=block_m, block_n=block_n)


def _launch_partials(q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits, causal,
                     capacity, out=None, lse=None):
    """Launch 1: per-split normalised outputs (batch, heads, splits, N_new, d) and lses (batch,
    heads, splits, N_new) in float32, or, given ``out`` and ``lse`` with one split, the answer."""
    batch, heads, n_new, d = q.shape
    h_kv = k_cache.shape[1]
    group = heads // h_kv
    block_m, block_n, warps, stages = _blocks(d, group * n_new)
    # chunks are whole key blocks, so every program but the last loads full tiles
    chunk = block_n * triton.cdiv(triton.cdiv(capacity, num_splits), block_n)
    if out is not None:
        o_part, l_part = out, lse
        o_strides = (out.stride(0), out.stride(1), 0, out.stride(2), out.stride(3))
        l_strides = (lse.stride(0), lse.stride(1), 0)
    else:
        o_part = torch.empty((batch, heads, num_splits, n_new, d), dtype=torch.float32,
                             device=q.device)
        l_part = torch.empty((batch, heads, num_splits, n_new), dtype=torch.float32,
                             device=q.device)
        o_strides, l_strides = o_part.stride(), l_part.stride()[:3]
    table = block_table if block_table is not None else cache_seqlens  # unused when dense
    grid = (num_splits, batch * h_kv, triton.cdiv(group * n_new, block_m))
    fastpath.launch(_decode_partial, grid,
                    (q, k_cache, v_cache, o_part, l_part, cache_seqlens, table, scale * LOG2E,
                     *q.stride(), *k_cache.stride(), *v_cache.stride(), *o_strides, *l_strides,
                     table.stride(0), h_kv, group, n_new, chunk, k_cache.shape[2]),
                    dict(CAUSAL=causal, PAGED=block_table is not None, HEAD_DIM=d,
                         BLOCK_D=block_d(d), BLOCK_M=block_m, BLOCK_N=block_n,
                         INPUT_PRECISION=input_precision(q.dtype)),
                    num_warps=warps, num_stages=stages)
    return o_part, l_part


def decode_partials(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: torch.Tensor, num_splits: int,
                    block_table: torch.Tensor | None = None, sm_scale: float | None = None,
                    causal: bool = True, check_inputs: bool = True,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 1 alone, for checking a chunk: (outputs (batch, heads, splits, N_new, d), lses
    (batch, heads, splits, N_new)), float32, each split normalised on its own."""
    scale, capacity = _validate(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale,
                                num_splits, causal, check_inputs)
    if num_splits is None:
        raise ValueError("num_splits must be a positive int, got None")
    return _launch_partials(q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits,
                            causal, capacity)


__all__ = ["decode_partials", "default_splits", "flash_decode"]
