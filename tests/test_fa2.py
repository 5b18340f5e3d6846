import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtext import fa2
from flashtext import reference as ref

ALIGNS = ("bottom_right", "top_left")


def _qkv(rng, n_q, n_k, d=8, dv=5, lead=(2,), spread=3.0):
    return (rng.standard_normal((*lead, n_q, d)), spread * rng.standard_normal((*lead, n_k, d)),
            rng.standard_normal((*lead, n_k, dv)))


def _same_lse(a, b):
    assert np.array_equal(np.isneginf(a), np.isneginf(b))
    fin = np.isfinite(b)
    np.testing.assert_allclose(a[fin], b[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (7, 33), (33, 7), (64, 64), (65, 100)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ALIGNS)
def test_forward_matches_reference(n_q, n_k, causal, align):
    rng = np.random.default_rng(n_q * 1000 + n_k)
    q, k, v = _qkv(rng, n_q, n_k)
    expected, expected_lse = ref.attention(q, k, v, causal, align=align, return_lse=True)
    for bm, bn in [(1, 1), (16, 8), (32, 64)]:
        o, lse = fa2.flash2_forward(q, k, v, causal, align=align, BLOCK_M=bm, BLOCK_N=bn)
        np.testing.assert_allclose(o, expected, rtol=1e-12, atol=1e-12)
        _same_lse(lse, expected_lse)


def test_exp2_form_agrees_with_exp():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, 50, 70, d=16)
    for causal in (False, True):
        o, lse = fa2.flash2_forward(q, k, v, causal, BLOCK_M=16, BLOCK_N=32)
        o2, lse2 = fa2.flash2_forward(q, k, v, causal, BLOCK_M=16, BLOCK_N=32, exp2=True)
        np.testing.assert_allclose(o2, o, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(lse2, lse, rtol=1e-13, atol=1e-14)  # natural log both ways
    assert fa2.LOG2E * fa2.LN2 == pytest.approx(1.0, abs=1e-16)
    x = np.linspace(-50, 50, 101)
    np.testing.assert_allclose(np.exp2(x * fa2.LOG2E), np.exp(x), rtol=1e-13)


def test_huge_scores_and_rows_without_keys_are_handled_without_warnings():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, 20, 6, d=4, lead=())
    q *= 300.0  # scores in the thousands: a naive exp overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, lse = fa2.flash2_forward(q, k, v, causal=True, BLOCK_M=4, BLOCK_N=4)
    expected, expected_lse = ref.attention(q, k, v, True, return_lse=True)
    np.testing.assert_allclose(o, expected, rtol=1e-12, atol=1e-12)
    _same_lse(lse, expected_lse)
    # bottom-right with Nq=20 > Nk=6: rows 0..13 see no key: output 0, lse -inf
    assert np.all(o[:14] == 0) and np.all(np.isneginf(lse[:14])) and np.isfinite(lse[14:]).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 17), st.integers(1, 17),
       st.booleans(), st.sampled_from(ALIGNS))
def test_block_sizes_never_change_the_answer(n_q, n_k, bm, bn, causal, align):
    rng = np.random.default_rng(n_q + 41 * n_k)
    q, k, v = _qkv(rng, n_q, n_k, d=4, dv=3, lead=())
    a, la = fa2.flash2_forward(q, k, v, causal, align=align, BLOCK_M=bm, BLOCK_N=bn)
    b, lb = fa2.flash2_forward(q, k, v, causal, align=align, BLOCK_M=n_q, BLOCK_N=n_k)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    _same_lse(la, lb)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.integers(1, 12), st.integers(1, 12),
       st.sampled_from(ALIGNS))
def test_block_kinds_agree_with_the_element_mask(n_q, n_k, bm, bn, align):
    grid = fa2.block_grid(n_q, n_k, bm, bn, True, align)
    mask = ref.causal_mask(n_q, n_k, align)
    for (i, j), kind in np.ndenumerate(grid):
        tile = mask[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
        want = fa2.SKIPPED if not tile.any() else fa2.FULL if tile.all() else fa2.MASKED
        assert kind == want, (i, j)
    c = fa2.count_blocks(n_q, n_k, bm, bn, True, align)
    assert c.total == grid.size
    assert c.scores == sum(
        mask[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn].size
        for (i, j), kind in np.ndenumerate(grid) if kind != fa2.SKIPPED)


def test_forward_counts_what_it_does():
    rng = np.random.default_rng(3)
    for n_q, n_k, align in [(100, 100, "bottom_right"), (37, 90, "bottom_right"),
                            (90, 37, "bottom_right"), (90, 37, "top_left")]:
        q, k, v = _qkv(rng, n_q, n_k, d=4, dv=4)
        counts = fa2.BlockCounts()
        fa2.flash2_forward(q, k, v, True, align=align, BLOCK_M=16, BLOCK_N=8, counts=counts)
        one = fa2.count_blocks(n_q, n_k, 16, 8, True, align)
        assert (counts.skipped, counts.masked, counts.full, counts.scores) == \
            (2 * one.skipped, 2 * one.masked, 2 * one.full, 2 * one.scores)  # two heads
        counts = fa2.BlockCounts()
        fa2.flash2_forward(q, k, v, False, BLOCK_M=16, BLOCK_N=8, counts=counts)
        assert counts.skipped == counts.masked == 0 and counts.scores == 2 * n_q * n_k


def test_causal_skipping_approaches_half_the_work():
    fractions = []
    for t in (2, 4, 8, 16, 32, 64):
        c = fa2.count_blocks(64 * t, 64 * t, 64, 64, True)
        assert (c.skipped, c.masked, c.full) == (t * (t - 1) // 2, t, t * (t - 1) // 2)
        fractions.append(c.visited / c.total)
    assert fractions == sorted(fractions, reverse=True)
    assert fractions[-1] == pytest.approx(0.5, abs=0.01)


def test_alignments_coincide_for_square_and_differ_otherwise():
    assert np.array_equal(fa2.block_grid(50, 50, 8, 8, True, "top_left"),
                          fa2.block_grid(50, 50, 8, 8, True, "bottom_right"))
    assert not np.array_equal(fa2.block_grid(20, 50, 8, 8, True, "top_left"),
                              fa2.block_grid(20, 50, 8, 8, True, "bottom_right"))
    assert fa2.causal_offset(20, 50, "bottom_right") == 30
    assert fa2.causal_offset(20, 50, "top_left") == 0


SCHEDULES = list(itertools.product(("kv_outer", "q_outer"), (False, True), (False, True)))


@pytest.mark.parametrize("loop_order,delayed,lse_only", SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_every_schedule_is_exact(loop_order, delayed, lse_only, causal):
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, 45, 30, lead=())
    o, lse, tally = fa2.schedule_forward(q, k, v, loop_order, delayed, lse_only, causal,
                                         BLOCK_M=16, BLOCK_N=8)
    expected, expected_lse = ref.attention(q, k, v, causal, return_lse=True)
    np.testing.assert_allclose(o, expected, rtol=1e-12, atol=1e-12)
    _same_lse(lse, expected_lse)
    assert tally.blocks.scores == fa2.count_blocks(45, 30, 16, 8, causal).scores
    assert tally.flops["matmul"] == 2 * tally.blocks.scores * (8 + 5)  # QK^T (d=8), PV (dv=5)


@pytest.mark.parametrize("bm,bn,d", [(128, 128, 64), (128, 64, 128), (64, 128, 128)])
def test_tally_matches_the_per_tile_formula(bm, bn, d):
    rng = np.random.default_rng(5)
    n = 256
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    tiles = (n // bm) * (n // bn)
    for style, args in (("fa1", ("kv_outer", False, False)), ("fa2", ("q_outer", True, True))):
        _, _, t = fa2.schedule_forward(q, k, v, *args, BLOCK_M=bm, BLOCK_N=bn)
        per_tile = fa2.nonmatmul_per_tile(style, bm, bn, d)
        finish_other = n * (d + 1) if style == "fa2" else n  # acc / l_i, and lse = m + log l
        assert t.flops["exp"] == tiles * per_tile["exp"] + n
        assert t.flops["other"] == tiles * per_tile["other"] + finish_other
        assert t.flops["matmul"] == 4 * n * n * d
    assert fa2.nonmatmul_per_tile("fa1", bm, bn, d)["other"] > \
        fa2.nonmatmul_per_tile("fa2", bm, bn, d)["other"]


def test_hbm_traffic_of_the_two_loop_orders():
    rng = np.random.default_rng(6)
    n, d, b = 256, 32, 64
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    _, _, fa1 = fa2.schedule_forward(q, k, v, "kv_outer", False, False, BLOCK_M=b, BLOCK_N=b)
    _, _, new = fa2.schedule_forward(q, k, v, "q_outer", True, True, BLOCK_M=b, BLOCK_N=b)
    t = n // b
    # FA1 reads Q and reads+writes O once per K/V block; FA2 reads K, V once per Q block
    assert fa1.reads["Q"] == t * n * d and fa1.reads["O"] == t * n * d
    assert fa1.writes["O"] == (t + 1) * n * d  # + line 2's initialisation
    assert new.reads["K"] == new.reads["V"] == t * n * d and new.reads["Q"] == n * d
    assert new.writes == {"O": n * d, "lse": n}
    assert new.hbm < fa1.hbm


def test_bad_arguments_are_named():
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="align"):
        fa2.flash2_forward(q, q, q, causal=True, align="middle")
    with pytest.raises(ValueError, match="BLOCK_M"):
        fa2.flash2_forward(q, q, q, BLOCK_M=0)
    with pytest.raises(ValueError, match="BLOCK_N"):
        fa2.count_blocks(4, 4, 4, 2.5)
    with pytest.raises(ValueError, match="head dim"):
        fa2.flash2_forward(q, np.zeros((4, 7)), np.zeros((4, 7)))
    with pytest.raises(ValueError, match="v must have one row per key"):
        fa2.flash2_forward(q, q, np.zeros((5, 8)))
    with pytest.raises(ValueError, match="loop_order"):
        fa2.schedule_forward(q, q, q, loop_order="diagonal")
    with pytest.raises(ValueError, match="one head"):
        fa2.schedule_forward(q[None], q[None], q[None])
    with pytest.raises(ValueError, match="style"):
        fa2.nonmatmul_per_tile("fa3", 64, 64, 64)
    with pytest.raises(ValueError, match="n_q"):
        fa2.block_grid(-1, 4, 2, 2)
