import math

from solutions import ch04
from tests.exercises.harness import assert_exercise


def test_block_sizes_for_gpu():
    def floor(smem, d, size):
        bc = (smem // size) // (4 * d)
        return bc, min(bc, d)

    assert_exercise(
        "ch04.block_sizes_for_gpu",
        ch04.block_sizes_for_gpu,
        wrong={
            "bytes used as elements": lambda smem, d, size: ch04.block_sizes_for_gpu(smem, d, 1),
            "floor instead of ceil": floor,
            "no min with d": lambda smem, d, size: (math.ceil(smem // size / (4 * d)),) * 2,
            "Br = d always": lambda smem, d, size: (math.ceil(smem // size / (4 * d)), d),
        },
        message_must_mention={"no min with d": "Br"},
    )


def test_largest_head_dim():
    def ignores_s(m):
        best = 0
        for d in range(1, m // 4 + 2):
            bc = math.ceil(m / (4 * d))
            br = min(bc, d)
            if 2 * br * d + 2 * bc * d + 2 * br <= m:
                best = d
        return best

    assert_exercise(
        "ch04.largest_head_dim",
        ch04.largest_head_dim,
        wrong={
            "sqrt(M / 4)": lambda m: int(math.isqrt(m // 4)),
            "forgot S_ij": ignores_s,
            "off by one": lambda m: ch04.largest_head_dim(m) + 1,
        },
        message_must_mention={"off by one": "Off by one"},
    )


def test_swapped_loops():
    def unswapped(n, d, m):
        out = ch04.swapped_loops(n, d, m)
        return {**out, "K": n * d, "V": n * d}

    def hoisted_q(n, d, m):
        return {**ch04.swapped_loops(n, d, m), "Q": n * d}

    assert_exercise(
        "ch04.swapped_loops",
        ch04.swapped_loops,
        wrong={
            "line 6 not moved": unswapped,
            "Q read once": hoisted_q,
            "a list": lambda n, d, m: list(ch04.swapped_loops(n, d, m).values()),
        },
        message_must_mention={"line 6 not moved": "line 6 runs inside"},
    )


def test_block_sizes_count_whole_elements_and_ties():
    def true_division(smem, d, size):  # M = smem / size keeps the half element
        bc = math.ceil(smem / size / (4 * d))
        return bc, min(bc, d)

    def floor_plus_one(smem, d, size):  # "ceil" as floor + 1: wrong when 4d divides M
        bc = (smem // size) // (4 * d) + 1
        return bc, min(bc, d)

    assert_exercise("ch04.block_sizes_for_gpu", ch04.block_sizes_for_gpu, wrong={
        "true division for M": true_division,
        "floor + 1 for the ceiling": floor_plus_one,
    }, message_must_mention={"true division for M": "left-over byte"})


def test_largest_head_dim_at_most_means_equal_fits():
    def strictly_below(m):
        best = 0
        for d in range(1, m // 4 + 2):
            bc = math.ceil(m / (4 * d))
            br = min(bc, d)
            if 2 * br * d + 2 * bc * d + br * bc + 2 * br < m:
                best = d
        return best

    assert_exercise("ch04.largest_head_dim", ch04.largest_head_dim, wrong={
        "< instead of <=": strictly_below,
        "returns a string": lambda m: str(ch04.largest_head_dim(m)),
    }, message_must_mention={"< instead of <=": "exactly", "returns a string": "str"})


def test_the_tie_cases_are_ties():
    from flashtext import cost

    for m in (16, 19, 48, 96, 160, 576):
        d = ch04.largest_head_dim(m)
        assert cost.fa1_paper_budget(m, d) == m


def test_the_block_size_cases_have_the_properties_their_names_claim():
    from flashtext.exercises.ch04 import _gpu_cases

    left_over = 0
    for case, smem, d, size in _gpu_cases():
        if "left over" in case:
            assert smem % size and (smem // size) % (4 * d) == 0  # true division would tip it
            left_over += 1
        if "exact multiple of 4d" in case:
            assert smem % size == 0 and (smem // size) % (4 * d) == 0
    assert left_over >= 3
