"""Float64 ground truth: softmax, attention (causal, Nq != Nk) and its gradients, in NumPy.

Every check in the book compares against these. They materialise the full score matrix on
purpose: this is the "standard attention" that FlashAttention computes exactly, only slower.

Shapes: q is (..., Nq, d), k and v are (..., Nk, d); leading batch/head axes broadcast.
Causal masks are aligned to the bottom-right corner by default (query i of Nq sees keys
j <= i + Nk - Nq), as in FlashAttention 2.1+ and KV-cache decoding; "top_left" (j <= i) is
PyTorch's ``is_causal`` convention. A query row that sees no key at all (possible when Nq > Nk,
bottom-right) gets output 0, log-sum-exp -inf and zero gradients, as FlashAttention does.

A sliding window ``window=(left, right)`` (flash-attn's ``window_size``) lets query i see keys j
with i + off - left <= j <= i + off + right, off = Nk - Nq for bottom-right alignment; -1 means
unbounded on that side, and ``causal=True`` means right = 0. Grouped-query attention: k and v may
have fewer heads than q (axis -3), a divisor of q's; query head h then uses key/value head
h // (Hq / Hkv), and the gradients of k and v sum over the query heads that share them.
A NaN anywhere in a row's inputs gives NaN in that row's output, never a silent number.
"""

from __future__ import annotations

import numbers
from typing import Literal

import numpy as np

Align = Literal["bottom_right", "top_left"]
Window = tuple[int, int]


def _f64(x) -> np.ndarray:
    """Accept NumPy arrays or torch tensors (any dtype or device) and return float64 NumPy."""
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def _check_flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_window(window) -> Window:
    """``window`` as a pair of ints >= -1 (-1: unbounded), or a ValueError naming it."""
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool)
                       for w in window) or min(window) < -1):
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1: unbounded), "
                         f"got {window!r}")
    return int(window[0]), int(window[1])


def _check_qkv(q, k, v=None) -> None:
    for name, t in (("q", q), ("k", k)) + ((("v", v),) if v is not None else ()):
        if t.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., seq, head_dim), "
                             f"got shape {t.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim (last axis), got q {q.shape} and "
                         f"k {k.shape}")
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys (axis -2), got k "
                         f"{k.shape} and v {v.shape}")
    if v is not None and v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"k and v must have the same leading shape, got k {k.shape} and "
                         f"v {v.shape}")


def _expand_kv(q: np.ndarray, kv: np.ndarray, name: str) -> np.ndarray:
    """Repeat grouped key/value heads (axis -3) to q's head count (GQA/MQA)."""
    if q.ndim < 3 or kv.ndim < 3 or kv.shape[-3] == q.shape[-3]:
        return kv
    h, h_kv = q.shape[-3], kv.shape[-3]
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"{name} has {h_kv} heads (axis -3); q has {h}, which must be a "
                         "multiple of it (grouped-query attention)")
    return np.repeat(kv, h // h_kv, axis=-3)


def _group_sum(grad: np.ndarray, h_kv: int) -> np.ndarray:
    """Sum a gradient over the query heads that share each key/value head."""
    if grad.ndim < 3 or grad.shape[-3] == h_kv:
        return grad
    *lead, h, n, d = grad.shape
    return grad.reshape(*lead, h_kv, h // h_kv, n, d).sum(axis=-3)


def softmax(x, axis: int = -1) -> np.ndarray:
    """Safe softmax: subtract the row max so every exponent is <= 0 and nothing overflows.

    Rows that are entirely -inf come out as zeros (no key to attend to), not NaN.
    """
    x = _f64(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    p = np.divide(e, s, out=np.zeros_like(e), where=s > 0)
    return np.where(np.isnan(s), np.nan, p)  # a NaN in the row stays visible


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
    return window_mask(n_q, n_k, (-1, 0), align)


def window_mask(n_q: int, n_k: int, window: Window = (-1, -1),
                align: Align = "bottom_right") -> np.ndarray:
    """Boolean (n_q, n_k) mask of a sliding window (left, right), -1 unbounded: True where query
    i sees key j, i.e. i + off - left <= j <= i + off + right (off = n_k - n_q bottom-right)."""
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")
    left, right = check_window(window)
    offset = n_k - n_q if align == "bottom_right" else 0
    i = np.arange(n_q)[:, None] + offset
    j = np.arange(n_k)[None, :]
    visible = np.ones((n_q, n_k), dtype=bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return visible


def default_scale(d: int) -> float:
    """The usual softmax scale 1/sqrt(d)."""
    return 1.0 / np.sqrt(d)


def _scale(scale, d: int) -> float:
    if scale is None:
        return default_scale(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"scale must be a number or None (1/sqrt(head_dim)), got {scale!r}")
    return float(scale)


def scores(q, k, causal: bool = False, scale: float | None = None,
           align: Align = "bottom_right", window: Window = (-1, -1)) -> np.ndarray:
    """S = scale * Q K^T with masked entries set to -inf (grouped k heads are repeated)."""
    q, k = _f64(q), _f64(k)
    _check_qkv(q, k)
    causal = _check_flag(causal, "causal")
    left, right = check_window(window)
    k = _expand_kv(q, k, "k")
    s = _scale(scale, q.shape[-1]) * (q @ np.swapaxes(k, -1, -2))
    if causal or (left, right) != (-1, -1):
        right = 0 if causal else right
        s = np.where(window_mask(q.shape[-2], k.shape[-2], (left, right), align), s, -np.inf)
    return s


def attention(q, k, v, causal: bool = False, scale: float | None = None,
              align: Align = "bottom_right", return_lse: bool = False,
              window: Window = (-1, -1)):
    """Standard attention O = softmax(scale * Q K^T) V in float64.

    With ``return_lse=True`` also returns L = logsumexp of each score row (natural log), the
    single statistic FlashAttention-2 saves for its backward pass.
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    _check_qkv(q, k, v)
    s = scores(q, k, causal, scale, align, window)
    out = softmax(s) @ _expand_kv(q, v, "v")
    if return_lse:
        return out, logsumexp(s)
    return out


def attention_backward(q, k, v, do, causal: bool = False, scale: float | None = None,
                       align: Align = "bottom_right", window: Window = (-1, -1),
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dQ, dK, dV) of sum(O * dO) for standard attention, in float64.

    dV = P^T dO;  dP = dO V^T;  dS = P * (dP - D) with D = rowsum(dO * O);
    dQ = scale * dS K;  dK = scale * dS^T Q  (summed over the query heads of a group).
    """
    q, k, v, do = _f64(q), _f64(k), _f64(v), _f64(do)
    _check_qkv(q, k, v)
    if do.shape[-2:] != (q.shape[-2], v.shape[-1]):
        raise ValueError(f"do must be shaped like the output (..., {q.shape[-2]}, "
                         f"{v.shape[-1]}), got {do.shape}")
    scale = _scale(scale, q.shape[-1])
    h_kv = k.shape[-3] if k.ndim >= 3 else None
    k, v = _expand_kv(q, k, "k"), _expand_kv(q, v, "v")
    p = softmax(scores(q, k, causal, scale, align, window))
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    d_row = np.sum(do * o, axis=-1, keepdims=True)
    ds = p * (dp - d_row)
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    if h_kv is not None:
        dk, dv = _group_sum(dk, h_kv), _group_sum(dv, h_kv)
    return dq, dk, dv
