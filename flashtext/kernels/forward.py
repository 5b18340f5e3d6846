"""The FlashAttention-2 forward kernel in Triton (chapter 10).

One program computes one block of BLOCK_M query rows of one (batch, head): it loads its Q tile
once, streams over the K/V tiles with the online softmax (running max ``m_i``, running sum
``l_i``, unnormalised output ``acc``), divides by ``l_i`` once at the end (delayed
normalisation) and writes the output block and the log-sum-exp ``lse`` of each row, the one
statistic the backward pass needs.

Names follow Algorithm 1 and the NumPy FA2 code of chapter 7 (``flashtext.fa2``): ``BLOCK_M``
(B_r) and ``BLOCK_N`` (B_c) are the tile heights, ``start_m``/``start_n`` the first row of the
current Q/K tile, ``m_i``/``l_i``/``acc`` the running statistics, ``sm_scale`` the softmax scale.

Exponentials are base 2 (``exp2`` is the GPU's native instruction; ``exp(x) = exp2(x log2 e)``):
the scores are multiplied by ``qk_scale = sm_scale * log2(e)``, so ``m_i`` and the exponents
live in log2 units and ``lse`` is converted back to natural log when it is stored. On unmasked
tiles the multiply comes late: the row max is taken of the raw scores and scaled once per row,
and each score's exponent ``qk * qk_scale - m`` is a single fused multiply-add. That needs a
scale >= 0, so for a negative ``sm_scale`` the kernel negates its Q tile and uses ``|sm_scale|``.

Masks are aligned to the bottom-right corner (query ``i`` of ``N_Q`` sees keys
``j <= i + N_K - N_Q`` when causal; a sliding window ``(left, right)`` bounds both sides;
``flashtext.reference.window_mask``). For each Q block the key range splits into tiles every
row of the tile sees in full (no mask computed), tiles that cross an edge of the window or the
end of K (masked), and tiles no row sees (skipped: never loaded); :mod:`flashtext.kernels.masks`
computes the split for every kernel. Grouped-query attention reads K/V head ``h // GROUP`` for
query head ``h``; packed sequences (``VARLEN``) find their rows through ``cu_seqlens``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtext.fa2 import LN2, LOG2E
from flashtext.kernels.config import KernelConfig, block_d, launch_config
from flashtext.kernels.descriptors import tile_sources
from flashtext.kernels.launcher import launch
from flashtext.kernels.masks import UNBOUNDED, key_tiles, visible, window_bounds

# constants a @triton.jit function may read from the module (the same ones chapter 7 uses)
_LOG2E = tl.constexpr(LOG2E)  # exp(x) = exp2(x * log2 e)
_LN2 = tl.constexpr(LN2)  # log(x) = log2(x) * ln 2


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
               start_m, lo, hi, qk_scale, N_Q, N_K, LEFT, RIGHT, off_z, off_kh, row0_k,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               USE_TMA: tl.constexpr, VARLEN: tl.constexpr):
    """Fold the K/V tiles starting at ``lo, lo + BLOCK_N, ... < hi`` into (acc, l_i, m_i).

    MASKED=False: every score in these tiles is visible to every row (no mask, no bounds check
    on K/V). MASKED=True: tiles that cross the window's edges (the causal diagonal) or the end
    of K; hidden scores become -inf, and a row that has seen no key yet is kept finite (see
    ``m_safe``).
    """
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM  # padding columns of a head_dim that is not a power of two
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N_K
        if USE_TMA:
            # the copy engine fetches each tile; columns past HEAD_DIM (and rows past the
            # tensor) come back as zeros; rows past this sequence are masked below
            if VARLEN:
                k = K.load([row0_k + start_n, off_kh, 0]).reshape(BLOCK_N, BLOCK_D)
                v = V.load([row0_k + start_n, off_kh, 0]).reshape(BLOCK_N, BLOCK_D)
                if MASKED:  # rows past this sequence are the next one's: P is 0 there, but
                    v = tl.where(n_ok[:, None], v, 0.0)  # 0 * inf or NaN would not be
            else:
                k = K.load([off_z, off_kh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
                v = V.load([off_z, off_kh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
            k = tl.trans(k)
        else:
            # K^T tile (BLOCK_D x BLOCK_N) and V tile (BLOCK_N x BLOCK_D), straight from HBM
            k_ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
            v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
            if MASKED:
                k = tl.load(k_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            else:
                k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        # S_ij = Q_i K_j^T; in log2 units it is qk * qk_scale = (sm_scale * log2 e) * q.k
        qk = tl.dot(q, k, input_precision=INPUT_PRECISION)
        if MASKED:
            qk = qk * qk_scale
            qk = tl.where(visible(offs_m, offs_n, N_Q, N_K, LEFT, RIGHT), qk, float("-inf"))
            # Algorithm 1 line 11: the new running max, per row
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen only hidden keys has m_ij = -inf; subtracting it would give
            # -inf - (-inf) = NaN. Subtract 0 instead: its p and alpha are then exactly 0.
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_safe[:, None])  # P~_ij, entries in [0, 1]
        else:
            # the hot path scales late: max(qk * s) = max(qk) * s for s >= 0 (the launcher
            # makes it so), which leaves one fused multiply-add per score, qk * s - m, instead
            # of a multiply and a subtract. Every score here is visible and finite.
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_safe = m_ij
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_safe)  # rescales what was accumulated under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        # line 12 without the division (FA2: O stays unnormalised until the very end)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


# sequence lengths and window bounds are not specialised on (divisibility by 16, == 1): one
# compiled kernel serves every length, which keeps the ragged test sweep from recompiling
@triton.jit(do_not_specialize=["N_Q", "N_K", "LEFT", "RIGHT"])
def _attn_fwd(Q, K, V, O, LSE, sm_scale, CU_Q, CU_K,
              stride_qz, stride_qh, stride_qm, stride_qd,
              stride_kz, stride_kh, stride_kn, stride_kd,
              stride_vz, stride_vh, stride_vn, stride_vd,
              stride_oz, stride_oh, stride_om, stride_od,
              stride_lz, stride_lh,
              H, GROUP, N_Q, N_K, LEFT, RIGHT,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, LONGEST_FIRST: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, NEGATE_Q: tl.constexpr, USE_TMA: tl.constexpr,
              VARLEN: tl.constexpr):
    # grid = (query blocks, batch * heads): program (i, zh) owns rows [start_m, start_m+BLOCK_M)
    if LONGEST_FIRST:
        # causal work grows with the row: hand out each head's last (longest) query blocks
        # first, so that the short ones, not the long ones, fill the tail of the launch
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    off_kh = off_h // GROUP  # grouped-query attention: GROUP query heads share a K/V head
    row0_q = 0
    row0_k = 0
    if VARLEN:  # packed sequences: this one's rows start at CU_Q[z] (queries) and CU_K[z]
        row0_q = tl.load(CU_Q + off_z)
        row0_k = tl.load(CU_K + off_z)
        N_Q = tl.load(CU_Q + off_z + 1) - row0_q
        N_K = tl.load(CU_K + off_z + 1) - row0_k
    if start_m < N_Q:
        # int64 offsets: batch * head strides overflow int32 on large tensors
        Q += (off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
              + row0_q.to(tl.int64) * stride_qm)
        if not USE_TMA:  # descriptors take (batch, head, row, column) coordinates instead
            K += (off_z.to(tl.int64) * stride_kz + off_kh.to(tl.int64) * stride_kh
                  + row0_k.to(tl.int64) * stride_kn)
            V += (off_z.to(tl.int64) * stride_vz + off_kh.to(tl.int64) * stride_vh
                  + row0_k.to(tl.int64) * stride_vn)
        O += (off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
              + row0_q.to(tl.int64) * stride_om)
        LSE += off_z.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + row0_q

        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_ok = offs_m < N_Q
        d_ok = offs_d < HEAD_DIM

        # the Q tile is loaded once and stays on chip for the whole loop (the FA2 loop order)
        q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        if NEGATE_Q:  # sm_scale < 0: (-q) . k * |sm_scale| is the same score, scale >= 0
            q = -q       # (negation is exact in every float format)
        # m_i = -inf and l_i = 0: "nothing seen yet" (Triton's tutorial starts l_i at 1.0; we
        # keep 0 so that a row that never sees a key is recognisable at the end)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E  # log2(e) folded into the scale

        # Which K/V tiles does this Q block need (flashtext.kernels.masks)?  [lo, full_lo) and
        # [full_hi, hi): tiles that cross an edge of the window (the causal diagonal) or the
        # end of K -> masked.  [full_lo, full_hi): tiles every row sees in full -> no mask.
        # Everything else is never loaded.
        lo, full_lo, full_hi, hi = key_tiles(start_m, N_Q, N_K, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn,
                                   stride_vd, start_m, lo, full_lo, qk_scale, N_Q, N_K, LEFT,
                                   RIGHT, off_z, off_kh, row0_k, HEAD_DIM, BLOCK_D, BLOCK_M,
                                   BLOCK_N, True, INPUT_PRECISION, USE_TMA, VARLEN)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn,
                                   stride_vd, start_m, full_lo, full_hi, qk_scale, N_Q, N_K,
                                   LEFT, RIGHT, off_z, off_kh, row0_k, HEAD_DIM, BLOCK_D,
                                   BLOCK_M, BLOCK_N, False, INPUT_PRECISION, USE_TMA, VARLEN)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn,
                                   stride_vd, start_m, full_hi, hi, qk_scale, N_Q, N_K, LEFT,
                                   RIGHT, off_z, off_kh, row0_k, HEAD_DIM, BLOCK_D, BLOCK_M,
                                   BLOCK_N, True, INPUT_PRECISION, USE_TMA, VARLEN)

        # epilogue: delayed normalisation (one division per row, not one per tile), and
        # lse = m + log(l) in natural log. A row that saw no key (l_i = 0) gets O = 0 and
        # lse = -inf (the backward maps it to +inf, so that its P = exp(S - lse) is 0).
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        acc = acc / l_safe[:, None]
        lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * _LN2, float("-inf"))
        tl.store(LSE + offs_m, lse, mask=m_ok)
        tl.store(O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                 acc.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def input_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get full-precision dots ("ieee"): on a GPU Triton would otherwise round
    them to TF32 (10-bit mantissa), errors near 1e-3. fp16/bf16 are unaffected by the choice."""
    return "ieee" if dtype == torch.float32 else "tf32"


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
            config: KernelConfig | None = None, window: tuple[int, int] = (-1, -1),
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel on validated inputs (see :mod:`flashtext.kernels.api`).

    q is (Z, H, N_Q, d), k and v (Z, H_kv, N_K, d) with H a multiple of H_kv, any strides.
    Returns O (contiguous, q's dtype) and lse (Z, H, N_Q) float32, natural log. ``config``
    overrides :func:`~flashtext.kernels.config.launch_config` (tests use it to try several tile
    shapes); ``window`` is flash-attn's ``window_size``.
    """
    z, h, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty((z, h, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((z, h, n_q), dtype=torch.float32, device=q.device)
    if o.is_meta:  # shape inference only
        return o, lse
    if o.numel() == 0 or n_k == 0:  # nothing to compute, or no key to see (and no K to pass:
        lse.fill_(float("-inf"))      # an empty CUDA tensor has a null pointer)
        return o.zero_(), lse
    _launch_forward(q, k, v, o, lse, sm_scale, causal, window, config, n_q, n_k,
                    batch_strides=True, cu=None, lse_strides=(h * n_q, n_q))
    return o, lse


def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   causal: bool, sm_scale: float, window: tuple[int, int] = (-1, -1),
                   config: KernelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward over packed sequences: q (total_q, H, d), k and v (total_k, H_kv, d), sequence
    b's rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` (likewise for keys). Returns O (total_q, H, d)
    and lse (H, total_q) float32 (flash-attn's varlen layout)."""
    total_q, h, d = q.shape
    o = torch.empty((total_q, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((h, total_q), dtype=torch.float32, device=q.device)
    if o.is_meta:
        return o, lse
    batch = cu_seqlens_q.numel() - 1
    if o.numel() == 0 or k.shape[0] == 0 or batch == 0 or max_seqlen_q == 0:
        lse.fill_(float("-inf"))
        return o.zero_(), lse
    lse.fill_(float("-inf"))  # rows of a sequence with no key are never visited
    o.zero_()
    _launch_forward(q, k, v, o, lse, sm_scale, causal, window, config, max_seqlen_q,
                    max_seqlen_k, batch_strides=False, cu=(cu_seqlens_q, cu_seqlens_k),
                    lse_strides=(0, total_q))
    return o, lse


def _launch_forward(q, k, v, o, lse, sm_scale, causal, window, config, n_q, n_k,
                    batch_strides: bool, cu, lse_strides) -> None:
    """One launch of ``_attn_fwd``; dense (Z, H, N, d) tensors or packed (total, H, d) ones."""
    left, right = window_bounds(causal, window)
    d = q.shape[-1]
    if batch_strides:
        z, h = q.shape[:2]
        strides = (*q.stride(), *k.stride(), *v.stride(), *o.stride())
        h_kv = k.shape[1]
    else:  # packed: no batch stride (CU_* give each sequence's first row), rows are dim 0
        z, h = cu[0].numel() - 1, q.shape[1]
        h_kv = k.shape[1]
        strides = tuple(x for t in (q, k, v, o) for x in (0, t.stride(1), t.stride(0),
                                                             t.stride(2)))
    if config is None:
        config = launch_config("fwd", d, q.element_size(), right < UNBOUNDED, n_q, n_k)

    def grid(c: KernelConfig):
        return (triton.cdiv(n_q, c.BLOCK_M), z * h)

    use_tma, (k_arg, v_arg) = tile_sources(config, "BLOCK_N", k, v)
    cu_q, cu_k = cu if cu is not None else (lse, lse)  # unused when VARLEN is off
    launch(_attn_fwd, grid, config, q, k_arg, v_arg, o, lse, abs(sm_scale), cu_q, cu_k,
           *strides, *lse_strides, h, h // h_kv, n_q, n_k, left, right,
           HEAD_DIM=d, BLOCK_D=block_d(d), LONGEST_FIRST=right < UNBOUNDED,
           INPUT_PRECISION=input_precision(q.dtype), NEGATE_Q=sm_scale < 0, USE_TMA=use_tma,
           VARLEN=cu is not None)


__all__ = ["forward", "forward_varlen", "input_precision"]
