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
