"""Chapter 2's exercises: the online (m, l) update, a streaming softmax, a streaming log-sum-exp."""

from __future__ import annotations

import numpy as np

from flashtext import reference as ref
from flashtext.exercises.core import (
    ExerciseFailed,
    adversarial_rows,
    describe,
    exercise,
    expect,
    expect_close,
    number,
)
from flashtext.exercises.rules import StreamedRow
from flashtext.online import SoftmaxState

BLOCKS = (1, 2, 3, 4, 8, 64)


def _rows(seed: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = {}
    for n in (1, 7, 23):
        for name, x in adversarial_rows(rng, n).items():
            rows[f"{name}, n={n}"] = x
    first_masked = rng.standard_normal(11) * 4
    first_masked[:4] = -np.inf
    rows["first 4 scores -inf (a masked first block), n=11"] = first_masked
    rows["max in the middle, n=9"] = np.array([0.0, -3.0, 2.0, 40.0, 1.0, -50.0, 39.0, 7.0, 0.0])
    return rows


def _blocks(x: np.ndarray, block: int):
    return [x[a:a + block] for a in range(0, len(x), block)]


@exercise(
    "ch02.online_update",
    "The online softmax update of (m, l)",
    hints=(
        "m_new is the larger of the old m and the largest score in the block.",
        "Everything in l was computed as exp(s - m_old); multiply it by exp(m_old - m_new) to "
        "re-base it on m_new, then add sum(exp(s_j - m_new)) for the new block.",
        "At the start m = -inf and l = 0: exp(-inf - (-inf)) is NaN, so use a rescale factor "
        "of 0 when m_old is -inf (np.where, or an if).",
        "A block that is all -inf leaves m at -inf; subtract 0 instead of -inf then, so "
        "exp(-inf - 0) = 0 and no NaN appears.",
    ),
)
def check_online_update(fn) -> None:
    for name, x in _rows().items():
        for block in BLOCKS:
            m, l = -np.inf, 0.0  # noqa: E741
            state = SoftmaxState.empty()
            for k, chunk in enumerate(_blocks(x, block)):
                case = (f"{name}, block={block}: after block {k} with scores "
                        f"{np.array2string(chunk[:6], precision=3)} starting from "
                        f"(m={number(m)}, l={number(l)})")
                out = fn(m, l, chunk.copy())
                expect(isinstance(out, tuple) and len(out) == 2,
                       f"{case}: return a tuple (m_new, l_new), got {describe(out)}")
                state = state.update(chunk)
                expect_close(out[0], state.m, what="m_new", case=case, rtol=0, atol=0)
                expect_close(out[1], state.l, what="l_new", case=case, rtol=1e-12, atol=1e-300)
                m, l = float(out[0]), float(out[1])  # noqa: E741


def _check_softmax_like(fn, what: str, expected_of, rtol: float) -> None:
    rows = _rows(3)
    rows["every score -inf (no key visible), n=5"] = np.full(5, -np.inf)
    for name, x in rows.items():
        for block in BLOCKS:
            case = f"{name}, block={block}"
            log: list[str] = []
            got = fn(StreamedRow(x.copy(), block, log), block)
            expect_close(got, expected_of(x), what=what, case=case, rtol=rtol, atol=1e-300)
            if log:
                raise ExerciseFailed(
                    f"{case}: your function used {log[0]}; a streaming pass reads at most "
                    f"block={block} scores at a time (x[a:a + block]) and folds them into "
                    "(m, l) with online_update: no whole-row max or sum.")


@exercise(
    "ch02.streaming_softmax",
    "Softmax streamed over blocks",
    builds_on=("ch02.online_update",),
    hints=(
        "Two passes over the blocks: the first folds (m, l) with your online update, the "
        "second writes exp(x - m) / l block by block.",
        "Do not normalise a block by its own sum: every block is divided by the final l.",
        "A row where every score is -inf has no visible key: return zeros there (not NaN), "
        "the convention of flashtext.reference.softmax and FlashAttention.",
    ),
)
def check_streaming_softmax(fn) -> None:
    _check_softmax_like(fn, "the probabilities", ref.softmax, rtol=1e-12)


@exercise(
    "ch02.streaming_logsumexp",
    "log-sum-exp in one streaming pass",
    builds_on=("ch02.online_update",),
    hints=(
        "Fold (m, l) over the blocks exactly as for softmax.",
        "log(sum_j exp(x_j)) = m + log(sum_j exp(x_j - m)) = m + log(l).",
        "If every score is -inf then l = 0 and the answer is -inf (log 0), not NaN.",
    ),
)
def check_streaming_logsumexp(fn) -> None:
    _check_softmax_like(fn, "the log-sum-exp", ref.logsumexp, rtol=1e-12)
