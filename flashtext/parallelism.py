"""Who works on what, in parallel (chapter 7): the launch grids of FlashAttention-1 and -2, a
model of how their programs fill the SMs of a GPU, and the two ways of splitting a tile across
warps.

Grids. FA1 launches one program (thread block) per (batch, head) pair: each walks the whole
head. FA2 also splits the query blocks, one program per (query block, batch, head), because the
query blocks of a head are independent once the loop over them is the outer loop (their O, l, m
never meet). With batch x heads small and N long, FA1 leaves most of 132 SMs idle.

The model (:func:`simulate`): each SM runs ``slots_per_sm`` programs at once; programs start in
launch order on the first free slot (the hardware's block scheduler does much the same), and a
program's time is proportional to the number of tiles it computes. Utilisation is tile-time
done over tile-time available until the last program ends. It ignores memory contention and
the different cost of masked tiles: an occupancy model, not a timing.

Warps. Inside one program FA1 splits the keys of a tile across its 4 warps ("split-K"): each
warp ends with partial (m, l, acc) for every query row, which must go through shared memory and
be merged. FA2 splits the queries ("split-Q"): each warp owns its rows and sees every key, so
no warp needs another's results. :func:`split_k_warps` and :func:`split_q_warps` do both and
count the shared-memory traffic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

import numpy as np

from flashtext.fa2 import SKIPPED, _check_block_sizes, _check_lengths, block_grid
from flashtext.hardware import H200
from flashtext.online import AttentionState, fold
from flashtext.reference import Align

__all__ = [
    "Occupancy",
    "occupancy",
    "occupancy_figure",
    "program_work",
    "programs",
    "simulate",
    "split_k_warps",
    "split_q_warps",
]

Schedule = Literal["fa1", "fa2"]


def _check_positive(**values: int) -> None:
    for name, x in values.items():
        if not isinstance(x, (int, np.integer)) or isinstance(x, bool) or x < 1:
            raise ValueError(f"{name} must be a positive integer, got {x!r}")


def _check_schedule(schedule: str) -> None:
    if schedule not in ("fa1", "fa2"):
        raise ValueError(f"schedule must be 'fa1' or 'fa2', got {schedule!r}")


def programs(schedule: Schedule, batch: int, heads: int, n_q: int,
             BLOCK_M: int = 128) -> int:  # noqa: N803 (the kernel's name)
    """Programs launched: batch*heads (FA1) or ceil(n_q / BLOCK_M) * batch*heads (FA2)."""
    _check_schedule(schedule)
    _check_positive(batch=batch, heads=heads, n_q=n_q, BLOCK_M=BLOCK_M)
    if schedule == "fa1":
        return batch * heads
    return -(-n_q // BLOCK_M) * batch * heads


def program_work(schedule: Schedule, batch: int, heads: int, n_q: int, n_k: int | None = None,
                 BLOCK_M: int = 128, BLOCK_N: int = 128,  # noqa: N803
                 causal: bool = False, align: Align = "bottom_right") -> np.ndarray:
    """Tiles each program computes, in launch order (the query-block index varies fastest,
    as in FA2's grid (ceil(N / BLOCK_M), batch * heads))."""
    _check_schedule(schedule)
    n_k = n_q if n_k is None else n_k
    _check_positive(batch=batch, heads=heads, n_q=n_q, n_k=n_k)
    _check_lengths(n_q, n_k)
    _check_block_sizes(BLOCK_M, BLOCK_N)
    per_q_block = (block_grid(n_q, n_k, BLOCK_M, BLOCK_N, causal, align) != SKIPPED).sum(axis=1)
    if schedule == "fa1":
        return np.full(batch * heads, int(per_q_block.sum()))
    return np.tile(per_q_block, batch * heads)


@dataclass(frozen=True)
class Occupancy:
    programs: int
    sms: int
    slots_per_sm: int
    makespan: float  # in tile-times, until the last program ends
    work: float  # total tile-times of all programs
    waves: int  # ceil(programs / (sms * slots_per_sm))

    @property
    def utilisation(self) -> float:
        """Fraction of the GPU's slot-time spent computing tiles."""
        return self.work / (self.sms * self.slots_per_sm * self.makespan)

    @property
    def sms_used(self) -> int:
        """SMs that get any program at all."""
        return min(self.sms, -(-self.programs // self.slots_per_sm))


def simulate(work, sms: int = H200.sms, slots_per_sm: int = 1,
             timeline: bool = False):
    """Greedy list scheduling in launch order; returns :class:`Occupancy` (and, with
    ``timeline=True``, a list of (slot, start, end) per program)."""
    _check_positive(sms=sms, slots_per_sm=slots_per_sm)
    work = np.asarray(work, dtype=np.float64)
    if work.ndim != 1 or work.size == 0 or (work < 0).any():
        raise ValueError(f"work must be a non-empty 1-D array of non-negative times, "
                         f"got shape {work.shape}")
    free = [(0.0, slot) for slot in range(sms * slots_per_sm)]
    heapq.heapify(free)
    spans = []
    for w in work:
        start, slot = heapq.heappop(free)
        spans.append((slot, start, start + w))
        heapq.heappush(free, (start + w, slot))
    makespan = max(end for _, _, end in spans)
    occ = Occupancy(programs=int(work.size), sms=sms, slots_per_sm=slots_per_sm,
                    makespan=makespan, work=float(work.sum()),
                    waves=-(-int(work.size) // (sms * slots_per_sm)))
    return (occ, spans) if timeline else occ


def occupancy(schedule: Schedule, batch: int, heads: int, n_q: int, n_k: int | None = None,
              BLOCK_M: int = 128, BLOCK_N: int = 128,  # noqa: N803
              causal: bool = False, align: Align = "bottom_right", sms: int = H200.sms,
              slots_per_sm: int = 1) -> Occupancy:
    """How well one attention call's programs fill ``sms`` SMs, under :func:`simulate`'s model."""
    work = program_work(schedule, batch, heads, n_q, n_k, BLOCK_M, BLOCK_N, causal, align)
    return simulate(work, sms, slots_per_sm)


def occupancy_figure(batch: int = 1, heads: int = 16, ns=(1024, 2048, 4096, 8192, 16384, 32768),
                     timeline_n: int = 8192, BLOCK_M: int = 128,  # noqa: N803
                     BLOCK_N: int = 128, sms: int = H200.sms):  # noqa: N803
    """Left: utilisation vs N, FA1 vs FA2 grids, causal and not. Right: which SM is busy when,
    for one N (non-causal), both grids on the same time axis."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.3]})
    styles = {("fa1", False): ("#c44e52", "-"), ("fa1", True): ("#c44e52", "--"),
              ("fa2", False): ("#4c72b0", "-"), ("fa2", True): ("#4c72b0", "--")}
    for (sched, causal), (color, ls) in styles.items():
        util = [occupancy(sched, batch, heads, n, None, BLOCK_M, BLOCK_N, causal,
                          sms=sms).utilisation for n in ns]
        label = f"{sched.upper()} grid{', causal' if causal else ''}"
        if sched == "fa1" and causal:
            label += " (same: hidden under it)"
        ax.plot(ns, np.array(util) * 100, color=color, ls=ls, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ns), [f"{n // 1024}k" for n in ns])
    ax.set_ylim(0, 105)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(f"SM utilisation on {sms} SMs (%)")
    ax.set_title(f"batch={batch}, heads={heads}, BLOCK_M={BLOCK_M}", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)

    spans = {}
    for sched in ("fa1", "fa2"):
        work = program_work(sched, batch, heads, timeline_n, None, BLOCK_M, BLOCK_N)
        spans[sched] = simulate(work, sms, timeline=True)
    horizon = max(o.makespan for o, _ in spans.values())
    for sched, color, y0 in (("fa1", "#c44e52", sms + 8), ("fa2", "#4c72b0", 0)):
        occ, sp = spans[sched]
        ax2.axhspan(y0 - 0.5, y0 + sms - 0.5, color="0.93", zorder=0)  # every SM, busy or not
        for slot, start, end in sp:
            ax2.barh(y0 + slot, end - start, left=start, height=1.0, color=color,
                     edgecolor="white", linewidth=0.2)
        ax2.text(horizon * 0.98, y0 + sms * 0.5,
                 f"{occ.sms_used} of {sms} SMs busy, utilisation {occ.utilisation:.0%}",
                 ha="right", va="center", fontsize=8)
    ax2.set_xlim(0, horizon)
    ax2.set_ylim(-2, 2 * sms + 10)
    ax2.set_yticks([sms / 2, sms + 8 + sms / 2], [f"FA2\n{sms} SMs", f"FA1\n{sms} SMs"])
    ax2.set_xlabel("time (tiles of work)")
    fa1, fa2 = spans["fa1"][0], spans["fa2"][0]
    ax2.set_title(f"N={timeline_n}: FA1 {fa1.programs} programs, done at {fa1.makespan:.0f}; "
                  f"FA2 {fa2.programs} programs, done at {fa2.makespan:.0f}", fontsize=9)
    ax2.legend(handles=[Patch(color="#c44e52", label="FA1: one program per (batch, head)"),
                        Patch(color="#4c72b0", label="FA2: one per (query block, batch, head)")],
               fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- inside one program: warps

def _split(n: int, parts: int) -> list[slice]:
    edges = np.linspace(0, n, parts + 1).round().astype(int)
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def split_k_warps(q_blk, k_blk, v_blk, n_warps: int = 4,
                  sm_scale: float = 1.0) -> tuple[np.ndarray, int]:
    """FA1's split-K: warp w takes a slice of the keys and computes (m, l, acc) for every query
    row of the tile; the partials go through shared memory and are merged.

    Returns (o, shared-memory elements written + read). Exact, but the exchange is
    n_warps * BLOCK_M * (d + 2) elements each way, plus a barrier, per tile.
    """
    _check_positive(n_warps=n_warps)
    s = (np.asarray(q_blk) @ np.asarray(k_blk).T) * sm_scale
    parts = [AttentionState.from_block(s[:, sl], np.asarray(v_blk)[sl])
             for sl in _split(s.shape[1], n_warps)]
    smem = sum(p.acc.size + p.m.size + p.l.size for p in parts)   # each warp writes its partial
    merged = fold(parts)                                            # ... and they are read back
    return merged.output(), 2 * smem


def split_q_warps(q_blk, k_blk, v_blk, n_warps: int = 4,
                  sm_scale: float = 1.0) -> tuple[np.ndarray, int]:
    """FA2's split-Q: warp w owns a slice of the query rows and sees every key of the tile. Rows
    never meet, so nothing is exchanged: returns (o, 0)."""
    _check_positive(n_warps=n_warps)
    s = (np.asarray(q_blk) @ np.asarray(k_blk).T) * sm_scale
    o = np.empty((s.shape[0], np.asarray(v_blk).shape[1]))
    for sl in _split(s.shape[0], n_warps):
        o[sl] = AttentionState.from_block(s[sl], np.asarray(v_blk)).output()
    return o, 0
