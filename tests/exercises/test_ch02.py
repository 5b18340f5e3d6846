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


def _global_max_first(x, block):  # right values, but not streamed: the whole row's max first
    m = float(np.max(x))
    if m == -np.inf:
        return np.zeros(len(x))
    out = np.zeros(len(x))
    l = sum(float(np.sum(np.exp(x[a:a + block] - m))) for a in range(0, len(x), block))  # noqa: E741
    for a in range(0, len(x), block):
        out[a:a + block] = np.exp(x[a:a + block] - m) / l
    return out


def _max_starts_at_zero(x, block):  # the running max starts at 0, not -inf
    m, l = 0.0, 0.0  # noqa: E741
    for a in range(0, len(x), block):
        m, l = ch02.online_update(m, l, x[a:a + block])  # noqa: E741
    out = np.zeros(len(x))
    with np.errstate(all="ignore"):
        for a in range(0, len(x), block):
            out[a:a + block] = np.exp(x[a:a + block] - m) / l
    return out


def test_streaming_softmax_must_stream_and_start_from_minus_inf():
    assert_exercise("ch02.streaming_softmax", ch02.streaming_softmax, wrong={
        "the whole row's max first": _global_max_first,
        "running max started at 0": _max_starts_at_zero,
    }, message_must_mention={"the whole row's max first": "at most block="})


def test_streaming_logsumexp_must_stream():
    def whole_row(x, block):
        m = float(np.max(x))
        return -np.inf if m == -np.inf else m + float(np.log(np.sum(np.exp(x - m))))

    assert_exercise("ch02.streaming_logsumexp", ch02.streaming_logsumexp, wrong={
        "the whole row at once": whole_row,
        "m started at 0": lambda x, block: _lse_from(0.0, x, block),
    }, message_must_mention={"the whole row at once": "streaming pass"})


def _lse_from(m0, x, block):
    m, l = m0, 0.0  # noqa: E741
    for a in range(0, len(x), block):
        m, l = ch02.online_update(m, l, x[a:a + block])  # noqa: E741
    with np.errstate(divide="ignore"):
        return m + np.log(l)


def test_the_rows_have_the_properties_their_names_claim():
    from flashtext.exercises.ch02 import _rows
    from flashtext.exercises.core import adversarial_rows

    for n in (1, 7, 23):
        rows = adversarial_rows(np.random.default_rng(n), n)
        assert abs(np.mean(rows["huge positive scores (around +1000)"]) - 1000) < 20
        assert np.all(rows["huge negative scores (around -1000)"] < -745)  # exp underflows
        assert np.all(rows["all scores tied at 1.0"] == 1.0)
        rising = rows["scores increasing, so the max arrives in the last block"]
        assert np.all(np.diff(rising) >= 0)
        assert np.isneginf(rows["scores with -inf entries (masked keys)"]).any() or n == 1
    extra = _rows()
    assert np.all(np.isneginf(extra["first 4 scores -inf (a masked first block), n=11"][:4]))
    middle = extra["max in the middle, n=9"]
    assert 0 < int(np.argmax(middle)) < len(middle) - 1
