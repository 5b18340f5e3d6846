"""Chapter 7 reference solutions."""

import numpy as np


def forward_q_outer(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):  # noqa: N803
    n_q, d = q.shape
    n_k = k.shape[0]
    sm_scale = 1.0 / np.sqrt(d)
    offset = n_k - n_q  # bottom-right alignment
    o = np.zeros((n_q, v.shape[1]))
    lse = np.empty(n_q)
    for start_m in range(0, n_q, BLOCK_M):
        end_m = min(start_m + BLOCK_M, n_q)
        rows = np.arange(start_m, end_m)
        m_i = np.full(end_m - start_m, -np.inf)
        l_i = np.zeros(end_m - start_m)
        acc = np.zeros((end_m - start_m, v.shape[1]))
        for start_n in range(0, n_k, BLOCK_N):
            end_n = min(start_n + BLOCK_N, n_k)
            s = q[start_m:end_m] @ k[start_n:end_n].T * sm_scale
            if causal:
                cols = np.arange(start_n, end_n)
                s = np.where(cols[None, :] <= rows[:, None] + offset, s, -np.inf)
            m_new = np.maximum(m_i, s.max(axis=1))
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            alpha = np.exp(m_i - m_safe)
            p = np.exp(s - m_safe[:, None])
            l_i = alpha * l_i + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v[start_n:end_n]
            m_i = m_new
        o[start_m:end_m], lse[start_m:end_m] = finalize(acc, m_i, l_i)
    return o, lse


def causal_block_counts(n_q, n_k, BLOCK_M, BLOCK_N, align="bottom_right"):  # noqa: N803
    offset = n_k - n_q if align == "bottom_right" else 0
    skipped = masked = full = 0
    for start_m in range(0, n_q, BLOCK_M):
        end_m = min(start_m + BLOCK_M, n_q)
        for start_n in range(0, n_k, BLOCK_N):
            end_n = min(start_n + BLOCK_N, n_k)
            if start_n > end_m - 1 + offset:
                skipped += 1
            elif end_n - 1 <= start_m + offset:
                full += 1
            else:
                masked += 1
    return skipped, masked, full


def finalize(acc, m_i, l_i):
    seen = l_i > 0
    o = np.divide(acc, l_i[:, None], out=np.zeros_like(acc), where=seen[:, None])
    with np.errstate(divide="ignore"):
        lse = m_i + np.log(l_i)  # -inf + -inf = -inf for a row that saw no key
    return o, lse
