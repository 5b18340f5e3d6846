"""Chapter 9's kernel exercises: the solutions pass, the stubs are not attempted, and plausible
wrong kernels fail with a message that says what went wrong."""

import triton
import triton.language as tl

from solutions import ch09
from tests.exercises.harness import assert_exercise


@triton.jit
def stub_kernel(X, OUT, n, BLOCK: tl.constexpr):
    raise NotImplementedError


def not_a_kernel(*args, **kwargs):
    return None


# ------------------------------------------------------------------------------ axpy

@triton.jit
def axpy_no_mask(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, alpha * tl.load(X + offs) + tl.load(Y + offs))


@triton.jit
def axpy_ignores_program_id(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(OUT + offs, alpha * tl.load(X + offs, mask=mask) + tl.load(Y + offs, mask=mask),
             mask=mask)


@triton.jit
def axpy_forgets_alpha(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(OUT + offs, tl.load(X + offs, mask=mask) + tl.load(Y + offs, mask=mask), mask=mask)


def test_axpy():
    assert_exercise("ch09.axpy", ch09.axpy, wrong={
        "no mask": axpy_no_mask,
        "ignores program_id": axpy_ignores_program_id,
        "forgets alpha": axpy_forgets_alpha,
        "not a kernel": not_a_kernel,
    }, message_must_mention={"no mask": "past the end", "ignores program_id": "never written",
                             "not a kernel": "@triton.jit"})


# -------------------------------------------------------------------- row logsumexp

@triton.jit
def lse_no_max(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * stride_row + cols, mask=cols < n_cols,
                other=float("-inf"))
    tl.store(OUT + tl.program_id(0), tl.log(tl.sum(tl.exp(x), axis=0)))


@triton.jit
def lse_pads_with_zero(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * stride_row + cols, mask=cols < n_cols, other=0.0)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tl.store(OUT + tl.program_id(0), m_safe + tl.log(tl.sum(tl.exp(x - m_safe), axis=0)))


@triton.jit
def lse_ignores_stride(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * n_cols + cols, mask=cols < n_cols, other=float("-inf"))
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tl.store(OUT + tl.program_id(0), m_safe + tl.log(tl.sum(tl.exp(x - m_safe), axis=0)))


@triton.jit
def lse_nan_on_empty_row(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * stride_row + cols, mask=cols < n_cols,
                other=float("-inf"))
    m = tl.max(x, axis=0)
    tl.store(OUT + tl.program_id(0), m + tl.log(tl.sum(tl.exp(x - m), axis=0)))


def test_row_logsumexp():
    assert_exercise("ch09.row_logsumexp", ch09.row_logsumexp, wrong={
        "no max subtracted": lse_no_max,
        "padding read as 0": lse_pads_with_zero,
        "ignores the row stride": lse_ignores_stride,
        "NaN for a row of -inf": lse_nan_on_empty_row,
    }, message_must_mention={"NaN for a row of -inf": "NaN"})


# --------------------------------------------------------------------------- matmul

@triton.jit
def matmul_no_k_mask(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                     stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start_k in range(0, K, BLOCK_K):
        k = start_k + tl.arange(0, BLOCK_K)
        a = tl.load(A + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=offs_m[:, None] < M, other=0.0)
        b = tl.load(B + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=offs_n[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_assumes_contiguous(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                              stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start_k in range(0, K, BLOCK_K):
        k = start_k + tl.arange(0, BLOCK_K)
        a = tl.load(A + offs_m[:, None] * K + k[None, :],
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(B + k[:, None] * N + offs_n[None, :],
                    mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(C + offs_m[:, None] * N + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_one_k_block(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    a = tl.load(A + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
    b = tl.load(B + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, tl.dot(a, b),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def test_matmul():
    assert_exercise("ch09.matmul", ch09.matmul, wrong={
        "no mask on k": matmul_no_k_mask,
        "assumes contiguous": matmul_assumes_contiguous,
        "one k block": matmul_one_k_block,
    }, message_must_mention={"assumes contiguous": "transposed"})


def test_stub_kernel_is_not_attempted():
    from flashtext.exercises import verify

    for name in ("ch09.axpy", "ch09.row_logsumexp", "ch09.matmul"):
        assert verify(name, stub_kernel).status == "not_attempted"
