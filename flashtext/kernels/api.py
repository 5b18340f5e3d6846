"""The public API: ``flash_attention`` (differentiable), ``flash_attention_varlen`` (packed
sequences), ``attention_forward`` / ``attention_backward`` (the kernels alone).

What they accept (anything else raises ``ValueError`` naming the argument and what was expected):

* ``q`` (batch, heads, N_q, head_dim); ``k`` and ``v`` (batch, heads_kv, N_k, head_dim) with
  ``heads`` a multiple of ``heads_kv`` (grouped-query attention; MQA is heads_kv = 1): query
  head h uses K/V head h // (heads / heads_kv), nothing is repeated in memory, and dk, dv sum
  over the query heads that share them. N_q and N_k may differ; either may be 0.
* ``head_dim`` any integer from 1 to 256, the same for q, k and v. Powers of two from 16 up run
  as they are; other sizes (e.g. 40, 80, 96) are padded to the next power of two inside the
  kernel by masked loads (the padding reads as 0 and is never written), so no copy is made.
* dtype float16, bfloat16 or float32, the same for all three. bfloat16 needs a CUDA GPU (Triton's
  CPU interpreter multiplies bf16 tiles wrongly). float32 dots run in full fp32 ("ieee"), not
  TF32.
* All three on one device: CUDA when Triton compiles for a GPU, CPU under the interpreter, or
  ``meta`` (shape inference: correctly shaped meta results, no kernel runs).
* Any strides (a transposed (batch, seq, heads, dim) view, a slice, an expanded tensor): the
  kernels address every element through its strides, so nothing is copied. O and the gradients
  come back contiguous. Offsets between batch and head slices are 64-bit; within one slice they
  are 32-bit, so one (batch, head) slice must span fewer than 2**31 elements.
* Masks are aligned bottom-right (as FlashAttention 2.1+ and ``flashtext.reference``): with
  off = N_k - N_q, ``causal=True`` lets query i see keys j <= i + off, and
  ``window_size=(left, right)`` (flash-attn's sliding window, -1 = unbounded) keys
  i + off - left <= j <= i + off + right; causal sets right = 0. A query that sees no key at all
  gets O = 0, lse = -inf and zero gradients. Key tiles wholly outside the window are skipped.
* ``sm_scale`` defaults to 1/sqrt(head_dim).
* On a GPU, batch * heads <= 65535 (CUDA's limit on the grid's second axis).
* Differentiable once: a double backward (``create_graph=True``) raises instead of dropping the
  second-order term.
* ``forward_kernel`` (dense calls): "auto" runs the Gluon FA3-style forward on an sm_90 GPU
  where it is the faster one (:mod:`flashtext.kernels.dispatch` says where) and the Triton
  forward everywhere else; "triton" or "gluon" asks for one ("gluon" raises on inputs it does
  not support).
* ``backward_kernel`` (dense calls): "auto" computes dK and dV with the Gluon FA3-style kernel on
  an sm_90 GPU where it is the faster one (d = 64 and 128, fp16 and bf16, long enough sequences:
  :mod:`flashtext.kernels.dispatch` says where) and with the Triton kernel everywhere else;
  "triton" or "gluon" asks for one. Either forward feeds either backward (both write the same
  O and lse).
* ``deterministic`` (flash-attn's argument): where the Gluon dK/dV kernel runs it also computes
  dQ, adding each tile's share into an fp32 buffer through the copy engine, in an order that
  varies from run to run (so may dQ's last bits); ``deterministic=True`` takes dQ from the
  Triton dQ pass instead, which writes each row once. Every other path is deterministic
  either way.
"""

from __future__ import annotations

import numbers

import torch

from flashtext import _boot
from flashtext.kernels.backward import backward_varlen
from flashtext.kernels.checks import check_device, check_scale
from flashtext.kernels.config import MAX_HEAD_DIM
from flashtext.kernels.dispatch import (
    backward,
    check_backward_kernel,
    check_forward_kernel,
    forward,
)
from flashtext.kernels.forward import forward_varlen

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, where the kernels put batch * heads
Window = tuple[int, int]


def _check_tensor(name: str, t, dims: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {layout}, "
                         f"got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions {layout}, got shape "
                         f"{tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of torch.float16, "
                         "torch.bfloat16, torch.float32")


def check_window(window_size) -> Window:
    """``window_size`` as a pair of ints >= -1, or a ValueError naming it."""
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(isinstance(w, numbers.Integral) and not isinstance(w, bool)
                  for w in window_size))
    if not ok or min(window_size) < -1:
        raise ValueError(f"window_size must be a pair of ints >= -1 (left, right; -1 = "
                         f"unbounded), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _check_heads(h: int, h_kv: int, hv: int) -> None:
    if h_kv != hv:
        raise ValueError(f"k and v must have the same number of heads, got k {h_kv}, v {hv}")
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"q's heads ({h}) must be a multiple of k's and v's heads ({h_kv}): "
                         "grouped-query attention shares each K/V head among "
                         "heads / heads_kv query heads")


def _check_reach(tensors: dict[str, torch.Tensor], row_dim: int) -> None:
    for name, t in tensors.items():
        reach = (t.shape[row_dim] - 1) * abs(t.stride(row_dim)) \
            + (t.shape[-1] - 1) * abs(t.stride(-1))
        if t.numel() and reach >= 2**31:
            raise ValueError(f"{name} spans {reach + 1} elements within one (batch, head) "
                             "slice; the kernels' in-head offsets are int32: expected fewer "
                             "than 2**31 (make the tensor contiguous or split it)")


def _check_common(q, k, v, causal, window_size) -> Window:
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, "
                         f"v {v.dtype}")
    check_device({"q": q, "k": k, "v": v})
    if not (dq == dk == dv):
        raise ValueError(f"q, k and v must have the same head_dim (last dim), got q {dq}, "
                         f"k {dk}, v {dv}")
    if not 1 <= dq <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim (last dim of q) must be between 1 and {MAX_HEAD_DIM}, "
                         f"got {dq}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    return check_window(window_size)


def _validate(q, k, v, causal, sm_scale, window_size=(-1, -1)) -> tuple[float, Window]:
    """Check dense inputs; return the softmax scale and the window to use."""
    layout = "(batch, heads, seq, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4, layout)
    window = _check_common(q, k, v, causal, window_size)
    zq, hq, _, _ = q.shape
    zk, hk, nk, _ = k.shape
    zv, hv, nv, _ = v.shape
    if not (zq == zk == zv):
        raise ValueError(f"q, k and v must have the same batch size (dim 0), got q {zq}, "
                         f"k {zk}, v {zv}")
    _check_heads(hq, hk, hv)
    if nk != nv:
        raise ValueError(f"k and v must have the same sequence length (dim 2), got k {nk}, "
                         f"v {nv}")
    _check_reach({"q": q, "k": k, "v": v}, 2)
    if not _boot.INTERPRETING and zq * hq > MAX_GRID_Y:
        raise ValueError(f"batch * heads (dims 0 and 1 of q) must be at most {MAX_GRID_Y} on a "
                         f"GPU (the kernels' second grid axis), got {zq} * {hq} = {zq * hq}")
    return check_scale(sm_scale, q.shape[-1]), window


def _no_double_backward() -> None:
    if torch.is_grad_enabled():
        raise RuntimeError("flash_attention is differentiable once: its backward kernels are "
                           "not themselves differentiable, so a double backward "
                           "(create_graph=True, e.g. a gradient penalty) is not supported. "
                           "Use torch.nn.functional.scaled_dot_product_attention's math "
                           "backend for second-order gradients.")


class _FlashAttention(torch.autograd.Function):
    """Autograd wrapper: the forward saves O and lse (not P); the backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float, window: Window, kernel: str,
                backward_kernel: str, deterministic: bool):
        o, lse = forward(q, k, v, causal, sm_scale, window, kernel)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, sm_scale, window, backward_kernel, deterministic)
        return o

    @staticmethod
    def backward(ctx, do):
        _no_double_backward()
        q, k, v, o, lse = ctx.saved_tensors
        causal, sm_scale, window, backward_kernel, deterministic = ctx.args
        dq, dk, dv = backward(do.to(q.dtype), q, k, v, o, lse, causal, sm_scale, window,
                              backward_kernel, deterministic)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None, window_size: Window = (-1, -1), *,
                    forward_kernel: str = "auto", backward_kernel: str = "auto",
                    deterministic: bool = False) -> torch.Tensor:
    """Exact attention ``softmax(sm_scale * q k^T [+ mask]) v`` with FlashAttention kernels
    (FA3-style Gluon forward and dK/dV on sm_90 where they are faster, FA2 Triton kernels
    otherwise); differentiable with respect to q, k and v. ``deterministic=True``: a backward
    that gives the same bits every run (no dQ fused into the Gluon kernel). See the module
    docstring for what it accepts."""
    scale, window = _validate(q, k, v, causal, sm_scale, window_size)
    kernel = check_forward_kernel(forward_kernel)
    backward_kernel = check_backward_kernel(backward_kernel)
    deterministic = _check_deterministic(deterministic)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # inference: no graph to record, so no autograd.Function (its apply costs the host
        # microseconds a short call is bound by)
        return forward(q, k, v, causal, scale, window, kernel)[0]
    return _FlashAttention.apply(q, k, v, causal, scale, window, kernel, backward_kernel,
                                 deterministic)


def _check_deterministic(deterministic) -> bool:
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    return deterministic


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      sm_scale: float | None = None, window_size: Window = (-1, -1), *,
                      forward_kernel: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone: returns (O, lse), lse of shape (batch, heads, N_q), float32,
    natural log (``-inf`` for a query that sees no key). No autograd graph is recorded."""
    scale, window = _validate(q, k, v, causal, sm_scale, window_size)
    kernel = check_forward_kernel(forward_kernel)
    with torch.no_grad():
        return forward(q, k, v, causal, scale, window, kernel)


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor, causal: bool = False,
                       sm_scale: float | None = None, window_size: Window = (-1, -1), *,
                       backward_kernel: str = "auto", deterministic: bool = False,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernels alone: (dq, dk, dv) from the forward's O and lse and the incoming
    gradient ``do`` (chapter 11 calls this directly). ``deterministic`` as for
    :func:`flash_attention`."""
    scale, window = _validate(q, k, v, causal, sm_scale, window_size)
    kernel = check_backward_kernel(backward_kernel)
    deterministic = _check_deterministic(deterministic)
    for name, t in (("do", do), ("o", o)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a tensor shaped like q {tuple(q.shape)}, got {got}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, expected q's device {q.device}")
    if not isinstance(lse, torch.Tensor) or lse.device != q.device:
        raise ValueError("lse must be the tensor returned by attention_forward, on q's device")
    with torch.no_grad():
        return backward(do.to(q.dtype), q, k, v, o.to(q.dtype), lse.contiguous(), causal, scale,
                        window, kernel, deterministic)


# ------------------------------------------------------------------ packed (varlen) sequences

def _check_cu(name: str, cu, total: int, device: torch.device) -> list[int]:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        got = f"{cu.dtype} of shape {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) \
            else type(cu).__name__
        raise ValueError(f"{name} must be a 1-D torch.int32 tensor (batch + 1,), got {got}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device}, expected the device of q, k, v ({device})")
    if cu.numel() < 1:
        raise ValueError(f"{name} must hold at least one entry (0), got an empty tensor")
    values = cu.tolist() if cu.device.type != "meta" else None
    if values is None:
        return []
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    if any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    if values[-1] != total:
        raise ValueError(f"{name} must end at the total length ({total}, dim 0 of the packed "
                         f"tensor), got {values[-1]}")
    return values


def _lengths(cu: list[int]) -> list[int]:
    return [b - a for a, b in zip(cu, cu[1:], strict=False)]


def _check_max(name: str, value, lengths: list[int]) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    longest = max(lengths, default=0)
    if value < longest:
        raise ValueError(f"{name} ({value}) is below the longest sequence ({longest})")
    return int(value)


def _validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                     sm_scale, window_size):
    layout = "(total, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 3, layout)
    window = _check_common(q, k, v, causal, window_size)
    _check_heads(q.shape[1], k.shape[1], v.shape[1])
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have the same total length (dim 0), got k {k.shape[0]}, "
                         f"v {v.shape[0]}")
    cq = _check_cu("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    ck = _check_cu("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of "
                         f"sequences, got {cu_seqlens_q.numel() - 1} and "
                         f"{cu_seqlens_k.numel() - 1}")
    max_q = _check_max("max_seqlen_q", max_seqlen_q, _lengths(cq))
    max_k = _check_max("max_seqlen_k", max_seqlen_k, _lengths(ck))
    _check_reach({"q": q, "k": k, "v": v}, 0)
    batch = cu_seqlens_q.numel() - 1
    if not _boot.INTERPRETING and batch * q.shape[1] > MAX_GRID_Y:
        raise ValueError(f"batch * heads must be at most {MAX_GRID_Y} on a GPU, got "
                         f"{batch} * {q.shape[1]}")
    return check_scale(sm_scale, q.shape[-1]), window, max_q, max_k


class _FlashAttentionVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale, window):
        o, lse = forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale, window)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.args = (max_q, max_k, causal, sm_scale, window)
        return o

    @staticmethod
    def backward(ctx, do):
        _no_double_backward()
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, causal, sm_scale, window = ctx.args
        dq, dk, dv = backward_varlen(do.to(q.dtype), q, k, v, o, lse, cu_q, cu_k, max_q, max_k,
                                     causal, sm_scale, window)
        return dq, dk, dv, None, None, None, None, None, None, None


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           sm_scale: float | None = None, window_size: Window = (-1, -1),
                           return_lse: bool = False):
    """Attention over a packed batch of sequences of different lengths, flash-attn's
    ``flash_attn_varlen_func``: q (total_q, heads, d), k and v (total_k, heads_kv, d), sequence
    b's queries are rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and its keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` (int32, starting at 0); no sequence attends to
    another. Masks, GQA and the scale as for :func:`flash_attention`. Returns O (total_q, heads,
    d), and with ``return_lse`` also lse (heads, total_q) float32 (no gradient through lse).
    Differentiable with respect to q, k and v."""
    scale, window, max_q, max_k = _validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                   max_seqlen_q, max_seqlen_k, causal,
                                                   sm_scale, window_size)
    if return_lse:
        with torch.no_grad():
            return forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, causal,
                                  scale, window)
    return _FlashAttentionVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                                       causal, scale, window)


__all__ = ["attention_backward", "attention_forward", "check_device", "check_scale",
           "check_window", "flash_attention", "flash_attention_varlen"]
