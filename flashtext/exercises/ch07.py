"""Chapter 7's exercises: the loop-swapped forward, counting causal tiles, the log-sum-exp form."""

from __future__ import annotations

import numpy as np

from flashtext import reference as ref
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect, expect_close
from flashtext.exercises.rules import peak_allocation
from flashtext.fa2 import count_blocks


def _forward_cases(rng: np.random.Generator):
    """(description, q, k, v, causal, BLOCK_M, BLOCK_N) for the forward exercise. Head
    dimensions vary (no scale 1/sqrt(d) is the same in every case); the tests of the checker
    assert that every case has the property its description names."""
    d = 8
    q, k, v = rng.standard_normal((37, d)), rng.standard_normal((37, d)), \
        rng.standard_normal((37, d))
    rising = np.linspace(-3, 3, 50)[:, None] * np.ones((1, d))  # later keys score higher
    yield "random, N=37, d=8, blocks 16 x 8", q, k, v, False, 16, 8
    yield "random, N=37, d=8, blocks 1 x 1", q, k, v, False, 1, 1
    yield "random, N=37, d=8, one block bigger than N (64 x 64)", q, k, v, False, 64, 64
    yield ("random, N_q=29, N_k=33, d=5, blocks 8 x 16", rng.standard_normal((29, 5)),
           rng.standard_normal((33, 5)), rng.standard_normal((33, 5)), False, 8, 16)
    yield ("random, N=24, d=16, blocks 8 x 8", rng.standard_normal((24, 16)),
           rng.standard_normal((24, 16)), rng.standard_normal((24, 16)), False, 8, 8)
    yield "scores around +-1000 (q scaled by 300), blocks 8 x 16", 300 * q, k, v, False, 8, 16
    yield ("every score below -1500 (q near +25, k near -25): exp(s) underflows to 0 for every "
           "key, so the running max must start at -inf, not 0, blocks 8 x 8",
           25 + 0.5 * rng.standard_normal((37, d)), -25 + 0.5 * rng.standard_normal((37, d)),
           v, False, 8, 8)
    levels = np.array([300.0, -300.0, 0.0, 200.0, -250.0])[np.arange(20) % 5]
    yield ("rows hundreds apart in one query block (scores near +600 and -600): each row needs "
           "its own running max, d=4, blocks 20 x 8",
           levels[:, None] + 0.3 * rng.standard_normal((20, 4)),
           1 + 0.3 * rng.standard_normal((30, 4)), rng.standard_normal((30, 4)), False, 20, 8)
    yield "all keys identical (tied scores), blocks 8 x 8", q, np.ones((37, d)), v, False, 8, 8
    yield ("keys whose scores rise, so each block raises the max, blocks 5 x 7",
           np.ones((20, d)), rising, rng.standard_normal((50, d)), False, 5, 7)
    yield "causal, Nq = Nk = 37, blocks 16 x 8", q, k, v, True, 16, 8
    yield ("causal, Nq=20 < Nk=45 (bottom-right: the last query sees every key), blocks 8 x 16",
           q[:20], rng.standard_normal((45, d)), rng.standard_normal((45, d)), True, 8, 16)
    yield ("causal, Nq=37 > Nk=12 (bottom-right: the first 25 queries see no key: output 0, "
           "lse -inf), blocks 8 x 4", q, k[:12], v[:12], True, 8, 4)
    yield ("causal, Nq=21 > Nk=6, d=3 (the first 15 queries see no key), blocks 4 x 4",
           rng.standard_normal((21, 3)), rng.standard_normal((6, 3)),
           rng.standard_normal((6, 3)), True, 4, 4)


# the stated rule, checked on its own case: no N x N matrix, only tiles
RULE_CASE = (512, 8, 32, 32)


def _check_tiles_only(fn, rng: np.random.Generator) -> None:
    n, d, bm, bn = RULE_CASE
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    (o, _), peak = peak_allocation(fn, q, k, v, False, bm, bn)
    scores = n * n * 8
    expect(peak < scores // 4,
           f"N_q = N_k = {n}, d = {d}, blocks {bm} x {bn}: your function allocated "
           f"{peak / 1e6:.2f} MB at its peak, as much as the {n} x {n} score matrix "
           f"({scores / 1e6:.2f} MB) would take: the loop-swapped forward holds one "
           f"{bm} x {bn} tile of scores at a time, never S = Q K^T whole.")
    expect_close(o, ref.attention(q, k, v), what="the output o",
                 case=f"N_q = N_k = {n}, d = {d}, blocks {bm} x {bn}", rtol=1e-9, atol=1e-12)


@exercise(
    "ch07.forward_q_outer",
    "The loop-swapped (FlashAttention-2) forward",
    hints=(
        "Outer loop: for start_m in range(0, Nq, BLOCK_M). Set m_i = -inf, l_i = 0, acc = 0 for "
        "the rows of that block; they stay local to the outer iteration.",
        "Inner loop over start_n: s = (q_blk @ k_blk.T) * sm_scale; m_new = max(m_i, rowmax(s)); "
        "alpha = exp(m_i - m_new); p = exp(s - m_new); l_i = alpha * l_i + rowsum(p); "
        "acc = alpha * acc + p @ v_blk.",
        "Only after the inner loop: o = acc / l_i and lse = m_i + log(l_i).",
        "A row that has seen no key yet has m = -inf, and -inf - (-inf) is NaN: subtract 0 "
        "instead of m_new for such rows (np.where(np.isneginf(m_new), 0, m_new)).",
        "Causal, bottom-right: query i sees key j when j <= i + (Nk - Nq). A row that sees no "
        "key at all gets o = 0 and lse = -inf.",
    ),
)
def check_forward_q_outer(fn) -> None:
    rng = np.random.default_rng(7)
    for case, q, k, v, causal, bm, bn in _forward_cases(rng):
        got = fn(q.copy(), k.copy(), v.copy(), causal, bm, bn)
        expect(isinstance(got, tuple) and len(got) == 2,
               f"{case}: return a pair (o, lse), got {describe(got)}")
        o, lse = got
        want_o, want_lse = ref.attention(q, k, v, causal, return_lse=True)
        expect_close(o, want_o, what="the output o", case=case, rtol=1e-9, atol=1e-12)
        expect_close(lse, want_lse, what="the log-sum-exp lse (natural log)", case=case,
                     rtol=1e-9, atol=1e-12)
    _check_tiles_only(fn, rng)


@exercise(
    "ch07.causal_block_counts",
    "Count the tiles a causal pass skips, masks and runs in full",
    hints=(
        "Query i sees key j when j <= i + offset, offset = Nk - Nq (bottom_right) or 0 "
        "(top_left).",
        "A tile of rows [start_m, end_m) and keys [start_n, end_n) is skipped when even its LAST "
        "row sees none of its keys: start_n > (end_m - 1) + offset.",
        "It is full when even its FIRST row sees all of its keys: end_n - 1 <= start_m + offset. "
        "Everything else is masked.",
        "The last block along each axis may be shorter: end_m = min(start_m + BLOCK_M, Nq).",
    ),
)
def check_causal_block_counts(fn) -> None:
    cases = [(256, 256, 64, 64, "bottom_right"), (256, 256, 32, 64, "bottom_right"),
             (100, 100, 16, 16, "top_left"), (100, 300, 32, 32, "bottom_right"),
             (100, 300, 32, 32, "top_left"), (300, 100, 32, 16, "bottom_right"),
             (300, 100, 32, 16, "top_left"), (1, 1000, 64, 64, "bottom_right"),
             (1000, 1, 64, 64, "bottom_right"), (77, 77, 128, 128, "bottom_right"),
             (130, 129, 8, 24, "bottom_right"), (5, 9, 1, 1, "top_left"),
             # top-left with a ragged last query block and key tiles narrower than the blocks'
             # padding: the padded rows must not count (end_m = min(start_m + BLOCK_M, Nq))
             (100, 300, 32, 8, "top_left"), (37, 50, 16, 4, "top_left"),
             (45, 45, 16, 3, "top_left"), (70, 140, 64, 8, "top_left")]
    for n_q, n_k, bm, bn, align in cases:
        case = f"Nq={n_q}, Nk={n_k}, BLOCK_M={bm}, BLOCK_N={bn}, align='{align}'"
        got = fn(n_q, n_k, bm, bn, align)
        c = count_blocks(n_q, n_k, bm, bn, True, align)
        want = (c.skipped, c.masked, c.full)
        expect(got is not None, f"{case}: got None. Did you forget `return`?")
        try:
            got_t = tuple(int(x) for x in got)
        except TypeError:
            raise ExerciseFailed(f"{case}: return (skipped, masked, full), got "
                                 f"{describe(got)}") from None
        if got_t != want:
            total = -(-n_q // bm) * -(-n_k // bn)
            raise ExerciseFailed(
                f"{case}: expected (skipped, masked, full) = {want} (of {total} tiles), got "
                f"{got_t}." + (" Your three counts do not add up to the number of tiles."
                               if sum(got_t) != total else ""))


def _finalize_cases(rng: np.random.Generator):
    rows, d = 6, 4
    acc = rng.standard_normal((rows, d))
    l_i = rng.uniform(0.5, 20.0, rows)
    m_i = rng.standard_normal(rows)
    yield "random statistics", acc, m_i, l_i
    yield "running max around +1000 (exp(m) overflows)", acc, m_i + 1000.0, l_i
    yield "running max around -1000 (exp(m) underflows to 0)", acc, m_i - 1000.0, l_i
    yield "l_i = 1 (one key dominates)", acc, m_i, np.ones(rows)
    yield ("running maxima hundreds apart across the rows (-1000 to +1000): every row needs "
           "its own max", acc, np.array([-1000.0, 0.0, 1000.0, -600.0, 800.0, 300.0]), l_i)
    yield ("rows 0 and 3 saw no key: m = -inf, l = 0, acc = 0",
           np.where(np.isin(np.arange(rows), [0, 3])[:, None], 0.0, acc),
           np.where(np.isin(np.arange(rows), [0, 3]), -np.inf, m_i),
           np.where(np.isin(np.arange(rows), [0, 3]), 0.0, l_i))


@exercise(
    "ch07.finalize",
    "After the last key block: the output and the log-sum-exp",
    hints=(
        "o = acc / l_i, one division per row (delayed normalisation).",
        "lse = log(sum_j exp(s_j)) = log(exp(m_i) * l_i), but never compute exp(m_i): write it "
        "as m_i + log(l_i).",
        "A row with l_i = 0 saw no key: its output is 0 and its lse is -inf (no NaN, no "
        "warning: use np.divide(..., where=...) and np.errstate).",
    ),
)
def check_finalize(fn) -> None:
    rng = np.random.default_rng(8)
    for case, acc, m_i, l_i in _finalize_cases(rng):
        got = fn(acc.copy(), m_i.copy(), l_i.copy())
        expect(isinstance(got, tuple) and len(got) == 2,
               f"{case}: return a pair (o, lse), got {describe(got)}")
        o, lse = got
        seen = l_i > 0
        want_o = np.where(seen[:, None], acc / np.where(seen, l_i, 1.0)[:, None], 0.0)
        want_lse = np.where(seen, m_i + np.log(np.where(seen, l_i, 1.0)), -np.inf)
        expect_close(o, want_o, what="the output o", case=case)
        expect_close(lse, want_lse, what="the log-sum-exp lse", case=case)
