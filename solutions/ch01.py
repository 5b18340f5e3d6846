"""Chapter 1 reference solutions."""

import numpy as np


def naive_attention_bytes(batch: int, heads: int, n: int, d: int, bytes_per_element: int) -> int:
    # S = QK^T: read Q, K, write S; softmax: read S, write P; O = PV: read P, V, write O
    return batch * heads * (4 * n * d + 4 * n * n) * bytes_per_element


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    return np.minimum(peak_flops, bandwidth * np.asarray(intensity, dtype=float))


def step_times(batch: int, heads: int, n: int, d: int, gpu) -> dict[str, float]:
    bh, size = batch * heads, 2
    work = {  # (FLOPs, HBM bytes, peak FLOP/s)
        "S = QK^T": (2 * bh * n * n * d, bh * (2 * n * d + n * n) * size, gpu.matmul_flops),
        "P = softmax(S)": (5 * bh * n * n, bh * 2 * n * n * size, gpu.fp32_flops),
        "O = PV": (2 * bh * n * n * d, bh * (n * n + 2 * n * d) * size, gpu.matmul_flops),
    }
    return {name: max(f / peak, b / gpu.hbm_bandwidth) for name, (f, b, peak) in work.items()}
