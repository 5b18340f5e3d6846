"""Chapter 13's exercises: the exponential's share of the matmul time, and the fast
Walsh-Hadamard transform behind FP8 incoherent processing."""

from __future__ import annotations

import numpy as np

from flashtext import fp8
from flashtext.exercises.core import exercise, expect, expect_close
from flashtext.exercises.rules import peak_allocation


@exercise(
    "ch13.exp_time_fraction",
    "How long the exponentials take next to the matmuls",
    hints=(
        "Per score there is one exponential. How many matmul FLOPs per score? Q K^T costs 2d "
        "per score (d multiply-adds), and P V costs as much again.",
        "Time = work / rate, for each unit: exps / exp_flops and matmul FLOPs / matmul_flops.",
        "(1 / exp_flops) / (4 d / matmul_flops) = matmul_flops / (4 d exp_flops).",
    ),
)
def check_exp_time_fraction(fn) -> None:
    cases = [(64, 989e12, 3.9e12), (128, 989e12, 3.9e12), (256, 989e12, 3.9e12),
             (128, 312e12, 19.5e12 / 4), (80, 750e12, 3.9e12), (1, 1.0, 1.0)]
    for d, mm, ex in cases:
        expected = mm / (4 * d * ex)
        expect_close(fn(d, mm, ex), expected, what="the exp / matmul time ratio",
                     case=f"d={d}, matmul_flops={mm:g}, exp_flops={ex:g}", rtol=1e-9, atol=0)


def _inputs(rng: np.random.Generator):
    for n in (1, 2, 4, 8, 64, 128):
        yield f"one vector of length {n}", rng.standard_normal(n)
        yield f"3 rows of length {n}", rng.standard_normal((3, n))
    spike = np.zeros(16)
    spike[3] = 100.0
    yield "a single outlier (100 at index 3) in a length-16 vector", spike
    yield "2 x 5 x 32 (leading batch axes)", rng.standard_normal((2, 5, 32))


RULE_N = 2048  # the length on which "no n x n matrix" is checked


@exercise(
    "ch13.fwht",
    "The fast Walsh-Hadamard transform",
    hints=(
        "Work on the last axis. For h = 1, 2, 4, ... < n: inside every block of 2h entries, pair "
        "entry i with entry i + h and replace them by (a + b, a - b).",
        "With NumPy: reshape to (..., n / (2h), 2, h), take [..., 0, :] and [..., 1, :], stack "
        "their sum and difference on the axis of size 2, reshape back.",
        "log2(n) rounds of butterflies compute x @ H_n for the unnormalised Hadamard matrix; "
        "divide by sqrt(n) at the end so that the transform is orthogonal.",
    ),
)
def check_fwht(fn) -> None:
    rng = np.random.default_rng(13)
    for case, x in _inputs(rng):
        got = fn(x.copy())
        expect(got is not None, f"{case}: your function returned None. Did you forget `return`?")
        expect_close(got, fp8.fwht(x), what="the transform of x", case=case, rtol=1e-9,
                     atol=1e-9)
    # the stated rule: O(n log n) butterflies, no n x n matrix (dense, it would be 32 MB here)
    n = RULE_N
    x = rng.standard_normal(n)
    got, peak = peak_allocation(fn, x.copy())
    expect(peak < n * n * 8 // 32,
           f"a vector of length {n}: your function allocated {peak / 1e6:.1f} MB at its peak, "
           f"on the scale of the {n} x {n} Hadamard matrix ({n * n * 8 / 1e6:.1f} MB in "
           "float64). The fast transform needs no matrix: only log2(n) rounds of butterflies "
           "on the vector itself, O(n log n) work.")
    expect_close(got, fp8.fwht(x), what="the transform of x", case=f"a vector of length {n}",
                 rtol=1e-9, atol=1e-9)
    # the point of the exercise: with the same random signs on Q and K, Q K^T is unchanged
    q, k = rng.standard_normal((6, 64)), rng.standard_normal((9, 64))
    signs = fp8.random_signs(64, rng)
    qr, kr = fn(q * signs), fn(k * signs)
    expect_close(np.asarray(qr) @ np.asarray(kr).T, q @ k.T, what="Q' K'^T after the rotation",
                 case="Q (6 x 64), K (9 x 64), the same random signs on both", rtol=1e-9,
                 atol=1e-9)


def _layouts():
    """(name, shape, strides, element_size, offset_bytes) of layouts models hand a kernel."""
    for dtype_name, size in (("fp16", 2), ("fp32", 4)):
        for d in (64, 128, 36, 40, 72):
            b, h, n = 2, 4, 96
            yield (f"{dtype_name} (batch, heads, seq, {d}) contiguous", (b, h, n, d),
                   (h * n * d, n * d, d, 1), size, 0)
            yield (f"{dtype_name} (batch, seq, heads, {d}) storage seen as (batch, heads, seq, "
                   f"{d})", (b, h, n, d), (n * h * d, d, h * d, 1), size, 0)
            yield (f"{dtype_name} d = {d}, rows 5: of the sequence (a slice)", (b, h, n - 5, d),
                   (h * n * d, n * d, d, 1), size, 5 * d * size)
            yield (f"{dtype_name} d = {d}, K/V heads expanded to 4 query heads (stride 0)",
                   (b, h, n, d), (n * d, 0, d, 1), size, 0)
        yield (f"{dtype_name} the first 64 of a 128-wide head dimension (a slice)",
               (2, 4, 96, 64), (4 * 96 * 128, 96 * 128, 128, 1), size, 0)
        yield (f"{dtype_name} the last 64 of a 128-wide head dimension (a slice)",
               (2, 4, 96, 64), (4 * 96 * 128, 96 * 128, 128, 1), size, 64 * size)
        yield (f"{dtype_name} every other element of a 128-wide head dimension (a step-2 slice)",
               (2, 4, 96, 64), (4 * 96 * 128, 96 * 128, 128, 2), size, 0)
        yield (f"{dtype_name} head dimension not innermost (a transposed view)",
               (2, 4, 96, 64), (4 * 96 * 64, 96 * 64, 1, 96), size, 0)
        yield (f"{dtype_name} one element past an aligned base", (2, 4, 96, 64),
               (4 * 96 * 64, 96 * 64, 64, 1), size, size)


def _library_rule(shape, strides, element_size: int, offset_bytes: int) -> bool:
    """``flashtext.kernels.descriptors.tma_ok`` on a real tensor of that layout (a view into
    a CPU buffer, whose base the allocator aligns to 64 bytes)."""
    import torch

    from flashtext.kernels.descriptors import tma_ok

    dtype = {2: torch.float16, 4: torch.float32}[element_size]
    reach = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    extent = offset_bytes // element_size + 1 + reach
    base = torch.empty(extent, dtype=dtype)
    assert base.data_ptr() % 64 == 0
    return tma_ok(base.as_strided(shape, strides, offset_bytes // element_size))


@exercise(
    "ch13.copy_engine_ok",
    "Which tiles can the copy engine fetch?",
    hints=(
        "Three conditions, all in bytes: the base address (offset_bytes here) a multiple of 16; "
        "the last stride exactly 1 element; every other stride positive and, times "
        "element_size, a multiple of 16.",
        "A stride of 0 (an expanded head axis) is not positive: a descriptor cannot step by 0 "
        "bytes. A stride of 36 fp16 elements is 72 bytes: not a multiple of 16.",
        "return offset_bytes % 16 == 0 and strides[-1] == 1 and all(s > 0 and s * "
        "element_size % 16 == 0 for s in strides[:-1])",
    ),
)
def check_copy_engine_ok(fn) -> None:
    seen = set()
    for name, shape, strides, size, offset in _layouts():
        want = _library_rule(shape, strides, size, offset)
        seen.add(want)
        got = fn(shape, strides, size, offset)
        expect(got is not None, f"{name}: your function returned None. Did you forget "
                                "`return`?")
        expect(isinstance(got, bool | np.bool_),
               f"{name}: your function returned {got!r}; expected True or False")
        expect(bool(got) == want,
               f"{name} (shape {shape}, strides {strides} elements of {size} bytes, base "
               f"{offset} bytes past an aligned address): you said {bool(got)}, the library's "
               f"rule says {want}: the copy engine {'can' if want else 'cannot'} fetch its "
               "tiles")
    assert seen == {True, False}  # the layouts exercise both answers
