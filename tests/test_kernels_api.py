"""The public API: flash_attention (autograd), attention_forward, attention_backward, and every
input it refuses, each with a ValueError that names the argument and what was expected."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flashtext
import flashtext.kernels.api as api
from flashtext import reference
from flashtext.kernels import attention_backward, attention_forward, flash_attention

DEVICE = flashtext.torch_device()
ON_GPU = flashtext.on_gpu()


def _rand(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def _qkv(n_q=20, n_k=30, d=16, dtype=torch.float32, device=DEVICE):
    return (_rand(2, 3, n_q, d, dtype=dtype, seed=1, device=device),
            _rand(2, 3, n_k, d, dtype=dtype, seed=2, device=device),
            _rand(2, 3, n_k, d, dtype=dtype, seed=3, device=device))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_reference_and_autograd(causal):
    q, k, v = (t.requires_grad_() for t in _qkv(n_q=40, n_k=25))
    do = _rand(2, 3, 40, 16, seed=4)
    o = flash_attention(q, k, v, causal=causal)
    o.backward(do)
    np.testing.assert_allclose(o.detach().cpu().double().numpy(),
                               reference.attention(q, k, v, causal=causal), atol=2e-6)
    want = reference.attention_backward(q, k, v, do, causal=causal)
    for t, w in zip((q, k, v), want, strict=True):
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        np.testing.assert_allclose(t.grad.cpu().double().numpy(), w, atol=5e-6)
    # the autograd path and the two kernel entry points are the same computation
    o2, lse = attention_forward(q, k, v, causal=causal)
    assert torch.equal(o.detach(), o2) and not o2.requires_grad
    grads = attention_backward(do, q, k, v, o2, lse, causal=causal)
    assert all(torch.equal(t.grad, g) for t, g in zip((q, k, v), grads, strict=True))


def test_lse_is_natural_log_and_minus_inf_for_blind_queries():
    q, k, v = _qkv(n_q=30, n_k=10)
    _, lse = attention_forward(q, k, v, causal=True)
    _, want = reference.attention(q, k, v, causal=True, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 30)
    assert torch.all(torch.isneginf(lse[..., :20])) and torch.isfinite(lse[..., 20:]).all()
    np.testing.assert_allclose(lse[..., 20:].cpu().numpy(), want[..., 20:], rtol=2e-6)


def test_default_and_custom_scale():
    q, k, v = _qkv(d=40)
    o_default, _ = attention_forward(q, k, v)
    o_explicit, _ = attention_forward(q, k, v, sm_scale=1 / math.sqrt(40))
    assert torch.equal(o_default, o_explicit)
    o, _ = attention_forward(q, k, v, sm_scale=0.5)
    np.testing.assert_allclose(o.cpu().numpy(), reference.attention(q, k, v, scale=0.5),
                               atol=2e-6)
    o_int, _ = attention_forward(q, k, v, sm_scale=1)
    o_float, _ = attention_forward(q, k, v, sm_scale=1.0)
    assert torch.equal(o_int, o_float)


def test_gradient_through_a_model_layout():
    # (batch, seq, heads, dim) tensors transposed into place, and a loss whose dO has stride 0
    x = _rand(2, 24, 3, 16, seed=5).requires_grad_()
    q = k = v = x.transpose(1, 2)
    flash_attention(q, k, v, causal=True).sum().backward()
    x64 = x.detach().transpose(1, 2)
    dq, dk, dv = reference.attention_backward(x64, x64, x64, np.ones((2, 3, 24, 16)),
                                              causal=True)
    np.testing.assert_allclose(x.grad.transpose(1, 2).cpu().numpy(), dq + dk + dv, atol=2e-5)


def test_only_some_inputs_require_grad():
    q, k, v = _qkv()
    k.requires_grad_()
    flash_attention(q, k, v).pow(2).sum().backward()
    assert k.grad is not None and q.grad is None and v.grad is None


def test_double_backward_is_not_supported():
    # the backward kernels build no graph: asking for one (create_graph=True) fails loudly,
    # instead of handing back a dq whose second-order term would silently be 0
    q, k, v = (t.requires_grad_() for t in _qkv())
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(flash_attention(q, k, v).sum(), q, create_graph=True)


def test_fp16_outputs_and_grads_keep_the_dtype():
    q, k, v = (t.requires_grad_() for t in _qkv(dtype=torch.float16))
    o = flash_attention(q, k, v, causal=True)
    o.float().sum().backward()
    assert o.dtype == torch.float16 and o.is_contiguous()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.float16


# ------------------------------------------------------------------ every refusal, one by one

def _raises(match: str, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        flash_attention(*args, **kwargs)
    with pytest.raises(ValueError, match=match):
        attention_forward(*args, **kwargs)


def test_refuses_non_tensors():
    q, k, v = _qkv()
    _raises(r"^q must be a torch.Tensor", q.cpu().numpy(), k, v)
    _raises(r"^v must be a torch.Tensor", q, k, [1.0])


def test_refuses_wrong_number_of_dimensions():
    q, k, v = _qkv()
    _raises(r"^k must have 4 dimensions .* got shape \(3, 30, 16\)", q, k[0], v)
    _raises(r"^q must have 4 dimensions", q[None], k, v)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.complex64])
def test_refuses_unsupported_dtypes(dtype):
    q, k, v = _qkv()
    _raises(r"^q has dtype .*expected one of torch.float16, torch.bfloat16, torch.float32",
            q.to(dtype), k.to(dtype), v.to(dtype))


def test_refuses_mixed_dtypes():
    q, k, v = _qkv()
    _raises(r"^q, k and v must share one dtype, got q torch.float32, k torch.float16",
            q, k.half(), v)


def test_refuses_tensors_on_different_devices():
    q, k, v = _qkv()
    _raises(r"^q and v must be on one device, got q on \S+ and v on meta", q, k,
            torch.empty(v.shape, device="meta"))


def test_refuses_cpu_tensors_when_compiling_for_a_gpu(monkeypatch):
    monkeypatch.setattr(api._boot, "INTERPRETING", False)  # as on a machine with a GPU
    q, k, v = _qkv(device="cpu")
    _raises(r"^q is on cpu, but Triton compiles for the GPU on this machine: expected CUDA", q,
            k, v)


def test_refuses_too_many_heads_for_the_gpu_grid(monkeypatch):
    monkeypatch.setattr(api._boot, "INTERPRETING", False)
    q = torch.empty(1, 1, 1, 16, device="meta").expand(512, 129, 1, 16)
    _raises(r"^batch \* heads \(dims 0 and 1 of q\) must be at most 65535 on a GPU", q, q, q)


def test_refuses_int32_overflow_within_a_head():
    big = torch.empty(1, 1, 1, 16, device="meta").as_strided((1, 1, 2**16 + 1, 16),
                                                             (0, 0, 2**15, 1))
    _raises(r"^q spans 2147483664 elements within one \(batch, head\) slice", big, big, big)


@pytest.mark.skipif(ON_GPU, reason="on a GPU bf16 is supported")
def test_refuses_bf16_under_the_interpreter():
    q, k, v = _qkv(dtype=torch.bfloat16)
    _raises(r"^q has dtype torch.bfloat16, which needs a CUDA GPU", q, k, v)


def test_refuses_mismatched_shapes():
    q, k, v = _qkv()
    _raises(r"^q, k and v must have the same batch size \(dim 0\), got q 2, k 1, v 2",
            q, k[:1], v)
    _raises(r"^k and v must have the same number of heads, got k 3, v 2", q, k, v[:, :2])
    _raises(r"^q's heads \(3\) must be a multiple of k's and v's heads \(2\)", q, k[:, :2],
            v[:, :2])
    _raises(r"^k and v must have the same sequence length \(dim 2\), got k 30, v 29",
            q, k, v[:, :, :29])
    _raises(r"^q, k and v must have the same head_dim \(last dim\), got q 16, k 16, v 8",
            q, k, v[..., :8])


@pytest.mark.parametrize("d", [0, 257, 512])
def test_refuses_unsupported_head_dim(d):
    q, k, v = (torch.zeros(1, 1, 4, d, device=DEVICE) for _ in range(3))
    _raises(rf"^head_dim \(last dim of q\) must be between 1 and 256, got {d}", q, k, v)


@pytest.mark.parametrize("causal", [1, "yes", None])
def test_refuses_non_bool_causal(causal):
    _raises(r"^causal must be True or False", *_qkv(), causal=causal)


@pytest.mark.parametrize("sm_scale", [float("nan"), float("inf"), "0.1", True])
def test_refuses_bad_scale(sm_scale):
    _raises(r"^sm_scale must be a finite number or None", *_qkv(), sm_scale=sm_scale)


def test_attention_backward_refuses_mismatched_extras():
    q, k, v = _qkv()
    o, lse = attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"^do must be a tensor shaped like q"):
        attention_backward(o[:, :, :5], q, k, v, o, lse)
    with pytest.raises(ValueError, match=r"^o must be a tensor shaped like q"):
        attention_backward(o, q, k, v, None, lse)
    with pytest.raises(ValueError, match=r"^lse must be"):
        attention_backward(o, q, k, v, o, None)
    with pytest.raises(ValueError, match=r"^lse must be a contiguous float32 tensor of shape"):
        attention_backward(o, q, k, v, o, lse[:, :, :3])


def test_exports():
    import flashtext.kernels as kernels

    assert set(kernels.__all__) >= {"flash_attention", "attention_forward"}


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_gpu_refuses_cpu_tensors_and_accepts_bf16():
    q, k, v = _qkv(device="cpu")
    _raises(r"^q is on cpu, but Triton compiles for the GPU", q, k, v)
    q, k, v = (t.requires_grad_() for t in _qkv(dtype=torch.bfloat16, device="cuda"))
    o = flash_attention(q, k, v, causal=True)
    o.float().sum().backward()
    assert o.dtype == q.grad.dtype == torch.bfloat16
    _raises(r"^q and k must be on one device, got q on cuda:0 and k on cpu", q, k.detach().cpu(), v)


def test_public_name_at_the_top_of_the_package():
    import flashtext
    from flashtext.kernels import api

    assert flashtext.flash_attention is api.flash_attention
    assert flashtext.attention_forward is api.attention_forward
    with pytest.raises(AttributeError, match="no_such_thing"):
        flashtext.no_such_thing  # noqa: B018
