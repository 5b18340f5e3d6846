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


def _one_max_for_all(outputs, lses):  # one max over every row and split
    m = np.max(lses[np.isfinite(lses)]) if np.isfinite(lses).any() else 0.0
    with np.errstate(all="ignore"):
        w = np.exp(lses - m)
        total = w.sum(axis=0)
        out = np.sum(w[..., None] * outputs, axis=0) / total[..., None]
        return np.nan_to_num(out), m + np.log(total)


def _broadcasts_wrong(outputs, lses):  # weights (S, rows) against outputs (S, rows, d)
    w = np.exp(lses - lses.max(axis=0))
    return np.sum(w * outputs, axis=0), lses.max(axis=0)


def test_combine_needs_a_max_per_row():
    assert_exercise("ch14.combine", ch14.combine, wrong={
        "one max for all rows": _one_max_for_all,
        "weights not broadcast over d": _broadcasts_wrong,
    }, message_must_mention={"one max for all rows": "rows hundreds apart",
                             "weights not broadcast over d": "outputs=array(shape=(1, 4, 8)"})


def test_the_combine_cases_have_the_properties_their_names_claim():
    from flashtext.exercises.ch14 import _combine_cases

    for case, outputs, lses in _combine_cases(np.random.default_rng(14)):
        assert outputs.ndim == 3 and lses.shape == outputs.shape[:2]  # (S, rows, d), (S, rows)
        finite = lses[np.isfinite(lses)]
        if "below -2000" in case:
            assert finite.max() < -2000 + np.log(37)  # every split's lse: exp underflows
        if "in the hundreds" in case:
            assert finite.max() > 709  # exp(lse) overflows float64
        if "rows hundreds apart" in case:
            row_max = lses.max(axis=0)
            assert row_max.max() - row_max.min() > 1500
        if "empty" in case:
            assert np.isneginf(lses).all(axis=1).sum() == 3
        if "see no key" in case:
            assert np.isneginf(lses[:, :3]).all()
