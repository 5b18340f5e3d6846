"""Chapter 7's Play widget: which tiles a causal FlashAttention-2 pass skips, masks or runs in full.

Choose Nq, Nk, BLOCK_M, BLOCK_N, causal or not, and the alignment of the diagonal (bottom-right,
the book's and FlashAttention 2.1+'s default, or top-left, PyTorch's ``is_causal``). The figure
colours each (query block, key block) tile and draws the element-level diagonal on top; the
caption counts the tiles (:func:`flashtext.fa2.count_blocks`) and the work saved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashtext.fa2 import FULL, MASKED, SKIPPED, BlockCounts, block_grid, count_blocks
from flashtext.reference import causal_mask
from flashtext.widgets.base import redraw_into

COLORS = {SKIPPED: "#e6e6e6", MASKED: "#f0a35e", FULL: "#4c72b0"}
LABELS = {SKIPPED: "skipped (never loaded)", MASKED: "masked (diagonal crosses it)",
          FULL: "full (no mask needed)"}


@dataclass
class CausalBlocks:
    """State of the widget; :meth:`counts` and :meth:`figure` read it."""

    n_q: int = 256
    n_k: int = 256
    BLOCK_M: int = 32  # noqa: N815 (the kernel's names)
    BLOCK_N: int = 32  # noqa: N815
    causal: bool = True
    align: str = "bottom_right"

    def counts(self) -> BlockCounts:
        return count_blocks(self.n_q, self.n_k, self.BLOCK_M, self.BLOCK_N, self.causal,
                            self.align)

    def caption(self) -> str:
        c = self.counts()
        work = c.scores / (self.n_q * self.n_k)
        return (f"Nq={self.n_q}, Nk={self.n_k}, BLOCK_M={self.BLOCK_M}, BLOCK_N={self.BLOCK_N}, "
                f"{'causal ' + self.align if self.causal else 'not causal'}\n"
                f"{c.skipped} skipped, {c.masked} masked, {c.full} full of {c.total} tiles: "
                f"{work:.1%} of the non-causal score work")

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle

        grid = block_grid(self.n_q, self.n_k, self.BLOCK_M, self.BLOCK_N, self.causal,
                          self.align)
        ratio = min(1.3, max(0.45, self.n_q / self.n_k))  # roughly square cells, bounded
        fig, ax = plt.subplots(figsize=(6.5, 5.0 * ratio + 1.6))
        for (i, j), kind in np.ndenumerate(grid):
            h = min(self.BLOCK_M, self.n_q - i * self.BLOCK_M)
            w = min(self.BLOCK_N, self.n_k - j * self.BLOCK_N)
            ax.add_patch(Rectangle((j * self.BLOCK_N, i * self.BLOCK_M), w, h,
                                   facecolor=COLORS[int(kind)], edgecolor="white", lw=1.0))
        if self.causal:  # the element-level boundary: last visible key of each query row
            visible = causal_mask(self.n_q, self.n_k, self.align)
            last = visible.sum(axis=1)  # keys 0..last-1 are visible
            rows = np.arange(self.n_q + 1)
            ax.step(np.r_[last, last[-1]], rows, where="post", color="k", lw=1.2,
                    label="last visible key")
        ax.set_xlim(0, self.n_k)
        ax.set_ylim(self.n_q, 0)
        ax.set_xlabel("key index j")
        ax.set_ylabel("query index i")
        ax.set_title(self.caption(), fontsize=8)
        fig.legend(handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in LABELS],
                   fontsize=7, loc="lower center", ncol=3)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        style = {"description_width": "70px"}
        n_q = w.IntSlider(value=self.n_q, min=1, max=1024, step=1, description="Nq", style=style)
        n_k = w.IntSlider(value=self.n_k, min=1, max=1024, step=1, description="Nk", style=style)
        bm = w.Dropdown(options=[8, 16, 32, 64, 128], value=self.BLOCK_M, description="BLOCK_M",
                        style=style)
        bn = w.Dropdown(options=[8, 16, 32, 64, 128], value=self.BLOCK_N, description="BLOCK_N",
                        style=style)
        causal = w.Checkbox(value=self.causal, description="causal", style=style)
        align = w.ToggleButtons(options=["bottom_right", "top_left"], value=self.align,
                                description="align", style=style)
        controls = {"n_q": n_q, "n_k": n_k, "BLOCK_M": bm, "BLOCK_N": bn, "causal": causal,
                    "align": align}

        def redraw(_=None):
            for name, control in controls.items():
                setattr(self, name, control.value)
            redraw_into(out, self)

        for name, control in controls.items():
            control.observe(redraw, names="value")
            control.add_class(f"ft-causal-tiles-{name.lower().replace('_', '-')}")
        redraw()
        box = w.VBox([w.HBox([n_q, n_k]), w.HBox([bm, bn, causal]), align, out])
        box.add_class("ft-causal-tiles")
        return box
