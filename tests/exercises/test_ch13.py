import math

import numpy as np

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
