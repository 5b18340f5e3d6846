"""Chapter 0's warm-up exercise: the size of the attention score matrix."""

from __future__ import annotations

from flashtext.exercises.core import exercise, expect_close


def score_matrix_bytes_reference(batch: int, heads: int, n: int, bytes_per_element: int) -> int:
    return batch * heads * n * n * bytes_per_element


@exercise(
    "ch00.score_matrix_bytes",
    "Bytes of the N x N score matrix",
    hints=(
        "There is one N x N matrix of scores per (batch element, head) pair.",
        "fp16 and bf16 take 2 bytes per element, fp32 takes 4.",
        "batch * heads * N * N * bytes_per_element.",
    ),
)
def check_score_matrix_bytes(fn) -> None:
    cases = [(1, 1, 4, 4), (1, 1, 1024, 2), (8, 16, 1024, 2), (64, 16, 1024, 2),
             (2, 3, 1000, 4), (1, 32, 65536, 2), (3, 1, 7, 1)]
    for batch, heads, n, size in cases:
        got = fn(batch, heads, n, size)
        expected = score_matrix_bytes_reference(batch, heads, n, size)
        expect_close(got, expected, what="the byte count",
                     case=f"batch={batch}, heads={heads}, N={n}, bytes_per_element={size}",
                     rtol=0, atol=0)
