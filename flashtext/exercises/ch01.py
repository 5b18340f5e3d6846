"""Chapter 1's exercises: bytes moved by standard attention, the roofline, which step dominates."""

from __future__ import annotations

import dataclasses

import numpy as np

from flashtext.exercises.core import describe, exercise, expect, expect_close
from flashtext.hardware import GPUS
from flashtext.roofline import standard_attention_steps

SIZES = [(1, 1, 4, 2, 2), (1, 1, 1024, 64, 2), (64, 16, 1024, 64, 2), (2, 3, 1000, 96, 4),
         (1, 32, 65536, 128, 2), (3, 5, 7, 11, 1), (8, 16, 4096, 256, 2)]


@exercise(
    "ch01.naive_attention_bytes",
    "HBM bytes moved by standard attention",
    hints=(
        "Three kernels, per (batch, head): S = QK^T reads Q and K (N x d each) and writes S "
        "(N x N); softmax reads S and writes P; O = PV reads P and V and writes O.",
        "Per head that is 4 N d + 4 N^2 elements.",
        "batch * heads * (4 N d + 4 N^2) * bytes_per_element.",
    ),
)
def check_naive_attention_bytes(fn) -> None:
    for batch, heads, n, d, size in SIZES:
        expected = sum(s.bytes for s in standard_attention_steps(batch, heads, n, d, size))
        got = fn(batch, heads, n, d, size)
        expect_close(got, expected, what="the byte count", rtol=0, atol=0,
                     case=f"batch={batch}, heads={heads}, N={n}, d={d}, "
                          f"bytes_per_element={size}")


@exercise(
    "ch01.attainable_flops",
    "The roofline",
    hints=(
        "A kernel cannot go faster than the arithmetic units (peak FLOP/s), nor faster than "
        "memory can feed it (bandwidth x FLOPs per byte).",
        "attainable = min(peak, bandwidth * intensity); use np.minimum so arrays work.",
    ),
)
def check_attainable_flops(fn) -> None:
    for key, (peak, bandwidth) in _roofline_machines().items():
        ridge = peak / bandwidth
        # both sides of the ridge and right at it, including the band between any guessed
        # ridge (100, 200, 300 FLOP/B) and the real one
        for intensity in (0.25, 1.25, 10.0, 0.5 * ridge, 0.75 * ridge, 0.95 * ridge, ridge,
                          1.05 * ridge, 1.5 * ridge, 1000.0, 1e6):
            expected = min(peak, bandwidth * intensity)
            got = fn(intensity, peak, bandwidth)
            expect_close(got, expected, what="attainable FLOP/s", rtol=1e-12,
                         case=f"{key}: intensity {intensity:.6g} FLOP/B (ridge {ridge:.4g} "
                              "FLOP/B)")
    xs = np.array([0.1, 10.0, 100.0, 1000.0])
    got = fn(xs, 312e12, 1.5e12)
    expect_close(got, np.minimum(312e12, 1.5e12 * xs), what="attainable FLOP/s", rtol=1e-12,
                 case="an array of intensities [0.1, 10, 100, 1000] on an A100")


def _roofline_machines() -> dict[str, tuple[float, float]]:
    """(peak FLOP/s, bandwidth B/s) of the book's GPUs and of two imaginary machines whose
    ridges (5 and 5000 FLOP/B) are far from any real GPU's, so no remembered ridge passes."""
    machines = {key: (gpu.matmul_flops, gpu.hbm_bandwidth) for key, gpu in GPUS.items()}
    machines["an imaginary chip with a ridge of 5 FLOP/B (10 TFLOP/s, 2 TB/s)"] = (10e12, 2e12)
    machines["an imaginary chip with a ridge of 5000 FLOP/B (5 PFLOP/s, 1 TB/s)"] = (5e15, 1e12)
    return machines


def _gpus():
    out = dict(GPUS)
    out["H200 with (imaginary) 1000x faster HBM"] = dataclasses.replace(
        GPUS["H200"], hbm_bandwidth=GPUS["H200"].hbm_bandwidth * 1000)
    return out


@exercise(
    "ch01.step_times",
    "Roofline time of each step of standard attention",
    hints=(
        "Each step takes max(FLOPs / peak, bytes / HBM bandwidth): whichever of the math and "
        "the memory traffic is slower.",
        "The matmuls run at gpu.matmul_flops; the softmax (5 operations per score: max, "
        "subtract, exp, sum, divide) at gpu.fp32_flops. Bytes: fp16, 2 per element.",
        "FLOPs: 2 N^2 d per matmul per head; bytes per head: (2 N d + N^2), 2 N^2, "
        "(N^2 + 2 N d) elements for the three steps.",
    ),
)
def check_step_times(fn) -> None:
    for key, gpu in _gpus().items():
        for batch, heads, n, d, _ in SIZES:
            steps = standard_attention_steps(batch, heads, n, d)
            got = fn(batch, heads, n, d, gpu)
            case = f"{key}, batch={batch}, heads={heads}, N={n}, d={d}"
            expect(isinstance(got, dict) and set(got) == {s.name for s in steps},
                   f"{case}: return a dict with keys {[s.name for s in steps]}, got "
                   f"{describe(got)}")
            for s in steps:
                expect_close(got[s.name], s.time(gpu), what=f"the time of {s.name} (seconds)",
                             case=case, rtol=1e-9)
