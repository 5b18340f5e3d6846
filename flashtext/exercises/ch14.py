"""Chapter 14's exercises: combine split-KV partial results, and count a ring's traffic."""

from __future__ import annotations

import numpy as np

from flashtext import reference, ring
from flashtext.exercises.core import exercise, expect, expect_close
from flashtext.online import combine_partials
from flashtext.splitkv import split_attention


def _combine_cases(rng: np.random.Generator):
    """(description, outputs (S, rows, d), lses (S, rows)). The tests of the checker assert that
    every case has the property its description names."""
    def partials(q, k, v, splits, causal=False):
        _, _, o, lse = split_attention(q, k, v, splits, causal=causal, return_lse=True,
                                       return_partials=True)
        return o, lse

    q, k, v = rng.standard_normal((4, 8)), rng.standard_normal((37, 8)), \
        rng.standard_normal((37, 8))
    for splits in (1, 2, 5):
        yield (f"{splits} split{'s' if splits > 1 else ''} of 37 keys, 4 query rows",
               *partials(q, k, v, splits))
    yield ("huge scores (q x 300): lses in the hundreds, exp(lse) overflows",
           *partials(q * 300.0, k, v, 3))
    yield ("every score below -2000 (q near +30, k near -30): exp(lse) underflows to 0",
           *partials(30 + 0.5 * rng.standard_normal((4, 8)),
                     -30 + 0.5 * rng.standard_normal((37, 8)), v, 3))
    levels = np.array([300.0, -300.0, 0.0, 150.0, -200.0])[:, None]
    yield ("rows hundreds apart (lses from about -850 to +850): each row needs its own max "
           "over the splits, not one for all rows",
           *partials(levels + 0.3 * rng.standard_normal((5, 8)),
                     1 + 0.3 * rng.standard_normal((37, 8)), v, 4))
    yield ("6 splits of 3 keys: three splits are empty (lse = -inf, output 0)",
           *partials(q, k[:3], v[:3], 6))
    yield ("causal, 7 queries over 4 keys: the first 3 rows see no key in any split",
           *partials(rng.standard_normal((7, 8)), k[:4], v[:4], 2, causal=True))


@exercise(
    "ch14.combine",
    "Combine split-KV partial outputs by their log-sum-exps",
    hints=(
        "Split s attended to its own keys only: o_s is normalised by its own sum "
        "l_s = exp(lse_s). The full softmax sum is sum_s exp(lse_s).",
        "So out = sum_s exp(lse_s) o_s / sum_s exp(lse_s), and lse = log sum_s exp(lse_s). "
        "Subtract m = max_s lse_s before exponentiating, or exp overflows.",
        "A split that saw no key has lse_s = -inf: its weight is 0. If every split has -inf "
        "(a row that sees no key), return output 0 and lse -inf, not NaN.",
    ),
)
def check_combine(fn) -> None:
    rng = np.random.default_rng(14)
    for case, outputs, lses in _combine_cases(rng):
        exp_out, exp_lse = combine_partials(outputs, lses)
        case = f"{case}; outputs {outputs.shape}, lses {lses.shape}"
        got = fn(outputs.copy(), lses.copy())
        expect(isinstance(got, tuple) and len(got) == 2,
               f"{case}: return a tuple (output, lse), got {type(got).__name__}")
        expect_close(got[0], exp_out, what="the combined output", case=case, rtol=1e-9,
                     atol=1e-12)
        expect_close(got[1], exp_lse, what="the combined lse", case=case, rtol=1e-9,
                     atol=1e-12)
    # and it is attention: the combine of the partials is the reference output
    q, k, v = (rng.standard_normal((n, 16)) for n in (15, 64, 64))
    _, _, o, lse = split_attention(q, k, v, 4, return_lse=True, return_partials=True)
    case = "4 splits of 64 keys, 15 query rows, d=16 (vs float64 attention)"
    got = fn(o, lse)
    expect(isinstance(got, tuple) and len(got) == 2,
           f"{case}: return a tuple (output, lse), got {type(got).__name__}")
    expect_close(got[0], reference.attention(q, k, v), what="the attention output", case=case,
                 rtol=1e-9, atol=1e-12)


@exercise(
    "ch14.ring_volume",
    "Bytes a ring attention forward sends",
    hints=(
        "Each rank holds n / world rows of K and of V: a shard of "
        "2 * (n / world) * d * batch * heads * bytes_per_element bytes.",
        "A shard must visit the other world - 1 ranks: every rank sends a shard at world - 1 of "
        "the world steps (the last shard it holds goes nowhere).",
        "Total = world ranks * (world - 1) sends * shard bytes.",
    ),
)
def check_ring_volume(fn) -> None:
    cases = [(8192, 128, 4, 1, 1, 2), (8192, 128, 4, 2, 8, 2), (4096, 64, 8, 1, 32, 2),
             (1 << 20, 128, 16, 1, 8, 2), (1024, 64, 2, 3, 4, 4), (64, 16, 1, 1, 1, 2),
             (131072, 128, 64, 1, 1, 1)]
    for n, d, world, batch, heads, size in cases:
        expected = ring.ring_bytes(n, d, world, batch, heads, size)["total"]
        expect_close(fn(n, d, world, batch, heads, size), expected, what="the total bytes",
                     case=f"n={n}, d={d}, world={world}, batch={batch}, heads={heads}, "
                          f"bytes_per_element={size}", rtol=0, atol=0)
