"""Float64 ground truth: softmax, attention (causal, Nq != Nk) and its gradients, in NumPy.

Every check in the book compares against these. They materialise the full score matrix on
purpose: this is the "standard attention" that FlashAttention computes exactly, only slower.

Shapes: q is (..., Nq, d), k and v are (..., Nk, d); leading batch/head axes broadcast.
Causal masks are aligned to the bottom-right corner by default (query i of Nq sees keys
j <= i + Nk - Nq), as in FlashAttention 2.1+ and KV-cache decoding; "top_left" (j <= i) is
PyTorch's ``is_causal`` convention. A query row that sees no key at all (possible when Nq > Nk,
bottom-right) gets output 0, log-sum-exp -inf and zero gradients, as FlashAttention does.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Align = Literal["bottom_right", "top_left"]


def _f64(x) -> np.ndarray:
    """Accept NumPy arrays or torch tensors (any dtype or device) and return float64 NumPy."""
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def softmax(x, axis: int = -1) -> np.ndarray:
    """Safe softmax: subtract the row max so every exponent is <= 0 and nothing overflows.

    Rows that are entirely -inf come out as zeros (no key to attend to), not NaN.
    """
    x = _f64(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def logsumexp(x, axis: int = -1) -> np.ndarray:
    """log(sum(exp(x))) computed safely; -inf for an all -inf row."""
    x = _f64(x)
    m = np.max(x, axis=axis, keepdims=True)
    finite_m = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - finite_m), axis=axis, keepdims=True)) + finite_m
    return np.squeeze(out, axis=axis)


def causal_mask(n_q: int, n_k: int, align: Align = "bottom_right") -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may attend to key j."""
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")
    offset = n_k - n_q if align == "bottom_right" else 0
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + offset


def default_scale(d: int) -> float:
    """The usual softmax scale 1/sqrt(d)."""
    return 1.0 / np.sqrt(d)


def scores(q, k, causal: bool = False, scale: float | None = None,
           align: Align = "bottom_right") -> np.ndarray:
    """S = scale * Q K^T with masked entries set to -inf."""
    q, k = _f64(q), _f64(k)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2], align), s, -np.inf)
    return s


def attention(q, k, v, causal: bool = False, scale: float | None = None,
              align: Align = "bottom_right", return_lse: bool = False):
    """Standard attention O = softmax(scale * Q K^T) V in float64.

    With ``return_lse=True`` also returns L = logsumexp of each score row (natural log), the
    single statistic FlashAttention-2 saves for its backward pass.
    """
    s = scores(q, k, causal, scale, align)
    out = softmax(s) @ _f64(v)
    if return_lse:
        return out, logsumexp(s)
    return out


def attention_backward(q, k, v, do, causal: bool = False, scale: float | None = None,
                       align: Align = "bottom_right") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dQ, dK, dV) of sum(O * dO) for standard attention, in float64.

    dV = P^T dO;  dP = dO V^T;  dS = P * (dP - D) with D = rowsum(dO * O);
    dQ = scale * dS K;  dK = scale * dS^T Q.
    """
    q, k, v, do = _f64(q), _f64(k), _f64(v), _f64(do)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    p = softmax(scores(q, k, causal, scale, align))
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    d_row = np.sum(do * o, axis=-1, keepdims=True)
    ds = p * (dp - d_row)
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    return dq, dk, dv
