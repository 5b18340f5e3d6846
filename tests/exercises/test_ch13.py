import math

import numpy as np
import pytest

from solutions import ch13
from tests.exercises.harness import assert_exercise


def test_exp_time_fraction():
    assert_exercise(
        "ch13.exp_time_fraction",
        ch13.exp_time_fraction,
        wrong={
            "only Q K^T counted (2d)": lambda d, mm, ex: mm / (2 * d * ex),
            "inverted": lambda d, mm, ex: 4 * d * ex / mm,
            "d forgotten": lambda d, mm, ex: mm / (4 * ex),
        },
    )


def _one_round_only(x):
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n == 1:
        return x.copy()
    y = x.reshape(*x.shape[:-1], n // 2, 2)
    return np.stack([y[..., 0] + y[..., 1], y[..., 0] - y[..., 1]], -1).reshape(x.shape) \
        / math.sqrt(n)


def test_fwht():
    assert_exercise(
        "ch13.fwht",
        ch13.fwht,
        wrong={
            "not normalised": lambda x: ch13.fwht(x) * math.sqrt(np.shape(x)[-1]),
            "one round of butterflies": _one_round_only,
            "normalised by n": lambda x: ch13.fwht(x) / math.sqrt(np.shape(x)[-1]),
            "forgot to return": lambda x: None,
        },
        message_must_mention={"forgot to return": "return"},
    )


def _dense_hadamard(x):  # right values, but an n x n matrix: not the fast transform
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return x @ h / math.sqrt(n)


def _kronecker(x):
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    h = np.ones((1, 1))
    for _ in range(int(math.log2(n))):
        h = np.kron(h, np.array([[1.0, 1.0], [1.0, -1.0]]))
    return x @ h / math.sqrt(n)


def test_fwht_must_not_build_the_matrix():
    assert_exercise("ch13.fwht", ch13.fwht, wrong={
        "dense Hadamard matrix": _dense_hadamard,
        "Kronecker powers of [[1, 1], [1, -1]]": _kronecker,
    }, message_must_mention={"dense Hadamard matrix": "Hadamard matrix"})


def test_the_reference_transform_stays_far_below_the_memory_budget():
    from flashtext.exercises.ch13 import RULE_N
    from flashtext.exercises.rules import peak_allocation

    x = np.random.default_rng(0).standard_normal(RULE_N)
    _, peak = peak_allocation(ch13.fwht, x)
    assert peak < RULE_N * RULE_N * 8 // 32 // 10  # ten times under the limit
    _, dense = peak_allocation(_dense_hadamard, x)
    assert dense > RULE_N * RULE_N * 8 // 32


def test_the_outlier_case_is_an_outlier():
    from flashtext.exercises.ch13 import _inputs

    cases = dict(_inputs(np.random.default_rng(13)))
    spike = cases["a single outlier (100 at index 3) in a length-16 vector"]
    assert spike[3] == 100 and np.count_nonzero(spike) == 1


def test_ds_waits():
    use = lambda t, b: t // b  # noqa: E731
    assert_exercise(
        "ch13.ds_waits",
        ch13.ds_waits,
        wrong={
            "free parity without the flip": lambda t, b: (t % b, use(t, b) & 1, use(t, b) & 1),
            "ready parity flipped too": lambda t, b: (t % b, (use(t, b) & 1) ^ 1,
                                                      (use(t, b) & 1) ^ 1),
            "two buffers assumed": lambda t, b: (t % 2 % b, ((t // 2) & 1) ^ 1, (t // 2) & 1),
            "parity of the tile, not of the use": lambda t, b: (t % b, (t & 1) ^ 1, t & 1),
            "always buffer 0": lambda t, b: (0, (use(t, b) & 1) ^ 1, use(t, b) & 1),
            "a bare buffer index": lambda t, b: t % b,
            "forgot to return": lambda t, b: None,
        },
        message_must_mention={"free parity without the flip": "hangs",
                              "ready parity flipped too": "not both of tile 0",
                              "a bare buffer index": "expected (buffer, free_parity",
                              "forgot to return": "return"},
    )


def test_the_exercise_is_the_kernels_exchange():
    """The reference answer is what the fused-dQ kernel waits on (two buffers), and its wait
    after the last tile is needed: without it, some interleavings let a warpgroup write dK over
    a K half the other's last dQ GEMM still reads."""
    import inspect

    from flashtext.exercises.ch13 import ds_exchange
    from flashtext.kernels import gluon_backward as gb

    if not gb.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon: no kernel source to compare with")
    src = inspect.getsource(gb._dkdv_consumer.fn)
    assert "mbarrier.wait(ds_free.index(buf), ((t // 2) & 1) ^ 1)" in inspect.getsource(
        gb._put_ds.fn)
    assert "buf = _put_ds(ds_t, t, WG, ds_smem, ds_ready, ds_free)" in src
    assert "mbarrier.wait(ds_ready.index(buf), (t // 2) & 1)" in src
    assert "mbarrier.wait(ds_free.index((total - 1) % 2), ((total - 1) // 2) & 1)" in src
    assert [ch13.ds_waits(t, 2) for t in range(4)] == [(0, 1, 0), (1, 1, 0), (0, 0, 1),
                                                       (1, 0, 1)]
    outcomes = {ds_exchange(ch13.ds_waits, 2, 5, seed, last_wait=False) for seed in range(40)}
    assert "ok" in outcomes and any("wrote dK over its K half" in o or "overwritten with dK"
                                    in o for o in outcomes)
    assert {ds_exchange(ch13.ds_waits, 2, 5, seed) for seed in range(40)} == {"ok"}


def test_copy_engine_ok():
    ok = ch13.copy_engine_ok
    assert_exercise(
        "ch13.copy_engine_ok",
        ok,
        wrong={
            "the base offset ignored": lambda sh, st, size, off: ok(sh, st, size, 0),
            "a stride of 0 allowed": lambda sh, st, size, off: ok(
                sh, [s if s else 16 for s in st], size, off),
            "strides counted in elements, not bytes": lambda sh, st, size, off: (
                off % 16 == 0 and st[-1] == 1 and all(s > 0 and s % 16 == 0 for s in st[:-1])),
            "unit last stride not required": lambda sh, st, size, off: (
                off % 16 == 0 and all(s > 0 and s * size % 16 == 0 for s in st[:-1])),
            "contiguous only": lambda sh, st, size, off: off == 0 and list(st) == [
                math.prod(sh[i + 1:]) for i in range(len(sh))],
            "an integer answer": lambda sh, st, size, off: int(ok(sh, st, size, off)),
            "forgot to return": lambda sh, st, size, off: None,
        },
        message_must_mention={"the base offset ignored": "past an aligned address",
                              "an integer answer": "True or False",
                              "forgot to return": "return"},
    )
