import numpy as np

from solutions import ch02
from tests.exercises.harness import assert_exercise


def _no_rescale(m, l, s):
    m_new = max(m, np.max(s))
    return m_new, l + np.sum(np.exp(s - m_new))


def _inverted_rescale(m, l, s):
    m_new = max(m, np.max(s))
    alpha = 0.0 if m == -np.inf else np.exp(m_new - m)
    return m_new, l * alpha + np.sum(np.exp(s - m_new))


def _no_guard(m, l, s):  # the textbook formula with no care for -inf
    m_new = max(m, np.max(s))
    with np.errstate(invalid="ignore"):
        return m_new, l * np.exp(m - m_new) + np.sum(np.exp(s - m_new))


def _local_max_for_new_terms(m, l, s):
    m_new = max(m, np.max(s))
    alpha = 0.0 if m == -np.inf else np.exp(m - m_new)
    return m_new, l * alpha + np.sum(np.exp(s - np.max(s)))


def test_online_update():
    assert_exercise("ch02.online_update", ch02.online_update, wrong={
        "forgot the rescale": _no_rescale,
        "rescale upside down": _inverted_rescale,
        "NaN when a block is all -inf": _no_guard,
        "new terms against the block's own max": _local_max_for_new_terms,
        "returns a list": lambda m, l, s: [*ch02.online_update(m, l, s)],
    }, message_must_mention={"NaN when a block is all -inf": "NaN",
                             "returns a list": "tuple"})


def _naive_softmax(x, block):
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum()


def _blockwise_local(x, block):
    out = np.zeros(len(x))
    for a in range(0, len(x), block):
        chunk = x[a:a + block]
        e = np.exp(chunk - chunk.max()) if np.isfinite(chunk.max()) else np.zeros(len(chunk))
        out[a:a + block] = e / e.sum() if e.sum() else 0.0
    return out


def _nan_on_empty_row(x, block):
    m = np.max(x)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        return e / e.sum()


def test_streaming_softmax():
    assert_exercise("ch02.streaming_softmax", ch02.streaming_softmax, wrong={
        "naive exp overflows": _naive_softmax,
        "each block normalised by itself": _blockwise_local,
        "NaN for a fully masked row": _nan_on_empty_row,
    })


def _naive_lse(x, block):
    with np.errstate(over="ignore", divide="ignore"):
        return float(np.log(np.sum(np.exp(x))))


def _forgot_log(x, block):
    m, l = ch02._stats(x, block)
    return m + l if l > 0 else -np.inf


def _forgot_m(x, block):
    m, l = ch02._stats(x, block)
    with np.errstate(divide="ignore"):
        return float(np.log(l))


def test_streaming_logsumexp():
    assert_exercise("ch02.streaming_logsumexp", ch02.streaming_logsumexp, wrong={
        "naive log(sum(exp))": _naive_lse,
        "forgot the log": _forgot_log,
        "forgot to add m back": _forgot_m,
    })
