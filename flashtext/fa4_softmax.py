"""FlashAttention-4's two softmax ideas, as NumPy a CPU can run and check.

On Hopper the exponentials of the online softmax run on the special-function unit (MUFU), 16
per clock per SM, against 128 fused multiply-adds per clock on the FMA units (``flashtext.hopper``
has the arithmetic: at d = 64 the exponentials take as long as both matmuls). FlashAttention-4
(Zadouri, Hoehnerbach, Shah, Liu, Thakkar and Dao) takes two kinds of work off that path:

* **Software exp2.** ``2**x = 2**floor(x) * 2**frac(x)``: the integer part goes straight into the
  float's exponent bits (an integer shift and add), the fraction through a short polynomial on
  the FMA units. Doing a fraction of a tile's exponentials this way lets both units work at
  once. :func:`exp2_poly_coefficients` fits the polynomial; :func:`exp2_emulated` is the exact
  sequence of float32 operations the kernel runs, so its error can be measured here, and
  :func:`exp2_asm` writes that sequence as the PTX the kernel inlines.
* **Conditional rescaling.** The online softmax multiplies O and l by ``alpha = 2**(m_old -
  m_new)`` whenever a row's running max grows. If it grows by at most ``threshold`` (log2
  units) one may keep the old, stale max instead: the exponentials are then at most
  ``2**threshold`` (no overflow for a small threshold), and the result is still exact because the
  final division by l uses the same stale max. :func:`online_softmax_conditional` is that loop
  in float64; it counts how many rescales were skipped.
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np

__all__ = [
    "ROUND_MAGIC",
    "exp2_asm",
    "exp2_emulated",
    "exp2_poly_coefficients",
    "exp2_relative_error",
    "online_softmax_conditional",
]

#: 1.5 * 2**23: adding it to x in [-127, 0] with rounding toward -inf leaves floor(x) in the
#: low mantissa bits (the sum lies in [2**23, 2**24), where one unit in the last place is 1)
ROUND_MAGIC = float(2**23 + 2**22)
EXP2_MIN = -127.0  # inputs are clamped here: 2**-127 comes out as exactly 0 (see exp2_emulated)


@functools.cache
def exp2_poly_coefficients(degree: int = 3) -> tuple[float, ...]:
    """Coefficients (c0 = 1, c1, ..., c_degree), float32-representable, of a polynomial close to
    2**f on [0, 1) in *relative* error (Lawson's iteration towards the minimax fit).

    c0 is pinned to 1 so that 2**0 is exact: the largest entry of each row of P is then exactly
    1, and a clamped -inf input becomes exactly 0.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or not 1 <= degree <= 6:
        raise ValueError(f"degree must be an integer from 1 to 6, got {degree!r}")
    f = 0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, 2001))  # Chebyshev-spaced points of [0, 1]
    target = np.exp2(f)
    # the residual p(f) - 2**f = (1 - 2**f) + sum_k c_k f**k, divided by 2**f (relative)
    basis = np.stack([f**k for k in range(1, degree + 1)], axis=1) / target[:, None]
    rhs = (target - 1.0) / target
    weights = np.full(f.size, 1.0 / f.size)
    for _ in range(400):  # Lawson: reweight by |residual| until the weighted LSQ fit equioscillates
        sw = np.sqrt(weights)
        coef, *_ = np.linalg.lstsq(basis * sw[:, None], rhs * sw, rcond=None)
        residual = np.abs(basis @ coef - rhs)
        weights = weights * residual
        weights /= weights.sum()
    return (1.0, *(float(np.float32(c)) for c in coef))


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c rounded once to float32 (float32 products are exact in float64; the float64
    sum is then rounded to float32, which matches a true fma except in rare double-rounding
    ties, a difference of one float32 unit)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def exp2_emulated(x, degree: int = 3) -> np.ndarray:
    """2**x for x <= 127 by the FMA-unit sequence the Gluon kernel runs, in float32:

    clamp to -127; r = x + ROUND_MAGIC rounded down (floor(x) now in r's low bits); f = x -
    (r - ROUND_MAGIC), the fraction in [0, 1); Horner's rule for 2**f (in [1, 2), exponent bits
    127); then add floor(x) << 23 to those bits, which multiplies by 2**floor(x). At x = -127
    the polynomial is exactly 1 and the sum of bits is exactly 0: -inf (a masked score) gives 0.
    """
    x = np.asarray(x, dtype=np.float32)
    if np.any(x > 127):  # (x > 0 happens with a stale max: conditional rescaling)
        raise ValueError("exp2_emulated expects x <= 127 (scores minus a running max)")
    coeffs = exp2_poly_coefficients(degree)
    xc = np.maximum(x, np.float32(EXP2_MIN))
    # rounding toward -inf of x + magic is floor(x) + magic exactly (both are in range)
    r = (np.floor(xc.astype(np.float64)) + ROUND_MAGIC).astype(np.float32)
    f = (xc - (r - np.float32(ROUND_MAGIC))).astype(np.float32)
    p = np.full_like(f, np.float32(coeffs[-1]))
    for c in coeffs[-2::-1]:
        p = _fma32(p, f, np.full_like(f, np.float32(c)))
    bits = (r.view(np.int32).astype(np.int64) << 23) + p.view(np.int32).astype(np.int64)
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def exp2_relative_error(degree: int = 3, n: int = 200_001) -> float:
    """Largest relative error of :func:`exp2_emulated` against float64 2**x on [-20, 0]
    (where P's entries that matter live; below that they vanish next to the row's max of 1)."""
    x = np.linspace(-20.0, 0.0, n, dtype=np.float32)
    exact = np.exp2(x.astype(np.float64))
    return float(np.max(np.abs(exp2_emulated(x, degree) - exact) / exact))


def online_softmax_conditional(s, v, block: int, threshold: float = 0.0):
    """Online softmax over key blocks of ``block`` columns with FA4's conditional rescaling, in
    float64 and log2 units: ``s`` (rows, N) scores already multiplied by log2(e) (-inf =
    masked), ``v`` (N, d). The running max used for the exponentials moves only when some row's
    max grows by more than ``threshold`` (0 = every growth rescales, FA2's rule); then every
    row is rescaled, as one branch of a warpgroup would.

    Returns (o, lse2, rescales): the normalised output, log2-sum-exp per row, and how many
    blocks rescaled O. The result does not depend on ``threshold`` beyond rounding.
    """
    s = np.asarray(s, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if threshold < 0 or not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite and >= 0, got {threshold!r}")
    rows, n = s.shape
    m = np.full(rows, -np.inf)
    l_sum = np.zeros(rows)
    o = np.zeros((rows, v.shape[1]))
    rescales = 0
    for start in range(0, n, block):
        sb = s[:, start:start + block]
        m_cand = np.maximum(m, sb.max(axis=1))
        with np.errstate(invalid="ignore"):  # -inf - -inf: a row that has seen nothing yet
            grow = m_cand - m
        if threshold == 0.0 or np.any(grow > threshold):
            m_new = m_cand
            rescales += 1
        else:
            m_new = m  # stale: every exponent below stays <= threshold
        m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
        alpha = np.exp2(m - m_safe)
        p = np.exp2(sb - m_safe[:, None])
        l_sum = l_sum * alpha + p.sum(axis=1)
        o = o * alpha[:, None] + p @ v[start:start + block]
        m = m_new
    seen = l_sum > 0
    o = np.where(seen[:, None], o / np.where(seen, l_sum, 1.0)[:, None], 0.0)
    with np.errstate(divide="ignore"):
        lse2 = np.where(seen, m + np.log2(np.where(seen, l_sum, 1.0)), -np.inf)
    return o, lse2, rescales


def _f32_hex(x: float) -> str:
    """A float as a PTX float32 literal (0fXXXXXXXX), exact."""
    return f"0f{struct.unpack('<I', struct.pack('<f', x))[0]:08X}"


def exp2_asm(poly_per_8: int, degree: int) -> str:
    """PTX for 8 exponentials 2**x (x <= 127), as the Gluon forward inlines it: the first
    ``poly_per_8`` by the FMA-unit sequence of :func:`exp2_emulated`, the rest on the MUFU
    (ex2.approx.ftz)."""
    coeffs = exp2_poly_coefficients(degree)
    magic, lo = _f32_hex(ROUND_MAGIC), _f32_hex(EXP2_MIN)
    blocks = []
    for i in range(8):
        out, inp = f"${i}", f"${8 + i}"
        if i >= poly_per_8:
            blocks.append(f"ex2.approx.ftz.f32 {out}, {inp};")
            continue
        horner = [f"mov.f32 p, {_f32_hex(coeffs[-1])};"]
        horner += [f"fma.rn.ftz.f32 p, p, f, {_f32_hex(c)};" for c in coeffs[-2::-1]]
        blocks.append("{ .reg .f32 x, r, b, f, p; .reg .b32 ri, pi;\n"
                      f"max.ftz.f32 x, {inp}, {lo};\n"
                      f"add.rm.ftz.f32 r, x, {magic};\n"    # floor(x) in r's low bits
                      f"sub.rn.ftz.f32 b, r, {magic};\n"    # floor(x) as a float
                      "sub.rn.ftz.f32 f, x, b;\n"           # fraction in [0, 1)
                      + "\n".join(horner) + "\n"
                      "mov.b32 ri, r; mov.b32 pi, p;\n"
                      "shl.b32 ri, ri, 23;\n"               # floor(x) into the exponent field
                      f"add.s32 {out}, ri, pi; }}")
    return "\n".join(blocks)
