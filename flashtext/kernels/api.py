"""The public API: ``flash_attention`` (differentiable) and ``attention_forward`` (O and lse).

What it accepts (anything else raises ``ValueError`` naming the argument and what was expected):

* ``q`` (batch, heads, N_q, head_dim); ``k`` and ``v`` (batch, heads, N_k, head_dim). N_q and
  N_k may differ; either may be 0.
* ``head_dim`` any integer from 1 to 256, the same for q, k and v. Powers of two from 16 up run
  as they are; other sizes (e.g. 40, 80, 96) are padded to the next power of two inside the
  kernel by masked loads (the padding reads as 0 and is never written), so no copy is made.
* dtype float16, bfloat16 or float32, the same for all three. bfloat16 needs a CUDA GPU (Triton's
  CPU interpreter multiplies bf16 tiles wrongly). float32 dots run in full fp32 ("ieee"), not
  TF32.
* All three on one device: CUDA when Triton compiles for a GPU, CPU under the interpreter.
* Any strides (a transposed (batch, seq, heads, dim) view, a slice, an expanded tensor): the
  kernels address every element through its strides, so nothing is copied. O and the gradients
  come back contiguous. Offsets between batch and head slices are 64-bit; within one slice they
  are 32-bit, so one (batch, head) slice must span fewer than 2**31 elements.
* ``causal=True`` masks key j for query i unless j <= i + N_k - N_q (aligned bottom-right, as
  FlashAttention 2.1+ and ``flashtext.reference.causal_mask``). A query that sees no key at all
  (i < N_q - N_k) gets O = 0, lse = -inf and zero gradients.
* ``sm_scale`` defaults to 1/sqrt(head_dim).
* On a GPU, batch * heads <= 65535 (CUDA's limit on the grid's second axis).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch.autograd.function import once_differentiable

from flashtext import _boot
from flashtext.kernels.backward import backward
from flashtext.kernels.config import MAX_HEAD_DIM
from flashtext.kernels.forward import forward

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, where the kernels put batch * heads


def _validate(q, k, v, causal, sm_scale) -> float:
    """Check the inputs; return the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (batch, heads, seq, "
                             f"head_dim), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, heads, seq, head_dim), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; expected one of torch.float16, "
                             "torch.bfloat16, torch.float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, "
                         f"v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on "
                         f"{k.device}, v on {v.device}")
    zq, hq, _, dq = q.shape
    zk, hk, nk, dk = k.shape
    zv, hv, nv, dv = v.shape
    if not (zq == zk == zv):
        raise ValueError(f"q, k and v must have the same batch size (dim 0), got q {zq}, "
                         f"k {zk}, v {zv}")
    if not (hq == hk == hv):
        raise ValueError(f"q, k and v must have the same number of heads (dim 1), got q {hq}, "
                         f"k {hk}, v {hv}")
    if nk != nv:
        raise ValueError(f"k and v must have the same sequence length (dim 2), got k {nk}, "
                         f"v {nv}")
    if not (dq == dk == dv):
        raise ValueError(f"q, k and v must have the same head_dim (dim 3), got q {dq}, k {dk}, "
                         f"v {dv}")
    if not 1 <= dq <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim (dim 3 of q) must be between 1 and {MAX_HEAD_DIM}, "
                         f"got {dq}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        reach = (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3))
        if t.numel() and reach >= 2**31:
            raise ValueError(f"{name} spans {reach + 1} elements within one (batch, head) "
                             "slice; the kernels' in-head offsets are int32: expected fewer "
                             "than 2**31 (make the tensor contiguous or split it)")
    if not _boot.INTERPRETING and zq * hq > MAX_GRID_Y:
        raise ValueError(f"batch * heads (dims 0 and 1 of q) must be at most {MAX_GRID_Y} on a "
                         f"GPU (the kernels' second grid axis), got {zq} * {hq} = {zq * hq}")
    if _boot.INTERPRETING:
        if q.dtype == torch.bfloat16:
            raise ValueError("q has dtype torch.bfloat16, which needs a CUDA GPU: Triton's CPU "
                             "interpreter computes bf16 tl.dot wrongly. Use torch.float16 or "
                             "torch.float32 here.")
    elif q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}, but Triton compiles for the GPU on this machine: "
                         "expected CUDA tensors (q.cuda()), or set TRITON_INTERPRET=1 before "
                         "importing flashtext to run on the CPU")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if sm_scale is None:
        return 1.0 / math.sqrt(dq)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) \
            or not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be a finite number or None (1/sqrt(head_dim)), "
                         f"got {sm_scale!r}")
    return float(sm_scale)


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: the forward saves O and lse (not P); the backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float):
        o, lse = forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    @once_differentiable  # the backward kernels are not themselves differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(do.to(q.dtype), q, k, v, o, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None) -> torch.Tensor:
    """Exact attention ``softmax(sm_scale * q k^T [+ causal mask]) v`` with FlashAttention-2
    kernels; differentiable with respect to q, k and v. See the module docstring for what it
    accepts."""
    scale = _validate(q, k, v, causal, sm_scale)
    return FlashAttentionFunction.apply(q, k, v, causal, scale)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone: returns (O, lse), lse of shape (batch, heads, N_q), float32,
    natural log (``-inf`` for a query that sees no key). No autograd graph is recorded."""
    scale = _validate(q, k, v, causal, sm_scale)
    with torch.no_grad():
        return forward(q, k, v, causal, scale)


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor, causal: bool = False,
                       sm_scale: float | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernels alone: (dq, dk, dv) from the forward's O and lse and the incoming
    gradient ``do`` (chapter 11 calls this directly)."""
    scale = _validate(q, k, v, causal, sm_scale)
    for name, t in (("do", do), ("o", o)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a tensor shaped like q {tuple(q.shape)}, got {got}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, expected q's device {q.device}")
    if not isinstance(lse, torch.Tensor) or lse.device != q.device:
        raise ValueError("lse must be the tensor returned by attention_forward, on q's device")
    with torch.no_grad():
        return backward(do.to(q.dtype), q, k, v, o.to(q.dtype), lse.contiguous(), causal, scale)
