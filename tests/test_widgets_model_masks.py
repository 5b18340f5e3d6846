"""Chapter 15's widgets: the tile map counts what the kernels schedule, packed sequences tile from
their own starts, and the paged cache's block table places every token exactly once."""

import numpy as np
import pytest

from flashtext import reference
from flashtext.kernels import plan
from flashtext.widgets.model_masks import (
    PagedCache,
    VisibleTiles,
    allocate,
    cu_seqlens,
    parse_lengths,
)


def _brute_visited(mask: np.ndarray, bm: int, bn: int, row0: int, col0: int, n: int) -> int:
    """Tiles of one sequence's square (tiles aligned to its first row) holding a visible pair."""
    count = 0
    for i in range(row0, row0 + n, bm):
        for j in range(col0, col0 + n, bn):
            count += bool(mask[i:min(i + bm, row0 + n), j:min(j + bn, col0 + n)].any())
    return count


def test_one_sequence_counts_are_the_plan():
    w = VisibleTiles(n_q=200, n_k=320, BLOCK_M=32, BLOCK_N=32, causal=True, left=63, right=-1)
    c = w.counts()
    stages = plan.forward_stages(200, 320, 32, 32, True, (63, -1))
    assert c.visited == int((stages != plan.NOT_VISITED).sum())
    assert c.total == stages.size == 7 * 10
    assert c.pairs == int(reference.window_mask(200, 320, (63, 0)).sum())
    assert "27 of 70 tiles visited" in w.caption()
    w.causal, w.left = False, -1  # no mask at all: every tile, and only the ragged ones masked
    assert w.counts().skipped == 0 and w.counts().pairs == 200 * 320
    w.n_q, w.n_k = 256, 256
    assert w.counts().masked == 0


@pytest.mark.parametrize("lengths", [(96, 0, 200, 40), (32, 64, 1), (5,), (0, 0, 7)])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (20, 3)), (True, (33, 0))])
def test_packed_tiles_start_at_each_sequence(lengths, causal, window):
    w = VisibleTiles(layout="packed", lengths=lengths, BLOCK_M=16, BLOCK_N=32, causal=causal,
                     left=window[0], right=window[1])
    cu = cu_seqlens(lengths)
    total = int(cu[-1])
    # the packed matrix: block diagonal, one window mask per sequence
    mask = np.zeros((total, total), dtype=bool)
    for b, n in enumerate(lengths):
        s = int(cu[b])
        mask[s:s + n, s:s + n] = reference.window_mask(n, n, (window[0], 0 if causal else
                                                              window[1]))
    want = sum(_brute_visited(mask, 16, 32, int(cu[b]), int(cu[b]), n)
               for b, n in enumerate(lengths))
    c = w.counts()
    assert c.visited == want and c.pairs == int(mask.sum())
    starts = [s for s, _ in w.packed_stages()]
    assert starts == cu[:-1].tolist()
    padded = w.padded_counts()
    assert padded.visited >= c.visited and padded.pairs >= c.pairs
    longest = max(lengths)
    one = plan.forward_stages(longest, longest, 16, 32, causal, window)
    assert padded.visited == len(lengths) * int((one != plan.NOT_VISITED).sum())


def test_padding_costs_what_the_caption_says():
    w = VisibleTiles(layout="packed", lengths=(40, 160, 16, 64), BLOCK_M=32, BLOCK_N=32,
                     causal=True, left=-1, right=-1)
    assert (w.counts().visited, w.padded_counts().visited) == (22, 60)
    assert "padded to 160: 60 (2.73x)" in w.caption()


def test_bad_state_is_named():
    with pytest.raises(ValueError, match="layout must be one of"):
        VisibleTiles(layout="ragged").counts()
    with pytest.raises(ValueError, match="left must be an integer >= -1"):
        VisibleTiles(left=-2).counts()
    with pytest.raises(ValueError, match="BLOCK_M must be an integer >= 1"):
        VisibleTiles(BLOCK_M=0).counts()
    with pytest.raises(ValueError, match="lengths must be integers"):
        parse_lengths("3, x")
    with pytest.raises(ValueError, match="lengths must be one or more integers >= 0"):
        parse_lengths("3, -1")
    assert parse_lengths("3, 0 7") == (3, 0, 7)


def test_tile_widget_controls_drive_the_state_and_figures_draw():
    import matplotlib.pyplot as plt

    w = VisibleTiles()
    box = w.widget()
    left = box.children[0].children[0]
    left.value = 10
    assert w.left == 10 and "left=10" in w.caption()
    box.children[3].value = "packed"
    assert w.layout == "packed"
    text = box.children[4].children[0]
    text.value = "8, 0, 40"
    assert w.lengths == (8, 0, 40)
    text.value = "8, oops"  # kept, and said so
    assert w.lengths == (8, 0, 40) and "kept [8, 0, 40]" in box.children[4].children[1].value
    for layout in ("packed", "one sequence"):
        w.layout = layout
        fig = w.figure()
        assert "left=10" in (fig.texts[0].get_text() if layout == "packed"
                             else fig.axes[0].get_title())
        plt.close(fig)
    assert "ft-visible-tiles" in box._dom_classes


# ------------------------------------------------------------------------------ paged cache

def _check_allocation(a, num_blocks):
    seen = set()
    for b, n in enumerate(a.lengths):
        assert len(a.table[b]) == -(-n // a.block_size)  # just enough blocks, never more
        for t in range(n):
            where = a.slot(b, t)
            assert where not in seen and 0 <= where[0] < num_blocks
            seen.add(where)
    for p, who in enumerate(a.owner):
        if who is not None:
            assert a.table[who[0]][who[1]] == p
    assert a.wasted_slots < max(1, len(a.lengths)) * a.block_size


@pytest.mark.parametrize("prompts,steps,block", [((37, 5, 20), 10, 8), ((16, 32, 0), 16, 16),
                                                 ((3,), 0, 4), ((7, 9), 25, 5)])
@pytest.mark.parametrize("seed", [None, 3])
def test_allocation_places_every_token_once(prompts, steps, block, seed):
    a = allocate(prompts, steps, block, num_blocks=40, seed=seed)
    assert a.lengths == tuple(n + steps for n in prompts) and not a.stalled
    _check_allocation(a, 40)
    table = a.block_table()
    assert table.dtype == np.int32 and table.shape[0] == len(prompts)
    for b, row in enumerate(a.table):
        assert table[b, :len(row)].tolist() == list(row) and (table[b, len(row):] == -1).all()


def test_decode_interleaves_blocks_and_a_full_pool_stalls():
    a = allocate((8, 8), steps=8, block_size=8, num_blocks=10)
    assert a.table == ((0, 2), (1, 3))  # prefill takes 0 and 1; decode alternates
    full = allocate((8, 8), steps=40, block_size=8, num_blocks=5)
    assert full.stalled and sum(len(t) for t in full.table) == 5
    _check_allocation(full, 5)
    with pytest.raises(ValueError, match="token 16 is not cached"):
        a.slot(0, 16)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        allocate((3,), 0, 0, 4)


def test_paged_widget_controls_drive_the_state_and_figure_draws():
    import matplotlib.pyplot as plt

    p = PagedCache(prompts=(37, 5, 20), block_size=8, num_blocks=24)
    assert "paged: 9 of 24 blocks, 72 slots for 62 tokens (10 empty)" in p.caption()
    box = p.widget()
    steps = box.children[0].children[0]
    steps.value = 10
    assert p.steps == 10 and "lengths [47, 15, 30]" in p.caption()
    steps.value = 64
    assert "the pool is full" in p.caption()
    box.children[0].children[2].value = True
    assert p.seed == 0
    fig = p.figure()
    assert "block_size=8" in fig.texts[0].get_text()
    plt.close(fig)
    assert "ft-paged-cache" in box._dom_classes
