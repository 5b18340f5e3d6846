"""The FlashAttention-2 backward pass in Triton (chapter 11): three kernels.

With P = softmax(S), S = sm_scale * Q K^T, and dO the gradient flowing into O = P V:

    dV = P^T dO      dP = dO V^T      dS = P * (dP - delta)      delta = rowsum(dO * O)
    dQ = sm_scale * dS K            dK = sm_scale * dS^T Q

P is never stored: each kernel recomputes a tile of it from Q, K and the saved log-sum-exp,
``P = exp(S - lse)`` (one exponential, no running max needed: lse is already the row's exact
normaliser).

1. ``_attn_bwd_preprocess``: delta = rowsum(dO * O), one number per query row (FA2 Alg. 2's D;
   a length-d reduction standing in for the length-N rowsum(P * dP)).
2. ``_attn_bwd_dkdv``: one program per K/V block (BLOCK_N keys) of one (batch, head); dK and dV
   stay on chip while the program loops over the Q blocks that see those keys.
3. ``_attn_bwd_dq``: one program per Q block; dQ stays on chip while it loops over K/V blocks.

Why dQ gets its own kernel rather than atomics: every K/V program contributes to every dQ row
it sees. FA2's CUDA code adds those contributions with fp32 atomics into a scratch buffer; that
saves recomputing S and dP (5 matmuls per tile pair instead of 7), but the order of the additions
changes from run to run (results are not bitwise reproducible), it needs an fp32 buffer and a
conversion pass, and atomics contend when many programs hit the same rows. A second kernel
reverses the roles: each program owns its dQ rows outright, writes them once, and the whole
backward is deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtext.kernels.config import KernelConfig, block_d, launch_config
from flashtext.kernels.descriptors import tile_sources
from flashtext.kernels.forward import _LOG2E, input_precision
from flashtext.kernels.gluon_backward import launch_dkdv
from flashtext.kernels.launcher import launch
from flashtext.kernels.masks import UNBOUNDED, key_tiles, query_tiles, visible, window_bounds


@triton.jit(do_not_specialize=["N_Q"])
def _attn_bwd_preprocess(O, DO, DELTA, CU_Q,
                         stride_oz, stride_oh, stride_om, stride_od,
                         stride_doz, stride_doh, stride_dom, stride_dod,
                         stride_lz, stride_lh, H, N_Q,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, VARLEN: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    row0 = 0
    if VARLEN:
        row0 = tl.load(CU_Q + off_z)
        N_Q = tl.load(CU_Q + off_z + 1) - row0
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    O += off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh \
        + row0.to(tl.int64) * stride_om
    DO += off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh \
        + row0.to(tl.int64) * stride_dom
    o = tl.load(O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=mask,
                other=0.0).to(tl.float32)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=mask,
                 other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    DELTA += off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + row0
    tl.store(DELTA + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                start_n, lo, hi, qk_scale, N_Q, N_K, LEFT, RIGHT, off_z, off_h, row0_q,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                USE_TMA: tl.constexpr, VARLEN: tl.constexpr):
    """Accumulate the contributions of the Q blocks ``lo, lo + BLOCK_M, ... < hi`` of one query
    head to this K/V block's dK and dV. Works on transposed tiles (keys along rows): S^T = K Q^T,
    P^T, dS^T."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N_Q
        # rows past N_Q read q = dO = 0 and lse = +inf, so their P is exactly 0
        if USE_TMA:  # the copy engine zero-fills columns past HEAD_DIM and rows past the tensor
            if VARLEN:  # rows past this sequence are the next one's: their P is 0 (lse =
                # +inf), and zeroing them keeps an inf or NaN there from reaching dK, dV
                q_t = tl.trans(Q.load([row0_q + start_m, off_h, 0]).reshape(BLOCK_M, BLOCK_D))
                do = DO.load([row0_q + start_m, off_h, 0]).reshape(BLOCK_M, BLOCK_D)
                q_t = tl.where(m_ok[None, :], q_t, 0.0)
                do = tl.where(m_ok[:, None], do, 0.0)
            else:
                q_t = tl.trans(Q.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M, BLOCK_D))
                do = DO.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        else:
            q_t = tl.load(Q + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                          mask=m_ok[None, :] & d_ok[:, None], other=0.0)  # Q^T: D x BLOCK_M
            do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                         mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(LSE + offs_m, mask=m_ok, other=float("inf"))
        delta = tl.load(DELTA + offs_m, mask=m_ok, other=0.0)
        # a row that saw no key has lse = -inf; give it +inf so its P is 0, not exp(+inf)
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * _LOG2E
        # P^T = exp2(S^T * log2 e - lse * log2 e), recomputed from the saved statistic
        qk_t = tl.dot(k, q_t, input_precision=INPUT_PRECISION) * qk_scale
        if MASKED:  # hidden scores -> -inf before the exponential (no overflow, P = 0)
            vis_t = tl.trans(visible(offs_m, offs_n, N_Q, N_K, LEFT, RIGHT))
            qk_t = tl.where(vis_t, qk_t, float("-inf"))
        p_t = tl.math.exp2(qk_t - lse2[None, :])
        # dV += P^T dO
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        # dP^T = V dO^T ; dS^T = P^T * (dP^T - delta)
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        # dK += dS^T Q (sm_scale applied once at the end)
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["N_Q", "N_K", "LEFT", "RIGHT"])
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, CU_Q, CU_K,
                   stride_qz, stride_qh, stride_qm, stride_qd,
                   stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd,
                   stride_doz, stride_doh, stride_dom, stride_dod,
                   stride_dkz, stride_dkh, stride_dkn, stride_dkd,
                   stride_dvz, stride_dvh, stride_dvn, stride_dvd,
                   stride_lz, stride_lh,
                   H_KV, GROUP, N_Q, N_K, LEFT, RIGHT,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                   USE_TMA: tl.constexpr, VARLEN: tl.constexpr):
    # grid = (key blocks, batch * K/V heads): program (j, zh) owns keys [start_n, +BLOCK_N) of
    # one K/V head and sums dK, dV over the GROUP query heads that read it (no atomics)
    start_n = tl.program_id(0) * BLOCK_N
    off_zh = tl.program_id(1)
    off_z = off_zh // H_KV
    off_kh = off_zh % H_KV
    row0_q = 0
    row0_k = 0
    if VARLEN:
        row0_q = tl.load(CU_Q + off_z)
        row0_k = tl.load(CU_K + off_z)
        N_Q = tl.load(CU_Q + off_z + 1) - row0_q
        N_K = tl.load(CU_K + off_z + 1) - row0_k
    if start_n < N_K:
        kv_base = off_z.to(tl.int64) * stride_kz + off_kh.to(tl.int64) * stride_kh
        K += kv_base + row0_k.to(tl.int64) * stride_kn
        V += off_z.to(tl.int64) * stride_vz + off_kh.to(tl.int64) * stride_vh \
            + row0_k.to(tl.int64) * stride_vn
        DK += off_z.to(tl.int64) * stride_dkz + off_kh.to(tl.int64) * stride_dkh \
            + row0_k.to(tl.int64) * stride_dkn
        DV += off_z.to(tl.int64) * stride_dvz + off_kh.to(tl.int64) * stride_dvh \
            + row0_k.to(tl.int64) * stride_dvn

        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        kv_mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
        # keys past N_K read as 0; their dK/dV rows are computed but never stored
        k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=kv_mask, other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=kv_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E

        # Which Q blocks see these keys (flashtext.kernels.masks)?  [lo, full_lo) and
        # [full_hi, hi): rows that see only some of the keys -> masked.  [full_lo, full_hi):
        # rows that see all of them -> no mask.  Other rows see none of them -> skipped.
        lo, full_lo, full_hi, hi = query_tiles(start_n, N_Q, N_K, LEFT, RIGHT, BLOCK_M,
                                               BLOCK_N)
        for g in range(0, GROUP):
            off_h = off_kh * GROUP + g
            q_h = Q
            do_h = DO
            if not USE_TMA:  # descriptors address Q and dO by (batch, head, row) instead
                q_h = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh \
                    + row0_q.to(tl.int64) * stride_qm
                do_h = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh \
                    + row0_q.to(tl.int64) * stride_dom
            row_stats = off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + row0_q
            lse_h = LSE + row_stats
            delta_h = DELTA + row_stats
            dk, dv = _dkdv_inner(dk, dv, k, v, q_h, do_h, lse_h, delta_h, stride_qm, stride_qd,
                                 stride_dom, stride_dod, start_n, lo, full_lo, qk_scale, N_Q,
                                 N_K, LEFT, RIGHT, off_z, off_h, row0_q, HEAD_DIM, BLOCK_D,
                                 BLOCK_M, BLOCK_N, True, INPUT_PRECISION, USE_TMA, VARLEN)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_h, do_h, lse_h, delta_h, stride_qm, stride_qd,
                                 stride_dom, stride_dod, start_n, full_lo, full_hi, qk_scale,
                                 N_Q, N_K, LEFT, RIGHT, off_z, off_h, row0_q, HEAD_DIM,
                                 BLOCK_D, BLOCK_M, BLOCK_N, False, INPUT_PRECISION, USE_TMA,
                                 VARLEN)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_h, do_h, lse_h, delta_h, stride_qm, stride_qd,
                                 stride_dom, stride_dod, start_n, full_hi, hi, qk_scale, N_Q,
                                 N_K, LEFT, RIGHT, off_z, off_h, row0_q, HEAD_DIM, BLOCK_D,
                                 BLOCK_M, BLOCK_N, True, INPUT_PRECISION, USE_TMA, VARLEN)

        dk = dk * sm_scale
        tl.store(DK + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
                 dk.to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
                 dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
              start_m, lo, hi, qk_scale, N_Q, N_K, LEFT, RIGHT, off_z, off_kh, row0_k,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
              USE_TMA: tl.constexpr, VARLEN: tl.constexpr):
    """Accumulate dS K over the K/V blocks ``lo, lo + BLOCK_N, ... < hi`` (same split as the
    forward: MASKED=False tiles are fully visible and fully inside K)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N_K
        if USE_TMA:  # zero-filled past HEAD_DIM and the tensor; past this sequence: masked
            if VARLEN:
                k = K.load([row0_k + start_n, off_kh, 0]).reshape(BLOCK_N, BLOCK_D)
                v = V.load([row0_k + start_n, off_kh, 0]).reshape(BLOCK_N, BLOCK_D)
                if MASKED:  # the next sequence's rows: 0, so that 0 * (inf or NaN) cannot occur
                    k = tl.where(n_ok[:, None], k, 0.0)
                    v = tl.where(n_ok[:, None], v, 0.0)
            else:
                k = K.load([off_z, off_kh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
                v = V.load([off_z, off_kh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            k_ptrs = K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
            v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
            if MASKED:
                k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            else:
                k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        if MASKED:
            qk = tl.where(visible(offs_m, offs_n, N_Q, N_K, LEFT, RIGHT), qk, float("-inf"))
        p = tl.math.exp2(qk - lse2[:, None])  # P recomputed from the saved lse
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit(do_not_specialize=["N_Q", "N_K", "LEFT", "RIGHT"])
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, CU_Q, CU_K,
                 stride_qz, stride_qh, stride_qm, stride_qd,
                 stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd,
                 stride_doz, stride_doh, stride_dom, stride_dod,
                 stride_dqz, stride_dqh, stride_dqm, stride_dqd,
                 stride_lz, stride_lh,
                 H, GROUP, N_Q, N_K, LEFT, RIGHT,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 USE_TMA: tl.constexpr, VARLEN: tl.constexpr):
    # grid = (query blocks, batch * heads), like the forward
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    off_kh = off_h // GROUP
    row0_q = 0
    row0_k = 0
    if VARLEN:
        row0_q = tl.load(CU_Q + off_z)
        row0_k = tl.load(CU_K + off_z)
        N_Q = tl.load(CU_Q + off_z + 1) - row0_q
        N_K = tl.load(CU_K + off_z + 1) - row0_k
    if start_m < N_Q:
        Q += off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh \
            + row0_q.to(tl.int64) * stride_qm
        if not USE_TMA:  # with descriptors, K and V tiles are addressed by (batch, head, row)
            K += off_z.to(tl.int64) * stride_kz + off_kh.to(tl.int64) * stride_kh \
                + row0_k.to(tl.int64) * stride_kn
            V += off_z.to(tl.int64) * stride_vz + off_kh.to(tl.int64) * stride_vh \
                + row0_k.to(tl.int64) * stride_vn
        DO += off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh \
            + row0_q.to(tl.int64) * stride_dom
        DQ += off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh \
            + row0_q.to(tl.int64) * stride_dqm
        row_stats = off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + row0_q
        LSE += row_stats
        DELTA += row_stats

        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_ok = offs_m < N_Q
        qd_mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=qd_mask, other=0.0)
        do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=qd_mask, other=0.0)
        lse = tl.load(LSE + offs_m, mask=m_ok, other=float("inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * _LOG2E
        delta = tl.load(DELTA + offs_m, mask=m_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E

        lo, full_lo, full_hi, hi = key_tiles(start_m, N_Q, N_K, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn,
                       stride_vd, start_m, lo, full_lo, qk_scale, N_Q, N_K, LEFT, RIGHT, off_z,
                       off_kh, row0_k, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, True,
                       INPUT_PRECISION, USE_TMA, VARLEN)
        dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn,
                       stride_vd, start_m, full_lo, full_hi, qk_scale, N_Q, N_K, LEFT, RIGHT,
                       off_z, off_kh, row0_k, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, False,
                       INPUT_PRECISION, USE_TMA, VARLEN)
        dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn,
                       stride_vd, start_m, full_hi, hi, qk_scale, N_Q, N_K, LEFT, RIGHT, off_z,
                       off_kh, row0_k, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, True,
                       INPUT_PRECISION, USE_TMA, VARLEN)
        dq = dq * sm_scale
        tl.store(DQ + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
                 dq.to(DQ.dtype.element_ty), mask=qd_mask)


def preprocess(o: torch.Tensor, do: torch.Tensor, config: KernelConfig | None = None,
               cu_seqlens_q: torch.Tensor | None = None, max_seqlen_q: int | None = None,
               ) -> torch.Tensor:
    """delta = rowsum(dO * O) in float32, shape (Z, H, N_Q) (packed: (H, total_q), like the
    forward's lse): the first backward kernel."""
    d = o.shape[-1]
    if cu_seqlens_q is None:
        z, h, n_q, _ = o.shape
        delta = torch.empty((z, h, n_q), dtype=torch.float32, device=o.device)
        strides = (*o.stride(), *do.stride(), h * n_q, n_q)
    else:
        total, h, _ = o.shape
        z, n_q = cu_seqlens_q.numel() - 1, max_seqlen_q
        delta = torch.zeros((h, total), dtype=torch.float32, device=o.device)
        strides = tuple(x for t in (o, do) for x in (0, t.stride(1), t.stride(0), t.stride(2)))
        strides += (0, total)
    if delta.numel() == 0 or n_q == 0:
        return delta
    config = config or launch_config("bwd_pre", d, o.element_size(), False, n_q, n_q)
    cu = cu_seqlens_q if cu_seqlens_q is not None else delta  # unused when VARLEN is off
    launch(_attn_bwd_preprocess, lambda c: (triton.cdiv(n_q, c.BLOCK_M), z * h), config,
           o, do, delta, cu, *strides, h, n_q, HEAD_DIM=d, BLOCK_D=block_d(d),
           VARLEN=cu_seqlens_q is not None)
    return delta


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float,
             configs: dict[str, KernelConfig] | None = None, window: tuple[int, int] = (-1, -1),
             dkdv_kernel: str = "triton", fuse_dq: bool = False, defer_dq: bool = False,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of ``sum(O * do)``, given the forward's O and lse.

    q, o, do (Z, H, N_Q, d), k and v (Z, H_kv, N_K, d); any strides for every tensor except
    ``lse`` (contiguous (Z, H, N_Q) float32, as the forward writes it). dk and dv sum over the
    query heads that share a K/V head. ``configs`` may override
    :func:`~flashtext.kernels.config.launch_config` per kernel ("bwd_pre", "bwd_dkdv",
    "bwd_dq"); tests use it to try several tile shapes. ``dkdv_kernel="gluon"`` computes dK and
    dV with the FA3-style Gluon kernel (:mod:`flashtext.kernels.gluon_backward`; inputs it
    supports only, see :mod:`flashtext.kernels.dispatch`) instead of ``_attn_bwd_dkdv``;
    with ``fuse_dq=True`` that kernel computes dQ as well, adding it into an fp32 buffer through
    the copy engine (run to run, the order of those additions varies, and so may dQ's last
    bits), and ``_attn_bwd_dq`` does not run; ``defer_dq=True`` computes each tile's share a
    tile late (:func:`~flashtext.kernels.gluon_backward.kernel_constants`).
    """
    if dkdv_kernel not in ("triton", "gluon"):
        raise ValueError(f"dkdv_kernel must be 'triton' or 'gluon', got {dkdv_kernel!r}")
    if defer_dq and not fuse_dq:
        raise ValueError("defer_dq=True needs fuse_dq=True (it reorders the fused dQ's steps)")
    if fuse_dq and dkdv_kernel != "gluon":
        raise ValueError("fuse_dq=True needs dkdv_kernel='gluon' (the Triton dK/dV kernel has "
                         "no fused dQ)")
    z, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    dq = torch.empty((z, h, n_q, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((z, h_kv, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((z, h_kv, n_k, d), dtype=v.dtype, device=v.device)
    if dq.is_meta:
        return dq, dk, dv
    if q.numel() == 0 or k.numel() == 0:  # nothing to attend to, or nobody attending
        return dq.zero_(), dk.zero_(), dv.zero_()
    if lse.shape != (z, h, n_q) or not lse.is_contiguous() or lse.dtype != torch.float32:
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {(z, h, n_q)}, "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    delta = preprocess(o, do, (configs or {}).get("bwd_pre"))
    if fuse_dq:
        dq_accum = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device)
        launch_dkdv(q, k, v, do, lse, delta, causal, sm_scale, window, out=(dk, dv),
                    dq_accum=dq_accum, defer_dq=defer_dq)
        return dq.copy_(dq_accum), dk, dv
    if dkdv_kernel == "gluon":
        dk, dv, _ = launch_dkdv(q, k, v, do, lse, delta, causal, sm_scale, window, out=(dk, dv))
    dense = (q, k, v, do, dq, dk, dv)
    _launch_backward(dense, lse, delta, causal, window, sm_scale, configs, n_q, n_k,
                     strides=[x for t in dense for x in t.stride()], batch=z,
                     lse_strides=(h * n_q, n_q), cu=None, dkdv=dkdv_kernel == "triton")
    return dq, dk, dv


def backward_varlen(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                    causal: bool, sm_scale: float, window: tuple[int, int] = (-1, -1),
                    configs: dict[str, KernelConfig] | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward over packed sequences (see :func:`flashtext.kernels.forward.forward_varlen`):
    q, o, do (total_q, H, d), k, v (total_k, H_kv, d), lse (H, total_q)."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    batch = cu_seqlens_q.numel() - 1
    if dq.is_meta or q.numel() == 0 or k.numel() == 0 or batch == 0:
        return dq, dk, dv
    delta = preprocess(o, do, (configs or {}).get("bwd_pre"), cu_seqlens_q, max_seqlen_q)
    packed = (q, k, v, do, dq, dk, dv)
    strides = [x for t in packed for x in (0, t.stride(1), t.stride(0), t.stride(2))]
    _launch_backward(packed, lse, delta, causal, window, sm_scale, configs, max_seqlen_q,
                     max_seqlen_k, strides=strides, batch=batch, lse_strides=(0, q.shape[0]),
                     cu=(cu_seqlens_q, cu_seqlens_k))
    return dq, dk, dv


def _launch_backward(tensors, lse, delta, causal, window, sm_scale, configs, n_q, n_k,
                     strides, batch, lse_strides, cu, dkdv: bool = True) -> None:
    """The dK/dV and dQ launches, dense or packed (``cu`` = (cu_seqlens_q, cu_seqlens_k));
    ``dkdv=False``: the dQ launch alone (dK and dV came from another kernel)."""
    q, k, v, do, dq, dk, dv = tensors
    d = q.shape[-1]
    h, h_kv = q.shape[1], k.shape[1]  # heads: dim 1 of (Z, H, N, d) and of packed (total, H, d)
    left, right = window_bounds(causal, window)
    configs = configs or {}

    def cfg(name: str) -> KernelConfig:
        return configs.get(name) or launch_config(name, d, q.element_size(),
                                                  right < UNBOUNDED, n_q, n_k)

    q_s, k_s, v_s, do_s, dq_s, dk_s, dv_s = (strides[i:i + 4] for i in range(0, 28, 4))
    consts = dict(HEAD_DIM=d, BLOCK_D=block_d(d), INPUT_PRECISION=input_precision(q.dtype),
                  VARLEN=cu is not None)
    cu_q, cu_k = cu if cu is not None else (lse, lse)  # unused when VARLEN is off
    # the dK/dV kernel streams Q and dO tiles past its keys, the dQ kernel K and V tiles past
    # its queries: those are the loads a tensor descriptor can take over
    if dkdv:
        c_kv = cfg("bwd_dkdv")
        tma_kv, (q_arg, do_arg) = tile_sources(c_kv, "BLOCK_M", q, do)
        launch(_attn_bwd_dkdv, lambda c: (triton.cdiv(n_k, c.BLOCK_N), batch * h_kv), c_kv,
               q_arg, k, v, do_arg, lse, delta, dk, dv, sm_scale, cu_q, cu_k,
               *q_s, *k_s, *v_s, *do_s, *dk_s, *dv_s, *lse_strides, h_kv, h // h_kv, n_q, n_k,
               left, right, USE_TMA=tma_kv, **consts)
    c_q = cfg("bwd_dq")
    tma_q, (k_arg, v_arg) = tile_sources(c_q, "BLOCK_N", k, v)
    launch(_attn_bwd_dq, lambda c: (triton.cdiv(n_q, c.BLOCK_M), batch * h), c_q,
           q, k_arg, v_arg, do, lse, delta, dq, sm_scale, cu_q, cu_k,
           *q_s, *k_s, *v_s, *do_s, *dq_s, *lse_strides, h, h // h_kv, n_q, n_k, left, right,
           USE_TMA=tma_q, **consts)


__all__ = ["backward", "backward_varlen", "preprocess"]
