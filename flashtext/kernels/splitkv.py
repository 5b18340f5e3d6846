"""Split-KV (Flash-Decoding) attention in Triton: a partial kernel and a combine kernel.

Launch 1, ``_splitkv_partial``: grid (splits, query blocks, batch x heads). Program (s, i, bh)
runs the FlashAttention-2 inner loop over keys [s * chunk, (s + 1) * chunk) only, and writes a
*normalised* partial output and the natural-log log-sum-exp of its scores (float32).
Launch 2, ``_splitkv_combine``: grid (query rows, batch x heads). Each program reads the S
partial lses of one row, and forms out = sum_s exp(lse_s - lse) o_s with lse = logsumexp_s lse_s
(the same combine as :func:`flashtext.online.combine_partials`).

The partial kernel works in base 2 (``exp2`` with the scale folded into log2(e)), like the main
forward kernel. A row whose chunk holds no visible key (causal, or an empty trailing chunk) keeps
m = -inf; every exponent is guarded so it yields 0, never NaN, and the combine gives it no weight.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashtext import _boot
from flashtext.fa2 import LN2, LOG2E
from flashtext.kernels.config import block_d
from flashtext.kernels.forward import input_precision  # fp32: ieee dots, not TF32
from flashtext.splitkv import choose_num_splits

__all__ = ["splitkv_attention", "splitkv_partials"]

_LN2 = tl.constexpr(LN2)  # log(x) = log2(x) * ln 2


@triton.jit
def _splitkv_partial(Q, K, V, O_part, L_part,
                     s_qb, s_qh, s_qm, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                     H, N_Q, N_K, CHUNK, qk_scale_log2,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     INPUT_PRECISION: tl.constexpr):
    split = tl.program_id(0)
    m_block = tl.program_id(1)
    bh = tl.program_id(2)
    num_splits = tl.num_programs(0)
    b = bh // H
    h = bh % H

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < N_Q
    d_ok = offs_d < HEAD_DIM
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :] * s_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    start = split * CHUNK
    stop = tl.minimum(start + CHUNK, N_K)
    if CAUSAL:
        # bottom-right alignment: row i sees keys j <= i + N_K - N_Q; skip keys no row here sees
        last_row = tl.minimum((m_block + 1) * BLOCK_M, N_Q) - 1
        stop = tl.minimum(stop, last_row + 1 + N_K - N_Q)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        key_ok = offs_n < stop
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None] * s_kn + offs_d[None, :] * s_kd, mask=kv_mask,
                    other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale_log2
        visible = key_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + N_K - N_Q)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-masked row: exp2(-inf) = 0
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * s_vn + offs_d[None, :] * s_vd, mask=kv_mask,
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * _LN2, float("-inf"))
    # partials are laid out (batch*heads, splits, N_Q, HEAD_DIM), contiguous
    row = (bh * num_splits + split) * N_Q + offs_m
    tl.store(O_part + row[:, None] * HEAD_DIM + offs_d[None, :], out,
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(L_part + row, lse, mask=row_ok)


@triton.jit
def _splitkv_combine(O_part, L_part, Out, LSE, s_ob, s_oh, s_om, s_od, H, N_Q, SPLITS,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    r = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < SPLITS
    d_ok = offs_d < HEAD_DIM
    rows = (bh * SPLITS + offs_s) * N_Q + r
    lse = tl.load(L_part + rows, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m_safe)  # 0 for a split that saw no key
    total = tl.sum(w, 0)
    o = tl.load(O_part + rows[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    safe_total = tl.where(total > 0, total, 1.0)
    out = tl.sum(w[:, None] * o, 0) / safe_total
    tl.store(Out + b * s_ob + h * s_oh + r * s_om + offs_d * s_od,
             out.to(Out.dtype.element_ty), mask=d_ok)
    tl.store(LSE + bh * N_Q + r, tl.where(total > 0, m + tl.log(safe_total), float("-inf")))


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be (batch, heads, N, d), got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[:2] != k.shape[:2] or k.shape != v.shape:
        raise ValueError(f"expected q (B, H, Nq, d) and k, v (B, H, Nk, d) with the same B, H "
                         f"and k.shape == v.shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dimension, got {q.shape[-1]} and "
                         f"{k.shape[-1]}")
    if q.shape[2] < 1 or k.shape[2] < 1:
        raise ValueError(f"need at least one query and one key, got Nq={q.shape[2]}, "
                         f"Nk={k.shape[2]}")
    if _boot.INTERPRETING and q.dtype == torch.bfloat16:
        raise ValueError("bfloat16 tl.dot is wrong under the Triton interpreter (see "
                         "ENVIRONMENT.md); use float16 or float32 on CPU")


def _blocks(head_dim: int) -> tuple[int, int]:
    if _boot.INTERPRETING:
        return 16, 32  # few, large NumPy steps; BLOCK_M >= 16 is what tl.dot needs
    return 16, (64 if block_d(head_dim) <= 128 else 32)


def splitkv_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int,
                     causal: bool = False, scale: float | None = None,
                     block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 1 only: per-split normalised outputs (B, H, S, Nq, d) and lses (B, H, S, Nq),
    float32 (for checking a chunk against :func:`flashtext.splitkv.partial_attention`)."""
    _validate(q, k, v)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer, got {num_splits!r}")
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    block_m, default_n = _blocks(d)
    block_n = default_n if block_n is None else block_n
    # chunks are whole key blocks so every program but the last loads full tiles
    chunk = block_n * math.ceil(math.ceil(n_k / num_splits) / block_n)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o_part = torch.empty((batch * heads, num_splits, n_q, d), device=q.device,
                         dtype=torch.float32)
    l_part = torch.empty((batch * heads, num_splits, n_q), device=q.device, dtype=torch.float32)
    grid = (num_splits, triton.cdiv(n_q, block_m), batch * heads)
    _splitkv_partial[grid](
        q, k, v, o_part, l_part, *q.stride(), *k.stride(), *v.stride(),
        heads, n_q, n_k, chunk, scale * LOG2E,
        CAUSAL=bool(causal), HEAD_DIM=d, BLOCK_D=block_d(d), BLOCK_M=block_m, BLOCK_N=block_n,
        INPUT_PRECISION=input_precision(q.dtype), num_warps=4, num_stages=2)
    shape = (batch, heads, num_splits, n_q)
    return o_part.view(*shape, d), l_part.view(shape)


def splitkv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: float | None = None, num_splits: int | None = None,
                      return_lse: bool = False, sms: int | None = None):
    """Attention by Flash-Decoding: split the keys, attend per chunk, combine by lse.

    q is (B, H, Nq, d) (decode: Nq = 1), k and v are (B, H, Nk, d); fp16/fp32 everywhere,
    bf16 on a GPU only. Causal masks are bottom-right aligned (the decode convention: the new
    token sees the whole cache). ``num_splits=None`` picks the count with
    :func:`flashtext.splitkv.choose_num_splits` for this GPU's SM count (132 on CPU, the
    H100/H200 value). Returns out (B, H, Nq, d) in q's dtype, and lse (B, H, Nq) float32 (natural
    log) if asked.
    """
    _validate(q, k, v)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    block_m, block_n = _blocks(d)
    if num_splits is None:
        if sms is None:
            sms = (torch.cuda.get_device_properties(q.device).multi_processor_count
                   if q.is_cuda else 132)
        num_splits = choose_num_splits(batch, heads, n_q, n_k, sms=sms, block_m=block_m,
                                       block_n=block_n)
    o_part, l_part = splitkv_partials(q, k, v, num_splits, causal, scale, block_n)
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    _splitkv_combine[(n_q, batch * heads)](
        o_part, l_part, out, lse, *out.stride(), heads, n_q, num_splits,
        HEAD_DIM=d, BLOCK_D=block_d(d), BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        num_warps=4)
    return (out, lse) if return_lse else out

