"""Chapter 10 reference solutions: the causal key range, and a compact forward kernel."""

import triton
import triton.language as tl


def key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N):  # noqa: N803
    offset = n_k - n_q
    hi = max(min(n_k, start_m + BLOCK_M + offset), 0)
    mid = max(min(n_k, start_m + offset + 1), 0) // BLOCK_N * BLOCK_N
    return mid, hi


@triton.jit
def attention_kernel(Q, K, V, O, LSE, sm_scale, stride_qh, stride_kh, stride_oh, stride_lh,
                     N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
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
        acc = tl.dot(p, v, acc * alpha[:, None])
        m_i = m_new
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(O + head * stride_oh + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             acc / l_safe[:, None], mask=offs_m[:, None] < N_Q)
    tl.store(LSE + head * stride_lh + offs_m, tl.where(seen, m_i + tl.log(l_safe), float("-inf")),
             mask=offs_m < N_Q)
