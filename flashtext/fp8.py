"""FP8 attention accuracy: block quantisation and incoherent processing (FlashAttention-3).

FP8 e4m3 keeps 3 mantissa bits and a range of +-448, so a tensor is stored as fp8 values times a
float32 *scale* (amax / 448). One scale per tensor lets a single outlier set it for everyone;
FA3 keeps one scale per block (a tile of rows per head), which it loads with the tile anyway.

*Incoherent processing* multiplies Q and K by the same random orthogonal matrix M = D H, with D a
random +-1 diagonal and H the (normalised) Hadamard matrix: (Q M)(K M)^T = Q M M^T K^T = Q K^T,
so attention is unchanged, while every rotated coordinate mixes all d of the originals and a
large feature is spread thinly over all of them. H x costs O(d log d) (:func:`fwht`), which is
why it can be fused into the kernel (Shah et al. 2024, arXiv 2407.08608, Sec. 3.3).

Everything here *emulates* the kernels on a CPU with torch's float8 dtypes (``torch.float8_e4m3fn``)
for the roundings and float64 NumPy for the rest: products of fp8/fp16 numbers accumulate in
float32, like the tensor cores' fp32 accumulators, by rounding each float64 matmul to float32.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flashtext import reference

__all__ = [
    "FP8_MAX",
    "PAPER_RMSE",
    "attention_error_table",
    "fake_quantize",
    "flash_attention_emulated",
    "fwht",
    "hadamard",
    "incoherent",
    "outlier_inputs",
    "random_signs",
    "rmse",
    "round_fp8",
    "standard_attention_fp16",
]

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}

#: FA3 paper, numerical error (RMSE against a float64 reference) on inputs with outliers.
PAPER_RMSE = {"fp16 baseline": 3.2e-4, "fp16 FA2/FA3": 1.9e-4, "fp8 baseline": 2.4e-2,
              "fp8 FA3": 9.1e-3}


def _power_of_two(n: int, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two (Hadamard sizes), got {n!r}")
    return int(n)


def hadamard(n: int) -> np.ndarray:
    """The n x n Hadamard matrix (Sylvester's construction), divided by sqrt(n) so that it is
    orthogonal: H H^T = I. It is also symmetric, so H^-1 = H."""
    _power_of_two(n, "n")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def fwht(x, axis: int = -1) -> np.ndarray:
    """Fast Walsh-Hadamard transform along ``axis``: equals ``x @ hadamard(n)`` (H is symmetric)
    in O(n log n) additions instead of O(n^2) multiply-adds. float64."""
    x = np.moveaxis(np.asarray(reference._f64(x)), axis, -1)
    n = _power_of_two(x.shape[-1], "the transformed axis length")
    lead = x.shape[:-1]
    y = x.copy()
    h = 1
    while h < n:  # butterflies on pairs (i, i + h) inside blocks of 2h
        y = y.reshape(*lead, n // (2 * h), 2, h)
        y = np.stack([y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]], axis=-2)
        h *= 2
    return np.moveaxis(y.reshape(*lead, n) / math.sqrt(n), -1, axis)


def random_signs(n: int, rng: np.random.Generator) -> np.ndarray:
    """The diagonal of D: n independent random signs."""
    return rng.choice(np.array([-1.0, 1.0]), size=n)


def incoherent(x, signs: np.ndarray) -> np.ndarray:
    """x D H for rows x (..., d): flip signs, then Walsh-Hadamard. Apply the SAME signs to Q and K;
    then incoherent(Q) incoherent(K)^T = Q K^T."""
    x = reference._f64(x)
    signs = np.asarray(signs, dtype=np.float64)
    if signs.shape != (x.shape[-1],) or not np.all(np.abs(signs) == 1):
        raise ValueError(f"signs must be a vector of +-1 of length d={x.shape[-1]}, "
                         f"got shape {signs.shape}")
    return fwht(x * signs)


def round_fp8(x, dtype: torch.dtype = torch.float8_e4m3fn) -> np.ndarray:
    """Round to the nearest fp8 value (saturating at +-max, as the scaled kernels never exceed
    it) and back to float64."""
    if dtype not in FP8_MAX:
        raise ValueError(f"dtype must be one of {list(FP8_MAX)}, got {dtype}")
    t = torch.as_tensor(reference._f64(x)).clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
    return t.to(dtype).to(torch.float64).numpy()


def fake_quantize(x, block: int | None = None, dtype: torch.dtype = torch.float8_e4m3fn
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Quantise x (..., N, d) to fp8 with scale = amax / fp8_max, and dequantise: returns
    (x as the kernel sees it, in float64; the scales).

    ``block=None``: one scale for the whole tensor. ``block=B``: one scale per B rows of each
    (batch, head) matrix (the last block may be shorter), as FA3 does per tile.
    """
    x = reference._f64(x)
    if x.ndim < 2:
        raise ValueError(f"x must be (..., N, d), got shape {x.shape}")
    fmax = FP8_MAX.get(dtype)
    if fmax is None:
        raise ValueError(f"dtype must be one of {list(FP8_MAX)}, got {dtype}")
    if block is None:
        amax = np.max(np.abs(x))
        scale = np.asarray(amax / fmax if amax > 0 else 1.0)
        return round_fp8(x / scale, dtype) * scale, scale
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive integer or None, got {block!r}")
    n = x.shape[-2]
    nb = math.ceil(n / block)
    pad = nb * block - n
    xp = np.concatenate([x, np.zeros((*x.shape[:-2], pad, x.shape[-1]))], axis=-2)
    xb = xp.reshape(*x.shape[:-2], nb, block, x.shape[-1])
    amax = np.max(np.abs(xb), axis=(-2, -1), keepdims=True)
    scale = np.where(amax > 0, amax / fmax, 1.0)
    deq = (round_fp8(xb / scale, dtype) * scale).reshape(xp.shape)[..., :n, :]
    return deq, scale[..., 0, 0]


def _f32(x: np.ndarray) -> np.ndarray:
    """A float32 accumulator's result: the float64 value rounded to float32."""
    return x.astype(np.float32).astype(np.float64)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def standard_attention_fp16(q, k, v, scale: float | None = None) -> np.ndarray:
    """Standard (materialising) attention in fp16, as a framework runs it: S = Q K^T written in
    fp16, scaled in fp16, softmax computed in float32 and written in fp16, O = P V written in
    fp16. Every intermediate that goes to memory is rounded to 16 bits."""
    q, k, v = (_f16(reference._f64(t)) for t in (q, k, v))
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    s = _f16(_f16(_f32(q @ np.swapaxes(k, -1, -2))) * _f16(np.asarray(scale)))
    p = _f16(_f32(reference.softmax(s)))
    return _f16(_f32(p @ v))


def flash_attention_emulated(q, k, v, precision: str = "fp8", scaling: str = "block",
                             rotate: bool = False, block_m: int = 64, block_n: int = 128,
                             seed: int = 0, scale: float | None = None,
                             round_p: bool = True) -> np.ndarray:
    """A FlashAttention forward with the kernel's roundings, in float64 NumPy.

    Inputs are rounded to fp16, or quantised to fp8 e4m3 (``scaling`` "tensor": one scale per
    tensor; "block": one per ``block_m`` rows of Q and ``block_n`` rows of K and V). With
    ``rotate``, Q and K are first multiplied by the same random D H (``seed`` picks D). The loop
    over K/V blocks keeps S, m, l and the accumulator in float32; P = exp(S - m) is rounded to
    the input precision before P V (fp8 for fp8, as FA3 feeds its second WGMMA; ``round_p=False``
    keeps it float32, to see how much of the error that rounding causes); the row sums use the
    float32 P. Output rounded to fp16.
    """
    if precision not in ("fp16", "fp8"):
        raise ValueError(f"precision must be 'fp16' or 'fp8', got {precision!r}")
    if scaling not in ("tensor", "block"):
        raise ValueError(f"scaling must be 'tensor' or 'block', got {scaling!r}")
    q, k, v = (reference._f64(t) for t in (q, k, v))
    d = q.shape[-1]
    scale = reference.default_scale(d) if scale is None else scale
    if rotate:
        signs = random_signs(d, np.random.default_rng(seed))
        q, k = incoherent(q, signs), incoherent(k, signs)
    if precision == "fp16":
        q, k, v = _f16(q), _f16(k), _f16(v)
        to_p = _f16
    else:
        blocks = (block_m, block_n, block_n) if scaling == "block" else (None, None, None)
        q, k, v = (fake_quantize(t, b)[0] for t, b in zip((q, k, v), blocks, strict=True))
        to_p = round_fp8
    if not round_p:
        to_p = _f32
    n_k = k.shape[-2]
    m = np.full(q.shape[:-1], -np.inf)
    l = np.zeros(q.shape[:-1])  # noqa: E741
    acc = np.zeros((*q.shape[:-1], v.shape[-1]))
    for start in range(0, n_k, block_n):
        kb, vb = k[..., start:start + block_n, :], v[..., start:start + block_n, :]
        s = _f32(_f32(q @ np.swapaxes(kb, -1, -2)) * scale)
        m_new = np.maximum(m, s.max(axis=-1))
        alpha = np.exp(m - m_new)
        p = _f32(np.exp(s - m_new[..., None]))
        l = _f32(l * alpha + p.sum(axis=-1))  # noqa: E741
        acc = _f32(acc * alpha[..., None] + _f32(to_p(p) @ vb))
        m = m_new
    return _f16(acc / l[..., None])


def rmse(out, ref) -> float:
    """Root-mean-square error of ``out`` against ``ref``."""
    out, ref = reference._f64(out), reference._f64(ref)
    if out.shape != ref.shape:
        raise ValueError(f"shapes differ: {out.shape} vs {ref.shape}")
    return float(np.sqrt(np.mean((out - ref) ** 2)))


def outlier_inputs(rng: np.random.Generator, shape: tuple[int, ...], kind: str = "entries",
                   rate: float = 1e-3, magnitude: float = 10.0, features: int = 2
                   ) -> np.ndarray:
    """Standard-normal inputs with outliers.

    ``kind="entries"``: each entry gets an extra N(0, magnitude^2) term with probability
    ``rate`` (rare, scattered large values). ``kind="features"``: ``features`` fixed channels
    of the last axis are ``magnitude`` times larger in every row (the outlier features of large
    language models' activations).
    """
    x = rng.standard_normal(shape)
    if kind == "entries":
        return x + magnitude * rng.standard_normal(shape) * (rng.random(shape) < rate)
    if kind == "features":
        channels = rng.choice(shape[-1], size=features, replace=False)
        x[..., channels] *= magnitude
        return x
    raise ValueError(f"kind must be 'entries' or 'features', got {kind!r}")


def attention_error_table(q, k, v, block_m: int = 64, block_n: int = 128, seed: int = 0
                          ) -> dict[str, float]:
    """RMSE against float64 attention of each way of computing it in low precision."""
    ref = reference.attention(q, k, v)

    def fa(**kw) -> float:
        return rmse(flash_attention_emulated(q, k, v, block_m=block_m, block_n=block_n,
                                             seed=seed, **kw), ref)

    return {
        "fp16 standard attention": rmse(standard_attention_fp16(q, k, v), ref),
        "fp16 FlashAttention": fa(precision="fp16"),
        "fp8, per-tensor scale": fa(precision="fp8", scaling="tensor"),
        "fp8, per-tensor scale + rotation": fa(precision="fp8", scaling="tensor", rotate=True),
        "fp8, per-block scale": fa(precision="fp8", scaling="block"),
        "fp8, per-block scale + rotation (FA3)": fa(precision="fp8", scaling="block",
                                                    rotate=True),
    }
