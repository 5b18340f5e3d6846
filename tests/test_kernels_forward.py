"""The forward kernel: O and lse against float64, on every shape the kernel's masks must get
right (ragged lengths, N_q != N_k, causal bottom-right, queries that see no key), tile shapes
other than the default, strides, and out-of-bounds reads made visible with NaN poison."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashtext import reference
from flashtext.kernels.accuracy import Case, compare, make_inputs, measure
from flashtext.kernels.config import KernelConfig
from flashtext.kernels.forward import forward
from tests.kernel_helpers import (
    CPU_SWEEP,
    DEVICE,
    GPU_SWEEP,
    _np,
    _poisoned,
    _rand,
    gpu,
    launched_on,
)


def _check_forward(q, k, v, causal, sm_scale=None, config=None, atol=2e-6):
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    o, lse = forward(q, k, v, causal, scale, config)
    o_ref, lse_ref = reference.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    np.testing.assert_allclose(_np(o), o_ref, rtol=0, atol=atol)
    np.testing.assert_array_equal(np.isneginf(_np(lse)), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    np.testing.assert_allclose(_np(lse)[fin], lse_ref[fin], rtol=2e-6, atol=2e-6)
    return o, lse


@pytest.mark.parametrize("case", CPU_SWEEP, ids=Case.label)
def test_sweep_forward(case):
    errors = measure(case, DEVICE, grads=False)
    assert not errors.failures(), (case.label(), errors.failures())


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", GPU_SWEEP, ids=Case.label)
def test_sweep_forward_gpu(case):
    errors = measure(case, DEVICE, grads=False)
    assert not errors.failures(), (case.label(), errors.failures())


def test_sweep_covers_the_required_shapes():
    for sweep in (CPU_SWEEP, GPU_SWEEP):
        assert {1, 17, 64, 100, 129, 256} <= {c.n_q for c in sweep} & {c.n_k for c in sweep}
        assert any(c.n_q != c.n_k for c in sweep) and any(c.causal for c in sweep)
        assert all(c.batch > 1 and c.heads > 1 for c in sweep)
        assert {16, 32, 64, 128} <= {c.head_dim for c in sweep}
    assert {c.dtype for c in GPU_SWEEP} == {"float32", "float16", "bfloat16"}


# Where the causal diagonal crosses a tile depends on (N_k - N_q) modulo the tile sizes; the
# default configuration and the sweep's shapes alone would test only a few of those crossings.
# N_q = 20 and every offset N_k - N_q in [-18, 18] covers every residue modulo 16 and 32.
CONFIGS = [KernelConfig(16, 16), KernelConfig(16, 32), KernelConfig(32, 16)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"M{c.BLOCK_M}xN{c.BLOCK_N}")
def test_causal_diagonal_at_every_offset(config):
    n_q = 20
    for offset in range(-18, 19):
        n_k = n_q + offset
        q, k, v = (_rand(1, 2, n, 16, seed=s) for s, n in enumerate((n_q, n_k, n_k)))
        _check_forward(q, k, v, True, config=config)


@pytest.mark.parametrize("config", CONFIGS + [KernelConfig(64, 16), KernelConfig(16, 64)],
                         ids=lambda c: f"M{c.BLOCK_M}xN{c.BLOCK_N}")
@pytest.mark.parametrize("n_q,n_k", [(33, 70), (70, 33), (1, 50), (50, 1)])
def test_tile_shapes_ragged(config, n_q, n_k):
    q, k, v = (_rand(2, 2, n, 16, seed=s) for s, n in enumerate((n_q, n_k, n_k)))
    for causal in (False, True):
        _check_forward(q, k, v, causal, config=config)


def test_queries_that_see_no_key():
    # bottom-right alignment with N_q > N_k: query i sees keys j <= i - (N_q - N_k)
    n_q, n_k = 40, 9
    q, k, v = _rand(2, 2, n_q, 32, seed=1), _rand(2, 2, n_k, 32, seed=2), _rand(2, 2, n_k, 32,
                                                                                 seed=3)
    o, lse = _check_forward(q, k, v, causal=True)
    blind = n_q - n_k
    assert torch.all(o[:, :, :blind] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :blind]))
    assert torch.all(torch.isfinite(lse[:, :, blind:]))


def test_empty_sequences():
    q, k = _rand(2, 3, 5, 16), _rand(2, 3, 0, 16)
    o, lse = forward(q, k, k, False, 0.25)
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))
    o, lse = forward(k, q, q, True, 0.25)
    assert o.shape == (2, 3, 0, 16) and lse.shape == (2, 3, 0)


@pytest.mark.parametrize("d", [1, 8, 16, 24, 40, 64, 96, 128])
def test_head_dims(d):
    q, k, v = _rand(1, 2, 37, d, seed=0), _rand(1, 2, 45, d, seed=1), _rand(1, 2, 45, d, seed=2)
    _check_forward(q, k, v, causal=bool(d % 3))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k,d", [(17, 100, 40), (100, 17, 24), (129, 129, 16), (1, 1, 8)])
def test_no_out_of_bounds_reads(n_q, n_k, d, causal):
    q, k, v = _rand(2, 2, n_q, d, seed=0), _rand(2, 2, n_k, d, seed=1), _rand(2, 2, n_k, d, seed=2)
    qp, kp, vp = (_poisoned(t) for t in (q, k, v))
    o, lse = _check_forward(qp, kp, vp, causal)
    o_plain, lse_plain = forward(q, k, v, causal, 1 / math.sqrt(d))
    assert torch.equal(o, o_plain) and torch.equal(lse, lse_plain)


def test_any_strides_without_copy():
    base = _rand(2, 50, 3, 32, seed=4)  # (batch, seq, heads, dim), as a model produces it
    q = base.transpose(1, 2)  # (batch, heads, seq, dim) view, seq stride = 96
    k = _rand(2, 3, 64, 64, seed=5)[..., ::2]  # every other column: stride 2 along head_dim
    v = _rand(1, 3, 64, 32, seed=6).expand(2, 3, 64, 32)  # batch stride 0
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    for causal in (False, True):
        # no copies: the kernels are handed the caller's own memory, not a contiguous copy
        (o, lse), read = launched_on(_check_forward, q, k, v, causal)
        assert {t.data_ptr() for t in (q, k, v)} <= read, "the forward copied an input"
        # the contiguous tensors take another load path (tensor descriptors): agreement within
        # fp32 rounding, never bit for bit (another tile layout feeds another BLAS kernel)
        o_c, lse_c = _check_forward(q.contiguous(), k.contiguous(), v.contiguous(), causal)
        torch.testing.assert_close(o, o_c, rtol=0, atol=4e-6)
        torch.testing.assert_close(lse, lse_c, rtol=4e-6, atol=4e-6)


def test_extreme_scores_do_not_overflow():
    # scores of order +-1e3 after scaling: exp of them overflows without the running max. fp32
    # rounding of such scores is ~1e-4 absolute, so judge against PyTorch's own fp32 error.
    q = _rand(1, 2, 70, 32, seed=7) * 30
    k, v = _rand(1, 2, 90, 32, seed=8) * 30, _rand(1, 2, 90, 32, seed=9)
    for causal in (False, True):
        errors = compare(q, k, v, causal=causal)
        assert not errors.failures(), errors.failures()
    tied = torch.ones(1, 1, 40, 16, device=DEVICE)  # every score equal: a plain average
    v = _rand(1, 1, 40, 16, seed=10)
    o, _ = _check_forward(tied, tied, v, causal=False)
    torch.testing.assert_close(o[0, 0], v[0, 0].mean(0).expand(40, 16), rtol=0, atol=1e-6)


@pytest.mark.parametrize("sm_scale", [0.0, 0.05, 1.0, -0.3])
@pytest.mark.parametrize("causal", [False, True])
def test_custom_scale(sm_scale, causal):
    # 70 x 100 spans several tiles, so both the unmasked tiles (scaled late, after the row
    # max) and the masked band (scaled first) see the scale, its sign and a zero scale
    # (judged by the accuracy module's bound: with sm_scale = 1 the exponents reach ~20, and
    # a GPU's fp32 exp2 argument then rounds at ~1e-6 relative, beyond a fixed 2e-6 absolute)
    q = _rand(2, 2, 70, 16, seed=0)
    k, v = _rand(2, 2, 100, 16, seed=1), _rand(2, 2, 100, 16, seed=2)
    errors = compare(q, k, v, causal=causal, sm_scale=sm_scale)
    assert not errors.failures(), errors.failures()


@pytest.mark.parametrize("sm_scale", [-0.5, 0.5])
def test_scale_sign_with_extreme_scores(sm_scale):
    # scores of +-1e3: with a negative scale the row max of the scaled scores is the minimum of
    # the raw ones; taking max(raw) * scale instead would overflow exp2 for every other score
    q = _rand(1, 2, 70, 32, seed=11) * 8
    k, v = _rand(1, 2, 100, 32, seed=12) * 8, _rand(1, 2, 100, 32, seed=13)
    for causal in (False, True):
        errors = compare(q, k, v, causal=causal, sm_scale=sm_scale)
        assert not errors.failures(), errors.failures()


def test_deterministic():
    q, k, v = (_rand(2, 2, 77, 32, seed=s, dtype=torch.float16) for s in range(3))
    first = forward(q, k, v, True, 0.2)
    second = forward(q, k, v, True, 0.2)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [16, 32, 64, 128, 256])
def test_gpu_long_sequence(dtype, d):
    case = Case(1, 4, 4096, 3000, d, True, str(dtype).removeprefix("torch."), seed=d)
    errors = measure(case, DEVICE, grads=False)
    assert not errors.failures(), (case.label(), errors.failures())


def test_make_inputs_is_seeded():
    case = Case(2, 2, 5, 7, 16, False, "float32", seed=3)
    a, b = make_inputs(case, DEVICE), make_inputs(case, DEVICE)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
