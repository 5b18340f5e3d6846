import numpy as np

from solutions import ch03
from tests.exercises.harness import assert_exercise


def _no_rescale(a, b):
    return max(a[0], b[0]), a[1] + b[1]


def _rescale_only_b(a, b):
    m = max(a[0], b[0])
    return m, a[1] + ch03._factor(b[0], m) * b[1]


def _nan_for_empty(a, b):
    m = max(a[0], b[0])
    with np.errstate(invalid="ignore"):
        return m, float(np.exp(a[0] - m) * a[1] + np.exp(b[0] - m) * b[1])


def test_merge():
    assert_exercise("ch03.merge", ch03.merge, wrong={
        "forgot to rescale": _no_rescale,
        "rescaled only the second block": _rescale_only_b,
        "NaN for an empty block": _nan_for_empty,
    }, message_must_mention={"NaN for an empty block": "NaN"})


def _first_leaf_only(blocks, tree):
    while not isinstance(tree, int):
        tree = tree[0]
    return ch03._leaf(blocks[tree])


def _all_blocks_ignoring_tree(blocks, tree):
    return ch03._leaf(np.concatenate(blocks))


def _tree_without_rescale(blocks, tree):
    if isinstance(tree, int):
        return ch03._leaf(blocks[tree])
    return _no_rescale(_tree_without_rescale(blocks, tree[0]),
                       _tree_without_rescale(blocks, tree[1]))


def test_merge_tree():
    assert_exercise("ch03.merge_tree", ch03.merge_tree, wrong={
        "only the leftmost leaf": _first_leaf_only,
        "ignores the tree (every block)": _all_blocks_ignoring_tree,
        "merges without rescaling": _tree_without_rescale,
    })


def _delta_squared(state, x):  # the classic slip: both factors use the old mean
    count, mean, m2 = state
    count += 1
    delta = x - mean
    return count, mean + delta / count, m2 + delta * delta


def _sum_of_squares(state, x):  # running sums: sum(x^2) - n mean^2 cancels catastrophically
    count, mean, m2 = state
    sumsq = m2 + count * mean * mean + x * x
    count += 1
    mean = mean + (x - mean) / count
    return count, mean, sumsq - count * mean * mean


def test_welford_update():
    assert_exercise("ch03.welford_update", ch03.welford_update, wrong={
        "m2 += delta**2": _delta_squared,
        "sum of squares minus n mean^2": _sum_of_squares,
        "forgot the count": lambda s, x: (s[0], *ch03.welford_update(s, x)[1:]),
    })


def _leaf_without_guard(block):
    m = float(np.max(block))
    with np.errstate(invalid="ignore"):
        return m, float(np.sum(np.exp(block - m)))


def _tree_nan_for_masked_leaves(blocks, tree):
    if isinstance(tree, int):
        return _leaf_without_guard(blocks[tree])
    return ch03.merge(_tree_nan_for_masked_leaves(blocks, tree[0]),
                      _tree_nan_for_masked_leaves(blocks, tree[1]))


def _tree_merging_without_guard(blocks, tree):
    if isinstance(tree, int):
        return ch03._leaf(blocks[tree])
    return _nan_for_empty(_tree_merging_without_guard(blocks, tree[0]),
                          _tree_merging_without_guard(blocks, tree[1]))


def test_merge_tree_with_fully_masked_leaves():
    assert_exercise("ch03.merge_tree", ch03.merge_tree, wrong={
        "NaN for an all -inf leaf": _tree_nan_for_masked_leaves,
        "NaN merging two masked subtrees": _tree_merging_without_guard,
    }, message_must_mention={"NaN for an all -inf leaf": "all -inf"})


def test_the_tree_cases_contain_fully_masked_leaves_and_subtrees():
    from flashtext.exercises.ch03 import _leaves, _tree_cases

    masked_leaf = masked_root = 0
    for case, blocks, tree, covered in _tree_cases(np.random.default_rng(5)):
        assert sorted(_leaves(tree)) == sorted(set(_leaves(tree)))
        assert np.array_equal(np.sort(np.concatenate([blocks[i] for i in _leaves(tree)])),
                              np.sort(covered))
        if "all -inf" in case:
            masked_leaf += any(np.all(np.isneginf(blocks[i])) for i in _leaves(tree))
            masked_root += bool(np.all(np.isneginf(covered)))
    assert masked_leaf >= 4 and masked_root >= 1

