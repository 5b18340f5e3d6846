"""Which kernels flash_attention runs (flashtext.kernels.dispatch).

On the CPU: the forward's rule by shape, the widest key span against the mask itself, the
routing of forward and backward (with the Gluon kernels' support checks and launches stood in
for), and the errors. On an sm_90 GPU: the default really launches the Gluon forward where the
rule says so and the Gluon dK/dV wherever it runs, and O, lse and the gradients through them
hold the accuracy rule against float64.
"""

import itertools

import numpy as np
import pytest
import torch

from flashtext import reference
from flashtext.kernels import attention_backward, attention_forward, dispatch, flash_attention
from flashtext.kernels import backward as triton_backward_module
from flashtext.kernels import gluon_backward as gb
from flashtext.kernels import gluon_forward as gf
from flashtext.kernels.accuracy import compare
from tests.kernel_helpers import DEVICE, ON_GPU

SM90 = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and gf.HAVE_GLUON
sm90 = pytest.mark.skipif(not SM90, reason="needs an sm_90 (Hopper) GPU and Triton with Gluon")


def _brute_span(n_q, n_k, causal, window, axis=1):
    """The most keys a query sees (axis 1), or the most queries a key is seen by (axis 0)."""
    left, right = window
    keep = reference.window_mask(n_q, n_k, (left, 0 if causal else right)) if (
        causal or window != (-1, -1)) else np.ones((n_q, n_k), bool)
    return int(keep.sum(axis=axis).max(initial=0))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (5, 0), (0, 7), (9, 3), (-1, 4), (6, -1),
                                    (40, 40)])
def test_widest_key_span_is_the_most_keys_any_query_sees(causal, window):
    for n_q, n_k in itertools.product([0, 1, 7, 16, 33], [0, 1, 9, 16, 40]):
        got = dispatch.widest_key_span(n_q, n_k, causal, window)
        assert got == _brute_span(n_q, n_k, causal, window), (n_q, n_k, causal, window)
        got = dispatch.widest_query_span(n_q, n_k, causal, window)
        assert got == _brute_span(n_q, n_k, causal, window, axis=0), (n_q, n_k, causal, window)


def test_the_rule_by_shape():
    at = dispatch.GLUON_MIN_MASKED_KEYS
    assert at == {64: 4096, 128: 2048, 256: 0}
    for n in (1, 100, 1024, 4096, 65536):
        for d in (64, 128):  # unmasked: Gluon at every N
            assert dispatch.prefers_gluon(d, n, n, False)
        assert dispatch.prefers_gluon(256, n, n, True)  # d = 256: Gluon, masked or not
        assert not dispatch.prefers_gluon(96, n, n, False)  # padded head dims: Triton only
    for d in (64, 128):
        # masked: Gluon from the first length at which a query sees `at[d]` keys
        assert not dispatch.prefers_gluon(d, at[d] - 1, at[d] - 1, True)
        assert dispatch.prefers_gluon(d, at[d], at[d], True)
        assert dispatch.prefers_gluon(d, 1, at[d], True)  # one query, at the end, sees all keys
        # a window of at[d] - 1 keys, then of at[d]
        assert not dispatch.prefers_gluon(d, 65536, 65536, True, (at[d] - 2, 0))
        assert dispatch.prefers_gluon(d, 65536, 65536, True, (at[d] - 1, 0))
    assert not dispatch.prefers_gluon(128, 65536, 65536, False, (1000, 1000))
    assert dispatch.prefers_gluon(128, 65536, 65536, False, (1024, 1023))


def test_the_persistent_rule_by_shape():
    most = dispatch.PERSISTENT_MAX_MASKED_KEYS
    assert most == {64: 4096, 128: 2048}
    for n in (1, 100, 1024, 4096, 65536):
        for d in (64, 128):  # unmasked: persistent at every N
            assert dispatch.prefers_persistent(d, n, n, False)
        assert not dispatch.prefers_persistent(256, n, n, False)  # no room for O's buffer
    for d in (64, 128):
        # masked: persistent while no query sees more than most[d] keys
        assert dispatch.prefers_persistent(d, most[d], most[d], True)
        assert not dispatch.prefers_persistent(d, most[d] + 1, most[d] + 1, True)
        assert not dispatch.prefers_persistent(d, 1, most[d] + 1, True)  # the last query
        assert dispatch.prefers_persistent(d, 65536, 65536, True, (most[d] - 1, 0))
        assert not dispatch.prefers_persistent(d, 65536, 65536, True, (most[d], 0))
    # where both hold, the masked Gluon forward at d = 128 starts persistent: one length only
    assert [n for n in (1024, 2048, 4096) if dispatch.prefers_gluon(128, n, n, True)
            and dispatch.prefers_persistent(128, n, n, True)] == [2048]


def test_the_three_consumer_rule_by_shape():
    most = dispatch.PERSISTENT_MAX_MASKED_KEYS[64]
    for n in (1, 100, 4096, 65536):  # unmasked d = 64: three, at every length
        assert dispatch.prefers_three_consumers(64, n, n, False)
        assert not dispatch.prefers_three_consumers(128, n, n, False)
        assert not dispatch.prefers_three_consumers(256, n, n, False)
    # masked: two (persistent) while no query sees more than most keys, three past it
    assert not dispatch.prefers_three_consumers(64, most, most, True)
    assert dispatch.prefers_three_consumers(64, most + 1, most + 1, True)
    assert not dispatch.prefers_three_consumers(64, 65536, 65536, True, (most - 1, 0))
    assert dispatch.prefers_three_consumers(64, 65536, 65536, True, (most, 0))
    assert not dispatch.prefers_three_consumers(128, 65536, 65536, True)


def test_cpu_and_float32_inputs_run_the_triton_forward():
    q = torch.randn(1, 2, 64, 128)
    assert dispatch.choose_forward(q, q, q, False) == "triton"  # not on an sm_90 GPU
    if SM90:
        g = q.cuda()
        assert dispatch.choose_forward(g, g, g, False) == "triton"  # float32
        h = g.half()
        assert dispatch.choose_forward(h, h, h, False) == "gluon"
        assert dispatch.choose_forward(h[..., :96], h[..., :96], h[..., :96], False) == "triton"


def test_auto_follows_the_rule_where_gluon_could_run(monkeypatch):
    """Routing: with the Gluon kernel's support check and launch stood in for, "auto" sends
    exactly the cases the rule names to it, and "triton" never does."""
    calls = []

    def fake_launch(q, k, v, causal, sm_scale, window=(-1, -1), checked=False, persistent=False,
                    consumers=2, open_left=False):
        assert checked  # the dispatch asked gluon_supported itself: the launch need not again
        calls.append((q.shape[-1], q.shape[2], causal, tuple(window), persistent, consumers,
                      open_left))
        return (torch.full(q.shape, 7.0, device=q.device),
                torch.zeros(q.shape[:-1], device=q.device), None)

    checks = []
    monkeypatch.setattr(gf, "gluon_supported", lambda *args: checks.append(args) or True)
    monkeypatch.setattr(gf, "launch", fake_launch)
    for d, n, causal, window in [(128, 64, False, (-1, -1)), (128, 64, True, (-1, -1)),
                                 (64, 64, False, (-1, -1)), (64, 64, True, (-1, -1)),
                                 (64, 5000, True, (-1, -1)), (64, 5000, False, (-1, 4096)),
                                 (128, 64, False, (8, 8)), (256, 64, True, (-1, -1)),
                                 (256, 64, False, (-1, -1))]:
        calls.clear()
        checks.clear()
        q = torch.randn(1, 1, n, d).to(DEVICE)
        o, _ = attention_forward(q, q, q, causal=causal, window_size=window)
        assert len(checks) == 1  # one support check a call, whichever kernel runs
        wanted = dispatch.prefers_gluon(d, n, n, causal, window)
        persistent = dispatch.prefers_persistent(d, n, n, causal, window)
        three = dispatch.prefers_three_consumers(d, n, n, causal, window)
        assert calls == ([(d, n, causal, window, persistent, 3 if three else 2, three)]
                         if wanted else []), (d, n, causal, window)
        assert bool((o == 7.0).all()) == wanted
        calls.clear()
        checks.clear()
        attention_forward(q, q, q, causal=causal, window_size=window, forward_kernel="triton")
        assert calls == [] and checks == []
        attention_forward(q, q, q, causal=causal, window_size=window, forward_kernel="gluon")
        assert len(calls) == len(checks) == 1


def test_inference_calls_skip_autograd(monkeypatch):
    """Without a gradient to record, flash_attention calls the forward directly (an
    autograd.Function's apply costs host time a short call is bound by); with one, through
    autograd. The same code runs either way: the same bits."""
    from flashtext.kernels import api

    applied = []
    real_apply = api._FlashAttention.apply
    monkeypatch.setattr(api._FlashAttention, "apply",
                        lambda *args: applied.append(1) or real_apply(*args))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 33, 16, generator=g).to(DEVICE) for _ in range(3))
    plain = flash_attention(q, k, v, causal=True)
    assert applied == [] and plain.grad_fn is None
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        assert flash_attention(qg, k, v, causal=True).grad_fn is None and applied == []
    graded = flash_attention(qg, k, v, causal=True)
    assert applied == [1] and graded.grad_fn is not None
    assert torch.equal(plain, graded.detach())
    graded.sum().backward()
    assert qg.grad is not None and qg.grad.shape == q.shape
    with pytest.raises(ValueError, match="backward_kernel must be one of"):
        flash_attention(q, k, v, backward_kernel="cuda")  # still checked without autograd
    with pytest.raises(ValueError, match="deterministic must be True or False"):
        flash_attention(q, k, v, deterministic=1)


def test_forward_kernel_is_checked():
    q = torch.randn(1, 1, 8, 16).to(DEVICE)
    for bad in ("cuda", "Gluon", None, 1):
        with pytest.raises(ValueError, match="forward_kernel must be one of"):
            flash_attention(q, q, q, forward_kernel=bad)
        with pytest.raises(ValueError, match="forward_kernel must be one of"):
            attention_forward(q, q, q, forward_kernel=bad)
    if not SM90:
        with pytest.raises(ValueError, match="forward_kernel='gluon' needs"):
            attention_forward(q, q, q, forward_kernel="gluon")


def test_triton_and_auto_are_the_same_code_off_sm90():
    if SM90:
        pytest.skip("on sm_90 'auto' may run the Gluon forward: compared below")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 50, 32, generator=g).to(DEVICE) for _ in range(3))
    a = attention_forward(q, k, v, causal=True)
    b = attention_forward(q, k, v, causal=True, forward_kernel="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _spy(monkeypatch, module, name: str, label: str) -> list:
    """Replace ``module.name`` by a pass-through that appends ``label`` to the returned list at
    each call: which kernel ran, and how often."""
    ran = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        ran.append(label)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return ran


def _gpu_inputs(d: int, n: int, h_kv: int, dtype: torch.dtype):
    """q, k, v, do on the GPU: 4 query heads over ``h_kv`` K/V heads, seeded by (d, n)."""
    g = torch.Generator().manual_seed(d + n)
    q = torch.randn(1, 4, n, d, generator=g).to("cuda", dtype)
    k, v = (torch.randn(1, h_kv, n, d, generator=g).to("cuda", dtype) for _ in range(2))
    do = torch.randn(1, 4, n, d, generator=g).to("cuda", dtype)
    return q, k, v, do


def _stand_in_for_the_gluon_dkdv(monkeypatch, on_call, seed: int):
    """Stand in for the Gluon dK/dV kernel's support check and launch (and scale the rule's
    threshold down to the interpreter's lengths): each launch calls ``on_call(q, lse, delta,
    causal, window, dq_accum, defer_dq)`` and fills the (dK, dV) pair the backward hands over
    with 7 and 5 (the pair it returns: one pair alive, not two). Returns seeded q, k, v, do
    (1, 2, 40, 64).
    """
    def fake_dkdv(q, k, v, do, lse, delta, causal, sm_scale, window=(-1, -1), out=None,
                  dq_accum=None, defer_dq=False):
        on_call(q, lse, delta, causal, window, dq_accum, defer_dq)
        dk, dv = out
        return dk.fill_(7.0), dv.fill_(5.0), None

    monkeypatch.setattr(gb, "gluon_dkdv_supported", lambda *args: True)
    monkeypatch.setattr(triton_backward_module, "launch_dkdv", fake_dkdv)
    monkeypatch.setattr(dispatch, "GLUON_MIN_BACKWARD_QUERIES", 40)
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, 40, 64, generator=g).to(DEVICE) for _ in range(4))


def test_the_fused_dq_rule_by_shape():
    for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (100, 0)),
                           (False, (-1, 5))):
        masked = causal or window != (-1, -1)
        for d in (64, 128):  # fused, mask or not; a tile late with a mask
            assert dispatch.prefers_fused_dq(d, causal, window)
            assert dispatch.prefers_deferred_dq(d, causal, window) is masked
    for d in (32, 96, 256):  # no Gluon dK/dV to fuse it into
        assert not dispatch.prefers_fused_dq(d, False)
        assert not dispatch.prefers_deferred_dq(d, True)


def test_deterministic_is_checked():
    q = torch.randn(1, 1, 8, 16).to(DEVICE)
    o, lse = attention_forward(q, q, q)
    for bad in (None, 1, "yes"):
        with pytest.raises(ValueError, match="deterministic must be True or False"):
            flash_attention(q, q, q, deterministic=bad)
        with pytest.raises(ValueError, match="deterministic must be True or False"):
            attention_backward(q, q, q, q, o, lse, deterministic=bad)
    with pytest.raises(ValueError, match="fuse_dq=True needs dkdv_kernel='gluon'"):
        triton_backward_module.backward(q, q, q, q, o, lse, False, 0.25, fuse_dq=True)


def test_dq_is_fused_where_the_rule_says_unless_deterministic(monkeypatch):
    """Routing of dQ: with the Gluon kernel stood in for, a call the rule fuses gets dQ from
    the buffer the kernel adds into (and no Triton dQ pass), unless ``deterministic=True``,
    through attention_backward and through autograd alike."""
    calls = []

    def on_call(q, lse, delta, causal, window, dq_accum, defer_dq):
        calls.append(dq_accum is not None)
        assert not defer_dq  # no mask: each tile's share at once
        if dq_accum is not None:
            assert dq_accum.dtype == torch.float32 and dq_accum.shape == q.shape
            assert bool((dq_accum == 0).all())  # the kernel adds into zeros
            dq_accum.fill_(3.0)

    q, k, v, do = _stand_in_for_the_gluon_dkdv(monkeypatch, on_call, seed=4)
    o, lse = attention_forward(q, k, v)
    want = attention_backward(do, q, k, v, o, lse, backward_kernel="triton")
    dq, dk, _ = attention_backward(do, q, k, v, o, lse)  # d = 64, no mask: fused
    assert calls == [True] and bool((dq == 3.0).all()) and bool((dk == 7.0).all())
    calls.clear()
    dq, dk, _ = attention_backward(do, q, k, v, o, lse, deterministic=True)
    assert calls == [False] and torch.equal(dq, want[0]) and bool((dk == 7.0).all())
    for deterministic in (False, True):
        calls.clear()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flash_attention(*leaves, deterministic=deterministic).backward(do)
        assert calls == [not deterministic]
        assert bool((leaves[0].grad == 3.0).all()) is not deterministic


@sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d, n, causal, window, h_kv", [
    (128, 333, False, (-1, -1), 4), (128, 2100, True, (-1, -1), 2),
    (256, 200, True, (-1, -1), 4), (128, 3000, False, (2100, 0), 1)])
def test_default_runs_gluon_where_the_rule_says_and_is_accurate(monkeypatch, dtype, d, n,
                                                                causal, window, h_kv):
    assert dispatch.prefers_gluon(d, n, n, causal, window)
    _check_the_default_path(monkeypatch, gf, "launch", (dtype, d, n, causal, window, h_kv),
                            reference_kernel="auto", ulps=2)


def _check_the_default_path(monkeypatch, module, name: str, case: tuple,
                            reference_kernel: str, ulps: int) -> None:
    """The default call on ``case`` = (dtype, d, n, causal, window, h_kv) launches
    ``module.name`` once through attention_forward/backward and once more through autograd,
    is within the accuracy rule against float64 (O, lse, dq, dk, dv), and autograd's gradients
    agree with attention_backward's (``reference_kernel``) within ``ulps`` units of the dtype's
    rounding of the largest gradient: autograd runs the same kernels."""
    dtype, d, n, causal, window, h_kv = case
    ran = _spy(monkeypatch, module, name, name)
    q, k, v, do = _gpu_inputs(d, n, h_kv, dtype)
    errors = compare(q, k, v, do, causal=causal, window=window)  # O, lse, dq, dk, dv
    assert ran == [name]
    assert not errors.failures(), errors.failures()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=causal, window_size=window).backward(do)
    assert ran == [name] * 2
    o, lse = attention_forward(q, k, v, causal=causal, window_size=window)
    want = attention_backward(do, q, k, v, o, lse, causal=causal, window_size=window,
                              backward_kernel=reference_kernel)
    if reference_kernel == "triton":
        assert ran == [name] * 2  # the reference ran none of it
    u = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    for grad, leaf, w in zip("qkv", leaves, want, strict=True):
        tol = ulps * u * float(w.abs().max())
        assert float((leaf.grad - w).abs().max()) <= tol, f"d{grad}"


@sm90
def test_short_masked_d128_runs_triton(monkeypatch):
    monkeypatch.setattr(gf, "launch", lambda *a, **k: pytest.fail("Gluon ran"))
    q = torch.randn(1, 2, 1024, 128, device="cuda", dtype=torch.float16)
    o = flash_attention(q, q, q, causal=True)
    assert o.shape == q.shape and torch.isfinite(o).all()


# ---------------------------------------------------------------- the backward's dK/dV kernel


def test_backward_kernel_is_checked():
    q = torch.randn(1, 1, 8, 16).to(DEVICE)
    o, lse = attention_forward(q, q, q)
    for bad in ("cuda", "Gluon", None, 1):
        with pytest.raises(ValueError, match="backward_kernel must be one of"):
            flash_attention(q, q, q, backward_kernel=bad)
        with pytest.raises(ValueError, match="backward_kernel must be one of"):
            attention_backward(q, q, q, q, o, lse, backward_kernel=bad)
    if not SM90:
        with pytest.raises(ValueError, match="backward_kernel='gluon' needs"):
            attention_backward(q, q, q, q, o, lse, backward_kernel="gluon")
    with pytest.raises(ValueError, match="dkdv_kernel must be 'triton' or 'gluon'"):
        triton_backward_module.backward(q, q, q, q, o, lse, False, 0.25, dkdv_kernel="cuda")


def test_the_backward_rule_by_shape():
    at = dispatch.GLUON_MIN_BACKWARD_QUERIES
    assert at == 2048
    for d in (64, 128):
        for causal in (False, True):
            assert not dispatch.prefers_gluon_backward(d, at - 1, at - 1, causal)
            assert dispatch.prefers_gluon_backward(d, at, at, causal)  # key 0: every query
        # the queries a key is seen by, not the keys: one long K/V, few queries -> Triton
        assert not dispatch.prefers_gluon_backward(d, 64, 65536, False)
        assert dispatch.prefers_gluon_backward(d, 65536, 64, False)
        assert not dispatch.prefers_gluon_backward(d, 65536, 65536, True, (at - 2, 0))
        assert dispatch.prefers_gluon_backward(d, 65536, 65536, True, (at - 1, 0))
    for d in (32, 96, 256):  # head dims the Gluon dK/dV does not have
        assert not dispatch.prefers_gluon_backward(d, 65536, 65536, False)


def test_cpu_float32_and_d256_inputs_run_the_triton_dkdv():
    q = torch.randn(1, 2, 2048, 128)
    assert dispatch.choose_backward(q, q, q, False) == "triton"  # not on an sm_90 GPU
    if SM90:
        g = q.cuda()
        assert dispatch.choose_backward(g, g, g, False) == "triton"  # float32
        for d in (64, 128):
            h = g[..., :d].half().contiguous()
            assert dispatch.choose_backward(h, h, h, True) == "gluon"
            assert dispatch.choose_backward(h[:, :, :2047], h[:, :, :2047], h[:, :, :2047],
                                            True) == "triton"  # fewer queries than the rule's
        h = torch.randn(1, 2, 2048, 256, device="cuda", dtype=torch.float16)
        assert dispatch.choose_backward(h, h, h, False) == "triton"  # d = 256: no Gluon dK/dV


def test_auto_backward_follows_the_rule_where_the_gluon_dkdv_could_run(monkeypatch):
    """Routing: with the Gluon dK/dV's support check and launch stood in for (and the rule's
    threshold scaled down to the interpreter's lengths), "auto" takes dK and dV from it exactly
    where the rule says and "gluon" always (with a mask, dQ fused a tile late; with
    ``deterministic``, from the Triton pass); "triton" never calls it."""
    calls = []

    def on_call(q, lse, delta, causal, window, dq_accum, defer_dq):
        calls.append((tuple(q.shape), causal, tuple(window), dq_accum is not None, defer_dq))
        assert delta.shape == lse.shape == q.shape[:-1]
        if dq_accum is not None:
            dq_accum.fill_(3.0)

    q, k, v, do = _stand_in_for_the_gluon_dkdv(monkeypatch, on_call, seed=3)
    checks = []
    monkeypatch.setattr(gb, "gluon_dkdv_supported", lambda *args: checks.append(args) or True)
    o, lse = attention_forward(q, k, v, causal=True)
    want = attention_backward(do, q, k, v, o, lse, causal=True, backward_kernel="triton")
    assert calls == [] and checks == []  # "triton": nothing to check
    for kernel, window in (("auto", (-1, -1)), ("gluon", (-1, -1)), ("gluon", (9, -1))):
        calls.clear()
        checks.clear()
        dq, dk, dv = attention_backward(do, q, k, v, o, lse, causal=True, window_size=window,
                                        backward_kernel=kernel)
        assert calls == [((1, 2, 40, 64), True, window, True, True)], kernel
        assert len(checks) == 1, kernel  # the dispatch asks once (the stand-in launch never)
        assert bool((dq == 3.0).all()) and bool((dk == 7.0).all()) and bool((dv == 5.0).all())
    calls.clear()  # a window: each key seen by 10 queries at most -> Triton
    attention_backward(do, q, k, v, o, lse, causal=True, window_size=(9, -1))
    assert calls == []
    calls.clear()  # below the threshold: a key seen by 39 queries at most -> Triton
    attention_backward(do[:, :, :39], q[:, :, :39], k[:, :, :39], v[:, :, :39],
                       *attention_forward(q[:, :, :39], k[:, :, :39], v[:, :, :39], causal=True),
                       causal=True)
    assert calls == []
    # deterministic: dQ is the Triton pass's whichever kernel made dK and dV, bitwise
    calls.clear()
    dq, _, _ = attention_backward(do, q, k, v, o, lse, causal=True, deterministic=True)
    assert calls == [((1, 2, 40, 64), True, (-1, -1), False, False)]
    assert torch.equal(dq, want[0])
    # and through autograd
    calls.clear()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=True).backward(do)
    assert len(calls) == 1 and bool((leaves[1].grad == 7.0).all())
    assert bool((leaves[0].grad == 3.0).all())
    calls.clear()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=True, backward_kernel="triton").backward(do)
    assert calls == [] and torch.equal(leaves[1].grad, want[1])


@sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d, n, causal, window, h_kv", [
    (64, 2048, False, (-1, -1), 4), (128, 2100, True, (-1, -1), 2),
    (64, 3000, True, (2100, 0), 1), (128, 2500, False, (1500, 600), 4)])
def test_default_backward_runs_the_gluon_dkdv_and_is_accurate(monkeypatch, dtype, d, n,
                                                              causal, window, h_kv):
    assert dispatch.prefers_gluon_backward(d, n, n, causal, window)
    # against the Triton backward: another order of additions, hence more room
    _check_the_default_path(monkeypatch, triton_backward_module, "launch_dkdv",
                            (dtype, d, n, causal, window, h_kv), reference_kernel="triton",
                            ulps=4)


@sm90
def test_short_backward_runs_the_triton_dkdv(monkeypatch):
    monkeypatch.setattr(triton_backward_module, "launch_dkdv",
                        lambda *a, **k: pytest.fail("the Gluon dK/dV ran"))
    q = torch.randn(1, 2, 1024, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    flash_attention(q, q, q, causal=True).sum().backward()
    assert torch.isfinite(q.grad).all()


@sm90
def test_deterministic_backward_gives_the_same_bits_every_run():
    # the default adds dQ's shares in the copy engine's order; deterministic=True takes dQ
    # from the Triton pass (each row written once), so two runs agree to the bit
    q, k, v, do = _gpu_inputs(128, 2048, 2, torch.bfloat16)
    assert dispatch.prefers_fused_dq(128, True)
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flash_attention(*leaves, causal=True, deterministic=True).backward(do)
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    # and the default agrees with it within rounding
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=True).backward(do)
    for name, leaf, want in zip("qkv", leaves, grads[0], strict=True):
        tol = 4 * 2.0**-8 * float(want.abs().max())
        assert float((leaf.grad - want).abs().max()) <= tol, f"d{name}"
