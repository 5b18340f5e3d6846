"""Chapter 10's exercises: solutions pass, stubs are not attempted, wrong answers fail."""

import triton
import triton.language as tl

from solutions import ch10
from tests.exercises.harness import assert_exercise


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
