"""Split-KV (Flash-Decoding): the float64 library version, the occupancy arithmetic, and the
Triton kernels (interpreter on CPU, compiled on a GPU) against the float64 reference."""

import numpy as np
import pytest
import torch

from flashtext import _boot, reference, splitkv


def _qkv(rng, batch, heads, n_q, n_k, d, dtype=torch.float32):
    def make(n):
        return torch.tensor(rng.standard_normal((batch, heads, n, d)), dtype=dtype)
    return make(n_q), make(n_k), make(n_k)


def test_split_bounds():
    assert splitkv.split_bounds(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert splitkv.split_bounds(3, 5) == [(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]
    assert splitkv.split_bounds(7, 1) == [(0, 7)]
    with pytest.raises(ValueError, match="num_splits"):
        splitkv.split_bounds(7, 0)
    with pytest.raises(ValueError, match="n_k"):
        splitkv.split_bounds(-1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 13])
@pytest.mark.parametrize("n_q, n_k", [(1, 50), (7, 50), (60, 50)])
def test_numpy_split_equals_reference(causal, num_splits, n_q, n_k):
    rng = np.random.default_rng(num_splits)
    q, k, v = (rng.standard_normal((2, n, 16)) for n in (n_q, n_k, n_k))
    out, lse = splitkv.split_attention(q, k, v, num_splits, causal=causal, return_lse=True)
    ref_out, ref_lse = reference.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)  # includes -inf rows (n_q > n_k)


def test_partials_are_each_chunk_alone():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((3, n, 8)) for n in (2, 40, 40))
    out, lse, parts, part_lse = splitkv.split_attention(q, k, v, 4, return_lse=True,
                                                         return_partials=True)
    assert parts.shape == (4, 3, 2, 8) and part_lse.shape == (4, 3, 2)
    for s, (a, b) in enumerate(splitkv.split_bounds(40, 4)):
        ref_o, ref_l = reference.attention(q, k[:, a:b], v[:, a:b], return_lse=True)
        np.testing.assert_allclose(parts[s], ref_o, atol=1e-12)
        np.testing.assert_allclose(part_lse[s], ref_l, atol=1e-12)
    with pytest.raises(ValueError, match="start"):
        splitkv.partial_attention(q, k, v, 30, 20)
    with pytest.raises(ValueError, match="head dimension"):
        splitkv.partial_attention(q, k[..., :4], v, 0, 5)


def test_occupancy_arithmetic():
    assert splitkv.num_programs(1, 8, 1, 16) == 8
    assert splitkv.num_programs(1, 8, 1, 16, num_splits=16) == 128
    assert splitkv.busy_sms(8) == 8 and splitkv.busy_sms(500) == 132
    assert splitkv.wave_efficiency(132) == 1.0
    assert splitkv.wave_efficiency(133) == pytest.approx(133 / 264)
    # batch 1, 8 heads, 64k keys: 14 splits put 112 programs on 132 SMs. The best eligible
    # count reaches ~0.99 (33 and 66 splits give the same chunk size as 32 and 65, so they are
    # skipped), and 14 is the fewest within 85% of it
    assert splitkv.choose_num_splits(1, 8, 1, 65536) == 14
    assert splitkv.wave_efficiency(8 * 13) < 0.85 * 0.99 < splitkv.wave_efficiency(8 * 14)
    assert splitkv.choose_num_splits(64, 32, 1, 65536) == 1  # a big batch fills the GPU alone
    assert splitkv.choose_num_splits(1, 1, 1, 64) == 1  # one block of keys: nothing to split
    # flash-attention's own example: 48 programs on 108 SMs -> 2 splits (0.89), not 3 (0.67)
    assert splitkv.choose_num_splits(1, 48, 1, 8192, sms=108) == 2
    with pytest.raises(ValueError, match="heads"):
        splitkv.num_programs(1, 0, 1, 16)


kernels = pytest.importorskip("flashtext.kernels.splitkv")
DEVICE = "cpu" if _boot.INTERPRETING else "cuda"


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6 if _boot.INTERPRETING else 5e-3),
                                        (torch.float16, 2e-3)])
@pytest.mark.parametrize("batch, heads, n_q, n_k, d, causal, num_splits", [
    (1, 2, 1, 300, 64, False, 4),    # decode: one query, a long cache
    (2, 1, 5, 77, 40, True, 3),      # ragged: d not a power of two, n_k not a block multiple
    (1, 1, 20, 50, 16, True, 8),     # more splits than blocks: empty trailing chunks
    (1, 1, 9, 6, 32, True, 2),       # n_q > n_k, causal: rows that see no key at all
    (1, 3, 2, 65, 16, False, 1),     # no split: the combine is the identity
])
def test_kernel_matches_reference(dtype, tol, batch, heads, n_q, n_k, d, causal, num_splits):
    rng = np.random.default_rng(n_k)
    q, k, v = (t.to(DEVICE) for t in _qkv(rng, batch, heads, n_q, n_k, d, dtype))
    out, lse = kernels.splitkv_attention(q, k, v, causal=causal, num_splits=num_splits,
                                         return_lse=True)
    ref_out, ref_lse = reference.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    np.testing.assert_allclose(out.double().cpu().numpy(), ref_out, atol=tol, rtol=tol)
    got_lse = lse.double().cpu().numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(got_lse[finite], ref_lse[finite], atol=1e-4, rtol=1e-5)


def test_kernel_partials_match_numpy_partials():
    rng = np.random.default_rng(3)
    q, k, v = (t.to(DEVICE) for t in _qkv(rng, 1, 2, 3, 70, 16))
    parts, part_lse = kernels.splitkv_partials(q, k, v, num_splits=3, causal=True)
    # the kernel's chunks are whole key blocks: recover its bounds from the chunk size
    from flashtext.kernels.decode import _blocks

    block_n = _blocks(16, 3)[1]
    chunk = block_n * int(np.ceil(np.ceil(70 / 3) / block_n))
    for s in range(3):
        a, b = min(s * chunk, 70), min((s + 1) * chunk, 70)
        ref_o, ref_l = splitkv.partial_attention(q, k, v, a, b, causal=True)
        np.testing.assert_allclose(parts[:, :, s].double().cpu().numpy(), ref_o, atol=2e-5)
        got = part_lse[:, :, s].double().cpu().numpy()
        assert np.array_equal(np.isneginf(got), np.isneginf(ref_l))
        np.testing.assert_allclose(got[np.isfinite(ref_l)], ref_l[np.isfinite(ref_l)],
                                   atol=2e-5)


def test_kernel_auto_splits_and_validation():
    rng = np.random.default_rng(4)
    q, k, v = (t.to(DEVICE) for t in _qkv(rng, 1, 1, 1, 200, 16))
    out = kernels.splitkv_attention(q, k, v)  # num_splits chosen for 132 SMs
    np.testing.assert_allclose(out.double().cpu().numpy(), reference.attention(q, k, v),
                               atol=1e-5)
    with pytest.raises(ValueError, match="share one dtype"):
        kernels.splitkv_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="batch, heads, N, d"):
        kernels.splitkv_attention(q[0], k, v)
    with pytest.raises(ValueError, match="num_splits"):
        kernels.splitkv_attention(q, k, v, num_splits=0)
    with pytest.raises(ValueError, match="head dimension"):
        kernels.splitkv_attention(q, k[..., :8], v[..., :8])
    if _boot.INTERPRETING:
        with pytest.raises(ValueError, match="bfloat16"):
            kernels.splitkv_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())


def test_kernel_refuses_what_it_cannot_do():
    rng = np.random.default_rng(5)
    q, k, v = (t.to(DEVICE) for t in _qkv(rng, 1, 1, 2, 40, 16))
    with pytest.raises(ValueError, match="causal must be True or False"):
        kernels.splitkv_attention(q, k, v, causal="False")  # a truthy string is no mask choice
    for bad in (float("nan"), float("inf"), "x", True):
        with pytest.raises(ValueError, match="scale must be a finite number"):
            kernels.splitkv_attention(q, k, v, scale=bad)
    with pytest.raises(ValueError, match="head dimension of at least 1"):
        kernels.splitkv_attention(q[..., :0], k[..., :0], v[..., :0])
    with pytest.raises(ValueError, match="inference-only"):
        kernels.splitkv_attention(q.clone().requires_grad_(), k, v)
    with pytest.raises(ValueError, match="num_splits"):
        kernels.splitkv_partials(q, k, v, num_splits=0)
