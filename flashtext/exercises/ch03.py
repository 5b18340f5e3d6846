"""Chapter 3's exercises: the two-block merge, merging along any tree, Welford's update."""

from __future__ import annotations

import numpy as np

from flashtext.exercises.core import adversarial_rows, describe, exercise, expect, expect_close
from flashtext.online import SoftmaxState, WelfordState, merge


def _pairs(seed: int = 4):
    """(case, block 1, block 2): adversarial rows cut at several points, empty halves included."""
    rng = np.random.default_rng(seed)
    for n in (1, 6, 17):
        for name, x in adversarial_rows(rng, n).items():
            for cut in sorted({0, 1, n // 2, n - 1, n}):
                yield f"{name}, n={n}, split at {cut}", x[:cut], x[cut:]
    masked = np.array([-np.inf, -np.inf, -np.inf])
    yield "first block fully masked", masked, np.array([0.5, 2.0])
    yield "second block fully masked", np.array([0.5, 2.0]), masked
    yield "both blocks fully masked", masked, masked


def _state_tuple(st: SoftmaxState) -> tuple[float, float]:
    return float(st.m), float(st.l)


@exercise(
    "ch03.merge",
    "Merge the (m, l) of two blocks",
    hints=(
        "The merged max is the larger of the two maxima.",
        "Each block's l was computed against its own max; multiply it by exp(m_block - m) to "
        "re-base it on the merged max m, then add the two.",
        "A block that saw nothing (or only -inf) has m = -inf, l = 0: its factor must be 0, "
        "not exp(-inf - (-inf)) = NaN.",
    ),
)
def check_merge(fn) -> None:
    for case, x1, x2 in _pairs():
        a, b = SoftmaxState.from_block(x1), SoftmaxState.from_block(x2)
        expected = merge(a, b)
        for first, second, order in ((a, b, "a, b"), (b, a, "b, a")):
            ta, tb = _state_tuple(first), _state_tuple(second)
            out = fn(ta, tb)
            where = f"{case}: merge({order}) with a={ta}, b={tb}"
            expect(isinstance(out, tuple) and len(out) == 2,
                   f"{where}: return a tuple (m, l), got {describe(out)}")
            expect_close(out[0], expected.m, what="the merged m", case=where, rtol=0, atol=0)
            expect_close(out[1], expected.l, what="the merged l", case=where, rtol=1e-13,
                         atol=1e-300)


def _random_tree(leaves: list[int], rng: np.random.Generator):
    if len(leaves) == 1:
        return leaves[0]
    cut = int(rng.integers(1, len(leaves)))
    return (_random_tree(leaves[:cut], rng), _random_tree(leaves[cut:], rng))


def _tree_cases(rng: np.random.Generator):
    """(case, blocks, tree, the scores the tree covers): random cuts of adversarial rows along
    random trees, and blocks that are entirely -inf (fully masked leaves and subtrees)."""
    for name, x in adversarial_rows(rng, 23).items():
        for n_blocks in (1, 2, 3, 5, 8):
            cuts = np.sort(rng.choice(np.arange(1, len(x)), n_blocks - 1, replace=False))
            blocks = [b.copy() for b in np.split(x, cuts)]
            leaves = [int(i) for i in rng.permutation(n_blocks)]
            for tree in (_random_tree(leaves, rng), _random_tree(sorted(leaves), rng)):
                yield (f"{name}, {n_blocks} blocks of sizes {[len(b) for b in blocks]}, tree "
                       f"{tree}"), blocks, tree, x
    inf3 = np.full(3, -np.inf)
    live = [np.array([1.0, 2.0]), np.array([50.0]), np.array([-3.0, 0.0])]
    yield ("blocks [[1, 2], [50], [-3, 0]], tree (2, 0) (block 1 is not in it)", live, (2, 0),
           np.concatenate([live[2], live[0]]))
    masked = [np.array([0.5, 3.0]), inf3, np.array([-1.0, 2.0, 7.0]), np.full(2, -np.inf)]
    for tree in (((1, 3), (0, 2)), (0, (1, (2, 3))), ((2, 1), 0)):
        covered = np.concatenate([masked[i] for i in _leaves(tree)])
        yield (f"blocks 1 and 3 are all -inf (fully masked leaves), tree {tree}", masked, tree,
               covered)
    yield "a subtree (1, 3) of fully masked blocks only, on its own", masked, (1, 3), \
        np.full(5, -np.inf)
    yield "every block all -inf (a row that sees no key), tree ((0, 1), 2)", \
        [inf3, np.full(1, -np.inf), inf3], ((0, 1), 2), np.full(7, -np.inf)


def _leaves(tree) -> list[int]:
    return [tree] if isinstance(tree, int) else _leaves(tree[0]) + _leaves(tree[1])


@exercise(
    "ch03.merge_tree",
    "Merge blocks along any tree",
    builds_on=("ch03.merge",),
    hints=(
        "Recursion: a leaf is an int, the index of a block; anything else is a pair "
        "(left subtree, right subtree).",
        "At a leaf, reduce the block on its own: m = max(block), l = sum(exp(block - m)) "
        "(careful when the block is all -inf).",
        "At a pair, merge the two children's (m, l) with the two-block merge.",
    ),
)
def check_merge_tree(fn) -> None:
    rng = np.random.default_rng(5)
    for case, blocks, tree, covered in _tree_cases(rng):
        out = fn([b.copy() for b in blocks], tree)
        expect(isinstance(out, tuple) and len(out) == 2,
               f"{case}: return a tuple (m, l), got {describe(out)}")
        want = SoftmaxState.from_block(covered)
        expect_close(out[0], want.m, what="the root's m", case=case, rtol=0, atol=0)
        expect_close(out[1], want.l, what="the root's l", case=case, rtol=1e-13, atol=1e-300)


@exercise(
    "ch03.welford_update",
    "Welford's running mean and variance",
    hints=(
        "state is (count, mean, m2) with m2 the sum of squared deviations from the mean.",
        "count += 1; delta = x - mean; mean += delta / count.",
        "m2 += delta * (x - new mean): one factor uses the old mean, the other the new one.",
    ),
)
def check_welford_update(fn) -> None:
    rng = np.random.default_rng(6)
    streams = {
        "small integers": np.array([4.0, 7.0, 13.0, 16.0]),
        "standard normal values": rng.standard_normal(50),
        "values around 1e9 (a large offset, variance ~1)": 1e9 + rng.standard_normal(200),
        "a single value": np.array([3.5]),
        "identical values": np.full(10, -2.25),
    }
    for name, xs in streams.items():
        state = (0, 0.0, 0.0)
        ref_state = WelfordState.empty()
        for i, x in enumerate(xs):
            state = fn(state, float(x))
            ref_state = ref_state.update(x)
            expect(isinstance(state, tuple) and len(state) == 3,
                   f"{name}: return a tuple (count, mean, m2), got {describe(state)}")
            case = f"{name}, after {i + 1} values"
            expect_close(state[0], i + 1, what="count", case=case, rtol=0, atol=0)
            expect_close(state[1], np.mean(xs[:i + 1]), what="the mean", case=case,
                         rtol=1e-13, atol=1e-13)
            expect_close(state[2], ref_state.m2, what="m2", case=case, rtol=1e-7, atol=1e-9)
        two_pass = float(np.var(xs))
        expect_close(state[2] / len(xs), two_pass, what="the variance m2 / count",
                     case=f"{name}, all {len(xs)} values", rtol=1e-6, atol=1e-12)
