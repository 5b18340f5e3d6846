"""Streaming softmax: the running statistics (m, l[, acc]) per row, their update and their merge.

Softmax of a row s needs two whole-row quantities, the max m (the overflow guard) and the sum
l = sum_j exp(s_j - m). Both can be built block by block: keep (m, l) for what has been seen,
and when a block raises the max, rescale what was accumulated by exp(m_old - m_new). The
result is exact (Milakov & Gimelshein 2018, arXiv 1805.02867; FlashAttention, arXiv 2205.14135).

* :class:`SoftmaxState` carries (m, l) per row; :func:`merge` joins two states. The merge is
  commutative and associative (up to rounding), so any split of a row, folded in any order or
  any tree, gives the same softmax statistics.
* :class:`AttentionState` adds acc, the *unnormalised* running sum of exp(s_j - m) v_j (the
  FlashAttention-2 form: divide by l once at the end, :meth:`AttentionState.output`).
* :func:`combine_partials` merges *normalised* partial outputs with their log-sum-exps, as
  split-KV / Flash-Decoding does.

Shapes: a state describes rows of shape ``rows`` (``()`` for a single 1-D score vector). Scores
for a state are ``(*rows, n)``; values are ``(*rows[:-1], n, d)`` (one row of keys shared by the
query rows of a block, the attention case) or anything that broadcasts with ``p @ values``.
Everything is float64 NumPy. A row that has seen no key (or only -inf scores) has m = -inf,
l = 0, output 0 and log-sum-exp -inf, like :mod:`flashtext.reference`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AttentionState",
    "SoftmaxState",
    "WelfordState",
    "combine_partials",
    "fold",
    "merge",
    "merge_attention",
    "merge_welford",
    "rescale_factor",
    "streaming_logsumexp",
    "streaming_softmax",
]


def _f64(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if np.isposinf(arr).any():
        raise ValueError(f"{name} contains +inf (scores must be finite or -inf)")
    return arr


def rescale_factor(m_old, m_new) -> np.ndarray:
    """exp(m_old - m_new), with 0 where m_old is -inf (nothing was accumulated, and -inf - -inf
    would be NaN). This is the factor that re-bases a sum taken against m_old onto m_new."""
    m_old = np.asarray(m_old, dtype=np.float64)
    m_new = np.asarray(m_new, dtype=np.float64)
    safe_new = np.where(np.isneginf(m_new), 0.0, m_new)
    with np.errstate(invalid="ignore"):
        return np.where(np.isneginf(m_old), 0.0, np.exp(m_old - safe_new))


def _exp_shifted(scores: np.ndarray, m: np.ndarray) -> np.ndarray:
    """exp(s - m) per row, with rows whose m is -inf (all scores -inf) giving zeros."""
    safe = np.where(np.isneginf(m), 0.0, m)
    return np.exp(scores - safe[..., None])


def _lse(m: np.ndarray, l: np.ndarray) -> np.ndarray:  # noqa: E741
    with np.errstate(divide="ignore"):
        return np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)


def _check_block(scores: np.ndarray, rows: tuple[int, ...] | None) -> None:
    if scores.ndim < 1:
        raise ValueError("scores must have at least one axis (the keys), got a scalar")
    if rows is not None and scores.shape[:-1] != rows:
        raise ValueError(f"scores must have shape (*rows, n) with rows={rows}, "
                         f"got {scores.shape}")


@dataclass(frozen=True, eq=False)
class SoftmaxState:
    """Running softmax statistics per row: m = max score seen, l = sum of exp(s - m)."""

    m: np.ndarray
    l: np.ndarray  # noqa: E741  (the paper's name)

    def __post_init__(self) -> None:
        m = np.asarray(self.m, dtype=np.float64)
        l = np.asarray(self.l, dtype=np.float64)  # noqa: E741
        if m.shape != l.shape:
            raise ValueError(f"m and l must have the same shape, got {m.shape} and {l.shape}")
        object.__setattr__(self, "m", m)
        object.__setattr__(self, "l", l)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.m.shape

    @classmethod
    def empty(cls, shape: tuple[int, ...] | int = ()) -> SoftmaxState:
        """The state before any key: m = -inf, l = 0."""
        return cls(np.full(shape, -np.inf), np.zeros(shape))

    @classmethod
    def from_block(cls, scores) -> SoftmaxState:
        """Statistics of one block on its own: m = rowmax, l = sum exp(s - m) (local max)."""
        s = _f64(scores, "scores")
        _check_block(s, None)
        if s.shape[-1] == 0:
            return cls.empty(s.shape[:-1])
        m = np.max(s, axis=-1)
        return cls(m, np.sum(_exp_shifted(s, m), axis=-1))

    def update(self, scores) -> SoftmaxState:
        """Fold one more block of scores in (the online update)::

            m_new = max(m, rowmax(s));  l_new = l * exp(m - m_new) + sum_j exp(s_j - m_new)
        """
        s = _f64(scores, "scores")
        _check_block(s, self.shape)
        block_max = np.max(s, axis=-1) if s.shape[-1] else np.full(self.shape, -np.inf)
        m_new = np.maximum(self.m, block_max)
        l_new = self.l * rescale_factor(self.m, m_new) + np.sum(_exp_shifted(s, m_new), axis=-1)
        return SoftmaxState(m_new, l_new)

    def lse(self) -> np.ndarray:
        """log(sum_j exp(s_j)) over the keys seen: m + log l (-inf for a row with no key)."""
        return _lse(self.m, self.l)

    def probabilities(self, scores) -> np.ndarray:
        """exp(s - m) / l for scores already folded into this state (the second pass)."""
        s = _f64(scores, "scores")
        _check_block(s, self.shape)
        e = _exp_shifted(s, self.m)
        l = self.l[..., None]  # noqa: E741
        return np.divide(e, l, out=np.zeros_like(e), where=l > 0)

    def __repr__(self) -> str:
        return f"SoftmaxState(m={self.m!r}, l={self.l!r})"


def merge(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """Join the statistics of two disjoint sets of keys of the same rows::

        m = max(m_a, m_b);  l = exp(m_a - m) l_a + exp(m_b - m) l_b

    Each block's local max cancels: exp(m_a - m) * exp(s - m_a) = exp(s - m).
    """
    if not (isinstance(a, SoftmaxState) and isinstance(b, SoftmaxState)):
        raise ValueError("merge takes two SoftmaxState objects")
    if a.shape != b.shape:
        raise ValueError(f"cannot merge states of shapes {a.shape} and {b.shape}")
    m = np.maximum(a.m, b.m)
    return SoftmaxState(m, rescale_factor(a.m, m) * a.l + rescale_factor(b.m, m) * b.l)


def _blocks(n: int, block: int) -> list[slice]:
    if not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    return [slice(start, min(start + block, n)) for start in range(0, n, block)]


def _stream_stats(x: np.ndarray, block: int) -> SoftmaxState:
    state = SoftmaxState.empty(x.shape[:-1])
    for sl in _blocks(x.shape[-1], block):
        state = state.update(x[..., sl])
    return state


def streaming_softmax(x, block: int) -> np.ndarray:
    """Softmax along the last axis, reading ``block`` scores at a time.

    Pass 1 folds (m, l) over the blocks; pass 2 writes exp(x - m) / l block by block. Rows that
    are all -inf come out as zeros. Exact: equals :func:`flashtext.reference.softmax`.
    """
    x = _f64(x, "x")
    _check_block(x, None)
    state = _stream_stats(x, block)
    out = np.empty_like(x)
    for sl in _blocks(x.shape[-1], block):
        out[..., sl] = state.probabilities(x[..., sl])
    return out


def streaming_logsumexp(x, block: int) -> np.ndarray:
    """log(sum(exp(x))) along the last axis in one streaming pass over blocks of ``block``."""
    x = _f64(x, "x")
    _check_block(x, None)
    return _stream_stats(x, block).lse()


@dataclass(frozen=True, eq=False)
class AttentionState:
    """Running attention statistics per query row: (m, l) and acc = sum_j exp(s_j - m) v_j.

    acc is unnormalised; :meth:`output` divides by l once at the end (FlashAttention-2).
    """

    m: np.ndarray
    l: np.ndarray  # noqa: E741
    acc: np.ndarray

    def __post_init__(self) -> None:
        m = np.asarray(self.m, dtype=np.float64)
        l = np.asarray(self.l, dtype=np.float64)  # noqa: E741
        acc = np.asarray(self.acc, dtype=np.float64)
        if m.shape != l.shape or acc.shape[:-1] != m.shape:
            raise ValueError(f"expected m, l of shape rows and acc of shape (*rows, d); got "
                             f"m {m.shape}, l {l.shape}, acc {acc.shape}")
        object.__setattr__(self, "m", m)
        object.__setattr__(self, "l", l)
        object.__setattr__(self, "acc", acc)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.m.shape

    @property
    def d(self) -> int:
        return self.acc.shape[-1]

    @property
    def stats(self) -> SoftmaxState:
        return SoftmaxState(self.m, self.l)

    @classmethod
    def empty(cls, rows_shape: tuple[int, ...] | int, d: int) -> AttentionState:
        """Before any key: m = -inf, l = 0, acc = 0 (Algorithm 1, line 2)."""
        rows = (rows_shape,) if isinstance(rows_shape, (int, np.integer)) else tuple(rows_shape)
        if not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be a positive integer, got {d!r}")
        return cls(np.full(rows, -np.inf), np.zeros(rows), np.zeros((*rows, d)))

    @classmethod
    def from_block(cls, scores, values) -> AttentionState:
        """One block on its own: m = rowmax, p = exp(s - m), l = rowsum p, acc = p @ values."""
        s = _f64(scores, "scores")
        v = _f64(values, "values")
        _check_block(s, None)
        return cls.empty(s.shape[:-1], _value_dim(s, v)).update(s, v)

    def update(self, scores, values) -> AttentionState:
        """Fold one block of keys in: rescale (l, acc) by exp(m - m_new), add the new terms."""
        s = _f64(scores, "scores")
        v = _f64(values, "values")
        _check_block(s, self.shape)
        if _value_dim(s, v) != self.d:
            raise ValueError(f"values must have last axis d={self.d}, got {v.shape}")
        block_max = np.max(s, axis=-1) if s.shape[-1] else np.full(self.shape, -np.inf)
        m_new = np.maximum(self.m, block_max)
        alpha = rescale_factor(self.m, m_new)
        p = _exp_shifted(s, m_new)
        acc = alpha[..., None] * self.acc + p @ v
        return AttentionState(m_new, alpha * self.l + p.sum(axis=-1), acc)

    def output(self) -> np.ndarray:
        """acc / l: the attention output over the keys seen (0 for a row that saw none)."""
        l = self.l[..., None]  # noqa: E741
        return np.divide(self.acc, l, out=np.zeros_like(self.acc), where=l > 0)

    def lse(self) -> np.ndarray:
        return _lse(self.m, self.l)

    def __repr__(self) -> str:
        return f"AttentionState(m={self.m!r}, l={self.l!r}, acc={self.acc!r})"


def _value_dim(s: np.ndarray, v: np.ndarray) -> int:
    if v.ndim < 2 or v.shape[-2] != s.shape[-1]:
        raise ValueError(f"values must have shape (..., n, d) with n={s.shape[-1]} keys matching "
                         f"the scores, got {v.shape}")
    return v.shape[-1]


def merge_attention(a: AttentionState, b: AttentionState) -> AttentionState:
    """Join two attention states over disjoint keys: m = max, and l and acc each rescaled by
    exp(m_x - m) and added. Commutative and associative (up to rounding)."""
    if not (isinstance(a, AttentionState) and isinstance(b, AttentionState)):
        raise ValueError("merge_attention takes two AttentionState objects")
    if a.shape != b.shape or a.d != b.d:
        raise ValueError(f"cannot merge states of rows {a.shape}, d={a.d} and rows {b.shape}, "
                         f"d={b.d}")
    m = np.maximum(a.m, b.m)
    wa, wb = rescale_factor(a.m, m), rescale_factor(b.m, m)
    return AttentionState(m, wa * a.l + wb * b.l, wa[..., None] * a.acc + wb[..., None] * b.acc)


def fold(states: Sequence, how: str = "left"):
    """Merge a non-empty sequence of states (SoftmaxState or AttentionState).

    ``how="left"`` folds one after another (the FlashAttention loop); ``"tree"`` merges pairs,
    then pairs of pairs (a parallel reduction). Both give the same result up to rounding.
    """
    states = list(states)
    if not states:
        raise ValueError("states must be a non-empty sequence")
    join = merge_attention if isinstance(states[0], AttentionState) else merge
    if how == "left":
        out = states[0]
        for s in states[1:]:
            out = join(out, s)
        return out
    if how == "tree":
        while len(states) > 1:
            nxt = [join(states[i], states[i + 1]) for i in range(0, len(states) - 1, 2)]
            if len(states) % 2:
                nxt.append(states[-1])
            states = nxt
        return states[0]
    raise ValueError(f"how must be 'left' or 'tree', got {how!r}")


def combine_partials(outputs, lses) -> tuple[np.ndarray, np.ndarray]:
    """Combine NORMALISED partial attention outputs over disjoint key splits (split-KV,
    Flash-Decoding).

    ``outputs``: (S, *rows, d) (or a sequence of S arrays); ``lses``: (S, *rows), the
    log-sum-exp of each split's scores. Returns (output, lse) with lse = logsumexp_i lse_i and
    output = sum_i exp(lse_i - lse) o_i. A split with lse = -inf (it saw no key) adds nothing;
    rows that saw no key anywhere get output 0 and lse -inf.
    """
    o = np.stack([_f64(x, "outputs") for x in outputs]) if not isinstance(outputs, np.ndarray) \
        else _f64(outputs, "outputs")
    lse = np.stack([_f64(x, "lses") for x in lses]) if not isinstance(lses, np.ndarray) \
        else _f64(lses, "lses")
    if o.ndim < 2 or lse.shape != o.shape[:-1]:
        raise ValueError(f"outputs must be (S, *rows, d) and lses (S, *rows); got outputs "
                         f"{o.shape}, lses {lse.shape}")
    if o.shape[0] == 0:
        raise ValueError("need at least one split")
    m = np.max(lse, axis=0)
    w = rescale_factor(lse, m)  # exp(lse_i - max), 0 for empty splits
    total = np.sum(w, axis=0)
    out_lse = _lse(m, total)
    scale = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    return np.sum(scale[..., None] * o, axis=0), out_lse


# ------------------------------------------------------------------ the same pattern: Welford

@dataclass(frozen=True, eq=False)
class WelfordState:
    """Running count, mean and M2 (sum of squared deviations from the mean), per feature.

    Welford (1962) updates them one value at a time without the catastrophic cancellation of
    sum(x^2) - n mean^2; Chan, Golub & LeVeque (1979) merge two states, exactly the way
    :func:`merge` joins two softmax blocks: a correction term re-bases one partial result onto
    the combined one.
    """

    count: float
    mean: np.ndarray
    m2: np.ndarray

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")
        object.__setattr__(self, "count", float(self.count))
        object.__setattr__(self, "mean", np.asarray(self.mean, dtype=np.float64))
        object.__setattr__(self, "m2", np.asarray(self.m2, dtype=np.float64))

    @classmethod
    def empty(cls, shape: tuple[int, ...] | int = ()) -> WelfordState:
        return cls(0, np.zeros(shape), np.zeros(shape))

    @classmethod
    def from_batch(cls, xs) -> WelfordState:
        """Statistics of a batch of values along axis 0, computed directly (two passes)."""
        x = _f64(xs, "xs")
        if x.ndim < 1 or x.shape[0] == 0:
            return cls.empty(x.shape[1:])
        mean = x.mean(axis=0)
        return cls(x.shape[0], mean, np.sum((x - mean) ** 2, axis=0))

    def update(self, x) -> WelfordState:
        """Add one observation: delta = x - mean; mean += delta / n; M2 += delta (x - mean_new)."""
        x = _f64(x, "x")
        count = self.count + 1
        delta = x - self.mean
        mean = self.mean + delta / count
        return WelfordState(count, mean, self.m2 + delta * (x - mean))

    def variance(self, ddof: int = 0) -> np.ndarray:
        """M2 / (count - ddof); NaN when count <= ddof (not enough data)."""
        if self.count <= ddof:
            return np.full(self.mean.shape, np.nan)
        return self.m2 / (self.count - ddof)


def merge_welford(a: WelfordState, b: WelfordState) -> WelfordState:
    """Chan et al.'s parallel merge: delta = mean_b - mean_a, n = n_a + n_b,
    mean = mean_a + delta n_b / n,  M2 = M2_a + M2_b + delta^2 n_a n_b / n."""
    if not (isinstance(a, WelfordState) and isinstance(b, WelfordState)):
        raise ValueError("merge_welford takes two WelfordState objects")
    n = a.count + b.count
    if n == 0:
        return a
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / n)
    return WelfordState(n, mean, a.m2 + b.m2 + delta**2 * (a.count * b.count / n))
