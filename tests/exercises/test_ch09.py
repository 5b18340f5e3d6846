"""Chapter 9's kernel exercises: the solutions pass, the stubs are not attempted, and plausible
wrong kernels fail with a message that says what went wrong."""

import triton
import triton.language as tl

from solutions import ch09
from tests.exercises.harness import assert_exercise, interpreted_only


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


@triton.jit
def axpy_loads_unmasked(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
    # the store is masked, so the lanes read past the end never reach OUT: still a bug (on a
    # GPU it reads memory that is not X's and can fault)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, alpha * tl.load(X + offs) + tl.load(Y + offs), mask=offs < n)


@triton.jit
def axpy_stores_far_away(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    out = alpha * tl.load(X + offs, mask=mask) + tl.load(Y + offs, mask=mask)
    tl.store(OUT + offs * 1_000_000, out, mask=mask)  # a wrong stride: far outside OUT


@triton.jit
def axpy_into_x(X, Y, OUT, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    out = alpha * tl.load(X + offs, mask=mask) + tl.load(Y + offs, mask=mask)
    tl.store(X + offs, out, mask=mask)
    tl.store(OUT + offs, out, mask=mask)


def test_axpy():
    assert_exercise("ch09.axpy", ch09.axpy, wrong={
        "no mask": axpy_no_mask,
        "ignores program_id": axpy_ignores_program_id,
        "forgets alpha": axpy_forgets_alpha,
        "not a kernel": not_a_kernel,
        "writes into its input": axpy_into_x,
        **interpreted_only({"loads unmasked, store masked": axpy_loads_unmasked,
                            "stores far out of bounds": axpy_stores_far_away}),
    }, message_must_mention={"no mask": "past the end", "ignores program_id": "never written",
                             "not a kernel": "@triton.jit",
                             "loads unmasked, store masked": "read X[1], past the end of X",
                             "stores far out of bounds": "none of its tensors",
                             "writes into its input": "an input"})


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


@triton.jit
def lse_unmasked_load(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
    # reads the whole BLOCK, then hides the padding lanes: right values, reads past the row
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * stride_row + cols)
    x = tl.where(cols < n_cols, x, float("-inf"))
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tl.store(OUT + tl.program_id(0), m_safe + tl.log(tl.sum(tl.exp(x - m_safe), axis=0)))


@triton.jit
def lse_stores_with_row_stride(X, OUT, stride_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + tl.program_id(0) * stride_row + cols, mask=cols < n_cols,
                other=float("-inf"))
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    tl.store(OUT + tl.program_id(0) * stride_row,
             m_safe + tl.log(tl.sum(tl.exp(x - m_safe), axis=0)))


def test_row_logsumexp():
    assert_exercise("ch09.row_logsumexp", ch09.row_logsumexp, wrong={
        "no max subtracted": lse_no_max,
        "padding read as 0": lse_pads_with_zero,
        "ignores the row stride": lse_ignores_stride,
        "NaN for a row of -inf": lse_nan_on_empty_row,
        "OUT indexed with the row stride": lse_stores_with_row_stride,
        **interpreted_only({"unmasked load, padding hidden after": lse_unmasked_load}),
    }, message_must_mention={"NaN for a row of -inf": "NaN",
                             "unmasked load, padding hidden after": "your kernel read X[",
                             "OUT indexed with the row stride": "wrote"})


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


@triton.jit
def _matmul_body(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 A_STRIDES: tl.constexpr, C_STRIDES: tl.constexpr, LOAD_MASKS: tl.constexpr,
                 STORE_MASK: tl.constexpr):
    """The solution with one ingredient switchable off, to build the wrong answers."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if not A_STRIDES:  # as if A were always row-major
        stride_am, stride_ak = K, 1
    if not C_STRIDES:
        stride_cm, stride_cn = N, 1
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start_k in range(0, K, BLOCK_K):
        k = start_k + tl.arange(0, BLOCK_K)
        a_ptrs = A + offs_m[:, None] * stride_am + k[None, :] * stride_ak
        b_ptrs = B + k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        if LOAD_MASKS:
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
            b = tl.load(b_ptrs, mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        else:  # loads everything, zeroes the padding afterwards: right values
            a = tl.where((offs_m[:, None] < M) & (k[None, :] < K), tl.load(a_ptrs), 0.0)
            b = tl.where((k[:, None] < K) & (offs_n[None, :] < N), tl.load(b_ptrs), 0.0)
        acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if STORE_MASK:
        tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    else:
        tl.store(c_ptrs, acc)


@triton.jit
def matmul_ignores_a_strides(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    # A taken as row-major, whatever its strides
    _matmul_body(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, False, True, True, True)


@triton.jit
def matmul_ignores_c_strides(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    # C written as row-major, whatever its strides
    _matmul_body(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, True, False, True, True)


@triton.jit
def matmul_unmasked_loads(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    # loads every lane, zeroes the padding after
    _matmul_body(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, True, True, False, True)


@triton.jit
def matmul_unmasked_store(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    # stores the whole tile
    _matmul_body(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, True, True, True, False)


def test_matmul():
    assert_exercise("ch09.matmul", ch09.matmul, wrong={
        "no mask on k": matmul_no_k_mask,
        "assumes contiguous": matmul_assumes_contiguous,
        "one k block": matmul_one_k_block,
        "ignores A's strides": matmul_ignores_a_strides,
        "ignores C's strides": matmul_ignores_c_strides,
        "unmasked store": matmul_unmasked_store,
        **interpreted_only({"unmasked loads, masked store": matmul_unmasked_loads}),
    }, message_must_mention={"assumes contiguous": "transposed",
                             "ignores A's strides": "A stored transposed",
                             "ignores C's strides": "C ",
                             "unmasked loads, masked store": "your kernel read",
                             "unmasked store": "past the end of C"})


def test_the_matmul_cases_cover_every_operand_transposed_and_padded():
    layouts = [lay for *_, lay in ch09_cases()]
    for position in range(3):
        assert {"T", "P"} <= {lay[position] for lay in layouts}


def ch09_cases():
    from flashtext.exercises.ch09 import MATMUL_CASES

    return MATMUL_CASES


def test_stub_kernel_is_not_attempted():
    from flashtext.exercises import verify

    for name in ("ch09.axpy", "ch09.row_logsumexp", "ch09.matmul"):
        assert verify(name, stub_kernel).status == "not_attempted"
