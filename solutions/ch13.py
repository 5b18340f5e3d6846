"""Chapter 13 reference solutions."""

import math

import numpy as np


def exp_time_fraction(d: int, matmul_flops: float, exp_flops: float) -> float:
    # one exp per score against 4d matmul FLOPs per score (2d for Q K^T, 2d for P V)
    return (1.0 / exp_flops) / (4 * d / matmul_flops)


def fwht(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    lead = x.shape[:-1]
    y = x.copy()
    h = 1
    while h < n:
        y = y.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2)
        h *= 2
    return y.reshape(*lead, n) / math.sqrt(n)


def ds_waits(t: int, n_buffers: int) -> tuple[int, int, int]:
    # tile t is the (t // n_buffers)-th use of buffer t % n_buffers: wait for the previous
    # use's "read by both" phase (parity flipped: a fresh barrier passes parity 1 at once),
    # then for this use's "both halves written" phase
    use = t // n_buffers
    return t % n_buffers, (use & 1) ^ 1, use & 1


def copy_engine_ok(shape, strides, element_size: int, offset_bytes: int) -> bool:
    # a 16-byte aligned base, unit stride along the head dimension, and every other stride a
    # positive multiple of 16 bytes (a stride of 0 cannot be described)
    return (offset_bytes % 16 == 0 and strides[-1] == 1
            and all(s > 0 and s * element_size % 16 == 0 for s in strides[:-1]))
