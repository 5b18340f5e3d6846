"""Chapter 10's exercises: solutions pass, stubs are not attempted, wrong answers fail."""

import triton
import triton.language as tl

from solutions import ch10
from tests.exercises.harness import assert_exercise, interpreted_only


def test_key_range():
    def top_left(start_m, n_q, n_k, bm, bn):
        hi = max(min(n_k, start_m + bm), 0)
        return max(min(n_k, start_m + 1), 0) // bn * bn, hi

    def no_clamp(start_m, n_q, n_k, bm, bn):
        off = n_k - n_q
        return (min(n_k, start_m + off + 1) // bn * bn, min(n_k, start_m + bm + off))

    def mid_rounded_up(start_m, n_q, n_k, bm, bn):
        off = n_k - n_q
        hi = max(min(n_k, start_m + bm + off), 0)
        return min(-(-max(min(n_k, start_m + off + 1), 0) // bn) * bn, hi), hi

    def everything(start_m, n_q, n_k, bm, bn):
        return 0, n_k

    assert_exercise("ch10.key_range", ch10.key_range, wrong={
        "top-left alignment": top_left,
        "no clamp at 0": no_clamp,
        "mid rounded up": mid_rounded_up,
        "mask everything, skip nothing": everything,
    }, message_must_mention={"mid rounded up": "needs the mask",
                             "mask everything, skip nothing": "nobody in the block sees"})


@triton.jit
def no_rescale(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
               N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # forgets to rescale acc when the max moves
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = head * stride_kh + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)
        v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        visible = offs_n[None, :] < N_K
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q))
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(qk - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p, v, acc)
        m_i = m_new
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(O + head * stride_oh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             acc / l_safe[:, None], mask=offs_m[:, None] < N_Q)
    tl.store(LSE + head * stride_lh + offs_m, tl.where(seen, m_i + tl.log(l_safe), float("-inf")),
             mask=offs_m < N_Q)


@triton.jit
def padded_keys_count(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                      N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # loads K/V with a mask but never hides the padded keys' scores (they score 0)
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = head * stride_kh + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)
        v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        if CAUSAL:
            qk = tl.where(offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q), qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(qk - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p, v, acc * alpha[:, None])
        m_i = m_new
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(O + head * stride_oh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             acc / l_safe[:, None], mask=offs_m[:, None] < N_Q)
    tl.store(LSE + head * stride_lh + offs_m, tl.where(seen, m_i + tl.log(l_safe), float("-inf")),
             mask=offs_m < N_Q)


@triton.jit
def lse_in_log2(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # the exp2 form, but lse stored in log2 units (forgets the factor ln 2)
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = head * stride_kh + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)
        v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * (sm_scale * 1.4426950408889634)
        visible = offs_n[None, :] < N_K
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q))
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p, v, acc * alpha[:, None])
        m_i = m_new
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(O + head * stride_oh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             acc / l_safe[:, None], mask=offs_m[:, None] < N_Q)
    tl.store(LSE + head * stride_lh + offs_m,
             tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf")), mask=offs_m < N_Q)


def test_attention_kernel():
    assert_exercise("ch10.attention_kernel", ch10.attention_kernel, wrong={
        "acc not rescaled": no_rescale,
        "padded keys not hidden": padded_keys_count,
        "lse in log2 units": lse_in_log2,
    }, message_must_mention={"lse in log2 units": "lse (natural log)"})


def test_the_kernel_checker_compiles_exact_fp32_dots(monkeypatch):
    """TF32 would move a score near 1000 by ~0.5: the checker asks Triton for ieee dots, and
    recompiles the reader's kernel under that setting, then leaves the environment as it was."""
    import os

    from flashtext.exercises.kernel_checks import exact_fp32_dots

    class FakeJit:
        device_caches = {"cuda:0": "compiled with tf32"}

    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    kernel = FakeJit()
    with exact_fp32_dots(kernel):
        assert os.environ["TRITON_F32_DEFAULT"] == "ieee"
        assert kernel.device_caches == {}
    assert "TRITON_F32_DEFAULT" not in os.environ


@triton.jit
def _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q, N_K,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, MAX0: tl.constexpr, TILE_MAX: tl.constexpr,
              CONTIGUOUS_HEADS: tl.constexpr, LSE_CONTIGUOUS: tl.constexpr,
              Q_MASK: tl.constexpr, FIXED_SCALE: tl.constexpr, O_MASK: tl.constexpr):
    """The solution with one learner's slip switchable on, to build the wrong answers."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    if CONTIGUOUS_HEADS:  # as if every tensor were (heads, N, HEAD_DIM) contiguous
        stride_qh = N_Q * HEAD_DIM
        stride_oh = N_Q * HEAD_DIM
        stride_kh = N_K * HEAD_DIM
        stride_lh = N_Q
    if LSE_CONTIGUOUS:
        stride_lh = N_Q
    if FIXED_SCALE:
        sm_scale = 0.25  # 1/sqrt(16), right for most cases only
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if Q_MASK:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
    else:  # the rows past N_Q are never stored, so their values do not matter... but the load
        q = tl.load(q_ptrs)
    if MAX0:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = head * stride_kh + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)
        v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        visible = offs_n[None, :] < N_K
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q))
        qk = tl.where(visible, qk, float("-inf"))
        if TILE_MAX:  # one max for the whole tile instead of one per row
            m_new = tl.maximum(m_i, tl.max(tl.max(qk, 1), 0))
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(qk - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p, v, acc * alpha[:, None])
        m_i = m_new
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    o_ptrs = O + head * stride_oh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if O_MASK:
        tl.store(o_ptrs, acc / l_safe[:, None], mask=offs_m[:, None] < N_Q)
    else:
        tl.store(o_ptrs, acc / l_safe[:, None])
    tl.store(LSE + head * stride_lh + offs_m, tl.where(seen, m_i + tl.log(l_safe), float("-inf")),
             mask=offs_m < N_Q)


def _make_variants():
    # one explicit kernel per slip: Triton specialises on constexpr arguments, not globals
    @triton.jit
    def max_starts_at_zero(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                           N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, False, False, False, True,
                  False, True)

    @triton.jit
    def one_max_per_tile(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                         N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, True, False, False, True,
                  False, True)

    @triton.jit
    def contiguous_heads(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                         N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, False, True, False, True,
                  False, True)

    @triton.jit
    def lse_contiguous(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                       N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, False, False, True, True,
                  False, True)

    @triton.jit
    def q_unmasked(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                   N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, False, False, False, False,
                  False, True)

    @triton.jit
    def fixed_scale(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                    N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, False, False, False, True,
                  True, True)

    @triton.jit
    def o_unmasked(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                   N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        _fwd_body(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh, N_Q,
                  N_K, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, False, False, False, True,
                  False, False)

    return {"running max starts at 0": max_starts_at_zero,
            "one max per tile, not per row": one_max_per_tile,
            "head strides taken as N * HEAD_DIM": contiguous_heads,
            "LSE's head stride ignored": lse_contiguous,
            "Q tile loaded without a mask": q_unmasked,
            "hard-coded scale 1/sqrt(16)": fixed_scale,
            "O stored without a mask": o_unmasked}


def test_attention_kernel_catches_each_class_of_slip():
    wrong = _make_variants()
    q_unmasked = {"Q tile loaded without a mask": wrong.pop("Q tile loaded without a mask")}
    wrong.update(interpreted_only(q_unmasked))  # its lanes past N_Q are never stored
    assert_exercise("ch10.attention_kernel", ch10.attention_kernel, wrong=wrong,
                    message_must_mention={
                        "running max starts at 0": "every score below -150",
                        "head strides taken as N * HEAD_DIM": "head strides",
                        "LSE's head stride ignored": "LSE[",
                        "Q tile loaded without a mask": "read Q[0, 17, 0], past the last row",
                        "hard-coded scale 1/sqrt(16)": "d=32",
                        "O stored without a mask": "O[0, 17, 0], past the last row",
                    })


def test_the_forward_kernel_cases_have_the_properties_their_names_claim():
    import math

    import numpy as np
    import torch

    from flashtext import reference as ref
    from flashtext.exercises.ch10 import _fwd_cases

    scales = set()
    for case, q, k, v, causal, bm, bn, sm_scale in _fwd_cases(torch.Generator().manual_seed(10)):
        s = ref.scores(q, k, scale=sm_scale)
        scales.add(sm_scale * math.sqrt(q.shape[-1]))
        if "below -150" in case:
            assert s.max() < -150  # exp(s) is exactly 0 in fp32 (below about -104)
        if "in the hundreds" in case:
            assert np.abs(s).max() > 200 and s.max() > 89  # exp(s) overflows fp32
        if "rows hundreds apart" in case:
            row_max = s[..., :bm, :].max(axis=-1)
            assert (row_max.max(axis=-1) - row_max.min(axis=-1)).min() > 200
        if "ragged" in case:
            assert q.shape[1] % bm or k.shape[1] % bn
        if "multiple of BLOCK_N" in case:
            assert k.shape[1] % bn == 0 and causal
        if "see no key" in case:
            assert causal and q.shape[1] - k.shape[1] == 33
        assert q.shape[0] >= 1 and v.shape == k.shape
    assert len(scales) >= 2  # one case's sm_scale is not 1/sqrt(d)


def test_key_range_catches_off_by_ones_at_the_block_edges():
    def keys_seen_without_plus_one(start_m, n_q, n_k, bm, bn):
        off = n_k - n_q
        return max(min(n_k, start_m + off), 0) // bn * bn, max(min(n_k, start_m + bm + off), 0)

    def mid_never_all_keys(start_m, n_q, n_k, bm, bn):
        off = n_k - n_q
        return (max(min(n_k - 1, start_m + off + 1), 0) // bn * bn,
                max(min(n_k, start_m + bm + off), 0))

    assert_exercise("ch10.key_range", ch10.key_range, wrong={
        "first row sees i + offset keys (no + 1)": keys_seen_without_plus_one,
        "the last tile always masked": mid_never_all_keys,
    }, message_must_mention={"first row sees i + offset keys (no + 1)": "masks tiles",
                             "the last tile always masked": "largest valid mid"})


def test_key_range_cases_put_block_edges_on_the_diagonal():
    from flashtext.exercises.ch10 import KEY_RANGE_CASES

    first_row_on_edge = all_keys_on_edge = 0
    for n_q, n_k, bm, bn in KEY_RANGE_CASES:
        for start_m in range(0, n_q, bm):
            seen = start_m + n_k - n_q + 1  # keys the block's first row sees
            first_row_on_edge += 0 < seen < n_k and seen % bn == 0
            all_keys_on_edge += seen >= n_k and n_k % bn == 0
    assert first_row_on_edge >= 3 and all_keys_on_edge >= 2
