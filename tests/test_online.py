"""flashtext.online against the float64 reference: any split, any order, any tree of merges."""

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flashtext import reference as ref
from flashtext.exercises.core import adversarial_rows
from flashtext.online import (
    AttentionState,
    SoftmaxState,
    WelfordState,
    combine_partials,
    fold,
    merge,
    merge_attention,
    merge_welford,
    rescale_factor,
    streaming_logsumexp,
    streaming_softmax,
)

RTOL, ATOL = 1e-12, 1e-300

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
score = st.one_of(finite, finite, finite, st.just(-np.inf), st.sampled_from([0.0, 1.0, 1e3]))


def row(min_size: int = 1, max_size: int = 40):
    return hnp.arrays(np.float64, st.integers(min_size, max_size), elements=score)


def cut_points(draw, n: int) -> list[int]:
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=6))))
    return [0, *[c for c in cuts if 0 < c < n], n]


def assert_same(got, expected):
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------ SoftmaxState

def test_empty_and_from_block():
    e = SoftmaxState.empty()
    assert e.m.shape == () and e.m == -np.inf and e.l == 0
    assert SoftmaxState.empty((2, 3)).m.shape == (2, 3)
    s = SoftmaxState.from_block([1.0, 3.0, 2.0])
    assert s.m == 3.0
    assert s.l == pytest.approx(np.exp(-2) + 1 + np.exp(-1), rel=1e-15)
    masked = SoftmaxState.from_block(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    assert masked.m.tolist() == [-np.inf, 0.0] and masked.l.tolist() == [0.0, 1.0]


def test_update_rescales_when_the_max_rises():
    s = SoftmaxState.from_block([0.0, 0.0]).update([2.0])
    assert s.m == 2.0
    assert s.l == pytest.approx(2 * np.exp(-2.0) + 1.0, rel=1e-15)


def test_first_rescale_factor_is_zero_not_nan():
    assert rescale_factor(-np.inf, 1.0) == 0.0
    assert rescale_factor(-np.inf, -np.inf) == 0.0
    assert rescale_factor(1.0, 1.0) == 1.0
    s = SoftmaxState.empty().update([-np.inf, -np.inf])
    assert s.m == -np.inf and s.l == 0.0 and s.lse() == -np.inf


def test_seed_worked_example():
    s = SoftmaxState.empty().update([1.0, 1.0])
    assert s.m == 1.0 and s.l == 2.0
    s = s.update([1.0, 1.0])
    assert s.m == 1.0 and s.l == 4.0
    assert np.array_equal(s.probabilities(np.ones(4)), np.full(4, 0.25))


@pytest.mark.parametrize("block", [1, 2, 3, 5, 8, 64])
def test_streaming_softmax_on_adversarial_rows(block):
    rng = np.random.default_rng(block)
    for name, x in adversarial_rows(rng, 37).items():
        assert_same(streaming_softmax(x, block), ref.softmax(x))
        assert_same(streaming_logsumexp(x, block), ref.logsumexp(x))
        assert np.isfinite(streaming_softmax(x, block)).all(), name


def test_streaming_on_batched_rows_and_fully_masked_rows():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 11)) * 30
    x[0, 1] = -np.inf
    assert_same(streaming_softmax(x, 4), ref.softmax(x))
    assert_same(streaming_logsumexp(x, 4), ref.logsumexp(x))
    assert np.array_equal(streaming_softmax(x, 4)[0, 1], np.zeros(11))


@settings(max_examples=150, deadline=None)
@given(x=row(), block=st.integers(1, 50))
def test_streaming_equals_reference_for_any_block(x, block):
    assert_same(streaming_softmax(x, block), ref.softmax(x))
    assert_same(streaming_logsumexp(x, block), ref.logsumexp(x))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), x=row())
def test_any_split_any_order_any_tree(data, x):
    cuts = cut_points(data.draw, len(x))
    states = [SoftmaxState.from_block(x[a:b]) for a, b in pairwise(cuts)]
    order = data.draw(st.permutations(range(len(states))))
    shuffled = [states[i] for i in order]
    expected = ref.logsumexp(x)
    for how in ("left", "tree"):
        assert_same(fold(shuffled, how).lse(), expected)
    # a random binary tree: repeatedly merge two random neighbours (or any two states)
    pool = list(shuffled)
    while len(pool) > 1:
        i = data.draw(st.integers(0, len(pool) - 1))
        j = data.draw(st.integers(0, len(pool) - 1).filter(lambda k, i=i: k != i))
        merged = merge(pool[i], pool[j])
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [merged]
    assert_same(pool[0].lse(), expected)
    m = np.max(x)
    assert pool[0].m == m  # the max is exact, not just close


@settings(max_examples=100, deadline=None)
@given(a=row(0, 10), b=row(0, 10), c=row(0, 10))
def test_merge_is_commutative_and_associative(a, b, c):
    sa, sb, sc = (SoftmaxState.from_block(v) for v in (a, b, c))
    ab, ba = merge(sa, sb), merge(sb, sa)
    assert ab.m == ba.m and ab.l == ba.l  # commutative exactly
    left, right = merge(ab, sc), merge(sa, merge(sb, sc))
    assert left.m == right.m
    np.testing.assert_allclose(left.l, right.l, rtol=1e-14)
    assert_same(left.lse(), ref.logsumexp(np.concatenate([a, b, c])) if a.size + b.size + c.size
                else -np.inf)


def test_empty_state_is_the_identity_of_merge():
    s = SoftmaxState.from_block([3.0, -1.0])
    for joined in (merge(s, SoftmaxState.empty()), merge(SoftmaxState.empty(), s)):
        assert joined.m == s.m and joined.l == s.l


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="block"):
        streaming_softmax(np.ones(4), 0)
    with pytest.raises(ValueError, match="NaN"):
        SoftmaxState.from_block([1.0, np.nan])
    with pytest.raises(ValueError, match=r"\+inf"):
        SoftmaxState.from_block([1.0, np.inf])
    with pytest.raises(ValueError, match="scores"):
        SoftmaxState.empty((2,)).update(np.ones((3, 4)))
    with pytest.raises(ValueError, match="shape"):
        merge(SoftmaxState.empty((2,)), SoftmaxState.empty((3,)))
    with pytest.raises(ValueError, match="scalar"):
        SoftmaxState.from_block(1.0)


# ---------------------------------------------------------------------------- AttentionState

def _attention_problem(rng, nq=5, nk=13, d=4):
    q, k, v = (rng.standard_normal(shape) for shape in ((nq, d), (nk, d), (nk, d)))
    return ref.scores(q, k), v, ref.attention(q, k, v, return_lse=True)


@pytest.mark.parametrize("block", [1, 3, 4, 13, 20])
def test_attention_blockwise_equals_reference(block):
    rng = np.random.default_rng(block)
    s, v, (o, lse) = _attention_problem(rng)
    state = AttentionState.empty(5, 4)
    for a in range(0, 13, block):
        state = state.update(s[:, a:a + block], v[a:a + block])
    assert_same(state.output(), o)
    assert_same(state.lse(), lse)


def test_attention_single_row_and_batched_heads():
    rng = np.random.default_rng(1)
    s = rng.standard_normal(7) * 50
    v = rng.standard_normal((7, 3))
    st_ = AttentionState.from_block(s[:3], v[:3]).update(s[3:], v[3:])
    assert st_.acc.shape == (3,)
    assert_same(st_.output(), ref.softmax(s) @ v)
    q, k, vv = (rng.standard_normal((2, 3, n, 4)) for n in (6, 9, 9))
    sc = ref.scores(q, k, causal=True)
    halves = [AttentionState.from_block(sc[..., :4], vv[..., :4, :]),
              AttentionState.from_block(sc[..., 4:], vv[..., 4:, :])]
    assert_same(merge_attention(*halves[::-1]).output(), ref.attention(q, k, vv, causal=True))


def test_row_that_sees_no_key_outputs_zero():
    s = np.array([[-np.inf, -np.inf], [0.0, 1.0]])
    v = np.arange(4.0).reshape(2, 2)
    st_ = AttentionState.from_block(s, v)
    assert np.array_equal(st_.output()[0], [0.0, 0.0])
    assert st_.lse()[0] == -np.inf
    assert np.isfinite(st_.output()).all()


def test_seed_worked_example_attention():
    q = np.array([1.0, 1.0])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [1.0, 0.0]])
    v = np.arange(8.0).reshape(4, 2)
    s = k @ q  # every score is exactly 1
    assert np.array_equal(s, np.ones(4))
    st_ = AttentionState.empty((), 2).update(s[:2], v[:2])
    assert st_.m == 1.0 and st_.l == 2.0
    st_ = st_.update(s[2:], v[2:])
    assert st_.l == 4.0
    assert np.array_equal(st_.output(), v.mean(axis=0))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), nk=st.integers(1, 24), scale=st.sampled_from([1.0, 30.0, 300.0]))
def test_attention_any_split_any_tree(data, nk, scale):
    rng = np.random.default_rng(nk)
    s = rng.standard_normal((3, nk)) * scale
    mask = rng.random((3, nk)) < 0.2
    s[mask] = -np.inf
    v = rng.standard_normal((nk, 5))
    cuts = cut_points(data.draw, nk)
    states = [AttentionState.from_block(s[:, a:b], v[a:b]) for a, b in pairwise(cuts)]
    order = data.draw(st.permutations(range(len(states))))
    expected = ref.softmax(s) @ v
    for how in ("left", "tree"):
        got = fold([states[i] for i in order], how)
        assert_same(got.output(), expected)
        assert_same(got.lse(), ref.logsumexp(s))


def test_attention_state_errors():
    with pytest.raises(ValueError, match="values"):
        AttentionState.from_block(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="d"):
        AttentionState.empty(3, 0)
    with pytest.raises(ValueError, match="d="):
        AttentionState.empty(2, 4).update(np.ones((2, 3)), np.ones((3, 5)))
    with pytest.raises(ValueError, match="merge"):
        merge_attention(AttentionState.empty(2, 4), AttentionState.empty(2, 3))


# --------------------------------------------------------------------------- combine_partials

@settings(max_examples=80, deadline=None)
@given(data=st.data(), nk=st.integers(1, 30))
def test_combine_partials_equals_full_attention(data, nk):
    rng = np.random.default_rng(nk + 100)
    q, k, v = (rng.standard_normal(shape) for shape in ((4, 8), (nk, 8), (nk, 8)))
    cuts = cut_points(data.draw, nk)
    outs, lses = [], []
    for a, b in pairwise(cuts):
        o, lse = ref.attention(q, k[a:b], v[a:b], return_lse=True)
        outs.append(o)
        lses.append(lse)
    o, lse = combine_partials(outs, lses)
    full, full_lse = ref.attention(q, k, v, return_lse=True)
    assert_same(o, full)
    assert_same(lse, full_lse)


def test_combine_partials_ignores_empty_splits():
    o = np.array([[[1.0, 2.0]], [[9.0, 9.0]]])  # (S=2, rows=1, d=2)
    lse = np.array([[0.5], [-np.inf]])
    out, out_lse = combine_partials(o, lse)
    assert np.array_equal(out, [[1.0, 2.0]]) and out_lse[0] == 0.5
    out, out_lse = combine_partials(o, np.full((2, 1), -np.inf))
    assert np.array_equal(out, [[0.0, 0.0]]) and out_lse[0] == -np.inf
    with pytest.raises(ValueError, match="lses"):
        combine_partials(o, np.zeros((2, 3)))


def test_combine_partials_matches_merge_attention():
    rng = np.random.default_rng(5)
    s, v = rng.standard_normal((3, 10)) * 10, rng.standard_normal((10, 2))
    a = AttentionState.from_block(s[:, :6], v[:6])
    b = AttentionState.from_block(s[:, 6:], v[6:])
    out, lse = combine_partials([a.output(), b.output()], [a.lse(), b.lse()])
    merged = merge_attention(a, b)
    assert_same(out, merged.output())
    assert_same(lse, merged.lse())


# ------------------------------------------------------------------------------ Welford

@settings(max_examples=80, deadline=None)
@given(data=st.data(), x=hnp.arrays(np.float64, st.integers(1, 40),
                                     elements=st.floats(-1e6, 1e6)))
def test_welford_update_and_merge_match_numpy(data, x):
    s = WelfordState.empty()
    for value in x:
        s = s.update(value)
    assert s.count == len(x)
    np.testing.assert_allclose(s.mean, np.mean(x), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(s.variance(), np.var(x), rtol=1e-9, atol=1e-6)
    cuts = cut_points(data.draw, len(x))
    parts = [WelfordState.from_batch(x[a:b]) for a, b in pairwise(cuts)]
    for how in ("left", "tree"):
        merged = parts[0]
        if how == "left":
            for p in parts[1:]:
                merged = merge_welford(merged, p)
        else:
            while len(parts) > 1:
                parts = [merge_welford(*parts[i:i + 2]) if i + 1 < len(parts) else parts[i]
                         for i in range(0, len(parts), 2)]
            merged = parts[0]
        np.testing.assert_allclose(merged.mean, np.mean(x), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(merged.variance(), np.var(x), rtol=1e-9, atol=1e-6)


def test_welford_beats_the_naive_formula_on_a_large_offset():
    x = 1e9 + np.array([4.0, 7.0, 13.0, 16.0])  # variance 22.5, offset by a billion
    s = WelfordState.empty()
    for value in x:
        s = s.update(value)
    assert s.variance() == 22.5
    naive = np.mean(x**2) - np.mean(x) ** 2
    assert abs(naive - 22.5) > 1  # sum of squares minus square of sum cancels catastrophically


def test_welford_edge_cases():
    assert np.isnan(WelfordState.empty().variance())
    e = merge_welford(WelfordState.empty(), WelfordState.empty())
    assert e.count == 0
    one = WelfordState.from_batch([3.0])
    assert merge_welford(WelfordState.empty(), one).mean == 3.0
    with pytest.raises(ValueError, match="count"):
        WelfordState(-1, 0.0, 0.0)
