"""Chapter 2 reference solutions."""

import numpy as np


def online_update(m: float, l: float, scores: np.ndarray) -> tuple[float, float]:  # noqa: E741
    m_new = max(m, float(np.max(scores)))
    alpha = 0.0 if m == -np.inf else np.exp(m - m_new)  # nothing accumulated yet: factor 0
    shift = 0.0 if m_new == -np.inf else m_new  # all -inf so far: exp(-inf - 0) = 0, not NaN
    return m_new, l * alpha + float(np.sum(np.exp(scores - shift)))


def _stats(x: np.ndarray, block: int) -> tuple[float, float]:
    m, l = -np.inf, 0.0  # noqa: E741
    for a in range(0, len(x), block):
        m, l = online_update(m, l, x[a:a + block])  # noqa: E741
    return m, l


def streaming_softmax(x: np.ndarray, block: int) -> np.ndarray:
    m, l = _stats(x, block)  # noqa: E741
    out = np.zeros(len(x))
    if l == 0:
        return out
    for a in range(0, len(x), block):
        out[a:a + block] = np.exp(x[a:a + block] - m) / l
    return out


def streaming_logsumexp(x: np.ndarray, block: int) -> float:
    m, l = _stats(x, block)  # noqa: E741
    return m + np.log(l) if l > 0 else -np.inf
