"""Attention as real models run it: grouped-query attention (K/V heads shared by several query
heads, MQA included), sliding windows, packed variable-length batches and KV-cache decoding,
against the float64 reference, with the argument checks each entry point promises."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashtext import reference
from flashtext.kernels import (
    attention_forward,
    flash_attention,
    flash_attention_varlen,
    flash_decode,
    plan,
)
from flashtext.kernels.accuracy import Case, measure, model_cases
from tests.kernel_helpers import DEVICE, ON_GPU, FakeCompiled, _np, _rand, gpu, launched_on

CPU_MODELS = model_cases("cpu", ("float32", "float16"))
GPU_MODELS = model_cases("gpu", ("float32", "float16", "bfloat16"))


@pytest.mark.parametrize("case", CPU_MODELS, ids=Case.label)
def test_model_sweep(case):
    errors = measure(case, DEVICE, grads=True)
    assert not errors.failures(), (case.label(), errors.failures())


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", GPU_MODELS, ids=Case.label)
def test_model_sweep_gpu(case):
    errors = measure(case, DEVICE, grads=True)
    assert not errors.failures(), (case.label(), errors.failures())


def test_the_sweep_covers_what_models_use():
    for sweep, ratios in ((CPU_MODELS, {1, 2, 4}), (GPU_MODELS, {1, 4, 8})):
        assert {c.heads // c.heads_kv for c in sweep} == ratios
        assert any(c.window[0] >= 0 for c in sweep) and any(c.window[1] >= 0 for c in sweep)
        assert any(c.causal and c.window != (-1, -1) for c in sweep)
        assert any(c.n_q != c.n_k for c in sweep) and all(c.batch > 1 for c in sweep)
        # windows that end inside a tile, not on its edge
        assert any(0 < (w + 1) % 16 for c in sweep for w in c.window if w > 0)


def test_grouped_heads_are_never_repeated_in_memory():
    q, k, v = _rand(2, 8, 33, 16, seed=1), _rand(2, 2, 40, 16, seed=2), _rand(2, 2, 40, 16, seed=3)
    for t in (q, k, v):
        t.requires_grad_()
    o, read = launched_on(flash_attention, q, k, v, causal=True)
    assert {k.data_ptr(), v.data_ptr()} <= read  # the kernel reads the 2 K/V heads themselves
    _, read_bwd = launched_on(o.backward, torch.ones_like(o))
    assert {k.data_ptr(), v.data_ptr()} <= read_bwd
    assert k.grad.shape == k.shape and v.grad.shape == v.shape  # summed over each group
    want = reference.attention_backward(q, k, v, torch.ones_like(o), causal=True)
    np.testing.assert_allclose(_np(k.grad), want[1], atol=2e-5)


@pytest.mark.parametrize("n,window", [(4096, (255, 0)), (4096, (1000, 1000))])
def test_window_work_grows_with_visible_pairs(n, window):
    # the tiles a window visits: within one tile row/column of its band, never the whole square
    bm = bn = 128
    stages = plan.forward_stages(n, n, bm, bn, False, window)
    visited = int((stages != plan.NOT_VISITED).sum()) * bm * bn
    pairs = plan.visible_pairs(n, n, False, window)
    band = sum(window) + 1
    assert pairs <= visited <= pairs + (n // bm) * (band + 2 * bn) * bm
    assert visited < 0.6 * n * n


def _qkv_case(h, h_kv, n_q, n_k, d=16, dtype=torch.float32):
    return (_rand(2, h, n_q, d, seed=1, dtype=dtype), _rand(2, h_kv, n_k, d, seed=2, dtype=dtype),
            _rand(2, h_kv, n_k, d, seed=3, dtype=dtype))


@pytest.mark.parametrize("bad, match", [
    (dict(k=(2, 3, 20, 16), v=(2, 3, 20, 16)), r"multiple of k's and v's heads \(3\)"),
    (dict(v=(2, 1, 20, 16)), "k and v must have the same number of heads"),
    (dict(window_size=(2,)), "window_size must be a pair"),
    (dict(window_size=(-2, 0)), "window_size must be a pair of ints >= -1"),
    (dict(window_size=(1.5, 0)), "window_size"),
    (dict(window_size=(True, 0)), "window_size"),
    (dict(causal="False"), "causal must be True or False"),
])
def test_dense_arguments_are_checked(bad, match):
    q, k, v = _qkv_case(4, 2, 10, 20)
    shapes = {name: bad.pop(name) for name in ("k", "v") if name in bad}
    k = _rand(*shapes["k"]) if "k" in shapes else k
    v = _rand(*shapes["v"]) if "v" in shapes else v
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, **bad)


def test_causal_and_a_window_compose():
    q, k, v = _qkv_case(2, 1, 30, 50)
    o, _ = attention_forward(q, k, v, causal=True, window_size=(7, 5))  # causal: right = 0
    np.testing.assert_allclose(_np(o), reference.attention(q, k, v, window=(7, 0)), atol=2e-6)


# ------------------------------------------------------------------------- packed sequences

def _packed(lengths, heads, seed, d=16, dtype=torch.float32):
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32,
                      device=DEVICE)
    return _rand(int(sum(lengths)), heads, d, seed=seed, dtype=dtype), cu


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (6, 2)),
                                           (True, (11, -1))])
def test_varlen_matches_each_sequence_alone(causal, window):
    lens_q, lens_k = [5, 0, 40, 33, 1], [9, 3, 40, 20, 1]
    q, cu_q = _packed(lens_q, 4, 1)
    k, cu_k = _packed(lens_k, 2, 2)
    v, _ = _packed(lens_k, 2, 3)
    for t in (q, k, v):
        t.requires_grad_()
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, 40, 40, causal=causal, window_size=window)
    do = _rand(*o.shape, seed=4)
    o.backward(do)
    _, lse = flash_attention_varlen(q, k, v, cu_q, cu_k, 40, 40, causal=causal,
                                    window_size=window, return_lse=True)
    assert lse.shape == (4, q.shape[0])
    for b in range(len(lens_q)):
        qs, ks = slice(*cu_q[b:b + 2].tolist()), slice(*cu_k[b:b + 2].tolist())
        per = [t[s].transpose(0, 1) for t, s in ((q, qs), (k, ks), (v, ks))]
        want, want_lse = reference.attention(*per, causal=causal, window=window,
                                             return_lse=True)
        np.testing.assert_allclose(_np(o[qs].transpose(0, 1)), want, atol=3e-6)
        fin = np.isfinite(want_lse)
        assert np.array_equal(np.isneginf(_np(lse[:, qs])), np.isneginf(want_lse))
        np.testing.assert_allclose(_np(lse[:, qs])[fin], want_lse[fin], rtol=3e-6, atol=3e-6)
        grads = reference.attention_backward(*per, do[qs].transpose(0, 1), causal=causal,
                                             window=window)
        for got, w in zip((q.grad[qs], k.grad[ks], v.grad[ks]), grads, strict=True):
            np.testing.assert_allclose(_np(got.transpose(0, 1)), w,
                                       atol=5e-6 * max(1.0, np.abs(w).max(initial=0)))


def test_varlen_never_attends_across_sequences():
    lens = [17, 23]
    q, cu = _packed(lens, 2, 1)
    k, _ = _packed(lens, 2, 2)
    v, _ = _packed(lens, 2, 3)
    o1 = flash_attention_varlen(q, k, v, cu, cu, 23, 23)
    k2, v2 = k.clone(), v.clone()
    k2[17:] = 1e4  # the second sequence's keys and values change completely
    v2[17:] = float("nan")
    o2 = flash_attention_varlen(q, k2, v2, cu, cu, 23, 23)
    assert torch.equal(o1[:17], o2[:17])  # the same code on the same first sequence
    for t in (q, k2, v2):
        t.requires_grad_()
    o2 = flash_attention_varlen(q, k2, v2, cu, cu, 23, 23)
    o2[:17].sum().backward()
    assert torch.isfinite(q.grad[:17]).all() and torch.isfinite(k2.grad[:17]).all()
    assert torch.isfinite(v2.grad[:17]).all() and torch.isfinite(v2.grad[17:]).all()


@pytest.mark.parametrize("change, match", [
    (dict(cu_seqlens_q=lambda cu: cu.long()), "cu_seqlens_q must be a 1-D torch.int32"),
    (dict(cu_seqlens_q=lambda cu: cu + 1), "cu_seqlens_q must start at 0"),
    (dict(cu_seqlens_k=lambda cu: cu.flip(0)), "cu_seqlens_k must start at 0|non-decreasing"),
    (dict(cu_seqlens_k=lambda cu: torch.tensor([0, 9, 4, 12], dtype=torch.int32,
                                                device=cu.device)), "non-decreasing"),
    (dict(cu_seqlens_q=lambda cu: cu[:-1]), "must end at the total length"),
    (dict(max_seqlen_q=lambda m: 3), r"max_seqlen_q \(3\) is below the longest sequence"),
    (dict(max_seqlen_k=lambda m: -1), "max_seqlen_k must be a non-negative int"),
])
def test_varlen_arguments_are_checked(change, match):
    q, cu = _packed([4, 5, 3], 2, 1)
    args = dict(q=q, k=q, v=q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    for name, fn in change.items():
        args[name] = fn(args[name])
    with pytest.raises(ValueError, match=match):
        flash_attention_varlen(**args)


# ------------------------------------------------------------------------------- decoding

def _cache(batch, h_kv, capacity, d, seed, dtype=torch.float32):
    return _rand(batch, h_kv, capacity, d, seed=seed, dtype=dtype), \
        _rand(batch, h_kv, capacity, d, seed=seed + 1, dtype=dtype)


def _paged(kc, vc, block_size, seed):
    """The same cache, scattered into shuffled physical blocks with a block table."""
    batch, h_kv, capacity, d = kc.shape
    per = capacity // block_size
    total = batch * per + 3  # some blocks nobody uses
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:batch * per]
    table = perm.view(batch, per).to(torch.int32).to(kc.device)
    kp = torch.full((total, h_kv, block_size, d), float("nan"), dtype=kc.dtype, device=kc.device)
    vp = kp.clone()
    for b in range(batch):
        for i in range(per):
            kp[table[b, i]] = kc[b, :, i * block_size:(i + 1) * block_size]
            vp[table[b, i]] = vc[b, :, i * block_size:(i + 1) * block_size]
    return kp, vp, table


@pytest.mark.parametrize("h,h_kv", [(8, 8), (8, 2), (8, 1)])
@pytest.mark.parametrize("n_new", [1, 3])
@pytest.mark.parametrize("paged", [None, 16, 64])
def test_decode_matches_reference(h, h_kv, n_new, paged):
    lens = [128, 37, n_new + 2]
    kc, vc = _cache(3, h_kv, 128, 32, seed=5)
    q = _rand(3, h, n_new, 32, seed=7)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    args = (kc, vc) if paged is None else _paged(kc, vc, paged, seed=9)[:2]
    table = None if paged is None else _paged(kc, vc, paged, seed=9)[2]
    # every split count once, the automatic choice everywhere
    for splits in (None, 1, 3) if (h_kv, paged) == (2, 16) else (None,):
        o, lse = flash_decode(q, *args, seqlens, block_table=table, num_splits=splits,
                              return_lse=True)
        for b, n in enumerate(lens):
            want, want_lse = reference.attention(q[b], kc[b, :, :n], vc[b, :, :n], causal=True,
                                                 return_lse=True)
            np.testing.assert_allclose(_np(o[b]), want, atol=3e-6)
            np.testing.assert_allclose(_np(lse[b]), want_lse, rtol=3e-6, atol=3e-6)


def test_decode_split_is_the_rule_worked_out_once_per_shape(monkeypatch):
    """The automatic split is splitkv's rule for the launch's programs, and a step of a shape
    seen before does not run the rule again (at batch 1 a step's host time is its time)."""
    from flashtext import splitkv
    from flashtext.kernels import decode

    decode._splits_for.cache_clear()
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return splitkv.choose_num_splits(*args, **kwargs)

    monkeypatch.setattr(decode, "choose_num_splits", counting)
    for batch, heads, h_kv, n_k in ((1, 32, 8, 65536), (1, 8, 8, 4096), (16, 32, 8, 32768)):
        q = torch.empty(batch, heads, 1, 128, dtype=torch.float16, device=DEVICE)
        block_m, block_n = decode._blocks(128, heads // h_kv)[:2]
        rows = -(-(heads // h_kv) // block_m) * block_m  # the group's rows, whole blocks
        want = splitkv.choose_num_splits(batch, h_kv, rows, n_k, sms=2 * 132, block_m=block_m,
                                         block_n=block_n)
        if not ON_GPU:  # 132 SMs stand in for the GPU on a CPU
            assert decode.default_splits(q, h_kv, n_k) == want, (batch, heads, h_kv, n_k)
        for _ in range(3):
            decode.default_splits(q, h_kv, n_k)
    assert len(calls) == 3, calls  # once per shape


class _FakeJit:
    """A JIT function with parameters (A, N, C, D): two runtime, two constexpr."""

    arg_names = ["A", "N", "C", "D"]

    def __init__(self):
        self.slow, self.compiled = [], FakeCompiled()

    def __getitem__(self, grid):
        def run(*args, num_warps, **constexprs):
            self.slow.append((grid, args, constexprs, num_warps))
            return self.compiled
        return run


def test_a_repeated_decode_step_takes_the_compiled_kernel(monkeypatch):
    """A step whose arguments Triton would specialise as an earlier step's launches the kernel
    that step compiled, skipping Triton's binding; any difference goes back to Triton."""
    from flashtext.kernels import decode, fastpath

    monkeypatch.setattr(decode._boot, "INTERPRETING", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fastpath, "COMPILED", {})
    k, a = _FakeJit(), torch.zeros(8)
    decode._launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=4)
    assert len(k.slow) == 1 and not k.compiled.calls
    decode._launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=4)
    # runtime arguments, then the constexprs in the kernel's parameter order; grid made 3-D
    assert k.compiled.calls == [((2, 3, 1), (a, 100, 7, 5))] and len(k.slow) == 1
    decode._launch(k, (2, 3), (a, 101), dict(D=5, C=7), num_warps=4)  # another integer
    decode._launch(k, (2, 3), (a[1:], 100), dict(D=5, C=7), num_warps=4)  # another alignment
    decode._launch(k, (2, 3), (a, 100), dict(D=6, C=7), num_warps=4)  # another constexpr
    decode._launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=8)  # another launch option
    assert len(k.slow) == 5 and len(k.compiled.calls) == 1
    monkeypatch.setattr(decode._boot, "INTERPRETING", True)  # the interpreter: Triton's path
    decode._launch(k, (2, 3), (a, 100), dict(D=5, C=7), num_warps=4)
    assert len(k.slow) == 6 and len(k.compiled.calls) == 1


@gpu
def test_decode_steps_after_the_first_match_it():
    """The fast path gives the bits Triton's launch gave, for every split and cache kind."""
    from flashtext.kernels import fastpath

    kc, vc = _cache(2, 2, 320, 64, seed=5, dtype=torch.float16)
    q = _rand(2, 8, 1, 64, seed=6, dtype=torch.float16)
    lens = torch.tensor([301, 77], dtype=torch.int32, device=DEVICE)
    kp, vp, table = _paged(kc, vc, 16, seed=7)
    for splits in (1, 3, None):
        for cache in ((kc, vc, None), (kp, vp, table)):
            fastpath.COMPILED.clear()
            first = flash_decode(q, *cache[:2], lens, block_table=cache[2], num_splits=splits,
                                 return_lse=True)
            assert fastpath.COMPILED, "the first step remembered no kernel"
            for _ in range(2):
                again = flash_decode(q, *cache[:2], lens, block_table=cache[2],
                                     num_splits=splits, return_lse=True)
                assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))


def test_decode_arguments_are_checked():
    kc, vc = _cache(2, 2, 64, 16, seed=1)
    q = _rand(2, 4, 1, 16, seed=2)
    ok = torch.tensor([64, 10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 65.*capacity 64"):
        flash_decode(q, kc, vc, ok + torch.tensor([1, 0], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="cache_seqlens must be a torch.int32"):
        flash_decode(q, kc, vc, ok.long())
    with pytest.raises(ValueError, match="inference-only"):
        flash_decode(q.clone().requires_grad_(), kc, vc, ok)
    with pytest.raises(ValueError, match=r"multiple of the caches' heads \(3"):
        flash_decode(_rand(2, 4, 1, 16), *_cache(2, 3, 64, 16, seed=1), ok)
    kp, vp, table = _paged(kc, vc, 16, seed=3)
    bad = table.clone()
    bad[1, 0] = kp.shape[0]  # one past the last physical block
    with pytest.raises(ValueError, match=r"block_table\[1\] names block"):
        flash_decode(q, kp, vp, ok, block_table=bad)
    bad[1, 0] = table[1, 0]
    bad[1, 3] = -1  # outside what sequence 1 (10 keys, one block) uses: allowed
    flash_decode(q, kp, vp, ok, block_table=bad)
    with pytest.raises(ValueError, match="block_table must be a torch.int32"):
        flash_decode(q, kp, vp, ok, block_table=table.long())


# ----------------------------------------------------------------------------- API edges

def test_double_backward_raises_instead_of_a_wrong_number():
    # a gradient penalty needs the second derivative, which the kernels do not provide: the
    # graph-building backward refuses, rather than return dq without its second-order term
    q, k, v = (t.requires_grad_() for t in _qkv_case(2, 2, 12, 12))
    o = flash_attention(q, k, v)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        flash_attention(q, k, v).sum().backward(create_graph=True)
    (dq,) = torch.autograd.grad(flash_attention(q, k, v).square().sum(), q)  # once is fine
    assert not dq.requires_grad


def test_meta_tensors_give_shapes_without_running_a_kernel():
    q = torch.empty(2, 8, 100, 64, device="meta", requires_grad=True)
    k = torch.empty(2, 2, 300, 64, device="meta", requires_grad=True)
    o = flash_attention(q, k, k, causal=True)
    assert o.device.type == "meta" and o.shape == q.shape
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    o, lse = attention_forward(q, k, k)
    assert lse.shape == (2, 8, 100) and lse.device.type == "meta"
    dec = flash_decode(q[:, :, :1].detach(), k.detach(), k.detach(),
                       torch.empty(2, dtype=torch.int32, device="meta"))
    assert dec.shape == (2, 8, 1, 64) and dec.device.type == "meta"


@pytest.mark.skipif(ON_GPU, reason="on a GPU CPU tensors are the unsupported device")
def test_an_unsupported_device_is_named():
    q = torch.empty(1, 1, 4, 16, device="meta")
    with pytest.raises(ValueError, match="q and k must be on one device"):
        flash_attention(q, torch.empty(1, 1, 4, 16), torch.empty(1, 1, 4, 16))


def test_the_autograd_function_is_not_a_public_entry_point():
    import flashtext.kernels as kernels

    assert not any("Function" in name for name in kernels.__all__)
    assert not hasattr(kernels, "FlashAttentionFunction")
    assert math.isclose(1.0, 1.0)  # the public entry points validate; see the tests above
