"""The backward kernels: dQ, dK, dV against float64 on the same shapes as the forward, causal
and not (Triton's tutorial handles causal only: triton-lang/triton#4541), other tile shapes,
queries that see no key, NaN-poisoned out-of-bounds memory, and bitwise determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashtext import reference
from flashtext.kernels.accuracy import Case, compare, measure
from flashtext.kernels.backward import backward, preprocess
from flashtext.kernels.config import KernelConfig
from flashtext.kernels.forward import forward
from tests.kernel_helpers import (
    CPU_SWEEP,
    DEVICE,
    GPU_SWEEP,
    ON_GPU,
    _np,
    _poisoned,
    _rand,
    gpu,
    launched_on,
)


def _grads(q, k, v, do, causal, configs=None, sm_scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    o, lse = forward(q, k, v, causal, scale)
    return backward(do, q, k, v, o, lse, causal, scale, configs)


def _check_grads(q, k, v, do, causal, configs=None, atol=3e-6, sm_scale=None):
    """Gradients against float64, within ``atol`` (relative to the largest gradient). Compiled
    on a GPU with the default launch table, the bound is the accuracy module's instead, which
    also allows for the GPU's approximate exp2 (accuracy.EXP2_APPROX_ULPS); explicit tile
    configurations keep the fixed tolerance (they passed it on the H200)."""
    got = _grads(q, k, v, do, causal, configs, sm_scale)
    want = reference.attention_backward(q, k, v, do, causal=causal, scale=sm_scale)
    judge_by_bound = ON_GPU and configs is None
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == q.dtype, name
        assert torch.isfinite(g).all(), name
        if not judge_by_bound:
            np.testing.assert_allclose(_np(g), w, rtol=0,
                                       atol=atol * max(1.0, np.abs(w).max()), err_msg=name)
    if judge_by_bound:
        errors = compare(q, k, v, do, causal=causal, sm_scale=sm_scale)
        assert not errors.failures(), errors.failures()
    return got


@pytest.mark.parametrize("case", CPU_SWEEP, ids=Case.label)
def test_sweep_backward(case):
    errors = measure(case, DEVICE, grads=True)
    assert not errors.failures(), (case.label(), errors.failures())


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", GPU_SWEEP, ids=Case.label)
def test_sweep_backward_gpu(case):
    errors = measure(case, DEVICE, grads=True)
    assert not errors.failures(), (case.label(), errors.failures())


# As in test_kernels_forward: every offset N_k - N_q in [-18, 18] puts the causal diagonal at
# every residue modulo the tile sizes, for the dK/dV kernel's Q-block range as for dQ's K range.
CONFIGS = [(16, 16), (16, 32), (32, 16)]


def _configs(blocks):
    c = KernelConfig(*blocks)
    return {"bwd_pre": c, "bwd_dkdv": c, "bwd_dq": c}


@pytest.mark.parametrize("blocks", CONFIGS, ids=lambda b: f"M{b[0]}xN{b[1]}")
def test_causal_diagonal_at_every_offset(blocks):
    n_q = 20
    for offset in range(-18, 19):
        n_k = n_q + offset
        q, k, v, do = (_rand(1, 1, n, 16, seed=s) for s, n in enumerate((n_q, n_k, n_k, n_q)))
        _check_grads(q, k, v, do, True, _configs(blocks))


@pytest.mark.parametrize("blocks", CONFIGS + [(64, 16), (16, 64)],
                         ids=lambda b: f"M{b[0]}xN{b[1]}")
@pytest.mark.parametrize("n_q,n_k", [(33, 70), (70, 33), (1, 50), (50, 1)])
def test_tile_shapes_ragged(blocks, n_q, n_k):
    q, k, v, do = (_rand(2, 2, n, 16, seed=s) for s, n in enumerate((n_q, n_k, n_k, n_q)))
    for causal in (False, True):
        _check_grads(q, k, v, do, causal, _configs(blocks))


def test_queries_that_see_no_key_get_zero_gradient():
    n_q, n_k = 45, 12
    q, do = _rand(2, 2, n_q, 32, seed=1), _rand(2, 2, n_q, 32, seed=4)
    k, v = _rand(2, 2, n_k, 32, seed=2), _rand(2, 2, n_k, 32, seed=3)
    dq, dk, dv = _check_grads(q, k, v, do, causal=True)
    assert torch.all(dq[:, :, : n_q - n_k] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k,d", [(17, 100, 40), (100, 17, 24), (129, 129, 16)])
def test_no_out_of_bounds_reads(n_q, n_k, d, causal):
    q, k, v, do = (_rand(2, 2, n, d, seed=s) for s, n in enumerate((n_q, n_k, n_k, n_q)))
    scale = 1 / math.sqrt(d)
    o, lse = forward(q, k, v, causal, scale)
    plain = backward(do, q, k, v, o, lse, causal, scale)
    # same compiled variant as the plain tensors (see _poisoned): any bit of difference is an
    # out-of-bounds read
    poisoned = backward(*(_poisoned(t) for t in (do, q, k, v, o)), lse, causal, scale)
    for a, b in zip(plain, poisoned, strict=True):
        assert torch.equal(a, b)
    _check_grads(q, k, v, do, causal)


def test_any_strides_without_copy():
    q = _rand(2, 50, 3, 32, seed=4).transpose(1, 2)
    k = _rand(2, 3, 64, 64, seed=5)[..., ::2]
    v = _rand(1, 3, 64, 32, seed=6).expand(2, 3, 64, 32)
    do = _rand(1, 1, 1, 1, seed=7).expand(2, 3, 50, 32)  # what o.sum().backward() sends
    for causal in (False, True):
        scale = 1 / math.sqrt(32)
        o, lse = forward(q, k, v, causal, scale)
        # no copies: the kernels are handed the caller's own memory, not a contiguous copy
        _, read = launched_on(backward, do, q, k, v, o, lse, causal, scale)
        assert {t.data_ptr() for t in (q, k, v, do)} <= read, "the backward copied an input"
        strided = _check_grads(q, k, v, do, causal)
        # Strided and dense inputs take other load paths (pointers vs tensor descriptors) and
        # compile to other variants: both must meet the float64 bound, and they agree within
        # fp32 rounding, never bit for bit (another layout, another summation order)
        dense = _check_grads(*(t.contiguous() for t in (q, k, v, do)), causal)
        for a, b in zip(strided, dense, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * max(1.0, b.abs().max().item()))


def test_extreme_scores():
    # |lse| ~ 3500: in fp32 the recomputed P = exp(S - lse) is then off by ~u32 * |lse| relative,
    # a cost PyTorch (which stores P) does not pay; the bound includes it (accuracy.RECOMPUTE)
    q = _rand(1, 2, 70, 32, seed=7) * 30
    k, v = _rand(1, 2, 90, 32, seed=8) * 30, _rand(1, 2, 90, 32, seed=9)
    do = _rand(1, 2, 70, 32, seed=10)
    for causal in (False, True):
        errors = compare(q, k, v, do, causal=causal)
        assert not errors.failures(), errors.failures()


@pytest.mark.parametrize("sm_scale", [0.05, -0.3])
def test_custom_scale(sm_scale):
    q, k, v, do = (_rand(2, 2, n, 16, seed=s) for s, n in enumerate((30, 41, 41, 30)))
    _check_grads(q, k, v, do, causal=True, sm_scale=sm_scale)


def test_deterministic():
    # one program owns each dQ/dK/dV row, so the additions always happen in the same order
    q, k, v, do = (_rand(2, 2, 77, 32, seed=s, dtype=torch.float16) for s in range(4))
    first, second = _grads(q, k, v, do, True), _grads(q, k, v, do, True)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_delta_preprocess(dtype):
    # delta = rowsum(dO * O), accumulated in fp32 from the stored (rounded) O
    o, do = _rand(2, 3, 45, 40, seed=1, dtype=dtype), _rand(2, 3, 45, 40, seed=2, dtype=dtype)
    for config in (None, KernelConfig(16, 16)):
        delta = preprocess(o, do.transpose(2, 3).contiguous().transpose(2, 3), config)
        np.testing.assert_allclose(_np(delta), (_np(o) * _np(do)).sum(-1), rtol=1e-6,
                                   atol=1e-5)
    # ... which equals rowsum(P * dP), the length-N reduction it replaces
    q, k, v, do = (_rand(1, 1, n, 16, seed=s) for s, n in enumerate((20, 30, 30, 20)))
    p = reference.softmax(reference.scores(q, k, causal=True))
    dp = _np(do) @ _np(v).swapaxes(-1, -2)
    np.testing.assert_allclose((p * dp).sum(-1), (_np(do) * (p @ _np(v))).sum(-1), atol=1e-12)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [16, 32, 64, 128, 256])
def test_gpu_long_sequence(dtype, d):
    case = Case(1, 4, 2048, 3000, d, True, str(dtype).removeprefix("torch."), seed=d)
    errors = measure(case, DEVICE, grads=True)
    assert not errors.failures(), (case.label(), errors.failures())


def test_bound_allows_the_gpu_approximate_exp2_and_only_there():
    """Compiled, exp2 is ex2.approx (relative error ~2**-22); the interpreter's is NumPy's."""
    from flashtext.kernels.accuracy import EXP2_APPROX_ULPS, Errors

    zero = {n: 0.0 for n in ("o", "lse", "dq", "dk", "dv")}
    scale = {**{n: 1.0 for n in zero}, "lse": 0.0}
    cpu = Errors("x", torch.float32, zero, zero, scale, approx_exp=False)
    gpu = Errors("x", torch.float32, zero, zero, scale, approx_exp=True)
    assert gpu.bound("dv") - cpu.bound("dv") == pytest.approx(4 * EXP2_APPROX_ULPS * 2.0**-24)
    assert gpu.bound("o") - cpu.bound("o") == pytest.approx(2 * EXP2_APPROX_ULPS * 2.0**-24)
    assert gpu.bound("lse") == cpu.bound("lse")


def test_bound_allows_the_dp_minus_d_cancellation_and_only_for_dq_dk():
    """N_k = 1: P = 1, so dS = dP - D with D = dO . O = dP exactly, and the true dQ, dK are 0.
    In fp32, dP (a dot) and D (a row sum) round differently: the bound covers that noise."""
    from flashtext.kernels.accuracy import CANCELLATION, Errors, cancellation_scale

    q, k, v, do = (_rand(1, 2, n, 16, seed=s, device="cpu") for s, n in enumerate((300, 1, 1, 300)))
    scales = cancellation_scale(q, k, v, do, False, 0.25)
    dp = _np(do) @ np.swapaxes(_np(v), -1, -2)  # (1, 2, 300, 1); E = |dP| + |D| = 2 |dP|
    want_dq = 0.25 * np.max(2 * np.abs(dp) * np.abs(_np(k)))
    want_dk = 0.25 * np.max(np.sqrt(np.sum((2 * dp * _np(q)) ** 2, axis=-2)))
    assert scales["dq_cancellation"] == pytest.approx(want_dq)
    assert scales["dk_cancellation"] == pytest.approx(want_dk)
    # FA2's way in fp32, sums in two orders: nonzero noise, inside the allowance
    ds = (do @ v.transpose(-1, -2)) - (do * v).sum(-1, keepdim=True)
    noise = {"dq": (0.25 * ds * k).abs().max().item(),
             "dk": (0.25 * ds.transpose(-1, -2) @ q).abs().max().item()}
    assert max(noise.values()) > 0
    zero = {n: 0.0 for n in ("o", "lse", "dq", "dk", "dv")}
    with_it = Errors("x", torch.float32, zero, zero, {**zero, **scales})
    without = Errors("x", torch.float32, zero, zero, zero)
    for name in ("dq", "dk"):
        assert noise[name] <= with_it.bound(name) - without.bound(name)
        assert with_it.bound(name) - without.bound(name) == pytest.approx(
            CANCELLATION * 2.0**-24 * scales[f"{name}_cancellation"])
    assert all(with_it.bound(n) == without.bound(n) for n in ("o", "lse", "dv"))
