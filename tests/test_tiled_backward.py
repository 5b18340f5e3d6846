import warnings

import numpy as np
import pytest
import torch

from flashtext import cost, fa2
from flashtext import reference as ref
from flashtext import tiled_backward as bw

ALIGNS = ("bottom_right", "top_left")


def _inputs(rng, n_q, n_k, d=8, dv=5, lead=(2,)):
    return (rng.standard_normal((*lead, n_q, d)), 2 * rng.standard_normal((*lead, n_k, d)),
            rng.standard_normal((*lead, n_k, dv)), rng.standard_normal((*lead, n_q, dv)))


def _grads(q, k, v, do, causal=False, align="bottom_right", **blocks):
    o, lse = fa2.flash2_forward(q, k, v, causal, align=align)
    return bw.flash2_backward(q, k, v, o, lse, do, causal, align=align, **blocks)


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (7, 33), (33, 7), (40, 40), (65, 50)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ALIGNS)
def test_backward_matches_reference(n_q, n_k, causal, align):
    rng = np.random.default_rng(n_q * 100 + n_k)
    q, k, v, do = _inputs(rng, n_q, n_k)
    expected = ref.attention_backward(q, k, v, do, causal, align=align)
    for bm, bn in [(1, 1), (16, 8), (8, 32)]:
        got = _grads(q, k, v, do, causal, align, BLOCK_M=bm, BLOCK_N=bn)
        for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(13, 13), (11, 17), (17, 11)])
def test_gradcheck_against_finite_differences(causal, n_q, n_k):
    g = torch.Generator().manual_seed(n_q + n_k)
    q = torch.randn(2, n_q, 4, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, n_k, 4, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(2, n_k, 3, dtype=torch.float64, generator=g, requires_grad=True)

    def f(q, k, v):  # blocks of 4 and 5: no length is a multiple of either
        return bw.numpy_attention(q, k, v, causal, None, "bottom_right", 4, 5)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_agrees_with_torch_autograd_of_standard_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 37, 16, dtype=torch.float64, generator=g) for _ in range(4))
    for causal in (False, True):
        qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        o.backward(do)
        qf, kf, vf = (x.clone().requires_grad_() for x in (q, k, v))
        bw.numpy_attention(qf, kf, vf, causal, None, "top_left", 16, 8).backward(do)
        for a, b in ((qf, qs), (kf, ks), (vf, vs)):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_delta_is_one_number_per_row_and_equals_rowsum_p_dp():
    rng = np.random.default_rng(1)
    q, k, v, do = _inputs(rng, 30, 20)
    p = ref.softmax(ref.scores(q, k))
    o = p @ v
    delta = bw.attention_delta(o, do)
    assert delta.shape == (2, 30)  # R^N per head, not R^d (flash-attention #2555)
    dp = do @ np.swapaxes(v, -1, -2)
    np.testing.assert_allclose(delta, np.sum(p * dp, axis=-1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        bw.attention_delta(o, do[..., :2])


def test_p_rebuilt_from_lse_is_the_normalised_softmax():
    rng = np.random.default_rng(2)
    q, k, v, _ = _inputs(rng, 25, 40, lead=())
    q *= 50  # large scores
    _, lse = fa2.flash2_forward(q, k, v)
    s = ref.scores(q, k)
    p = np.exp(s - lse[:, None])
    np.testing.assert_allclose(p, ref.softmax(s), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    unnormalised = np.exp(s - s.max(axis=1, keepdims=True))  # subtracting only the max
    assert np.abs(unnormalised.sum(axis=1) - 1).max() > 1e-3


def test_rows_without_keys_get_zero_gradients_without_warnings():
    rng = np.random.default_rng(3)
    q, k, v, do = _inputs(rng, 20, 6, lead=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dq, dk, dv = _grads(q, k, v, do, causal=True, BLOCK_M=4, BLOCK_N=4)
    assert np.all(dq[:14] == 0)
    for g, e in zip((dq, dk, dv), ref.attention_backward(q, k, v, do, True), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_counts_and_flops_of_the_backward():
    rng = np.random.default_rng(4)
    n, d = 128, 16
    q, k, v, do = _inputs(rng, n, n, d=d, dv=d, lead=())
    o, lse = fa2.flash2_forward(q, k, v)
    counts = fa2.BlockCounts()
    bw.flash2_backward(q, k, v, o, lse, do, BLOCK_M=32, BLOCK_N=32, counts=counts)
    # five matmuls per tile (S, dV, dP, dK, dQ): 2.5x the forward's two
    assert 10 * d * counts.scores == cost.attention_flops(1, 1, n, d, mode="bwd")
    counts = fa2.BlockCounts()
    bw.flash2_backward(q, k, v, o, lse, do, True, BLOCK_M=32, BLOCK_N=32, counts=counts)
    c = fa2.count_blocks(n, n, 32, 32, True)
    assert (counts.skipped, counts.masked, counts.full, counts.scores) == \
        (c.skipped, c.masked, c.full, c.scores)


def test_flash_backward_memory_grows_like_n_standard_like_n_squared():
    rng = np.random.default_rng(5)
    peaks = {}
    for n in (512, 1024):
        q, k, v, do = _inputs(rng, n, n, d=32, dv=32, lead=())
        o, lse = fa2.flash2_forward(q, k, v)
        peaks[n] = (bw.peak_bytes(ref.attention_backward, q, k, v, do),
                    bw.peak_bytes(bw.flash2_backward, q, k, v, o, lse, do,
                                  BLOCK_M=64, BLOCK_N=64))
    (std_a, flash_a), (std_b, flash_b) = peaks[512], peaks[1024]
    assert std_a >= 3 * 512 * 512 * 8  # several N x N float64 matrices alive at once
    assert std_b / std_a > 3.5  # quadratic
    assert flash_b / flash_a < 2.5  # linear (plus fixed tiles)
    assert flash_b < 1024 * 1024 * 8 / 3  # a third of ONE N x N matrix
    assert bw.peak_bytes(np.ones, 1000) >= 8000


def test_bad_arguments_are_named():
    q = np.zeros((4, 8))
    o, lse = fa2.flash2_forward(q, q, q)
    with pytest.raises(ValueError, match="o and do"):
        bw.flash2_backward(q, q, q, o, lse, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="lse"):
        bw.flash2_backward(q, q, q, o, lse[:2], o)
    with pytest.raises(ValueError, match="BLOCK_N"):
        bw.flash2_backward(q, q, q, o, lse, o, BLOCK_N=-1)
