"""Chapter 15's exercises: the keys a window lets through, the GQA head map, where packed rows
belong, and a gather through a paged cache's block table.

Each checker builds its expected answers from first principles (a boolean mask, a division, the
offsets themselves) and names the input of the first case that goes wrong.
"""

from __future__ import annotations

import numpy as np

from flashtext.exercises.answer import AnswerRaised
from flashtext.exercises.core import ExerciseFailed, exercise, expect, expect_close
from flashtext.reference import window_mask


def _call(fn, case: str, *args):
    """The reader's ``fn(*args)``; a crash becomes a failure that names the input (a stub's
    NotImplementedError passes through to the framework: not attempted yet)."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the reader's code raised
        error = _unwrap(e)
        if isinstance(error, NotImplementedError):
            raise
        raise ExerciseFailed(f"{case}: your function raised {type(error).__name__}: {error}") \
            from None


def _unwrap(e: BaseException) -> BaseException:
    """What the reader's code raised (the framework's answer wrapper carries it)."""
    return e.error if isinstance(e, AnswerRaised) else e


def _keys(value) -> list[int] | None:
    """A reader's answer as a list of ints (a range, a list, an array), or None if it is not."""
    try:
        return [int(x) for x in value]
    except (TypeError, ValueError):
        return None


def _show_keys(keys: list[int]) -> str:
    if not keys:
        return "no key"
    if keys == list(range(keys[0], keys[-1] + 1)):
        return f"keys {keys[0]}..{keys[-1]} (range({keys[0]}, {keys[-1] + 1}))"
    return f"keys {keys[:8]}{' ...' if len(keys) > 8 else ''}"


# (i, n_q, n_k, left, right, causal, what the case is about)
WINDOW_CASES = [
    (5, 10, 10, -1, -1, False, "no mask: every key"),
    (0, 10, 10, -1, -1, True, "causal, first row: only key 0"),
    (9, 10, 10, -1, -1, True, "causal, last row: every key"),
    (5, 10, 10, 3, 0, False, "left edge: key i - left is inside (a tie at the edge)"),
    (5, 10, 10, 3, 2, False, "both edges: keys i - left ... i + right"),
    (5, 10, 10, 3, 2, True, "causal sets right = 0"),
    (7, 10, 10, 0, 0, False, "left = right = 0: the diagonal key alone"),
    (8, 10, 10, 2, 5, False, "right edge past the last key: clamped to n_k - 1"),
    (1, 10, 10, 4, -1, False, "left edge before key 0: clamped to 0"),
    (0, 3, 10, -1, -1, True, "n_q < n_k, bottom-right: row 0 sits at key 7"),
    (1, 3, 10, 2, 0, False, "n_q < n_k with a window: keys 6..8"),
    (2, 10, 4, -1, -1, True, "n_q > n_k: row 2's diagonal is key -4, no key at all"),
    (6, 10, 4, -1, -1, True, "n_q > n_k: row 6 is the first to see a key"),
    (0, 10, 4, 1, 1, False, "the whole window left of key 0: no key at all"),
    (3, 4, 0, -1, -1, False, "no keys"),
    (4095, 8192, 8192, 4095, 0, True, "a 4096-key window, row 4095: keys 0..4095"),
    (5000, 8192, 8192, 4095, 0, True, "a 4096-key window, row 5000: keys 905..5000"),
    (3, 6, 6, 6, -1, False, "left larger than the sequence"),
]


@exercise(
    "ch15.window_keys",
    "The keys a sliding window lets a query see",
    hints=(
        "With off = n_k - n_q (masks aligned bottom-right), query i sits at key i + off. The "
        "window lets through keys j with i + off - left <= j <= i + off + right; -1 means "
        "unbounded on that side, and causal=True means right = 0.",
        "Clamp to the keys that exist, 0 ... n_k - 1. Both edges are inclusive: with left = 3 "
        "query 5 (n_q = n_k) sees key 2.",
        "Return range(first, last + 1); when first > last (a row that sees no key, e.g. n_q > "
        "n_k with a causal mask) return an empty range.",
    ),
)
def check_window_keys(fn) -> None:
    for i, n_q, n_k, left, right, causal, why in WINDOW_CASES:
        case = (f"query i={i}, n_q={n_q}, n_k={n_k}, left={left}, right={right}, "
                f"causal={causal} ({why})")
        mask = window_mask(n_q, n_k, (left, 0 if causal else right))
        want = np.flatnonzero(mask[i]).tolist()
        got = _keys(_call(fn, case, i, n_q, n_k, left, right, causal))
        expect(got is not None, f"{case}: return the visible keys as a range (or a list of "
                                "ints), got something that is not a sequence of integers")
        expect(got == want, f"{case}: expected {_show_keys(want)}, got {_show_keys(got)}")


HEAD_CASES = [(8, 8), (8, 1), (8, 2), (32, 8), (64, 8), (6, 3), (1, 1), (12, 4)]
BAD_HEADS = [(6, 4), (8, 0), (8, 16)]


@exercise(
    "ch15.gqa_head_map",
    "Which K/V head each query head reads (grouped-query attention)",
    hints=(
        "heads / heads_kv query heads share each K/V head, and they are consecutive: query "
        "heads 0 .. group - 1 use K/V head 0, the next group K/V head 1, ...",
        "So query head h reads K/V head h // (heads // heads_kv). heads_kv = heads is plain "
        "multi-head attention (h -> h), heads_kv = 1 is multi-query attention (h -> 0).",
        "Raise ValueError when heads_kv < 1 or heads is not a multiple of heads_kv: there is no "
        "grouping then, and a silent answer would pair heads wrongly.",
    ),
)
def check_gqa_head_map(fn) -> None:
    for heads, heads_kv in HEAD_CASES:
        case = f"heads={heads}, heads_kv={heads_kv}"
        try:
            got = _keys(fn(heads, heads_kv))
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001
            error = _unwrap(e)
            if isinstance(error, NotImplementedError):
                raise
            if isinstance(error, ValueError):
                raise ExerciseFailed(f"{case}: a valid grouping, but your function raised "
                                     f"ValueError({error})") from None
            raise ExerciseFailed(f"{case}: your function raised {type(error).__name__}: "
                                 f"{error}") from None
        want = [h // (heads // heads_kv) for h in range(heads)]
        expect(got is not None and len(got) == heads,
               f"{case}: return one K/V head per query head ({heads} ints), got "
               f"{'something else' if got is None else f'{len(got)} of them'}")
        wrong = [h for h in range(heads) if got[h] != want[h]]
        if wrong:
            h = wrong[0]
            raise ExerciseFailed(f"{case}: query head {h} should read K/V head {want[h]}, got "
                                 f"{got[h]} (expected map {want}, got {got})")
    for heads, heads_kv in BAD_HEADS:
        try:
            got = fn(heads, heads_kv)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001
            error = _unwrap(e)
            if isinstance(error, NotImplementedError):
                raise
            if isinstance(error, ValueError):
                continue
            raise ExerciseFailed(f"heads={heads}, heads_kv={heads_kv}: expected a ValueError, "
                                 f"your function raised {type(error).__name__}: {error}") \
                from None
        raise ExerciseFailed(f"heads={heads}, heads_kv={heads_kv}: {heads} query heads cannot "
                             f"be grouped over {heads_kv} K/V heads; expected a ValueError, "
                             f"got {_keys(got) if _keys(got) is not None else got!r}")


CU_CASES = [
    ([0, 3, 8], "two sequences"),
    ([0, 3, 3, 5], "an empty sequence in the middle: row 3 is sequence 2's first"),
    ([0, 0, 4], "an empty first sequence"),
    ([0, 4, 4], "an empty last sequence"),
    ([0, 0, 0, 2, 2], "several empty sequences"),
    ([0], "no sequence at all (total 0)"),
    ([0, 0, 0], "only empty sequences (total 0)"),
    ([0, 1], "one sequence of one token"),
    ([0, 32, 64, 96], "lengths that are multiples of a 32-row tile"),
    ([0, 31, 64, 97, 97, 130], "lengths that are not"),
]


def _random_cu(rng: np.random.Generator) -> list[int]:
    lengths = rng.integers(0, 40, size=12)
    lengths[rng.random(12) < 0.3] = 0
    return np.concatenate([[0], np.cumsum(lengths)]).tolist()


@exercise(
    "ch15.varlen_rows",
    "Which sequence, and which position in it, each packed row holds",
    hints=(
        "Sequence b owns the packed rows cu_seqlens[b] <= t < cu_seqlens[b + 1]; its position "
        "there is t - cu_seqlens[b] (position ids restart at 0 for every sequence).",
        "An empty sequence has cu_seqlens[b] == cu_seqlens[b + 1]: it owns no row, and the row "
        "at that offset belongs to the next non-empty sequence. np.searchsorted(cu, t, "
        "side='right') - 1 finds b; side='left' gets the boundaries wrong.",
        "Return two integer arrays of length cu_seqlens[-1] (the total): (sequence, position).",
    ),
)
def check_varlen_rows(fn) -> None:
    rng = np.random.default_rng(15)
    cases = CU_CASES + [(_random_cu(rng), f"random lengths, seed 15 draw {k}") for k in range(3)]
    for cu, why in cases:
        cu_arr = np.asarray(cu, dtype=np.int32)
        case = f"cu_seqlens={cu} ({why})"
        got = _call(fn, case, cu_arr.copy())
        expect(isinstance(got, tuple) and len(got) == 2,
               f"{case}: return a tuple (sequence, position), got {type(got).__name__}")
        seq = np.repeat(np.arange(len(cu) - 1), np.diff(cu_arr))
        pos = np.arange(cu[-1]) - cu_arr[seq] if cu[-1] else np.zeros(0, dtype=np.int64)
        expect_close(got[0], seq, what="the sequence of each row", case=case, rtol=0, atol=0)
        expect_close(got[1], pos, what="the position of each row in its sequence", case=case,
                     rtol=0, atol=0)


def _pages_case(rng: np.random.Generator, n: int, block_size: int, d: int, extra: int,
                garbage: str) -> tuple[np.ndarray, np.ndarray]:
    """A pool with more blocks than the sequence needs, shuffled, and a table whose unused tail
    is -1 ("minus one") or out of range ("out of range")."""
    used = -(-n // block_size)
    num_blocks = used + extra
    pages = rng.standard_normal((num_blocks, block_size, d))
    table = np.full(used + 3, -1, dtype=np.int32)
    table[:used] = rng.permutation(num_blocks)[:used]
    if garbage == "out of range":
        table[used:] = num_blocks + 7
    return pages, table


PAGED_CASES = [(40, 8, "a multiple of the block size"), (37, 8, "not a multiple (last block "
               "holds 5)"), (1, 16, "one token"), (0, 8, "an empty sequence"),
               (5, 16, "shorter than one block"), (9, 1, "block size 1"),
               (64, 16, "exactly 4 blocks")]


@exercise(
    "ch15.paged_gather",
    "Gather a sequence's keys through its block table",
    hints=(
        "Token t of the sequence lives in logical block t // block_size, at slot "
        "t % block_size of that block. The table names the physical block: "
        "block_table[t // block_size].",
        "So row t of the answer is pages[block_table[t // block_size], t % block_size]. Only "
        "the first ceil(seqlen / block_size) entries of the table belong to the sequence; the "
        "rest may hold -1 or anything else.",
        "Return an array (seqlen, d); for seqlen = 0 that is shape (0, d).",
    ),
)
def check_paged_gather(fn) -> None:
    rng = np.random.default_rng(1515)
    for n, block_size, why in PAGED_CASES:
        for garbage in ("minus one", "out of range"):
            pages, table = _pages_case(rng, n, block_size, 4, extra=3, garbage=garbage)
            t = np.arange(n)
            want = pages[table[t // block_size], t % block_size].reshape(n, 4)
            case = (f"seqlen={n}, block_size={block_size} ({why}), block_table={table.tolist()} "
                    f"(unused entries {garbage}), pages of shape {pages.shape}")
            got = _call(fn, case, pages.copy(), table.copy(), n)
            expect_close(got, want, what="the gathered keys", case=case, rtol=0, atol=0)
