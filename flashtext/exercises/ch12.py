"""Chapter 12's exercises: TFLOP/s from a timing, and compute- or memory-bound from the roofline."""

from __future__ import annotations

from flashtext.cost import attention_flops, compulsory_hbm_elements
from flashtext.exercises.core import describe, exercise, expect, expect_close
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
                          f"mode='{mode}', {ms} ms")


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


# An imaginary GPU whose ridge is exactly 256 FLOP/B (256 TFLOP/s over 1 TB/s), and cases whose
# intensity is exactly 256 (N_q = N_k = 512 in fp16; 2 N_q N_k / ((N_q + N_k) bytes)) or just
# off it. Every number involved is an integer times a power of two, so the tie is exact in
# floating point whatever the order of the operations: "at or above the ridge" is compute.
TIE_GPU = ("an imaginary GPU with a ridge of exactly 256 FLOP/B (256 TFLOP/s, 1 TB/s)",
           256e12, 1e12)
TIE_CASES = [(1, 1, 512, 512, 64, 2), (4, 8, 512, 512, 128, 2), (1, 1, 256, 256, 64, 1),
             (1, 1, 510, 512, 64, 2)]


def _bound_cases():
    """(description, case, peak, bandwidth, must be away from the ridge)."""
    for key, gpu in GPUS.items():
        for case in BOUND_CASES:
            yield key, case, gpu.matmul_flops, gpu.hbm_bandwidth, True
    name, peak, bandwidth = TIE_GPU
    for case in TIE_CASES:
        yield name, case, peak, bandwidth, False


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
    for key, (batch, heads, n_q, n_k, d, size), peak, bandwidth, away in _bound_cases():
        ridge = peak / bandwidth
        flops = attention_flops(batch, heads, n_q, d, n_k=n_k)
        moved = batch * heads * compulsory_hbm_elements(n_q, d, n_k) * size
        assert not away or abs(flops / moved / ridge - 1) > 0.1, "a case too close to the ridge"
        expected = bound_reference(batch, heads, n_q, n_k, d, size, peak, bandwidth)
        seen.add(expected)
        got = fn(batch, heads, n_q, n_k, d, size, peak, bandwidth)
        expect(got in ("compute", "memory"),
               f"the answer must be 'compute' or 'memory', got {describe(got)}")
        at = " (exactly at the ridge: at or above it is compute-bound)" \
            if flops / moved == ridge else ""
        expect(got == expected,
               f"{key} (ridge {ridge:.0f} FLOP/B), batch={batch}, heads={heads}, "
               f"N_q={n_q}, N_k={n_k}, d={d}, {size} bytes per element: intensity "
               f"{flops / moved:.6g} FLOP/B{at}, so '{expected}'-bound; you said '{got}'.")
    assert seen == {"compute", "memory"}
