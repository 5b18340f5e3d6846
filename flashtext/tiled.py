"""Algorithm 1 of FlashAttention (Dao et al. 2022, arXiv 2205.14135) in NumPy, with its memory.

The point of this module is not speed but bookkeeping you can see:

* :class:`SRAM` is the on-chip memory, with a capacity of M *elements*. Every tile the algorithm
  puts on chip is named; putting one more than fits raises :class:`SRAMOverflow`.
* :class:`HBM` is the off-chip memory. It holds Q, K, V, O, l, m and records every read and
  write, in elements, by tensor and by the line of Algorithm 1 that made it.
* :func:`algorithm1` runs lines 1-16 of Algorithm 1 (batch size 1, one head) on them and
  returns a :class:`Run`. A ``hook`` sees every (i, j) iteration as a :class:`Step`, with the
  two halves of line 12 (the "green" old-output term and the "yellow" current-block term).
* :func:`standard_attention` is the paper's Algorithm 0 on the same HBM counter.

Indices are 0-based in code (the paper's i = 1 is ``step.i == 0``). Everything is float64.
A softmax scale (default 1/sqrt(d), as in :mod:`flashtext.reference`) and an optional causal
mask are applied inside line 9, as the paper's Algorithm 2 does; Algorithm 1 itself has neither.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from flashtext import cost
from flashtext.online import rescale_factor
from flashtext.reference import Align, causal_mask, default_scale

__all__ = ["HBM", "SRAM", "Line12", "Run", "SRAMOverflow", "Step", "algorithm1",
           "line12_paper", "standard_attention"]

# line12(o_i, l_i, m_i, p_tilde, m_tilde, v_j, l_new, m_new) -> the new O_i
Line12 = Callable[..., np.ndarray]


class SRAMOverflow(MemoryError):
    """A tile was put on chip that does not fit in the SRAM's M elements."""


class SRAM:
    """On-chip memory of ``capacity`` elements that refuses to overflow.

    Tiles are named ("K_j", "Q_i", "S_ij", ...). :attr:`peak` is the most ever held at once and
    :attr:`peak_contents` what was held then.
    """

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive number of elements, got {capacity!r}")
        self.capacity = capacity
        self.tiles: dict[str, np.ndarray] = {}
        self.peak = 0
        self.peak_contents: dict[str, int] = {}

    @property
    def used(self) -> int:
        return sum(t.size for t in self.tiles.values())

    def contents(self) -> dict[str, int]:
        """Name -> size in elements of every tile on chip now."""
        return {name: t.size for name, t in self.tiles.items()}

    def put(self, name: str, array: np.ndarray) -> np.ndarray:
        """Place a tile on chip (a copy) and return it; raise SRAMOverflow if it does not fit."""
        if name in self.tiles:
            raise ValueError(f"tile {name!r} is already on chip; free it first")
        array = np.array(array, dtype=np.float64)
        need = self.used + array.size
        if need > self.capacity:
            shape = f"{array.shape[0]} x {array.shape[1]} = " if array.ndim == 2 else ""
            held = ", ".join(f"{k} {v:,}" for k, v in self.contents().items()) or "nothing"
            raise SRAMOverflow(
                f"SRAM overflow: putting {name} ({shape}{array.size:,} elements) on chip would "
                f"need {need:,} elements, but the SRAM holds M = {self.capacity:,}. "
                f"Already on chip: {held}.")
        self.tiles[name] = array
        if need > self.peak:
            self.peak, self.peak_contents = need, self.contents()
        return array

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tiles[name]

    def free(self, *names: str) -> None:
        for name in names:
            del self.tiles[name]


class HBM:
    """Off-chip memory: named tensors, and a count of every element read or written.

    ``reads``/``writes`` are Counters keyed by ``(tensor, line)``; :meth:`by_tensor` and
    :meth:`by_line` sum them up. Placing the inputs (:meth:`place`) is not counted: they are
    already in HBM when the algorithm starts.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}
        self.reads: Counter = Counter()
        self.writes: Counter = Counter()

    def place(self, name: str, array: np.ndarray) -> None:
        self.tensors[name] = np.array(array, dtype=np.float64)

    def init(self, name: str, shape: tuple[int, ...], value: float, line: int) -> None:
        """Allocate and fill a tensor in HBM (counted as writes)."""
        self.tensors[name] = np.full(shape, value, dtype=np.float64)
        self.writes[(name, line)] += int(np.prod(shape))

    def read(self, name: str, rows: slice, line: int) -> np.ndarray:
        block = self.tensors[name][rows]
        self.reads[(name, line)] += block.size
        return block.copy()

    def write(self, name: str, rows: slice, value: np.ndarray, line: int) -> None:
        target = self.tensors[name][rows]
        if target.shape != np.shape(value):
            raise ValueError(f"writing {np.shape(value)} into {name}[{rows}] of shape "
                             f"{target.shape}")
        self.tensors[name][rows] = value
        self.writes[(name, line)] += target.size

    def by_tensor(self) -> dict[str, dict[str, int]]:
        """``{"reads": {tensor: elements}, "writes": {...}}`` over every tensor placed here."""
        out: dict[str, dict[str, int]] = {"reads": {}, "writes": {}}
        for kind, counter in (("reads", self.reads), ("writes", self.writes)):
            for name in self.tensors:
                out[kind][name] = sum(v for (t, _), v in counter.items() if t == name)
        return out

    def by_line(self) -> dict[int, dict[str, int]]:
        """``{line: {"reads": n, "writes": n}}`` in elements."""
        lines: dict[int, dict[str, int]] = {}
        for kind, counter in (("reads", self.reads), ("writes", self.writes)):
            for (_, line), v in counter.items():
                lines.setdefault(line, {"reads": 0, "writes": 0})[kind] += v
        return dict(sorted(lines.items()))

    @property
    def total_reads(self) -> int:
        return sum(self.reads.values())

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        return self.total_reads + self.total_writes


@dataclass
class Step:
    """One (i, j) iteration of Algorithm 1, as seen right after line 13 (0-based i, j).

    ``green`` = diag(l_old) e^{m_old - m_new} O_old, the old output un-normalised and re-based;
    ``yellow`` = e^{m_tilde - m_new} P_tilde V_j, the current block re-based;
    ``o_new`` = diag(l_new)^-1 (green + yellow). Row vectors are 1-D of length Br.
    """

    i: int
    j: int
    rows: slice
    cols: slice
    s: np.ndarray
    m_old: np.ndarray
    l_old: np.ndarray
    o_old: np.ndarray
    m_tilde: np.ndarray
    p_tilde: np.ndarray
    l_tilde: np.ndarray
    m_new: np.ndarray
    l_new: np.ndarray
    green: np.ndarray
    yellow: np.ndarray
    o_new: np.ndarray
    keys_seen: slice  # the keys folded into O_i so far (this block included), in key order
    sram_used: int


@dataclass
class Run:
    """What :func:`algorithm1` returns: the output and everything it did to get there."""

    o: np.ndarray
    l: np.ndarray  # noqa: E741  (the paper's name)
    m: np.ndarray
    hbm: HBM
    sram: SRAM
    bc: int
    br: int
    tr: int
    tc: int
    loop_order: str
    steps: list[Step] = field(default_factory=list)

    @property
    def lse(self) -> np.ndarray:
        """Log-sum-exp per query row, m + log l (-inf for a row that saw no key)."""
        with np.errstate(divide="ignore"):
            return np.where(self.l > 0, self.m + np.log(np.where(self.l > 0, self.l, 1.0)),
                            -np.inf)


def _matrix(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, d) array (Algorithm 1 has batch size 1 and "
                         f"one head), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _blocks(n: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _safe_exp(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """exp(x - shift[:, None]) with rows whose shift is -inf (all masked so far) giving 0."""
    finite = np.where(np.isneginf(shift), 0.0, shift)
    return np.exp(x - finite[:, None])


def line12_paper(o_i, l_i, m_i, p_tilde, m_tilde, v_j, l_new, m_new) -> np.ndarray:
    """Line 12 on its own, in its three moves (what :func:`algorithm1` does inline).

    diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j), with the
    conventions for rows that have seen no unmasked key yet: e^{-inf - (-inf)} is taken as 0,
    and a row with l_new = 0 keeps output 0.
    """
    raw_old = l_i[:, None] * o_i  # move 1: undo the old normalisation
    green = rescale_factor(m_i, m_new)[:, None] * raw_old  # move 2: re-base both halves ...
    yellow = rescale_factor(m_tilde, m_new)[:, None] * (p_tilde @ v_j)  # ... on m_new
    inv = np.divide(1.0, l_new, out=np.zeros_like(l_new), where=l_new > 0)
    return inv[:, None] * (green + yellow)  # move 3: re-normalise by the new l


def algorithm1(q, k, v, m_elements: int, *, causal: bool = False,
               scale: float | None = None, align: Align = "bottom_right",
               sram_elements: int | None = None, bc: int | None = None,
               br: int | None = None, loop_order: str = "kv_outer",
               hook: Callable[[Step], None] | None = None, trace: bool = False,
               line12: Line12 | None = None, l_init: float = 0.0,
               m_init: float = -np.inf) -> Run:
    """Algorithm 1 (FlashAttention forward), line by line, on a simulated SRAM and HBM.

    ``m_elements`` is the M of line 1 (on-chip memory in elements) that picks the block sizes;
    ``sram_elements`` is the capacity of the simulated SRAM (default: the same M, so the run
    raises :class:`SRAMOverflow` wherever the paper's block sizes do not fit; pass
    ``cost.fa1_sram_elements`` summed to give it exactly what one iteration needs). ``bc``/``br``
    override line 1. ``loop_order="q_outer"`` swaps the loops and moves line 6 inside.
    ``hook(step)`` is called after every (i, j); ``trace=True`` keeps every step in ``run.steps``.

    Teaching knobs (chapter 5): ``line12`` replaces line 12's update with
    ``line12(o_i, l_i, m_i, p_tilde, m_tilde, v_j, l_new, m_new) -> new O_i`` (the step's
    ``green``/``yellow`` stay the paper's); ``l_init``/``m_init`` change line 2's fill values.
    """
    q, k, v = _matrix(q, "q"), _matrix(k, "k"), _matrix(v, "v")
    n, d = q.shape
    n_k = k.shape[0]
    if k.shape[1] != d:
        raise ValueError(f"k must have the same head dimension d={d} as q, got {k.shape}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {k.shape}, got {v.shape}")
    if loop_order not in cost.LOOP_ORDERS:
        raise ValueError(f"loop_order must be one of {cost.LOOP_ORDERS}, got {loop_order!r}")
    scale = default_scale(d) if scale is None else float(scale)
    mask = causal_mask(n, n_k, align) if causal else None

    # line 1: block sizes from the SRAM size M (in elements)
    default_bc, default_br = cost.block_sizes(m_elements, d)
    bc = default_bc if bc is None else bc
    br = default_br if br is None else br
    if bc <= 0 or br <= 0:
        raise ValueError(f"block sizes must be positive, got bc={bc}, br={br}")
    sram = SRAM(m_elements if sram_elements is None else sram_elements)
    hbm = HBM()
    for name, x in (("Q", q), ("K", k), ("V", v)):
        hbm.place(name, x)

    # line 2: O = 0, l = 0, m = -inf, in HBM
    hbm.init("O", (n, d), 0.0, line=2)
    hbm.init("l", (n,), l_init, line=2)
    hbm.init("m", (n,), m_init, line=2)

    # lines 3-4: Q, O, l, m split into Tr blocks of Br rows; K, V into Tc blocks of Bc rows
    row_blocks, col_blocks = _blocks(n, br), _blocks(n_k, bc)
    tr, tc = len(row_blocks), len(col_blocks)
    run = Run(o=hbm.tensors["O"], l=hbm.tensors["l"], m=hbm.tensors["m"], hbm=hbm, sram=sram,
              bc=bc, br=br, tr=tr, tc=tc, loop_order=loop_order)

    def load_kv(j: int) -> None:  # line 6
        sram.put("K_j", hbm.read("K", col_blocks[j], line=6))
        sram.put("V_j", hbm.read("V", col_blocks[j], line=6))

    def inner(i: int, j: int) -> None:  # lines 8-13 for one (i, j)
        rows, cols = row_blocks[i], col_blocks[j]
        # line 8: load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM
        q_i = sram.put("Q_i", hbm.read("Q", rows, line=8))
        o_i = sram.put("O_i", hbm.read("O", rows, line=8))
        l_i = sram.put("l_i", hbm.read("l", rows, line=8))
        m_i = sram.put("m_i", hbm.read("m", rows, line=8))
        # line 9: S_ij = Q_i K_j^T, a Br x Bc tile (scale and mask as in Algorithm 2)
        s_ij = sram.put("S_ij", scale * (q_i @ sram["K_j"].T))
        if mask is not None:
            s_ij[~mask[rows, cols]] = -np.inf
        s_seen = s_ij.copy() if (hook or trace) else None
        # line 10: m~ = rowmax(S), P~ = exp(S - m~) (overwrites S_ij in place), l~ = rowsum(P~)
        m_t = sram.put("m~_ij", np.max(s_ij, axis=1))
        s_ij[:] = _safe_exp(s_ij, m_t)
        p_t = s_ij
        l_t = sram.put("l~_ij", np.sum(p_t, axis=1))
        # line 11: m_new = max(m_i, m~), l_new = e^{m_i - m_new} l_i + e^{m~ - m_new} l~
        m_new = sram.put("m_new", np.maximum(m_i, m_t))
        alpha, beta = rescale_factor(m_i, m_new), rescale_factor(m_t, m_new)
        l_new = sram.put("l_new", alpha * l_i + beta * l_t)
        # line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j)
        green = (l_i * alpha)[:, None] * o_i  # old output, un-normalised, re-based
        yellow = beta[:, None] * (p_t @ sram["V_j"])  # this block, re-based
        inv = np.divide(1.0, l_new, out=np.zeros_like(l_new), where=l_new > 0)
        o_old = o_i.copy() if (hook or trace) else None
        if line12 is None:
            o_i[:] = inv[:, None] * (green + yellow)  # in place: the MMA accumulates into O_i
        else:
            o_i[:] = line12(o_i.copy(), l_i.copy(), m_i.copy(), p_t.copy(), m_t.copy(),
                            sram["V_j"].copy(), l_new.copy(), m_new.copy())
        hbm.write("O", rows, o_i, line=12)
        # line 13: write l_i <- l_new, m_i <- m_new to HBM
        hbm.write("l", rows, l_new, line=13)
        hbm.write("m", rows, m_new, line=13)
        if hook or trace:
            step = Step(i=i, j=j, rows=rows, cols=cols, s=s_seen, m_old=m_i.copy(),
                        l_old=l_i.copy(), o_old=o_old, m_tilde=m_t.copy(), p_tilde=p_t.copy(),
                        l_tilde=l_t.copy(), m_new=m_new.copy(), l_new=l_new.copy(),
                        green=green, yellow=yellow, o_new=o_i.copy(),
                        keys_seen=slice(0, cols.stop), sram_used=sram.used)
            if trace:
                run.steps.append(step)
            if hook:
                hook(step)
        sram.free("Q_i", "O_i", "l_i", "m_i", "S_ij", "m~_ij", "l~_ij", "m_new", "l_new")

    if loop_order == "kv_outer":
        for j in range(tc):  # line 5: outer loop over K/V blocks
            load_kv(j)  # line 6
            for i in range(tr):  # line 7: inner loop over Q blocks
                inner(i, j)  # lines 8-13
            sram.free("K_j", "V_j")
    else:  # loops swapped: line 6 has to move inside, next to line 8
        for i in range(tr):
            for j in range(tc):
                load_kv(j)
                inner(i, j)
                sram.free("K_j", "V_j")
    return run  # line 16: return O


def standard_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                       align: Align = "bottom_right") -> tuple[np.ndarray, HBM]:
    """Algorithm 0 of the paper on the same HBM counter: S and P make a round trip to HBM.

    1. read Q, K; write S = Q K^T.   2. read S; write P = softmax(S).   3. read P, V; write O = PV.
    Returns (O, hbm); hbm's counts equal :func:`flashtext.cost.standard_attention_hbm_elements`.
    """
    q, k, v = _matrix(q, "q"), _matrix(k, "k"), _matrix(v, "v")
    n, d = q.shape
    n_k = k.shape[0]
    scale = default_scale(d) if scale is None else float(scale)
    hbm = HBM()
    for name, x in (("Q", q), ("K", k), ("V", v)):
        hbm.place(name, x)
    everything = slice(None)
    s = scale * (hbm.read("Q", everything, 1) @ hbm.read("K", everything, 1).T)
    if causal:
        s = np.where(causal_mask(n, n_k, align), s, -np.inf)
    hbm.place("S", np.zeros((n, n_k)))  # allocating is free; the write is the access
    hbm.write("S", everything, s, 1)
    s = hbm.read("S", everything, 2)
    m = np.max(s, axis=1)
    p = _safe_exp(s, m)
    total = p.sum(axis=1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    hbm.place("P", np.zeros((n, n_k)))
    hbm.write("P", everything, p, 2)
    o = hbm.read("P", everything, 3) @ hbm.read("V", everything, 3)
    hbm.place("O", np.zeros((n, d)))
    hbm.write("O", everything, o, 3)
    return hbm.tensors["O"], hbm

