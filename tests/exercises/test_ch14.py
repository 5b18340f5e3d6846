import numpy as np

from solutions import ch14
from tests.exercises.harness import assert_exercise


def _no_max(outputs, lses):  # exp(lse) directly: overflows for large scores
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(lses)
        return np.sum(w[..., None] * outputs, 0) / w.sum(0)[..., None], np.log(w.sum(0))


def _mean(outputs, lses):  # every split weighted equally
    return outputs.mean(axis=0), ch14.combine(outputs, lses)[1]


def _max_only(outputs, lses):  # keeps the lse of the best split only
    out, _ = ch14.combine(outputs, lses)
    return out, lses.max(axis=0)


def test_combine():
    assert_exercise(
        "ch14.combine",
        ch14.combine,
        wrong={"no max subtracted": _no_max, "plain average": _mean,
               "lse of the largest split": _max_only,
               "returns only the output": lambda o, lse: ch14.combine(o, lse)[0]},
        message_must_mention={"returns only the output": "tuple"},
    )


def test_ring_volume():
    assert_exercise(
        "ch14.ring_volume",
        ch14.ring_volume,
        wrong={
            "world sends instead of world - 1":
                lambda n, d, w, b, h, s: w * w * 2 * (n // w) * d * b * h * s,
            "K only": lambda n, d, w, b, h, s: w * (w - 1) * (n // w) * d * b * h * s,
            "per rank, not total": lambda n, d, w, b, h, s: (w - 1) * 2 * (n // w) * d * b * h * s,
        },
    )
