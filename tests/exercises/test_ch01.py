import numpy as np

from solutions import ch01
from tests.exercises.harness import assert_exercise


def test_naive_attention_bytes():
    assert_exercise("ch01.naive_attention_bytes", ch01.naive_attention_bytes, wrong={
        "scores written once, never re-read": lambda b, h, n, d, s: b * h * (4 * n * d + n * n) * s,
        "forgot the heads": lambda b, h, n, d, s: b * (4 * n * d + 4 * n * n) * s,
        "counted elements, not bytes": lambda b, h, n, d, s: b * h * (4 * n * d + 4 * n * n),
        "only Q, K, V, O": lambda b, h, n, d, s: b * h * 4 * n * d * s,
    })


def test_attainable_flops():
    assert_exercise("ch01.attainable_flops", ch01.attainable_flops, wrong={
        "max instead of min": lambda i, p, b: np.maximum(p, b * np.asarray(i)),
        "memory only": lambda i, p, b: b * np.asarray(i, dtype=float),
        "python min (fails on arrays)": lambda i, p, b: min(p, b * i),
    })


def _memory_only(batch, heads, n, d, gpu):
    bh = batch * heads
    elems = {"S = QK^T": 2 * n * d + n * n, "P = softmax(S)": 2 * n * n,
             "O = PV": n * n + 2 * n * d}
    return {k: bh * v * 2 / gpu.hbm_bandwidth for k, v in elems.items()}


def _softmax_on_tensor_cores(batch, heads, n, d, gpu):
    times = ch01.step_times(batch, heads, n, d, gpu)
    bh = batch * heads
    times["P = softmax(S)"] = max(5 * bh * n * n / gpu.matmul_flops,
                                  bh * 4 * n * n / gpu.hbm_bandwidth)
    return times


def _sum_not_max(batch, heads, n, d, gpu):
    bh = batch * heads
    t = _memory_only(batch, heads, n, d, gpu)
    t["S = QK^T"] += 2 * bh * n * n * d / gpu.matmul_flops
    t["O = PV"] += 2 * bh * n * n * d / gpu.matmul_flops
    t["P = softmax(S)"] += 5 * bh * n * n / gpu.fp32_flops
    return t


def test_step_times():
    assert_exercise("ch01.step_times", ch01.step_times, wrong={
        "memory time only": _memory_only,
        "softmax at the tensor-core peak": _softmax_on_tensor_cores,
        "compute + memory instead of the max": _sum_not_max,
    })
