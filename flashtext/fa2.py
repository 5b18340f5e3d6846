"""FlashAttention-2's forward pass in NumPy (chapter 7): the same math as FlashAttention-1, a
better schedule (Dao 2023, arXiv 2307.08691).

:func:`flash2_forward` is the algorithm the Triton kernel of chapter 10 implements, with the
kernel's names, so the two can be read side by side:

* the outer loop walks over query blocks (``start_m``, ``BLOCK_M`` rows): a query tile, its
  running max ``m_i``, running sum ``l_i`` and *unnormalised* output ``acc`` never leave the chip;
* the inner loop walks over key/value blocks (``start_n``, ``BLOCK_N`` rows);
* ``acc`` is divided by ``l_i`` once, at the end (delayed normalisation), and the only statistic
  saved for the backward pass is ``lse = m_i + log(l_i)`` (natural log; L in the paper);
* causal attention skips the blocks wholly above the diagonal and masks only the blocks the
  diagonal crosses; :class:`BlockCounts` counts skipped, masked and full blocks;
* ``exp2=True`` computes every exponential as exp2(x * log2 e) with log2 e folded into the scale,
  as the kernel does (the hardware has an exp2 instruction, not an exp).

:func:`schedule_forward` is the teaching version: FlashAttention-1's schedule (outer loop over
K/V blocks, O normalised after every step, l and m kept in HBM) and each of FA2's changes can be
switched on one at a time. It tallies HBM traffic and FLOPs (matmul, exponentials, other
elementwise work) as it runs, so the chapter can count what each change saves.

Causal masks follow :func:`flashtext.reference.causal_mask`: query i of Nq sees key j when
j <= i + offset, offset = Nk - Nq for "bottom_right" (the default) and 0 for "top_left".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from flashtext.reference import Align, _f64, default_scale

__all__ = [
    "LN2",
    "LOG2E",
    "BlockCounts",
    "Tally",
    "block_grid",
    "block_kind",
    "causal_offset",
    "count_blocks",
    "flash2_forward",
    "nonmatmul_per_tile",
    "schedule_forward",
]

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2) = 1 / LOG2E: turns a base-2 log-sum-exp back into natural log

SKIPPED, MASKED, FULL = 0, 1, 2


@dataclass
class BlockCounts:
    """How many (query block, key block) tiles a causal pass skipped, masked or ran in full,
    and how many score entries it computed (the matmul work is proportional to ``scores``)."""

    skipped: int = 0
    masked: int = 0
    full: int = 0
    scores: int = 0

    @property
    def visited(self) -> int:
        return self.masked + self.full

    @property
    def total(self) -> int:
        return self.skipped + self.masked + self.full

    def add(self, kind: int, rows: int = 0, cols: int = 0) -> None:
        if kind == SKIPPED:
            self.skipped += 1
            return
        if kind == MASKED:
            self.masked += 1
        else:
            self.full += 1
        self.scores += rows * cols


def causal_offset(n_q: int, n_k: int, align: Align = "bottom_right") -> int:
    """The diagonal's offset: query i sees key j when j <= i + offset."""
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")
    return n_k - n_q if align == "bottom_right" else 0


def block_kind(start_m: int, end_m: int, start_n: int, end_n: int, offset: int) -> int:
    """Classify the tile of query rows [start_m, end_m) and key columns [start_n, end_n).

    SKIPPED: even the tile's last row sees none of its keys; FULL: even its first row sees all
    of them (no mask needed); MASKED: the diagonal crosses it.
    """
    if start_n > end_m - 1 + offset:
        return SKIPPED
    if end_n - 1 <= start_m + offset:
        return FULL
    return MASKED


def _check_block_sizes(BLOCK_M: int, BLOCK_N: int) -> None:  # noqa: N803 (the kernel's names)
    for name, b in (("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N)):
        if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 1:
            raise ValueError(f"{name} must be a positive integer, got {b!r}")


def _check_lengths(n_q: int, n_k: int) -> None:
    for name, n in (("n_q", n_q), ("n_k", n_k)):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {n!r}")


def block_grid(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
               causal: bool = True, align: Align = "bottom_right") -> np.ndarray:
    """(Tr, Tc) array of SKIPPED / MASKED / FULL codes, one per tile."""
    _check_lengths(n_q, n_k)
    _check_block_sizes(BLOCK_M, BLOCK_N)
    offset = causal_offset(n_q, n_k, align)
    starts_m, starts_n = range(0, n_q, BLOCK_M), range(0, n_k, BLOCK_N)
    grid = np.full((len(starts_m), len(starts_n)), FULL, dtype=np.int8)
    if causal:
        for i, sm in enumerate(starts_m):
            for j, sn in enumerate(starts_n):
                grid[i, j] = block_kind(sm, min(sm + BLOCK_M, n_q), sn,
                                        min(sn + BLOCK_N, n_k), offset)
    return grid


def count_blocks(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                 causal: bool = True, align: Align = "bottom_right") -> BlockCounts:
    """Skipped, masked and full tiles (and score entries computed) of one head's pass."""
    counts = BlockCounts()
    grid = block_grid(n_q, n_k, BLOCK_M, BLOCK_N, causal, align)
    for i, j in np.ndindex(grid.shape):
        rows = min(BLOCK_M, n_q - i * BLOCK_M)
        cols = min(BLOCK_N, n_k - j * BLOCK_N)
        counts.add(int(grid[i, j]), rows, cols)
    return counts


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = _f64(q), _f64(k), _f64(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got {x.shape}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have the head dim of q ({q.shape[-1]}), got k {k.shape}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have one row per key: v.shape[:-1] == k.shape[:-1], got "
                         f"k {k.shape}, v {v.shape}")
    if not (q.shape[:-2] == k.shape[:-2]):
        raise ValueError(f"q and k must share their leading (batch, head) axes, got "
                         f"q {q.shape}, k {k.shape}")
    return q, k, v


def flash2_forward(q, k, v, causal: bool = False, sm_scale: float | None = None,
                   align: Align = "bottom_right", BLOCK_M: int = 64,  # noqa: N803
                   BLOCK_N: int = 64, exp2: bool = False,  # noqa: N803
                   counts: BlockCounts | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward. Returns (o, lse): o of shape (..., Nq, dv) and lse (..., Nq).

    q: (..., Nq, d); k: (..., Nk, d); v: (..., Nk, dv); leading axes must match. Pass a
    :class:`BlockCounts` as ``counts`` to have it tallied (over all heads).
    """
    q, k, v = _check_qkv(q, k, v)
    _check_block_sizes(BLOCK_M, BLOCK_N)
    offset = causal_offset(q.shape[-2], k.shape[-2], align)
    sm_scale = default_scale(q.shape[-1]) if sm_scale is None else float(sm_scale)
    o = np.empty(q.shape[:-1] + v.shape[-1:])
    lse = np.empty(q.shape[:-1])
    for head in np.ndindex(q.shape[:-2]):
        o[head], lse[head] = _forward_head(q[head], k[head], v[head], causal, sm_scale, offset,
                                           BLOCK_M, BLOCK_N, exp2, counts)
    return o, lse


def _forward_head(q, k, v, causal, sm_scale, offset, BLOCK_M, BLOCK_N,  # noqa: N803
                  exp2, counts):
    """One head: q (Nq, d), k (Nk, d), v (Nk, dv) -> (o, lse). The outer loop's body is what
    one program of the Triton kernel does."""
    n_q, n_k = q.shape[0], k.shape[0]
    # exp(x) = exp2(x * log2 e): fold log2 e into the scale once, and m_i, l_i live in base 2
    qk_scale = sm_scale * LOG2E if exp2 else sm_scale
    exp = np.exp2 if exp2 else np.exp
    log = np.log2 if exp2 else np.log
    o = np.zeros((n_q, v.shape[1]))
    lse = np.empty(n_q)
    for start_m in range(0, n_q, BLOCK_M):                 # one program per query block
        end_m = min(start_m + BLOCK_M, n_q)
        offs_m = np.arange(start_m, end_m)
        q_blk = q[start_m:end_m]                           # loaded once, stays on chip
        m_i = np.full(end_m - start_m, -np.inf)            # running max
        l_i = np.zeros(end_m - start_m)                    # running sum of exp(s - m_i)
        acc = np.zeros((end_m - start_m, v.shape[1]))      # unnormalised output
        # causal: keys beyond what the block's last row sees are never loaded
        hi = min(n_k, max(0, end_m + offset)) if causal else n_k
        for start_n in range(0, hi, BLOCK_N):
            end_n = min(start_n + BLOCK_N, n_k)
            kind = block_kind(start_m, end_m, start_n, end_n, offset) if causal else FULL
            if counts is not None:
                counts.add(kind, end_m - start_m, end_n - start_n)
            s = (q_blk @ k[start_n:end_n].T) * qk_scale
            if kind == MASKED:                             # only tiles the diagonal crosses
                offs_n = np.arange(start_n, end_n)
                s = np.where(offs_n[None, :] <= offs_m[:, None] + offset, s, -np.inf)
            m_ij = np.maximum(m_i, s.max(axis=1))
            m_safe = np.where(np.isneginf(m_ij), 0.0, m_ij)  # a row that has seen no key yet
            p = exp(s - m_safe[:, None])
            alpha = exp(m_i - m_safe)                      # rescales what was accumulated
            l_i = l_i * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + p @ v[start_n:end_n]
            m_i = m_ij
        if counts is not None:
            counts.skipped += -(-n_k // BLOCK_N) - len(range(0, hi, BLOCK_N))
        # delayed normalisation: one division per row, after the last key block
        seen = l_i > 0
        o[start_m:end_m] = np.divide(acc, l_i[:, None], out=np.zeros_like(acc),
                                     where=seen[:, None])
        with np.errstate(divide="ignore"):
            lse_blk = m_i + log(l_i)                       # -inf for a row that saw no key
        lse[start_m:end_m] = lse_blk * LN2 if exp2 else lse_blk
    return o, lse


# ---------------------------------------------------------------- the teaching version

LoopOrder = Literal["kv_outer", "q_outer"]


@dataclass
class Tally:
    """What a pass cost: HBM elements read and written (by tensor) and FLOPs by kind.

    FLOP kinds: ``matmul`` (2 per multiply-add, tensor cores), ``exp`` (exponentials and logs,
    the special-function unit), ``other`` (elementwise add, multiply, max, select, divide, and
    one op per element a row reduction reads). Non-matmul FLOPs = exp + other.
    """

    reads: Counter = field(default_factory=Counter)
    writes: Counter = field(default_factory=Counter)
    flops: Counter = field(default_factory=Counter)
    blocks: BlockCounts = field(default_factory=BlockCounts)

    @property
    def nonmatmul(self) -> int:
        return self.flops["exp"] + self.flops["other"]

    @property
    def hbm(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())


def nonmatmul_per_tile(style: Literal["fa1", "fa2"], BLOCK_M: int, BLOCK_N: int,  # noqa: N803
                       d: int) -> dict[str, int]:
    """Exponentials and other non-matmul FLOPs of one full (unmasked) inner-loop step.

    Shared by both: scale S (MN), rowmax (MN), subtract the max (MN), exp (MN), rowsum (MN).
    FA1 (Algorithm 1, lines 10-12) then re-bases l with two exps and re-normalises O every step:
    6M row ops, 2M exps, and 4Md for diag(l_new)^-1 (diag(l) e^(m-m_new) O + e^(m~-m_new) P~V).
    FA2 keeps O unnormalised: 4M row ops, M exps and 2Md (acc * alpha + P V).
    """
    mn, m = BLOCK_M * BLOCK_N, BLOCK_M
    if style == "fa1":
        return {"exp": mn + 2 * m, "other": 4 * mn + 6 * m + 4 * m * d}
    if style == "fa2":
        return {"exp": mn + m, "other": 4 * mn + 4 * m + 2 * m * d}
    raise ValueError(f"style must be 'fa1' or 'fa2', got {style!r}")


def _safe(m: np.ndarray) -> np.ndarray:
    return np.where(np.isneginf(m), 0.0, m)


def _step_fa1(o, l_i, m_i, s, v_blk, t: Tally):
    """Algorithm 1, lines 10-12: block statistics, merge, and a normalised O after the step."""
    rows, d = o.shape
    m_tilde = s.max(axis=1)
    p = np.exp(s - _safe(m_tilde)[:, None])
    l_tilde = p.sum(axis=1)
    m_new = np.maximum(m_i, m_tilde)
    a = np.exp(m_i - _safe(m_new))                      # e^(m_i - m_new)
    b = np.exp(m_tilde - _safe(m_new))                  # e^(m~ - m_new)
    la = l_i * a
    l_new = la + b * l_tilde
    pv = p @ v_blk
    num = la[:, None] * o + b[:, None] * pv
    o = np.divide(num, l_new[:, None], out=np.zeros_like(num), where=l_new[:, None] > 0)
    t.flops["matmul"] += 2 * s.size * d
    t.flops["exp"] += s.size + 2 * rows
    t.flops["other"] += 3 * s.size + 6 * rows + 4 * rows * d
    return o, l_new, m_new


def _step_fa2(acc, l_i, m_i, s, v_blk, t: Tally):
    """FA2's inner step: one new max, one rescale of l and acc, no division."""
    rows, d = acc.shape
    m_ij = np.maximum(m_i, s.max(axis=1))
    p = np.exp(s - _safe(m_ij)[:, None])
    alpha = np.exp(m_i - _safe(m_ij))
    l_i = l_i * alpha + p.sum(axis=1)
    acc = acc * alpha[:, None] + p @ v_blk
    t.flops["matmul"] += 2 * s.size * d
    t.flops["exp"] += s.size + rows
    t.flops["other"] += 3 * s.size + 4 * rows + 2 * rows * d
    return acc, l_i, m_ij


def _scores(q_blk, k_blk, sm_scale, kind, offs_m, offs_n, offset, t: Tally):
    s = (q_blk @ k_blk.T) * sm_scale
    t.flops["matmul"] += 2 * s.size * q_blk.shape[1]
    t.flops["other"] += s.size                          # the scale
    if kind == MASKED:
        s = np.where(offs_n[None, :] <= offs_m[:, None] + offset, s, -np.inf)
        t.flops["other"] += s.size                      # the select
    return s


def _finish(state, delayed: bool, t: Tally):
    """Turn (O or acc, l, m) into (o, lse)."""
    o, l_i, m_i = state
    rows, d = o.shape
    if delayed:
        o = np.divide(o, l_i[:, None], out=np.zeros_like(o), where=l_i[:, None] > 0)
        t.flops["other"] += rows * d
    with np.errstate(divide="ignore"):
        lse = m_i + np.log(l_i)
    t.flops["exp"] += rows
    t.flops["other"] += rows
    return o, lse


def schedule_forward(q, k, v, loop_order: LoopOrder = "q_outer",
                     delayed_normalisation: bool = True, save_lse_only: bool = True,
                     causal: bool = False, sm_scale: float | None = None,
                     align: Align = "bottom_right", BLOCK_M: int = 64,  # noqa: N803
                     BLOCK_N: int = 64) -> tuple[np.ndarray, np.ndarray, Tally]:  # noqa: N803
    """One head (q: (Nq, d), k, v: (Nk, d)) under a chosen schedule; returns (o, lse, tally).

    FlashAttention-1 is ``loop_order="kv_outer", delayed_normalisation=False,
    save_lse_only=False``; FlashAttention-2 is the default. With ``kv_outer`` the per-row state
    (O, l, m) lives in HBM between steps, as in Algorithm 1, and every inner step reads and
    writes it; with ``q_outer`` it stays on chip and is written once. ``save_lse_only`` writes
    lse (N numbers) for the backward instead of l and m (2N).
    """
    q, k, v = _check_qkv(q, k, v)
    if q.ndim != 2:
        raise ValueError(f"schedule_forward takes one head: q of shape (N, d), got {q.shape}")
    if loop_order not in ("kv_outer", "q_outer"):
        raise ValueError(f"loop_order must be 'kv_outer' or 'q_outer', got {loop_order!r}")
    _check_block_sizes(BLOCK_M, BLOCK_N)
    n_q, n_k, d = q.shape[0], k.shape[0], q.shape[1]
    dv = v.shape[1]
    offset = causal_offset(n_q, n_k, align)
    sm_scale = default_scale(d) if sm_scale is None else float(sm_scale)
    step = _step_fa2 if delayed_normalisation else _step_fa1
    t = Tally()
    q_starts, k_starts = range(0, n_q, BLOCK_M), range(0, n_k, BLOCK_N)

    def kind_of(sm, sn):
        if not causal:
            return FULL
        return block_kind(sm, min(sm + BLOCK_M, n_q), sn, min(sn + BLOCK_N, n_k), offset)

    def rows_of(sm):
        return slice(sm, min(sm + BLOCK_M, n_q))

    def cols_of(sn):
        return slice(sn, min(sn + BLOCK_N, n_k))

    o = np.zeros((n_q, dv))
    lse = np.empty(n_q)
    if loop_order == "q_outer":
        for sm in q_starts:
            r = rows_of(sm)
            rows = r.stop - r.start
            t.reads["Q"] += rows * d
            state = (np.zeros((rows, dv)), np.zeros(rows), np.full(rows, -np.inf))
            for sn in k_starts:
                kind = kind_of(sm, sn)
                c = cols_of(sn)
                t.blocks.add(kind, rows, c.stop - c.start)
                if kind == SKIPPED:
                    continue
                t.reads["K"] += (c.stop - c.start) * d
                t.reads["V"] += (c.stop - c.start) * dv
                s = _scores(q[r], k[c], sm_scale, kind, np.arange(r.start, r.stop),
                            np.arange(c.start, c.stop), offset, t)
                state = step(*state, s, v[c], t)
            o[r], lse[r] = _finish(state, delayed_normalisation, t)
            t.writes["O"] += rows * dv
            _write_stats(t, rows, save_lse_only)
        return o, lse, t

    # kv_outer: Algorithm 1. Line 2 initialises O, l, m in HBM.
    o_hbm, l_hbm, m_hbm = np.zeros((n_q, dv)), np.zeros(n_q), np.full(n_q, -np.inf)
    t.writes["O"] += n_q * dv
    t.writes["l"] += n_q
    t.writes["m"] += n_q
    for sn in k_starts:
        c = cols_of(sn)
        cols = c.stop - c.start
        visited = [sm for sm in q_starts if kind_of(sm, sn) != SKIPPED]
        if visited:
            t.reads["K"] += cols * d
            t.reads["V"] += cols * dv
        for sm in q_starts:
            r = rows_of(sm)
            rows = r.stop - r.start
            kind = kind_of(sm, sn)
            t.blocks.add(kind, rows, cols)
            if kind == SKIPPED:
                continue
            t.reads["Q"] += rows * d
            t.reads["O"] += rows * dv
            t.reads["l"] += rows
            t.reads["m"] += rows
            s = _scores(q[r], k[c], sm_scale, kind, np.arange(r.start, r.stop),
                        np.arange(c.start, c.stop), offset, t)
            o_hbm[r], l_hbm[r], m_hbm[r] = step(o_hbm[r], l_hbm[r], m_hbm[r], s, v[c], t)
            t.writes["O"] += rows * dv
            t.writes["l"] += rows
            t.writes["m"] += rows
    # one fused pass at the end: divide the unnormalised O by l (FA2), and/or form lse
    if delayed_normalisation:
        t.reads["O"] += n_q * dv
        t.writes["O"] += n_q * dv
    if delayed_normalisation or save_lse_only:
        t.reads["l"] += n_q
    if save_lse_only:
        t.reads["m"] += n_q
        t.writes["lse"] += n_q
    o, lse = _finish((o_hbm, l_hbm, m_hbm), delayed_normalisation, t)
    return o, lse, t


def _write_stats(t: Tally, rows: int, save_lse_only: bool) -> None:
    if save_lse_only:
        t.writes["lse"] += rows
    else:
        t.writes["l"] += rows
        t.writes["m"] += rows
