"""Chapter 15's Play widgets: the tiles a kernel visits for a sliding window, a causal mask or a
packed batch, and the block table of a paged KV cache.

:class:`VisibleTiles` colours every (query tile, key tile) the way the forward kernel schedules
it (:func:`flashtext.kernels.plan.forward_stages`: run without a mask, run with one, or never
loaded). For a packed batch (``flash_attention_varlen``) each sequence's tiles start at its own
offset ``cu_seqlens[b]``, so the picture is a block diagonal; next to it the same batch padded to
its longest sequence, as a dense (batch, heads, N, d) call would compute it.

:class:`PagedCache` grows a batch of sequences token by token into a pool of fixed-size physical
blocks (vLLM's PagedAttention): a sequence takes a new block from the free list only when its
last one is full, so its blocks end up wherever the pool had room, and ``block_table[b, i]``
records which physical block holds its logical block ``i`` (what ``flash_decode`` reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flashtext.kernels import plan
from flashtext.reference import window_mask
from flashtext.widgets.base import redraw_into

STAGE_COLORS = {plan.NOT_VISITED: "#e6e6e6", plan.MASKED_STAGE: "#f0a35e",
                plan.UNMASKED_STAGE: "#4c72b0"}
STAGE_LABELS = {plan.NOT_VISITED: "skipped (never loaded)",
                plan.MASKED_STAGE: "masked (an edge of the window crosses it)",
                plan.UNMASKED_STAGE: "full (no mask needed)"}
LAYOUTS = ("one sequence", "packed")
BLOCKS = (8, 16, 32, 64, 128)
SEQ_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
              "#8c8c8c", "#ccb974", "#64b5cd")


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"96, 0, 200"`` -> (96, 0, 200); a ValueError naming ``lengths`` otherwise."""
    try:
        values = tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"lengths must be integers separated by commas, got {text!r}") from None
    if not values or min(values) < 0:
        raise ValueError(f"lengths must be one or more integers >= 0, got {text!r}")
    return values


def cu_seqlens(lengths) -> np.ndarray:
    """The offsets ``[0, L0, L0 + L1, ...]`` (int32) of sequences packed end to end."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


@dataclass(frozen=True)
class TileCounts:
    """Tiles of one schedule: visited = masked + unmasked; ``pairs`` are visible (query, key)
    pairs, the work no schedule can avoid."""

    masked: int
    unmasked: int
    skipped: int
    pairs: int

    @property
    def visited(self) -> int:
        return self.masked + self.unmasked

    @property
    def total(self) -> int:
        return self.visited + self.skipped


def _counts(grids, pairs: int) -> TileCounts:
    masked = sum(int((g == plan.MASKED_STAGE).sum()) for g in grids)
    unmasked = sum(int((g == plan.UNMASKED_STAGE).sum()) for g in grids)
    total = sum(g.size for g in grids)
    return TileCounts(masked, unmasked, total - masked - unmasked, pairs)


@dataclass
class VisibleTiles:
    """State of the tile map: a window ``(left, right)`` (-1 unbounded), ``causal`` (right = 0),
    tiles ``BLOCK_M`` x ``BLOCK_N``, and either one sequence of ``n_q`` queries and ``n_k`` keys
    or a packed batch of ``lengths`` (each sequence's queries are its keys)."""

    layout: str = "one sequence"
    n_q: int = 256
    n_k: int = 256
    lengths: tuple[int, ...] = (96, 0, 200, 40)
    BLOCK_M: int = 32  # noqa: N815 (the kernel's names)
    BLOCK_N: int = 32  # noqa: N815
    causal: bool = True
    left: int = 63
    right: int = -1

    def validate(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        self.n_q, self.n_k = _int("n_q", self.n_q, 0), _int("n_k", self.n_k, 0)
        self.BLOCK_M, self.BLOCK_N = _int("BLOCK_M", self.BLOCK_M, 1), \
            _int("BLOCK_N", self.BLOCK_N, 1)
        self.left, self.right = _int("left", self.left, -1), _int("right", self.right, -1)
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")
        self.lengths = tuple(_int("lengths", n, 0) for n in self.lengths)
        if not self.lengths:
            raise ValueError("lengths must hold at least one sequence")

    @property
    def window(self) -> tuple[int, int]:
        return self.left, self.right

    def stages(self) -> np.ndarray:
        """One sequence: the forward kernel's (query tiles, key tiles) schedule."""
        self.validate()
        return plan.forward_stages(self.n_q, self.n_k, self.BLOCK_M, self.BLOCK_N, self.causal,
                                   self.window)

    def packed_stages(self) -> list[tuple[int, np.ndarray]]:
        """Packed batch: (first row, schedule) of each sequence, tiles aligned to its start."""
        self.validate()
        starts = cu_seqlens(self.lengths)[:-1]
        return [(int(s), plan.forward_stages(n, n, self.BLOCK_M, self.BLOCK_N, self.causal,
                                             self.window))
                for s, n in zip(starts, self.lengths, strict=True)]

    def padded_stages(self) -> np.ndarray:
        """The schedule of one sequence padded to the longest (every sequence of a dense
        (batch, heads, N, d) call runs this one)."""
        longest = max(self.lengths)
        return plan.forward_stages(longest, longest, self.BLOCK_M, self.BLOCK_N, self.causal,
                                   self.window)

    def counts(self) -> TileCounts:
        """One sequence: its tiles. Packed: the tiles of every sequence, each counted in its own
        grid (the packed matrix's off-diagonal blocks are never even launched)."""
        if self.layout == "one sequence":
            return _counts([self.stages()], plan.visible_pairs(self.n_q, self.n_k, self.causal,
                                                               self.window))
        grids = [g for _, g in self.packed_stages()]
        pairs = sum(plan.visible_pairs(n, n, self.causal, self.window) for n in self.lengths)
        return _counts(grids, pairs)

    def padded_counts(self) -> TileCounts:
        """What a dense call over the batch padded to its longest sequence schedules."""
        self.validate()
        grid = self.padded_stages()
        longest = max(self.lengths)
        pairs = plan.visible_pairs(longest, longest, self.causal, self.window)
        return _counts([grid] * len(self.lengths), pairs * len(self.lengths))

    def caption(self) -> str:
        c = self.counts()
        mask = (f"window (left={self.left}, right={self.right})"
                + (", causal" if self.causal else ""))
        blocks = f"BLOCK_M={self.BLOCK_M}, BLOCK_N={self.BLOCK_N}"
        if self.layout == "one sequence":
            return (f"Nq={self.n_q}, Nk={self.n_k}, {mask}, {blocks}\n"
                    f"{c.visited} of {c.total} tiles visited ({c.masked} masked, {c.unmasked} "
                    f"full), {c.skipped} skipped; {c.pairs:,} visible pairs")
        p = self.padded_counts()
        ratio = f"{p.visited / c.visited:.2f}x" if c.visited else "n/a"
        return (f"packed lengths {list(self.lengths)}, {mask}, {blocks}\n"
                f"packed: {c.visited} tiles visited ({c.masked} masked); padded to "
                f"{max(self.lengths)}: {p.visited} ({ratio}); {c.pairs:,} visible pairs")

    # ------------------------------------------------------------------------------ drawing

    def _draw_grid(self, ax, grid: np.ndarray, row0: int, col0: int, n_q: int, n_k: int) -> None:
        from matplotlib.patches import Rectangle

        for (i, j), kind in np.ndenumerate(grid):
            h = min(self.BLOCK_M, n_q - i * self.BLOCK_M)
            w = min(self.BLOCK_N, n_k - j * self.BLOCK_N)
            ax.add_patch(Rectangle((col0 + j * self.BLOCK_N, row0 + i * self.BLOCK_M), w, h,
                                   facecolor=STAGE_COLORS[int(kind)], edgecolor="white",
                                   lw=0.8))

    def _draw_edges(self, ax, n_q: int, n_k: int, row0: int = 0, col0: int = 0) -> None:
        """The element-level window: first and last visible key of every row."""
        if n_q == 0 or n_k == 0:
            return
        vis = window_mask(n_q, n_k, (self.left, 0 if self.causal else self.right))
        rows = np.arange(n_q + 1) + row0
        seen = vis.any(axis=1)
        first = np.where(seen, vis.argmax(axis=1), np.nan)
        last = np.where(seen, n_k - vis[:, ::-1].argmax(axis=1), np.nan)
        for edge in (first, last):
            ax.step(np.r_[edge, edge[-1]] + col0, rows, where="post", color="k", lw=1.0)

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle

        self.validate()
        if self.layout == "one sequence":
            ratio = min(1.3, max(0.45, self.n_q / max(self.n_k, 1)))
            fig, ax = plt.subplots(figsize=(6.5, 5.0 * ratio + 1.6))
            self._draw_grid(ax, self.stages(), 0, 0, self.n_q, self.n_k)
            self._draw_edges(ax, self.n_q, self.n_k)
            ax.set_xlim(0, max(self.n_k, 1))
            ax.set_ylim(max(self.n_q, 1), 0)
            ax.set_xlabel("key index j")
            ax.set_ylabel("query index i")
            ax.set_title(self.caption(), fontsize=8)
        else:
            fig, (ax, ax_pad) = plt.subplots(1, 2, figsize=(10, 5.6))
            total = int(sum(self.lengths))
            for (start, grid), n in zip(self.packed_stages(), self.lengths, strict=True):
                self._draw_grid(ax, grid, start, start, n, n)
                self._draw_edges(ax, n, n, start, start)
                if n:
                    ax.add_patch(Rectangle((start, start), n, n, fill=False, edgecolor="k",
                                           lw=1.2))
            ax.set_xlim(0, max(total, 1))
            ax.set_ylim(max(total, 1), 0)
            ax.set_title(f"packed: cu_seqlens = {cu_seqlens(self.lengths).tolist()}\n"
                         "white: pairs of two sequences, never launched", fontsize=8)
            ax.set_xlabel("packed key row")
            ax.set_ylabel("packed query row")
            longest = max(self.lengths)
            grid = self.padded_stages()
            for b, n in enumerate(self.lengths):
                start = b * longest
                self._draw_grid(ax_pad, grid, start, start, longest, longest)
                if longest > n:  # the padding: rows and keys that hold no token
                    for rect in ((start + n, start, longest - n, longest),
                                 (start, start + n, n, longest - n)):
                        ax_pad.add_patch(Rectangle(rect[:2], *rect[2:], facecolor="none",
                                                   hatch="///", edgecolor="0.25", lw=0))
            side = max(longest * len(self.lengths), 1)
            ax_pad.set_xlim(0, side)
            ax_pad.set_ylim(side, 0)
            ax_pad.set_title(f"padded to {longest}: hatched = padding", fontsize=8)
            ax_pad.set_xlabel("key (sequence b at b x N)")
            fig.suptitle(self.caption(), fontsize=8)
        fig.legend(handles=[Patch(color=STAGE_COLORS[k], label=STAGE_LABELS[k])
                            for k in STAGE_LABELS], fontsize=7, loc="lower center", ncol=3)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        return fig

    def widget(self):
        import ipywidgets as w

        self.validate()
        out = w.Output()
        style = {"description_width": "70px"}
        # the first slider moves the window in both layouts (the browser test moves it)
        left = w.IntSlider(value=self.left, min=-1, max=512, description="left", style=style)
        right = w.IntSlider(value=self.right, min=-1, max=512, description="right", style=style)
        n_q = w.IntSlider(value=self.n_q, min=0, max=1024, description="Nq", style=style)
        n_k = w.IntSlider(value=self.n_k, min=0, max=1024, description="Nk", style=style)
        bm = w.Dropdown(options=BLOCKS, value=self.BLOCK_M, description="BLOCK_M", style=style)
        bn = w.Dropdown(options=BLOCKS, value=self.BLOCK_N, description="BLOCK_N", style=style)
        causal = w.Checkbox(value=self.causal, description="causal", style=style)
        layout = w.ToggleButtons(options=LAYOUTS, value=self.layout, description="layout",
                                 style=style)
        lengths = w.Text(value=", ".join(map(str, self.lengths)), description="lengths",
                         continuous_update=False, style=style)
        note = w.HTML()
        controls = {"left": left, "right": right, "n_q": n_q, "n_k": n_k, "BLOCK_M": bm,
                    "BLOCK_N": bn, "causal": causal, "layout": layout}

        def redraw(_=None):
            for name, control in controls.items():
                setattr(self, name, control.value)
            try:
                self.lengths = parse_lengths(lengths.value)
                note.value = ""
            except ValueError as e:
                note.value = f"<span style='color:#c44e52'>{e}; kept {list(self.lengths)}</span>"
            redraw_into(out, self)

        for name, control in {**controls, "lengths": lengths}.items():
            control.observe(redraw, names="value")
            control.add_class(f"ft-visible-tiles-{name.lower().replace('_', '-')}")
        redraw()
        box = w.VBox([w.HBox([left, right]), w.HBox([n_q, n_k]), w.HBox([bm, bn, causal]),
                      layout, w.HBox([lengths, note]), out])
        box.add_class("ft-visible-tiles")
        return box


# ------------------------------------------------------------------------- the paged cache

@dataclass(frozen=True)
class Allocation:
    """A paged cache after prefill and some decode steps.

    ``lengths[b]`` tokens of sequence b are cached; ``table[b]`` lists its physical blocks in
    logical order (``table[b][i]`` holds its tokens ``i * block_size ...``); ``owner[p]`` is
    ``(b, i)`` for a used physical block p, None for a free one; ``stalled`` are the sequences
    that wanted a block when the pool was empty (a server would preempt them)."""

    lengths: tuple[int, ...]
    table: tuple[tuple[int, ...], ...]
    owner: tuple[tuple[int, int] | None, ...]
    block_size: int
    stalled: frozenset[int] = field(default_factory=frozenset)

    def block_table(self) -> np.ndarray:
        """(batch, max_blocks) int32, unused entries -1: ``flash_decode``'s block_table."""
        width = max((len(t) for t in self.table), default=0)
        out = np.full((len(self.table), max(width, 1)), -1, dtype=np.int32)
        for b, row in enumerate(self.table):
            out[b, :len(row)] = row
        return out

    def slot(self, b: int, t: int) -> tuple[int, int]:
        """Where token t of sequence b lives: (physical block, slot in the block)."""
        if not 0 <= t < self.lengths[b]:
            raise ValueError(f"token {t} is not cached for sequence {b} "
                             f"(length {self.lengths[b]})")
        return self.table[b][t // self.block_size], t % self.block_size

    @property
    def allocated_slots(self) -> int:
        return sum(len(t) for t in self.table) * self.block_size

    @property
    def wasted_slots(self) -> int:
        """Slots reserved but not (yet) holding a token: under one block per sequence."""
        return self.allocated_slots - sum(self.lengths)


def allocate(prompts, steps: int, block_size: int, num_blocks: int,
             seed: int | None = None) -> Allocation:
    """Prefill ``prompts`` (one block list per sequence, in order), then run ``steps`` decode
    steps in which every sequence appends one token; a sequence takes the next free physical
    block only when its last block is full. The free list is 0, 1, 2, ... or, with ``seed``, a
    seeded shuffle (a pool fragmented by earlier requests)."""
    prompts = tuple(_int("prompts", n, 0) for n in prompts)
    steps = _int("steps", steps, 0)
    block_size = _int("block_size", block_size, 1)
    num_blocks = _int("num_blocks", num_blocks, 0)
    free = list(range(num_blocks))
    if seed is not None:
        free = np.random.default_rng(seed).permutation(num_blocks).tolist()
    free.reverse()  # pop() hands out the front of the list
    table: list[list[int]] = [[] for _ in prompts]
    lengths = [0] * len(prompts)
    stalled: set[int] = set()

    def append(b: int, tokens: int) -> None:
        for _ in range(tokens):
            if lengths[b] % block_size == 0:  # the last block is full (or there is none)
                if not free:
                    stalled.add(b)
                    return
                table[b].append(free.pop())
            lengths[b] += 1

    for b, n in enumerate(prompts):
        append(b, n)
    for _ in range(steps):
        for b in range(len(prompts)):
            if b not in stalled:
                append(b, 1)
    owner: list[tuple[int, int] | None] = [None] * num_blocks
    for b, row in enumerate(table):
        for i, p in enumerate(row):
            owner[p] = (b, i)
    return Allocation(tuple(lengths), tuple(tuple(r) for r in table), tuple(owner), block_size,
                      frozenset(stalled))


@dataclass
class PagedCache:
    """State of the block-table widget: prompt lengths, decode steps taken, the block size, the
    pool's size, and the capacity ``max_len`` a dense cache would reserve per sequence."""

    prompts: tuple[int, ...] = (37, 5, 20)
    steps: int = 0
    block_size: int = 8
    num_blocks: int = 24
    max_len: int = 96
    seed: int | None = None

    def allocation(self) -> Allocation:
        return allocate(self.prompts, self.steps, self.block_size, self.num_blocks, self.seed)

    def caption(self) -> str:
        a = self.allocation()
        tokens = sum(a.lengths)
        used = sum(len(t) for t in a.table)
        dense = len(a.lengths) * self.max_len
        text = (f"block_size={self.block_size}, after {self.steps} decode steps: lengths "
                f"{list(a.lengths)}\npaged: {used} of {self.num_blocks} blocks, "
                f"{a.allocated_slots} slots for {tokens} tokens ({a.wasted_slots} empty); "
                f"dense, {self.max_len} reserved per sequence: {dense} slots "
                f"({dense - tokens} empty)")
        if a.stalled:
            text += f"\nthe pool is full: sequence(s) {sorted(a.stalled)} wait for a block"
        return text

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        a = self.allocation()
        batch = len(a.lengths)
        width = max((len(t) for t in a.table), default=0)
        per_row = 8
        pool_rows = _cdiv(max(self.num_blocks, 1), per_row)
        fig, (ax, ax_pool) = plt.subplots(1, 2, figsize=(10, 1.4 + 0.55 * max(batch, pool_rows)),
                                          gridspec_kw={"width_ratios": [max(width, 4), per_row]})
        for b, row in enumerate(a.table):
            color = SEQ_COLORS[b % len(SEQ_COLORS)]
            for i, p in enumerate(row):
                used = min(a.block_size, a.lengths[b] - i * a.block_size)
                ax.add_patch(Rectangle((i, b), 1, 1, facecolor="white", edgecolor="0.4"))
                ax.add_patch(Rectangle((i, b), used / a.block_size, 1, facecolor=color,
                                       alpha=0.55, lw=0))
                ax.text(i + 0.5, b + 0.5, f"-> {p}", ha="center", va="center", fontsize=7)
        ax.set_xlim(0, max(width, 4))
        ax.set_ylim(max(batch, 1), 0)
        ax.set_yticks(np.arange(batch) + 0.5, [f"seq {b} ({n})" for b, n in
                                              enumerate(a.lengths)], fontsize=7)
        ax.set_xticks(np.arange(max(width, 4)) + 0.5, range(max(width, 4)), fontsize=7)
        ax.set_xlabel("logical block i  (cell: -> physical block = block_table[b, i])",
                      fontsize=8)
        for p, who in enumerate(a.owner):
            x, y = p % per_row, p // per_row
            ax_pool.add_patch(Rectangle((x, y), 1, 1, facecolor="#f2f2f2" if who is None
                                        else SEQ_COLORS[who[0] % len(SEQ_COLORS)],
                                        alpha=1.0 if who is None else 0.55, edgecolor="0.4"))
            label = f"{p}" if who is None else f"{p}\ns{who[0]}:{who[1]}"
            ax_pool.text(x + 0.5, y + 0.5, label, ha="center", va="center", fontsize=6)
        ax_pool.set_xlim(0, per_row)
        ax_pool.set_ylim(pool_rows, 0)
        ax_pool.set_axis_off()
        ax_pool.set_title("physical pool (number; seq:logical block)", fontsize=8)
        fig.suptitle(self.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        style = {"description_width": "80px"}
        steps = w.IntSlider(value=self.steps, min=0, max=64, description="decode steps",
                            style=style)
        block = w.Dropdown(options=(4, 8, 16, 32), value=self.block_size,
                           description="block_size", style=style)
        shuffle = w.Checkbox(value=self.seed is not None, description="fragmented pool",
                             style=style)
        controls = {"steps": steps, "block_size": block}

        def redraw(_=None):
            for name, control in controls.items():
                setattr(self, name, control.value)
            self.seed = 0 if shuffle.value else None
            redraw_into(out, self)

        for name, control in {**controls, "shuffle": shuffle}.items():
            control.observe(redraw, names="value")
            control.add_class(f"ft-paged-cache-{name.replace('_', '-')}")
        redraw()
        box = w.VBox([w.HBox([steps, block, shuffle]), out])
        box.add_class("ft-paged-cache")
        return box


__all__ = ["Allocation", "PagedCache", "TileCounts", "VisibleTiles", "allocate", "cu_seqlens",
           "parse_lengths"]
