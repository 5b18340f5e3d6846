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
from flashtext.kernels.launcher import launch


@triton.jit(do_not_specialize=["N_Q"])
def _attn_bwd_preprocess(O, DO, DELTA,
                         stride_oz, stride_oh, stride_om, stride_od,
                         stride_doz, stride_doh, stride_dom, stride_dod,
                         H, N_Q,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    O += off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    DO += off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
    o = tl.load(O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=mask,
                other=0.0).to(tl.float32)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=mask,
                 other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    tl.store(DELTA + off_zh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                start_n, lo, hi, qk_scale, N_Q, CAUSAL_OFFSET, off_z, off_h,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                USE_TMA: tl.constexpr):
    """Accumulate the contributions of the Q blocks ``lo, lo + BLOCK_M, ... < hi`` to this K/V
    block's dK and dV. Works on transposed tiles (keys along rows): S^T = K Q^T, P^T, dS^T."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N_Q
        # rows past N_Q read q = dO = 0 and lse = +inf, so their P is exactly 0
        if USE_TMA:  # the copy engine zero-fills rows past N_Q and columns past HEAD_DIM
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
            visible = offs_n[:, None] <= offs_m[None, :] + CAUSAL_OFFSET
            qk_t = tl.where(visible, qk_t, float("-inf"))
        p_t = tl.math.exp2(qk_t - lse2[None, :])
        # dV += P^T dO
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        # dP^T = V dO^T ; dS^T = P^T * (dP^T - delta)
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        # dK += dS^T Q (sm_scale applied once at the end)
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["N_Q", "N_K"])
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
                   stride_qz, stride_qh, stride_qm, stride_qd,
                   stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd,
                   stride_doz, stride_doh, stride_dom, stride_dod,
                   stride_dkz, stride_dkh, stride_dkn, stride_dkd,
                   stride_dvz, stride_dvh, stride_dvn, stride_dvd,
                   H, N_Q, N_K,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                   USE_TMA: tl.constexpr):
    # grid = (key blocks, batch * heads): program (j, zh) owns keys [start_n, start_n + BLOCK_N)
    start_n = tl.program_id(0) * BLOCK_N
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    if not USE_TMA:  # with descriptors, Q and dO tiles are addressed by (batch, head, row)
        Q += off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        DO += off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
    K += off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    V += off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    DK += off_z.to(tl.int64) * stride_dkz + off_h.to(tl.int64) * stride_dkh
    DV += off_z.to(tl.int64) * stride_dvz + off_h.to(tl.int64) * stride_dvh
    LSE += off_zh.to(tl.int64) * N_Q
    DELTA += off_zh.to(tl.int64) * N_Q

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    # keys past N_K read as 0; their dK/dV rows are computed but never stored
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask,
                other=0.0)
    v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask,
                other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * _LOG2E

    # Which Q blocks see these keys?  Row i sees key j iff j <= i + CAUSAL_OFFSET.
    # [lo, mid): rows that see only some of the keys -> masked.  [mid, N_Q): rows that see all
    # of them -> no mask.  Rows before lo see none of them -> skipped.
    CAUSAL_OFFSET = N_K - N_Q
    if CAUSAL:
        lo = tl.maximum(start_n - CAUSAL_OFFSET, 0) // BLOCK_M * BLOCK_M
        # first row that sees the tile's last real key
        mid = tl.maximum(tl.minimum(start_n + BLOCK_N, N_K) - 1 - CAUSAL_OFFSET, 0)
        mid = tl.maximum((mid + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo)  # round up to a block
        dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd,
                             stride_dom, stride_dod, start_n, lo, tl.minimum(mid, N_Q),
                             qk_scale, N_Q, CAUSAL_OFFSET, off_z, off_h, HEAD_DIM, BLOCK_D,
                             BLOCK_M, BLOCK_N, True, INPUT_PRECISION, USE_TMA)
    else:
        mid = 0
    dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd,
                         stride_dom, stride_dod, start_n, mid, N_Q, qk_scale, N_Q,
                         CAUSAL_OFFSET, off_z, off_h, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, False,
                         INPUT_PRECISION, USE_TMA)

    dk = dk * sm_scale
    tl.store(DK + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
              start_m, lo, hi, qk_scale, N_K, CAUSAL_OFFSET, off_z, off_h,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr):
    """Accumulate dS K over the K/V blocks ``lo, lo + BLOCK_N, ... < hi`` (same split as the
    forward: MASKED=False tiles are fully visible and fully inside K)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N_K
        if USE_TMA:  # zero-filled past N_K and HEAD_DIM by the copy engine
            k = K.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
            v = V.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
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
            visible = n_ok[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + CAUSAL_OFFSET)
            qk = tl.where(visible, qk, float("-inf"))
        p = tl.math.exp2(qk - lse2[:, None])  # P recomputed from the saved lse
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit(do_not_specialize=["N_Q", "N_K"])
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
                 stride_qz, stride_qh, stride_qm, stride_qd,
                 stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd,
                 stride_doz, stride_doh, stride_dom, stride_dod,
                 stride_dqz, stride_dqh, stride_dqm, stride_dqd,
                 H, N_Q, N_K,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 USE_TMA: tl.constexpr):
    # grid = (query blocks, batch * heads), like the forward
    start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    Q += off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    if not USE_TMA:  # with descriptors, K and V tiles are addressed by (batch, head, row)
        K += off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
        V += off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    DO += off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
    DQ += off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh
    LSE += off_zh.to(tl.int64) * N_Q
    DELTA += off_zh.to(tl.int64) * N_Q

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < N_Q
    qd_mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=qd_mask,
                other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=qd_mask, other=0.0)
    lse = tl.load(LSE + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * _LOG2E
    delta = tl.load(DELTA + offs_m, mask=m_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * _LOG2E

    CAUSAL_OFFSET = N_K - N_Q
    if CAUSAL:
        hi = tl.maximum(tl.minimum(N_K, start_m + BLOCK_M + CAUSAL_OFFSET), 0)
        first_row_sees = tl.maximum(tl.minimum(N_K, start_m + CAUSAL_OFFSET + 1), 0)
        mid = first_row_sees // BLOCK_N * BLOCK_N
    else:
        hi = N_K
        mid = N_K // BLOCK_N * BLOCK_N
    dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                   start_m, 0, mid, qk_scale, N_K, CAUSAL_OFFSET, off_z, off_h, HEAD_DIM,
                   BLOCK_D, BLOCK_M, BLOCK_N, False, CAUSAL, INPUT_PRECISION, USE_TMA)
    dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                   start_m, mid, hi, qk_scale, N_K, CAUSAL_OFFSET, off_z, off_h, HEAD_DIM,
                   BLOCK_D, BLOCK_M, BLOCK_N, True, CAUSAL, INPUT_PRECISION, USE_TMA)
    dq = dq * sm_scale
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=qd_mask)


def preprocess(o: torch.Tensor, do: torch.Tensor, config: KernelConfig | None = None,
               ) -> torch.Tensor:
    """delta = rowsum(dO * O) in float32, shape (Z, H, N_Q): the first backward kernel."""
    z, h, n_q, d = o.shape
    delta = torch.empty((z, h, n_q), dtype=torch.float32, device=o.device)
    if delta.numel() == 0:
        return delta
    config = config or launch_config("bwd_pre", d, o.element_size(), False, n_q, n_q)
    launch(_attn_bwd_preprocess, lambda c: (triton.cdiv(n_q, c.BLOCK_M), z * h), config,
           o, do, delta, *o.stride(), *do.stride(), h, n_q, HEAD_DIM=d, BLOCK_D=block_d(d))
    return delta


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float,
             configs: dict[str, KernelConfig] | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of ``sum(O * do)``, given the forward's O and lse.

    Any strides for every tensor except ``lse`` (contiguous (Z, H, N_Q) float32, as the forward
    writes it). ``configs`` may override :func:`~flashtext.kernels.config.launch_config` per
    kernel ("bwd_pre", "bwd_dkdv", "bwd_dq"); tests use it to try several tile shapes.
    """
    z, h, n_q, d = q.shape
    n_k = k.shape[2]
    configs = configs or {}
    dq = torch.empty((z, h, n_q, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((z, h, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((z, h, n_k, d), dtype=v.dtype, device=v.device)
    if q.numel() == 0 or k.numel() == 0:  # nothing to attend to, or nobody attending
        return dq.zero_(), dk.zero_(), dv.zero_()
    if lse.shape != (z, h, n_q) or not lse.is_contiguous() or lse.dtype != torch.float32:
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {(z, h, n_q)}, "
                         f"got {tuple(lse.shape)} {lse.dtype}")

    def cfg(name: str) -> KernelConfig:
        return configs.get(name) or launch_config(name, d, q.element_size(), causal, n_q, n_k)

    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    consts = dict(HEAD_DIM=d, BLOCK_D=block_d(d), INPUT_PRECISION=input_precision(q.dtype))

    delta = preprocess(o, do, cfg("bwd_pre"))
    # the dK/dV kernel streams Q and dO tiles past its keys, the dQ kernel K and V tiles past
    # its queries: those are the loads a tensor descriptor can take over
    c_kv = cfg("bwd_dkdv")
    tma_kv, (q_arg, do_arg) = tile_sources(c_kv, "BLOCK_M", q, do)
    launch(_attn_bwd_dkdv, lambda c: (triton.cdiv(n_k, c.BLOCK_N), z * h), c_kv,
           q_arg, k, v, do_arg, lse, delta, dk, dv, sm_scale, *strides, *dk.stride(),
           *dv.stride(), h, n_q, n_k, CAUSAL=causal, USE_TMA=tma_kv, **consts)
    c_q = cfg("bwd_dq")
    tma_q, (k_arg, v_arg) = tile_sources(c_q, "BLOCK_N", k, v)
    launch(_attn_bwd_dq, lambda c: (triton.cdiv(n_q, c.BLOCK_M), z * h), c_q,
           q, k_arg, v_arg, do, lse, delta, dq, sm_scale, *strides, *dq.stride(), h, n_q, n_k,
           CAUSAL=causal, USE_TMA=tma_q, **consts)
    return dq, dk, dv


__all__ = ["backward", "preprocess"]
