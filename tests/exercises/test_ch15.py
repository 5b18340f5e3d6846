import numpy as np

from solutions import ch15
from tests.exercises.harness import assert_exercise


def _window_exclusive_left(i, n_q, n_k, left, right, causal):  # j > i - left: misses the tie
    r = ch15.window_keys(i, n_q, n_k, left, right, causal)
    diag = i + n_k - n_q
    return range(r.start + 1, r.stop) if left >= 0 and r and r.start == diag - left else r


def _window_top_left(i, n_q, n_k, left, right, causal):  # forgets off = n_k - n_q
    return ch15.window_keys(i, n_k, n_k, left, right, causal)


def _window_no_clamp(i, n_q, n_k, left, right, causal):  # negative keys, keys past n_k
    diag = i + n_k - n_q
    right = 0 if causal else right
    first = 0 if left < 0 else diag - left
    last = n_k - 1 if right < 0 else diag + right
    return range(first, last + 1)


def _window_causal_ignored(i, n_q, n_k, left, right, causal):
    return ch15.window_keys(i, n_q, n_k, left, right, False)


def _window_empty_as_diag(i, n_q, n_k, left, right, causal):  # a fully masked row keeps a key
    r = ch15.window_keys(i, n_q, n_k, left, right, causal)
    return r if len(r) or n_k == 0 else range(0, 1)


def test_window_keys():
    assert_exercise(
        "ch15.window_keys",
        ch15.window_keys,
        wrong={"exclusive left edge": _window_exclusive_left,
               "top-left alignment": _window_top_left,
               "no clamping": _window_no_clamp,
               "causal ignored": _window_causal_ignored,
               "a fully masked row sees key 0": _window_empty_as_diag,
               "returns the count": lambda *a: len(ch15.window_keys(*a))},
        message_must_mention={"exclusive left edge": "tie at the edge",
                              "top-left alignment": "n_q < n_k",
                              "no clamping": "left=",
                              "causal ignored": "causal=True",
                              "a fully masked row sees key 0": "no key at all",
                              "returns the count": "not a sequence of integers"},
    )


def _heads_interleaved(heads, heads_kv):  # h % heads_kv: right only for heads_kv in {1, heads}
    ch15.gqa_head_map(heads, heads_kv)
    return [h % heads_kv for h in range(heads)]


def _heads_divided_by_kv(heads, heads_kv):  # h // heads_kv instead of h // group
    ch15.gqa_head_map(heads, heads_kv)
    return [h // heads_kv for h in range(heads)]


def _heads_no_check(heads, heads_kv):
    group = max(heads // max(heads_kv, 1), 1)
    return [h // group for h in range(heads)]


def test_gqa_head_map():
    assert_exercise(
        "ch15.gqa_head_map",
        ch15.gqa_head_map,
        wrong={"interleaved heads": _heads_interleaved,
               "divides by heads_kv": _heads_divided_by_kv,
               "never raises": _heads_no_check,
               "one entry per K/V head": lambda h, hkv: ch15.gqa_head_map(h, hkv)[:hkv],
               "raises on MQA": lambda h, hkv: ch15.gqa_head_map(h, hkv if hkv > 1 else 0)},
        message_must_mention={"interleaved heads": "heads=8, heads_kv=2",
                              "divides by heads_kv": "heads=8, heads_kv=8",
                              "never raises": "expected a ValueError",
                              "one entry per K/V head": "one K/V head per query head",
                              "raises on MQA": "heads_kv=1: a valid grouping"},
    )


def _rows_left(cu):  # side="left": a row at a boundary goes to the previous sequence
    rows = np.arange(cu[-1])
    seq = np.maximum(np.searchsorted(cu, rows, side="left") - 1, 0)
    return seq, rows - cu[seq]


def _rows_skip_empty(cu):  # numbers the non-empty sequences only
    lengths = np.diff(cu)
    seq = np.repeat(np.arange(int((lengths > 0).sum())), lengths[lengths > 0])
    return seq, np.arange(cu[-1]) - np.repeat(cu[:-1][lengths > 0], lengths[lengths > 0])


def _rows_global_position(cu):  # position ids that never restart
    seq, _ = ch15.varlen_rows(cu)
    return seq, np.arange(cu[-1])


def test_varlen_rows():
    assert_exercise(
        "ch15.varlen_rows",
        ch15.varlen_rows,
        wrong={"searchsorted side='left'": _rows_left,
               "empty sequences not counted": _rows_skip_empty,
               "positions never restart": _rows_global_position,
               "sequence only": lambda cu: ch15.varlen_rows(cu)[0]},
        message_must_mention={"searchsorted side='left'": "cu_seqlens=[0, 3, 8]",
                              "empty sequences not counted": "an empty sequence in the middle",
                              "positions never restart": "the position of each row",
                              "sequence only": "return a tuple"},
    )


def _gather_ignore_table(pages, table, n):  # the pool read as if it were contiguous
    return pages.reshape(-1, pages.shape[-1])[:n]


def _gather_whole_blocks(pages, table, n):  # floor instead of ceil: drops a partial block
    used = n // pages.shape[1]
    return pages[table[:used]].reshape(-1, pages.shape[-1])


def _gather_every_entry(pages, table, n):  # reads the unused tail of the table too
    return pages[table].reshape(-1, pages.shape[-1])[:n]


def _gather_swapped(pages, table, n):  # block and slot swapped
    t = np.arange(n)
    size = pages.shape[1]
    return pages[table[t % size % len(table)], t // size % size]


def test_paged_gather():
    assert_exercise(
        "ch15.paged_gather",
        ch15.paged_gather,
        wrong={"ignores the table": _gather_ignore_table,
               "whole blocks only": _gather_whole_blocks,
               "reads unused entries": _gather_every_entry,
               "block and slot swapped": _gather_swapped},
        message_must_mention={"ignores the table": "seqlen=40, block_size=8",
                              "whole blocks only": "not a multiple",
                              "reads unused entries": "out of range"},
    )


def test_the_solutions_agree_with_the_library():
    # the window of every checker case, summed over all its rows, is what the kernels' plan
    # counts; and a gather through an allocated block table finds each token's slot
    from flashtext.exercises.ch15 import WINDOW_CASES
    from flashtext.kernels import plan
    from flashtext.widgets.model_masks import allocate

    for _, n_q, n_k, left, right, causal, _ in WINDOW_CASES:
        if n_q * n_k <= 100:
            pairs = sum(len(ch15.window_keys(i, n_q, n_k, left, right, causal))
                        for i in range(n_q))
            assert pairs == plan.visible_pairs(n_q, n_k, causal, (left, right))
    a = allocate((37, 5), steps=3, block_size=8, num_blocks=12, seed=1)
    pages = np.arange(12 * 8).reshape(12, 8, 1).astype(float)
    for b, n in enumerate(a.lengths):
        got = ch15.paged_gather(pages, a.block_table()[b], n)[:, 0]
        assert got.tolist() == [a.slot(b, t)[0] * 8 + a.slot(b, t)[1] for t in range(n)]
