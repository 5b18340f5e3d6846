"""FlashAttention-4's softmax ideas in NumPy: the software exp2 and conditional rescaling."""

import numpy as np
import pytest

from flashtext import fa4_softmax as fa4
from flashtext import reference


@pytest.mark.parametrize("degree", [2, 3, 4, 5])
def test_poly_coefficients_are_float32_with_c0_one(degree):
    coeffs = fa4.exp2_poly_coefficients(degree)
    assert len(coeffs) == degree + 1 and coeffs[0] == 1.0
    assert all(float(np.float32(c)) == c for c in coeffs)
    # near ln 2 ** k / k!, the Taylor coefficients, which a minimax fit perturbs a little
    assert coeffs[1] == pytest.approx(np.log(2), rel=0.05)


def test_relative_error_falls_with_degree():
    errors = [fa4.exp2_relative_error(d, n=20_001) for d in (2, 3, 4, 5)]
    assert all(a > 10 * b for a, b in zip(errors, errors[1:], strict=False))
    # degree 3 is below bf16's and fp16's rounding of P (2**-8, 2**-11): good enough for P
    assert errors[1] < 1e-4 < 2.0**-11


def test_emulated_exp2_special_values():
    x = np.array([-np.inf, -127.0, -200.0, 0.0, -1.0, -8.0, 3.0], dtype=np.float32)
    got = fa4.exp2_emulated(x)
    # masked scores give exactly 0, integers exactly their power of two (c0 = 1)
    assert got.tolist() == [0.0, 0.0, 0.0, 1.0, 0.5, 2.0**-8, 8.0]
    with pytest.raises(ValueError, match="x <= 127"):
        fa4.exp2_emulated(np.array([128.0]))
    with pytest.raises(ValueError, match="degree"):
        fa4.exp2_poly_coefficients(0)


def test_emulated_exp2_matches_exp2():
    x = -np.random.default_rng(0).exponential(4.0, size=10_000).astype(np.float32)
    rel = np.abs(fa4.exp2_emulated(x, 3) / np.exp2(x.astype(np.float64)) - 1.0)
    assert rel.max() <= fa4.exp2_relative_error(3) * 1.01 + 2.0**-23


@pytest.mark.parametrize("threshold", [0.0, 2.0, 8.0])
def test_conditional_rescaling_is_exact(threshold):
    rng = np.random.default_rng(1)
    n_q, n_k, d = 24, 300, 16
    q, k, v = rng.normal(size=(n_q, d)), rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d))
    s = reference.scores(q, k, causal=True, scale=0.5) * np.log2(np.e)
    o, lse2, _ = fa4.online_softmax_conditional(s, v, block=32, threshold=threshold)
    o_ref, lse_ref = reference.attention(q, k, v, causal=True, scale=0.5, return_lse=True)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse2 / np.log2(np.e), lse_ref, rtol=1e-12, atol=1e-12)


def test_conditional_rescaling_skips_rescales():
    rng = np.random.default_rng(2)
    s = rng.normal(size=(8, 512)) * 2.0
    s[:, :64] += 3.0  # the row max is reached early: later blocks rarely raise it much
    v = rng.normal(size=(512, 4))
    _, _, always = fa4.online_softmax_conditional(s, v, block=64, threshold=0.0)
    _, _, sometimes = fa4.online_softmax_conditional(s, v, block=64, threshold=8.0)
    assert always == 8 and sometimes == 1  # only the first block (max from -inf) rescales


def test_rows_that_see_nothing():
    s = np.full((2, 10), -np.inf)
    s[1, 3] = 0.0
    o, lse2, _ = fa4.online_softmax_conditional(s, np.ones((10, 3)), block=4, threshold=8.0)
    assert np.isneginf(lse2[0]) and lse2[1] == 0.0
    assert o[0].tolist() == [0.0, 0.0, 0.0] and o[1].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="threshold"):
        fa4.online_softmax_conditional(s, np.ones((10, 3)), block=4, threshold=-1.0)
