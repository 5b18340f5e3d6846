"""Chapter 3 reference solutions."""

import numpy as np


def _factor(m_block: float, m: float) -> float:
    return 0.0 if m_block == -np.inf else float(np.exp(m_block - m))


def merge(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    (ma, la), (mb, lb) = a, b
    m = max(ma, mb)
    return m, _factor(ma, m) * la + _factor(mb, m) * lb


def _leaf(block: np.ndarray) -> tuple[float, float]:
    m = float(np.max(block))
    if m == -np.inf:
        return m, 0.0
    return m, float(np.sum(np.exp(block - m)))


def merge_tree(blocks: list[np.ndarray], tree) -> tuple[float, float]:
    if isinstance(tree, int):
        return _leaf(blocks[tree])
    left, right = tree
    return merge(merge_tree(blocks, left), merge_tree(blocks, right))


def welford_update(state: tuple[int, float, float], x: float) -> tuple[int, float, float]:
    count, mean, m2 = state
    count += 1
    delta = x - mean
    mean += delta / count
    return count, mean, m2 + delta * (x - mean)
