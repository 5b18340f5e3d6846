"""Chapter 12's exercises: TFLOP/s from a timing, and compute- or memory-bound from the roofline."""

from __future__ import annotations

from flashtext.cost import attention_flops, compulsory_hbm_elements
from flashtext.exercises.core import exercise, expect, expect_close
from flashtext.hardware import GPUS


def tflops_reference(batch: int, heads: int, n: int, d: int, causal: bool, mode: str,
                     ms: float) -> float:
    return attention_flops(batch, heads, n, d, causal=causal, mode=mode) / (ms * 1e-3) / 1e12


@exercise(
    "ch12.tflops",
    "TFLOP/s from a timing",
    hints=(
        "Count first: the forward does two matmuls of 2 N^2 d FLOPs per (batch, head): "
        "4 B H N^2 d.",
        "causal halves the count; mode 'bwd' is 2.5x the forward, 'fwd_bwd' 3.5x.",
        "The time is in milliseconds: FLOP/s = FLOPs / (ms / 1000); TFLOP/s divides by 1e12.",
    ),
)
def check_tflops(fn) -> None:
    cases = [(4, 16, 4096, 128, False, "fwd", 0.995), (4, 16, 4096, 128, True, "fwd", 0.6),
             (1, 16, 16384, 128, False, "fwd_bwd", 14.3), (32, 32, 512, 64, True, "fwd_bwd", 0.4),
             (2, 3, 1000, 96, False, "bwd", 0.02), (1, 1, 64, 16, True, "bwd", 1e-3),
             (8, 16, 2048, 64, False, "fwd", 123.0)]
    for batch, heads, n, d, causal, mode, ms in cases:
        got = fn(batch, heads, n, d, causal, mode, ms)
        expect_close(got, tflops_reference(batch, heads, n, d, causal, mode, ms),
                     what="TFLOP/s", rtol=1e-9, atol=0,
                     case=f"batch={batch}, heads={heads}, N={n}, d={d}, causal={causal}, "
                          f"mode={mode!r}, {ms} ms")


def bound_reference(batch: int, heads: int, n_q: int, n_k: int, d: int, bytes_per_element: int,
                    peak_flops: float, bandwidth: float) -> str:
    flops = attention_flops(batch, heads, n_q, d, n_k=n_k)
    moved = batch * heads * compulsory_hbm_elements(n_q, d, n_k) * bytes_per_element
    return "compute" if flops / moved >= peak_flops / bandwidth else "memory"


# (batch, heads, n_q, n_k, d, bytes per element): prefill, decode, short sequences, fp32/fp8,
# chosen so that no case sits within 10% of a GPU's ridge point (a guess could not pass by luck
# of rounding, and both answers appear on every GPU).
BOUND_CASES = [(4, 16, 4096, 4096, 128, 2), (1, 32, 1, 65536, 128, 2), (64, 16, 1024, 1024, 64, 2),
               (8, 8, 16, 8192, 64, 2), (1, 16, 128, 128, 128, 4), (2, 8, 2048, 2048, 256, 1),
               (16, 32, 64, 64, 64, 2), (1, 8, 16384, 16384, 64, 4), (2, 16, 512, 512, 64, 4),
               (4, 16, 256, 256, 128, 2), (1, 8, 4096, 256, 128, 2)]


@exercise(
    "ch12.predict_bound",
    "Compute- or memory-bound? The roofline's verdict for one attention call",
    hints=(
        "FLOPs: 4 B H N_q N_k d (no mask here). Bytes: what no kernel can avoid, Q and O "
        "(N_q x d each) and K and V (N_k x d each), once, times bytes_per_element.",
        "Intensity = FLOPs / bytes. The ridge point is peak_flops / bandwidth.",
        "Return 'compute' if the intensity is at or above the ridge point, else 'memory'. "
        "Decoding (N_q = 1) sits far below it: each K/V byte is used for one query only.",
    ),
)
def check_predict_bound(fn) -> None:
    seen = set()
    for key, gpu in GPUS.items():
        ridge = gpu.matmul_flops / gpu.hbm_bandwidth
        for batch, heads, n_q, n_k, d, size in BOUND_CASES:
            flops = attention_flops(batch, heads, n_q, d, n_k=n_k)
            moved = batch * heads * compulsory_hbm_elements(n_q, d, n_k) * size
            assert abs(flops / moved / ridge - 1) > 0.1, "a case too close to the ridge"
            expected = bound_reference(batch, heads, n_q, n_k, d, size, gpu.matmul_flops,
                                       gpu.hbm_bandwidth)
            seen.add(expected)
            got = fn(batch, heads, n_q, n_k, d, size, gpu.matmul_flops, gpu.hbm_bandwidth)
            expect(got in ("compute", "memory"),
                   f"the answer must be 'compute' or 'memory', got {got!r}")
            expect(got == expected,
                   f"{key} (ridge {ridge:.0f} FLOP/B), batch={batch}, heads={heads}, "
                   f"N_q={n_q}, N_k={n_k}, d={d}, {size} bytes per element: intensity "
                   f"{flops / moved:.4g} FLOP/B, so {expected!r}-bound; you said {got!r}.")
    assert seen == {"compute", "memory"}
