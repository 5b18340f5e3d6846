"""Chapter 6's exercises: Algorithm 1's exact HBM bytes, predicting the DRAM bytes a GPU moves
(then checking against the H200 measurement), and the SRAM size from which Algorithm 1 wins."""

from __future__ import annotations

import numbers

from flashtext import cost
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect, expect_close

FA1_CASES = [(1024, 64, 49_152, 2), (1000, 64, 4096, 2), (4096, 128, 116_736, 2),
             (37, 8, 200, 4), (100, 4, 48, 4), (7, 16, 10_000, 2), (513, 32, 3000, 1),
             (256, 64, 256 * 64, 2), (64, 64, 64, 2)]


@exercise(
    "ch06.fa1_hbm_bytes",
    "Algorithm 1's exact HBM traffic in bytes",
    hints=(
        "Count by line: line 2 writes O, l and m once (N d + 2N); line 6 reads all of K and V "
        "once (2 N d); lines 8, 12, 13 read Q, O, l, m and write O, l, m at every (i, j).",
        "Summed over the inner loop, lines 8-13 touch every row of Q, O, l, m once per outer "
        "iteration: Tc (3 N d + 4 N) elements, with Tc = ceil(N / Bc) and Bc = ceil(M / 4d).",
        "Multiply the element count by bytes_per_element. Br does not appear in the total.",
    ),
)
def check_fa1_hbm_bytes(fn) -> None:
    for n, d, m, size in FA1_CASES:
        case = f"N={n}, d={d}, M={m}, {size} bytes per element"
        got = fn(n, d, m, size)
        expected = cost.fa1_hbm_total(n, d, m) * size
        four = cost.fa1_hbm_four_step(n, d, m) * size
        looks_like_four_step = (isinstance(got, numbers.Real)
                                and abs(float(got) - four) <= 1e-6 * four)
        if looks_like_four_step and four != expected:
            expect(False, f"{case}: you returned the four-step estimate 16 N^2 d^2 / M "
                          f"({four:,.0f} bytes); the exact count is {expected:,} bytes.")
        expect_close(got, expected, what="the byte count", case=case, rtol=0, atol=0)


MEASURED = ("naive", "flash")


@exercise(
    "ch06.predict_dram_bytes",
    "Predict the DRAM bytes of naive and flash attention, then compare with an H200",
    hints=(
        "naive: every head moves standard attention's 4 N d + 4 N^2 elements (S and P each "
        "make a round trip to HBM).",
        "flash: a fused kernel whose K/V re-reads hit in L2 moves only the compulsory traffic: "
        "read Q, K, V once and write O once, 4 N d elements per head (ignore the small "
        "log-sum-exp).",
        "Multiply by batch * heads * bytes_per_element.",
    ),
)
def check_predict_dram_bytes(fn) -> None:
    for impl in MEASURED:
        for n, d, batch, heads, size in [(1024, 64, 4, 16, 2), (8192, 128, 1, 32, 2),
                                         (300, 48, 3, 5, 4), (1, 8, 1, 1, 2)]:
            case = f"{impl}, N={n}, d={d}, batch={batch}, heads={heads}, {size} bytes"
            kind = "standard" if impl == "naive" else "compulsory"
            expected = cost.attention_bytes(kind, n, d, batch=batch, heads=heads,
                                            bytes_per_element=size)
            expect_close(fn(impl, n, d, batch, heads, size), expected, what="the predicted bytes",
                         case=case, rtol=1e-12, atol=0)
    _compare_with_h200(fn)


def _compare_with_h200(fn) -> None:
    """Print the reader's (now correct) predictions next to the recorded H200 measurement."""
    from flashtext import recorded

    try:
        data = recorded.load("hbm_traffic")
    except FileNotFoundError:
        return
    rows = [r for r in data["rows"] if "dram__bytes_read.sum" in r and r["d"] == 64]
    if not rows:
        return
    print(f"Your predictions next to DRAM bytes measured on {data['gpu']} ({data['date']}):")
    for r in rows:
        pred = fn(r["impl"], r["n"], r["d"], r["batch"], r["heads"], r["bytes_per_element"])
        meas = r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"]
        print(f"  {r['impl']:>5} N={r['n']:>5}: predicted {pred / 1e6:9.1f} MB, "
              f"measured {meas / 1e6:9.1f} MB ({meas / pred:.0%})")


@exercise(
    "ch06.crossover_m",
    "The smallest SRAM from which Algorithm 1 moves less than standard attention",
    builds_on=("ch06.fa1_hbm_bytes",),
    hints=(
        "Compare Algorithm 1's exact count (exercise 6.1, in elements) with standard "
        "attention's 4 N d + 4 N^2 for the same N and d.",
        "Algorithm 1's count never rises as M grows, so you can search: start from M = 1, or "
        "bisect between 1 and 4 N d (beyond 4 N d, Tc = 1 and nothing changes).",
        "If even M = 4 N d does not win (tiny N), return None. Expect an answer near 3 d^2.",
    ),
)
def check_crossover_m(fn) -> None:
    # (10, 2), (100, 10), (266, 13): at some M Algorithm 1 moves exactly as many elements as
    # standard attention, before it moves fewer (a tie that "strictly fewer" must step over)
    for n, d in [(4096, 64), (4096, 128), (1024, 64), (64, 64), (16, 1), (8192, 16), (1, 64),
                 (3, 2), (1000, 100), (10, 2), (100, 10), (266, 13)]:
        case = f"N={n}, d={d}"
        expected = cost.fa1_crossover_m(n, d)
        got = fn(n, d)
        if expected is None:
            expect(got is None, f"{case}: no M makes Algorithm 1 beat standard attention here "
                                f"(return None), got {describe(got)}")
            continue
        expect(got is not None, f"{case}: expected M = {expected:,}, got None")
        standard = cost.standard_attention_hbm_total(n, d)
        if isinstance(got, (int, float)) and 1 <= got < expected and got == int(got) \
                and cost.fa1_hbm_total(n, d, int(got)) == standard:
            raise ExerciseFailed(
                f"{case}: expected M = {expected:,}, got {int(got):,}: at M = {int(got):,} "
                f"Algorithm 1 moves exactly as many elements as standard attention "
                f"({standard:,}), not fewer. The crossover is where it moves strictly fewer.")
        if got == expected - 1 or got == expected + 1:
            expect(False, f"{case}: expected M = {expected:,}, got {got:,}: off by one. At the "
                          f"crossover Algorithm 1 must move strictly fewer elements.")
        expect_close(got, expected, what="the crossover M", case=case, rtol=0, atol=0)
