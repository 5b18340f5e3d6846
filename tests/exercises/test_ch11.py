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
             DELTA_ON: tl.constexpr):
    """The solution with one ingredient switchable off, to build the wrong answers."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    m_ok = offs_m < N_Q
    q = tl.load(Q + rows, mask=m_ok[:, None], other=0.0)
    do = tl.load(DO + rows, mask=m_ok[:, None], other=0.0)
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
        p = tl.exp(tl.where(visible, qk, float("-inf")) - lse[:, None])
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds, k, dq)
    if SCALE:
        dq = dq * sm_scale
    tl.store(DQ + head * stride_dqh + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq,
             mask=m_ok[:, None])


@triton.jit
def dq_no_scale(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q,
                N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, False, True, True)


@triton.jit
def dq_no_causal_mask(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh,
                      N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, False, True)


@triton.jit
def dq_no_delta(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q,
                N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr):
    _dq_body(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
             HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, True, True, False)


def test_dq_kernel():
    assert_exercise("ch11.dq_kernel", ch11.dq_kernel, wrong={
        "forgot sm_scale at the end": dq_no_scale,
        "no causal mask": dq_no_causal_mask,
        "delta left out": dq_no_delta,
    })
