"""Chapter 4's exercises: line 1's block sizes on a real GPU, the largest head dimension the
paper's budget allows, and what swapping Algorithm 1's loops costs."""

from __future__ import annotations

import numpy as np

from flashtext import cost
from flashtext.exercises.core import ExerciseFailed, describe, exercise, expect, expect_close
from flashtext.hardware import GPUS


def _gpu_cases() -> list[tuple[str, int, int, int]]:
    cases = []
    for name, gpu in GPUS.items():
        for d in (32, 64, 80, 96, 128, 256):
            for size, dtype in ((2, "fp16"), (4, "fp32")):
                cases.append((f"{name} ({gpu.smem_per_sm:,} bytes of shared memory), {dtype}",
                              gpu.smem_per_sm, d, size))
    # small memories: Bc <= d (the min collapses), M < 4d, M not a multiple of 4d
    cases += [("a 16 KB SRAM, fp16", 16 * 1024, 64, 2), ("a 1,000-byte SRAM, fp32", 1000, 64, 4),
              ("a 300-byte SRAM, fp16", 300, 128, 2), ("a 49,999-byte SRAM, fp16", 49_999, 64, 2),
              ("a 6,000-byte SRAM, 1-byte fp8", 6000, 48, 1)]
    # M an exact multiple of 4d (the ceiling is a tie: no extra row), and the same memory with
    # a few bytes left over that do not make a whole element (M counts whole elements)
    cases += [("a 49,152-byte SRAM, fp16 (M = 24,576 = 96 x 4d)", 49_152, 64, 2),
              ("a 49,665-byte SRAM, fp16 (one byte left over)", 49_665, 64, 2),
              ("a 65,539-byte SRAM, fp32 (three bytes left over)", 65_539, 128, 4),
              ("a 8,193-byte SRAM, fp16 (one byte left over)", 8_193, 32, 2)]
    return cases


@exercise(
    "ch04.block_sizes_for_gpu",
    "Line 1 on a real GPU: Bc and Br from shared memory in bytes",
    hints=(
        "M in Algorithm 1 counts elements, not bytes: M = smem_bytes // bytes_per_element.",
        "Bc = ceil(M / (4 d)): a ceiling, so a remainder still buys one more row (math.ceil, or "
        "-(-M // (4 * d))).",
        "Br = min(Bc, d): Q_i and O_i never get more than d rows.",
    ),
)
def check_block_sizes_for_gpu(fn) -> None:
    for case, smem, d, size in _gpu_cases():
        got = fn(smem, d, size)
        expect(isinstance(got, tuple) and len(got) == 2,
               f"{case}, d={d}: return a tuple (Bc, Br), got {describe(got)}")
        m = smem // size
        bc, br = cost.block_sizes(m, d)
        if smem % size and got[0] != bc and got[0] == -(-smem // (4 * d * size)):
            raise ExerciseFailed(
                f"{case}, d={d}: Bc = {describe(got[0])}, but {smem:,} bytes hold only "
                f"M = {m:,} whole elements of {size} bytes (smem_bytes // bytes_per_element), "
                f"and Bc = ceil({m:,} / {4 * d}) = {bc}: the left-over byte is no element.")
        expect_close(got[0], bc, what="Bc", case=f"{case}, d={d} (M = {m:,} elements)",
                     rtol=0, atol=0)
        expect_close(got[1], br, what="Br", case=f"{case}, d={d} (M = {m:,} elements, Bc = {bc})",
                     rtol=0, atol=0)


def largest_head_dim_reference(m_elements: int) -> int:
    """Largest d whose paper budget (with line 1's block sizes) fits in M; 0 if none does."""
    d = np.arange(1, m_elements + 1, dtype=np.int64)
    bc = -(-m_elements // (4 * d))
    br = np.minimum(bc, d)
    budget = 2 * br * d + 2 * bc * d + br * bc + 2 * br
    fits = np.nonzero(budget <= m_elements)[0]
    return int(d[fits[-1]]) if fits.size else 0


@exercise(
    "ch04.largest_head_dim",
    "The largest head dimension d whose tiles fit in M elements",
    hints=(
        "The budget of one iteration is Br d (Q_i) + 2 Bc d (K_j, V_j) + Br d (O_i) + Br Bc "
        "(S_ij) + 2 Br (l_i, m_i), with Bc = ceil(M / 4d) and Br = min(Bc, d) from line 1.",
        "When Bc <= d, Q, K, V and O alone take 4 Bc d >= M, and S_ij comes on top: such a d "
        "never fits. You need M comfortably above 4 d^2.",
        "The budget is not a simple formula in d because of the ceiling: try every d from 1 "
        "up (d larger than M / 4 can never fit) and keep the largest that fits; return 0 if "
        "none does.",
    ),
)
def check_largest_head_dim(fn) -> None:
    cases = {f"{name} shared memory in fp16 ({g.smem_per_sm // 2:,} elements)": g.smem_per_sm // 2
             for name, g in GPUS.items()}
    cases.update({"M = 49,152 (about 100 KB of fp16)": 49_152, "M = 4,096": 4096,
                  "M = 1,000": 1000, "M = 200": 200, "M = 7": 7, "M = 1 (nothing fits)": 1,
                  "M = 8,200": 8200, "M = 131,072": 131_072})
    # budgets that land exactly on M at the answer: "at most M" includes M itself
    cases.update({f"M = {m:,} (the largest d's budget is exactly M)": m
                  for m in (16, 19, 48, 96, 160, 576)})
    for case, m in cases.items():
        got = fn(m)
        expected = largest_head_dim_reference(m)
        if isinstance(got, (int, np.integer)) and int(got) == expected + 1:
            raise ExerciseFailed(f"{case}: you returned d = {got}, but at d = {got} the budget "
                                 f"is {cost.fa1_paper_budget(m, int(got)):,} > M = {m:,}. "
                                 "Off by one?")
        if isinstance(got, (int, np.integer)) and int(got) < expected \
                and cost.fa1_paper_budget(m, expected) == m:
            raise ExerciseFailed(f"{case}: you returned d = {got}, but d = {expected} fits too: "
                                 f"its budget is exactly {m:,} = M, and the tiles must take "
                                 "at most M (<=, not <).")
        expect_close(got, expected, what="the largest d", case=case, rtol=0, atol=0)


@exercise(
    "ch04.swapped_loops",
    "Swap the loops: HBM reads per tensor when the outer loop runs over Q blocks",
    hints=(
        "Swapping lines 5 and 7 puts line 6 (load K_j, V_j) outside the loop over j: it can "
        "only load one K/V block there, and the SRAM cannot hold them all. Line 6 must move "
        "into the inner loop, next to line 8.",
        "Line 8 (load Q_i, O_i, l_i, m_i) stays in the inner loop: the bookkeeping is unchanged, "
        "so Q, O, l and m are still read once per (i, j): Tc times each over the whole run.",
        "K and V are now read once per (i, j) too: Tr times each, Tr = ceil(N / Br).",
        "Return a dict with keys 'Q', 'K', 'V', 'O', 'l', 'm' and element counts as values.",
    ),
)
def check_swapped_loops(fn) -> None:
    cases = [(1024, 64, 49_152), (1000, 64, 4096), (37, 8, 200), (4096, 128, 116_736),
             (100, 4, 48), (7, 16, 10_000), (513, 32, 3000)]
    for n, d, m in cases:
        case = f"N={n}, d={d}, M={m}"
        got = fn(n, d, m)
        expect(isinstance(got, dict),
               f"{case}: return a dict of reads by tensor, got {describe(got)}")
        expected = cost.fa1_hbm_elements(n, d, m, loop_order="q_outer")["reads"]
        unswapped = cost.fa1_hbm_elements(n, d, m)["reads"]
        missing = sorted(set(expected) - set(got))
        expect(not missing, f"{case}: your dict lacks {missing}")
        for name, value in expected.items():
            note = ""
            if got[name] == unswapped[name] != value:
                note = (" That is Algorithm 1's count in its own loop order; with the loops "
                        "swapped, line 6 runs inside the inner loop.")
            expect(got[name] == value,
                   f"{case}: reads of {name} should be {value:,}, got {describe(got[name])}."
                   f"{note}")
