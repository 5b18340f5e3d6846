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


def test_attainable_flops_rejects_a_remembered_ridge():
    def ridge_200(i, p, b):  # "the ridge is about 200 FLOP/B" (true for an A100 and an H200)
        i = np.asarray(i, dtype=float)
        return np.where(i >= 200.0, p, b * i)

    def ridge_of_h100(i, p, b):
        i = np.asarray(i, dtype=float)
        return np.where(i >= 989e12 / 3.35e12, p, b * i)

    assert_exercise("ch01.attainable_flops", ch01.attainable_flops, wrong={
        "hard-coded ridge of 200 FLOP/B": ridge_200,
        "the H100's ridge for every GPU": ridge_of_h100,
    }, message_must_mention={"hard-coded ridge of 200 FLOP/B": "FLOP/B"})


def test_the_roofline_cases_straddle_every_ridge():
    from flashtext.exercises.ch01 import _roofline_machines

    ridges = [p / b for p, b in _roofline_machines().values()]
    assert min(ridges) < 10 and max(ridges) > 1000  # no single remembered ridge fits all
    assert any(100 < r < 250 for r in ridges) and any(250 < r < 400 for r in ridges)
