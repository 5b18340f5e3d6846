import numpy as np

from flashtext import tiled
from solutions import ch05
from tests.exercises.harness import assert_exercise


def _factor(m_from, m_new):
    safe = np.where(np.isneginf(m_new), 0.0, m_new)
    return np.where(np.isneginf(m_from), 0.0, np.exp(m_from - safe))


def _norm(x, l_new):
    return np.where(l_new[:, None] > 0, x / np.where(l_new > 0, l_new, 1.0)[:, None], 0.0)


def no_green_rescale(o_i, l_i, m_i, p, mt, v, l_new, m_new):
    return _norm(l_i[:, None] * o_i + _factor(mt, m_new)[:, None] * (p @ v), l_new)


def no_yellow_rescale(o_i, l_i, m_i, p, mt, v, l_new, m_new):
    return _norm(_factor(m_i, m_new)[:, None] * l_i[:, None] * o_i + p @ v, l_new)


def no_rescale_at_all(o_i, l_i, m_i, p, mt, v, l_new, m_new):
    return _norm(l_i[:, None] * o_i + p @ v, l_new)


def forgot_diag_l(o_i, l_i, m_i, p, mt, v, l_new, m_new):
    return _norm(_factor(m_i, m_new)[:, None] * o_i + _factor(mt, m_new)[:, None] * (p @ v),
                 l_new)


def typo_273(o_i, l_i, m_i, p, mt, v, l_new, m_new):
    return l_new[:, None] * (_factor(m_i, m_new)[:, None] * l_i[:, None] * o_i
                             + _factor(mt, m_new)[:, None] * (p @ v))


def naive_exp(o_i, l_i, m_i, p, mt, v, l_new, m_new):
    with np.errstate(all="ignore"):
        return (l_i[:, None] * np.exp(m_i - m_new)[:, None] * o_i
                + np.exp(mt - m_new)[:, None] * (p @ v)) / l_new[:, None]


def test_line12():
    assert_exercise(
        "ch05.line12",
        ch05.line12,
        wrong={
            "no green rescale": no_green_rescale,
            "no yellow rescale": no_yellow_rescale,
            "no rescale at all": no_rescale_at_all,
            "forgot diag(l_i)": forgot_diag_l,
            "the #273 typo": typo_273,
            "NaN on empty rows": naive_exp,
            "forgot to return": lambda *a: None,
        },
        message_must_mention={
            "no green rescale": "GREEN term",
            "no yellow rescale": "YELLOW term",
            "forgot diag(l_i)": "diag(l_i)",
            "the #273 typo": "#273",
            "NaN on empty rows": "-inf",
            "forgot to return": "return",
        },
    )


def test_library_line12_passes_too():
    assert_exercise("ch05.line12", tiled.line12_paper, wrong={
        "no green rescale": no_green_rescale, "no yellow rescale": no_yellow_rescale})


def test_the_line12_cases_have_the_properties_their_names_claim():
    from flashtext.exercises.ch05 import _cases

    for case, spec in _cases():
        q, k, v = spec["qkv"]
        s = q @ k.T * (spec.get("scale") or 1 / np.sqrt(q.shape[1]))
        if case.startswith("huge scores"):
            assert np.abs(s).max() > 1000 and s.max() > 709  # exp(m) overflows
        if case.startswith("scores rising"):
            assert np.all(np.diff(s, axis=1) > 0)
        if case.startswith("scores falling"):
            assert np.all(np.diff(s, axis=1) < 0)
        if "see no key" in case:
            assert spec.get("causal") and q.shape[0] > k.shape[0]
