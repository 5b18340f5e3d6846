"""Chapter 11 reference solutions: the dK/dV program's query range, and a dQ kernel."""

import triton
import triton.language as tl


def query_range(start_n, n_q, n_k, BLOCK_M, BLOCK_N):  # noqa: N803
    offset = n_k - n_q
    lo = max(start_n - offset, 0) // BLOCK_M * BLOCK_M
    mid = max(min(start_n + BLOCK_N, n_k) - 1 - offset, 0)
    mid = max(-(-mid // BLOCK_M) * BLOCK_M, lo)
    return lo, mid


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, stride_qh, stride_kh, stride_dqh, N_Q, N_K,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = head * stride_qh + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    m_ok = offs_m < N_Q
    q = tl.load(Q + rows, mask=m_ok[:, None], other=0.0)
    do = tl.load(DO + rows, mask=m_ok[:, None], other=0.0)
    lse = tl.load(LSE + head * N_Q + offs_m, mask=m_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)  # rows that saw no key: P = 0
    delta = tl.load(DELTA + head * N_Q + offs_m, mask=m_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = head * stride_kh + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)
        v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        visible = offs_n[None, :] < N_K
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q))
        p = tl.exp(tl.where(visible, qk, float("-inf")) - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq)
    tl.store(DQ + head * stride_dqh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             dq * sm_scale, mask=m_ok[:, None])
