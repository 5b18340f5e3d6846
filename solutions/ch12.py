"""Chapter 12 reference solutions."""


def tflops(batch: int, heads: int, n: int, d: int, causal: bool, mode: str, ms: float) -> float:
    flops = 4 * batch * heads * n * n * d  # two matmuls of 2 N^2 d per (batch, head)
    if causal:
        flops *= 0.5
    flops *= {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]
    return flops / (ms / 1e3) / 1e12


def predict_bound(batch: int, heads: int, n_q: int, n_k: int, d: int, bytes_per_element: int,
                  peak_flops: float, bandwidth: float) -> str:
    flops = 4 * batch * heads * n_q * n_k * d
    moved = batch * heads * (2 * n_q * d + 2 * n_k * d) * bytes_per_element  # Q, O; K, V
    return "compute" if flops / moved >= peak_flops / bandwidth else "memory"
