"""Chapter 11's exercises: solutions pass, stubs are not attempted, wrong answers fail."""

import triton
import triton.language as tl

from solutions import ch11
from tests.exercises.harness import assert_exercise


def test_query_range():
    def top_left(start_n, n_q, n_k, bm, bn):
        lo = start_n // bm * bm
        mid = max(-(-(min(start_n + bn, n_k) - 1) // bm) * bm, lo)
        return lo, mid

    def lo_rounded_up(start_n, n_q, n_k, bm, bn):
        lo, mid = ch11.query_range(start_n, n_q, n_k, bm, bn)
        lo = -(-max(start_n - (n_k - n_q), 0) // bm) * bm
        return lo, max(mid, lo)

    def mid_rounded_down(start_n, n_q, n_k, bm, bn):
        off = n_k - n_q
        lo = max(start_n - off, 0) // bm * bm
        return lo, max(max(min(start_n + bn, n_k) - 1 - off, 0) // bm * bm, lo)

    def padded_last_key(start_n, n_q, n_k, bm, bn):
        off = n_k - n_q
        lo = max(start_n - off, 0) // bm * bm
        return lo, max(-(-max(start_n + bn - 1 - off, 0) // bm) * bm, lo)

    assert_exercise("ch11.query_range", ch11.query_range, wrong={
        "top-left alignment": top_left,
        "lo rounded up": lo_rounded_up,
        "mid rounded down": mid_rounded_down,
        "mid from the padded last key": padded_last_key,
    }, message_must_mention={"lo rounded up": "skips row",
                             "mid rounded down": "without the mask",
                             "mid from the padded last key": "need no mask"})


@triton.jit
def _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr,
             DELTA_ON: tl.constexpr, EXP_OVER_EXP: tl.constexpr, DQ_STRIDE: tl.constexpr,
             ROW_MASKS: tl.constexpr, GIVEN_SCALE: tl.constexpr):
    """The solution with one ingredient switchable off, to build the wrong answers."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    if not GIVEN_SCALE:
        sm_scale = 0.25  # 1/sqrt(16): right for most cases only
    if not DQ_STRIDE:
        stride_dqh = stride_qh  # as if dQ were laid out like Q
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    m_ok = offs_m < N_Q
    if ROW_MASKS:
        q = tl.load(Q + rows, mask=m_ok[:, None], other=0.0)
        do = tl.load(DO + rows, mask=m_ok[:, None], other=0.0)
    else:  # loads the padded rows too (never stored: values right, reads out of bounds)
        q = tl.load(Q + rows)
        do = tl.load(DO + rows)
    lse = tl.load(LSE + head * N_Q + offs_m, mask=m_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(DELTA + head * N_Q + offs_m, mask=m_ok, other=0.0)
    if not DELTA_ON:
        delta = delta * 0.0
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = head * stride_kh + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)
        v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        visible = offs_n[None, :] < N_K
        if CAUSAL and MASK:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q))
        if EXP_OVER_EXP:  # exp(s) / exp(lse): the same number, until exp(s) overflows
            p = tl.exp(tl.where(visible, qk, float("-inf"))) / tl.exp(lse[:, None])
            p = tl.where(p == p, p, 0.0)
        else:
            p = tl.exp(tl.where(visible, qk, float("-inf")) - lse[:, None])
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds, k, dq)
    if SCALE:
        dq = dq * sm_scale
    dq_ptrs = DQ + head * stride_dqh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if ROW_MASKS:
        tl.store(dq_ptrs, dq, mask=m_ok[:, None])
    else:
        tl.store(dq_ptrs, dq)


@triton.jit
def dq_no_scale(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, True, True, False, True, True, True)


@triton.jit
def dq_no_causal_mask(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                      N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, False, True, False, True, True, True)


@triton.jit
def dq_no_delta(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, True, False, False, True, True, True)


@triton.jit
def dq_exp_over_exp(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                    N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, True, True, True, True, True, True)


@triton.jit
def dq_stride_of_q(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                   N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, True, True, False, False, True, True)


@triton.jit
def dq_no_row_masks(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                    N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, True, True, False, True, False, True)


@triton.jit
def dq_fixed_scale(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                   N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, True, True, False, True, True, False)


def test_dq_kernel():
    assert_exercise("ch11.dq_kernel", ch11.dq_kernel, wrong={
        "forgot sm_scale at the end": dq_no_scale,
        "no causal mask": dq_no_causal_mask,
        "delta left out": dq_no_delta,
    })


def test_dq_kernel_catches_overflow_strides_masks_and_a_fixed_scale():
    assert_exercise("ch11.dq_kernel", ch11.dq_kernel, wrong={
        "P = exp(s) / exp(lse)": dq_exp_over_exp,
        "dQ written with Q's head stride": dq_stride_of_q,
        "Q and dO loaded, dQ stored without row masks": dq_no_row_masks,
        "hard-coded scale 1/sqrt(16)": dq_fixed_scale,
    }, message_must_mention={"P = exp(s) / exp(lse)": "scores above 100",
                             "dQ written with Q's head stride": "DQ",
                             "Q and dO loaded, dQ stored without row masks": "past the last row",
                             "hard-coded scale 1/sqrt(16)": "d=32"})


def test_the_dq_cases_have_the_properties_their_names_claim():
    import math

    import numpy as np
    import torch

    from flashtext import reference as ref
    from flashtext.exercises.ch11 import _dq_cases, dq_spec

    scales = set()
    for case, q, k, v, do, causal, bm, bn, sm_scale in _dq_cases(
            torch.Generator().manual_seed(11)):
        s = ref.scores(q, k, scale=sm_scale)
        scales.add(round(sm_scale * math.sqrt(q.shape[-1]), 6))
        assert do.shape == q.shape and v.shape == k.shape
        if "scores above 100 for every key" in case:
            assert s.min() > 88.8  # exp(s) overflows fp32 for every score
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            assert p.max() < 0.9  # spread, not one-hot: dQ is not near 0
            assert np.abs(dq_spec(q, k, v, do, causal, sm_scale)).max() > 0.1  # >> tolerance
        elif "scores above 100" in case:
            assert s.max() > 100  # exp(s) overflows fp32 (above about 88.7)
        else:
            assert np.abs(s).max() < 30
        if "ragged" in case:
            assert q.shape[1] % bm or k.shape[1] % bn
        if "see no key" in case:
            assert causal and q.shape[1] - k.shape[1] == 33
    assert len(scales) >= 2


def test_query_range_cases_put_block_edges_on_the_diagonal():
    from flashtext.exercises.ch11 import QUERY_RANGE_CASES

    def first_rows(n_q, n_k, bm, bn):
        off = n_k - n_q
        return [s - off for s in range(0, n_k, bn)] + \
            [min(s + bn, n_k) - 1 - off for s in range(0, n_k, bn)]

    edges = [(case, r) for case in QUERY_RANGE_CASES for r in first_rows(*case)
             if r > 0 and r % case[2] == 0]
    assert len({case for case, _ in edges}) >= 4  # several cases with a row on a block edge
    assert any(n_k % bn for n_q, n_k, bm, bn in QUERY_RANGE_CASES)  # a ragged last key block


def test_the_spread_overflow_case_alone_catches_exp_over_exp(monkeypatch):
    """On a GPU the one-hot overflow case lets exp(s)/exp(lse) through (a one-hot row has almost
    no gradient to get wrong): the case with every score near 100 must catch it by itself."""
    import torch

    import flashtext.exercises.ch11 as checker
    from flashtext.exercises import verify

    every_case = checker._dq_cases
    names = [c[0] for c in every_case(torch.Generator().manual_seed(11))]
    assert any(n.startswith("scores above 100 for every key") for n in names)
    monkeypatch.setattr(checker, "_dq_cases", lambda g: (
        c for c in every_case(g) if not c[0].startswith("scores above 100 (q scaled")))
    result = verify("ch11.dq_kernel", dq_exp_over_exp)
    assert result.status == "failed" and "for every key" in result.message, result.message
