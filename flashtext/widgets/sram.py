"""Chapters 4-6's widgets: the SRAM budget of Algorithm 1, a line-12 stepper, traffic curves.

* :class:`SRAMBudget` (chapter 4, Play): choose M, d and N; see Bc, Br, Tr, Tc, the tile grid of
  the N x N score matrix (which is never stored) and how full the SRAM is in one iteration.
* :class:`Line12Stepper` (chapter 5): step through the key blocks of one row block and watch the
  green (already folded) and yellow (on chip now) keys, and one query row's softmax weights
  (the paper's 1-based i and j; keys and rows numbered from 1 too).
* :class:`TrafficCurves` (chapter 6, Play): Algorithm 1's HBM accesses against N and against M,
  next to standard attention's, and the M from which Algorithm 1 moves less.

All are state objects with ``figure()`` and ``widget()`` reading the same state; all numbers
come from :mod:`flashtext.cost` and :mod:`flashtext.tiled`, nothing is recomputed here. The
stepper's ``figure()`` shows every step side by side for the static page; its live widget
redraws one step, ``frame_figure()``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np

from flashtext import cost, reference, tiled
from flashtext.hardware import GPUS
from flashtext.widgets.base import redraw_into
from flashtext.widgets.tiles import CurrentFrame

TILE_COLORS = {"K_j": "#4c72b0", "V_j": "#55a868", "Q_i": "#8172b2", "O_i": "#ccb974",
               "S_ij": "#c44e52", "l_i, m_i": "#64b5cd", "line 10-11 row stats": "#999999"}
GREEN, YELLOW, FUTURE = "#7fc97f", "#ffd92f", "#eeeeee"
M_CHOICES = sorted({2 ** k for k in range(8, 19)} | {3 * 2 ** k for k in range(8, 17)})


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def gpu_presets(bytes_per_element: int = 2) -> dict[str, int]:
    """M in elements for each GPU's shared memory per SM (fp16/bf16 by default)."""
    return {f"{name} ({g.smem_per_sm // 1024} KB)": g.smem_per_sm // bytes_per_element
            for name, g in GPUS.items()}


def _edges(n: int, block: int) -> np.ndarray:
    return np.minimum(np.arange(0, n + block, block), n)


def _memory_controls(m_elements: int, d: int, prefix: str):
    """The M slider (with every GPU preset among its stops), a GPU dropdown that moves it, and
    the d dropdown, shared by the chapter 4 and chapter 6 widgets."""
    import ipywidgets as w

    presets = gpu_presets()
    options = sorted(set(M_CHOICES) | set(presets.values()) | {m_elements})
    m = w.SelectionSlider(options=options, value=m_elements, description="M (elements)",
                          continuous_update=False, style={"description_width": "initial"})
    gpu = w.Dropdown(options=["(choose)"] + list(presets), description="GPU, fp16")
    dd = w.Dropdown(options=[16, 32, 64, 128, 256], value=d, description="d")

    def pick_gpu(change):
        if change["new"] in presets:
            m.value = presets[change["new"]]

    gpu.observe(pick_gpu, names="value")
    for control, name in ((m, "m"), (gpu, "gpu"), (dd, "d")):
        control.add_class(f"{prefix}-{name}")
    return m, gpu, dd


# -------------------------------------------------------------------------------- SRAM budget

@dataclass
class SRAMBudget:
    """Algorithm 1's line 1 and its SRAM budget for one choice of (M, d, N).

    ``step`` is the (0-based) iteration of the doubly nested loop, in Algorithm 1's order (outer
    over key blocks j, inner over query blocks i).
    """

    m_elements: int = 4096
    d: int = 64
    n: int = 256
    step: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check_positive(m_elements=self.m_elements, d=self.d, n=self.n)
        total = self.grid()["Tr"] * self.grid()["Tc"]
        self.step = int(min(max(self.step, 0), total - 1))

    def grid(self) -> dict[str, int]:
        return cost.fa1_grid(self.n, self.d, self.m_elements)

    def tiles(self) -> dict[str, int]:
        return cost.fa1_sram_elements(self.m_elements, self.d)

    def current(self) -> tuple[int, int]:
        """(i, j) of ``step``: j = step // Tr, i = step % Tr."""
        tr = self.grid()["Tr"]
        return self.step % tr, self.step // tr

    def state(self) -> dict:
        g, tiles = self.grid(), self.tiles()
        paper = cost.fa1_paper_budget(self.m_elements, self.d)
        return {**g, "iterations": g["Tr"] * g["Tc"], "collapsed": g["Bc"] <= self.d,
                "paper_budget": paper, "with_row_stats": sum(tiles.values()),
                "fits": paper <= self.m_elements,
                "hbm_fa1": cost.fa1_hbm_total(self.n, self.d, self.m_elements),
                "hbm_standard": cost.standard_attention_hbm_total(self.n, self.d)}

    def caption(self) -> str:
        s = self.state()
        why = ("Bc <= d, so the min collapses: Br = Bc" if s["collapsed"]
               else f"Br capped at d = {self.d}")
        fit = (f"paper's budget {s['paper_budget']:,} <= M" if s["fits"] else
               f"paper's budget {s['paper_budget']:,} EXCEEDS M by "
               f"{s['paper_budget'] - self.m_elements:,}")
        return (f"M = {self.m_elements:,} elements, d = {self.d}, N = {self.n}:  "
                f"Bc = {s['Bc']}, Br = {s['Br']} ({why});  Tr = {s['Tr']}, Tc = {s['Tc']}, "
                f"{s['iterations']:,} iterations\n{fit};  HBM accesses: Algorithm 1 "
                f"{s['hbm_fa1']:,} vs standard {s['hbm_standard']:,} elements")

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        s = self.state()
        fig, (ax, bar) = plt.subplots(1, 2, figsize=(11, 4.4),
                                      gridspec_kw={"width_ratios": [1, 1.35]})
        # left: the N x N score matrix as a Tr x Tc grid of Br x Bc tiles
        rows, cols = _edges(self.n, s["Br"]), _edges(self.n, s["Bc"])
        i, j = self.current()
        status = np.zeros((s["Tr"], s["Tc"]))
        status[:, :j] = 1
        status[:i, j] = 1
        status[i, j] = 2
        from matplotlib.colors import ListedColormap

        ax.pcolormesh(cols, rows, status, cmap=ListedColormap([FUTURE, "#b9d3ee", YELLOW]),
                      vmin=0, vmax=2, edgecolors="k" if s["iterations"] <= 1024 else "none",
                      linewidth=0.3)
        ax.add_patch(Rectangle((cols[j], 0), cols[j + 1] - cols[j], self.n, fill=False,
                               ec="#4c72b0", lw=2, label=f"K_j, V_j (j={j + 1})"))
        ax.add_patch(Rectangle((0, rows[i]), self.n, rows[i + 1] - rows[i], fill=False,
                               ec="#8172b2", lw=2, label=f"Q_i, O_i (i={i + 1})"))
        ax.set_xlim(0, self.n)
        ax.set_ylim(self.n, 0)
        ax.set_aspect("equal")
        ax.set_xlabel(f"keys: Tc = {s['Tc']} blocks of Bc = {s['Bc']}")
        ax.set_ylabel(f"queries: Tr = {s['Tr']} blocks of Br = {s['Br']}")
        ax.set_title(f"iteration {self.step + 1} of {s['iterations']:,} (yellow: S_ij on chip)",
                     fontsize=9)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7)
        # right: what one iteration holds on chip, against M
        left = 0
        for name, size in self.tiles().items():
            bar.barh(0, size, left=left, color=TILE_COLORS[name], edgecolor="white",
                     label=f"{name}: {size:,}")
            left += size
        bar.axvline(self.m_elements, color="k", lw=2)
        bar.text(self.m_elements, 0.45, " M", va="bottom", fontsize=9)
        if left > self.m_elements:
            bar.barh(0, left - self.m_elements, left=self.m_elements, fill=False, hatch="///",
                     edgecolor="red", lw=0)
            paper_over = s["paper_budget"] - self.m_elements
            bar.text(self.m_elements, -0.5, f"over M by {left - self.m_elements:,} "
                     f"({paper_over:,} without the line 10-11 row stats)", color="red",
                     ha="right", va="top", fontsize=8)
        bar.set_xlim(0, max(left, self.m_elements) * 1.05)
        bar.set_ylim(-0.9, 0.9)
        bar.set_yticks([])
        bar.set_xlabel("elements on chip during one (i, j) iteration")
        bar.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=7)
        bar.set_title(f"SRAM fill: {left:,} of M = {self.m_elements:,} "
                      f"({100 * left / self.m_elements:.0f}%)", fontsize=9)
        fig.suptitle(self.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        m, gpu, d = _memory_controls(self.m_elements, self.d, "ft-sram")
        n = w.IntSlider(value=self.n, min=16, max=4096, step=16, description="N",
                        continuous_update=False)
        # the slider counts iterations from 1, as the figure's title does
        step = w.IntSlider(value=self.step + 1, min=1, max=self.state()["iterations"],
                           description="iteration", continuous_update=False)
        n.add_class("ft-sram-n")
        step.add_class("ft-sram-step")

        def redraw(_=None):
            self.m_elements, self.d, self.n = m.value, d.value, n.value
            step.max = self.state()["iterations"]
            self.step = step.value - 1
            self.validate()
            redraw_into(out, self)

        for control in (m, d, n, step):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([m, gpu]), w.HBox([d, n, step]), out])
        box.add_class("ft-sram-budget")
        return box


# ----------------------------------------------------------------------------- line-12 stepper

@dataclass
class Line12Stepper:
    """Walk the key blocks j of one row block i of a small Algorithm 1 run.

    Every index is 1-based, as in the paper: row block ``i`` in 1..Tr, key block ``j`` in
    1..Tc, ``query`` the row within the block in 1..Br, and the figures number keys and query
    rows 1..N. ``frame_figure()`` shows the step (i, j): row block i's key blocks already folded
    into O_i green, the one on chip yellow, and, for the chosen query row, the softmax weights the
    current O_i uses (diag(l_new)^-1 e^{s - m_new}) next to the exact softmax over the keys seen
    so far. ``figure()``, the static page's view, shows those weights after every key block
    j = 1..Tc side by side.
    """

    n: int = 12
    d: int = 4
    m_elements: int = 48  # Bc = Br = 3: a 4 x 4 grid of 3 x 3 tiles
    i: int = 2
    j: int = 3
    query: int = 2  # with seed 0 this row's max rises at j = 3, so line 12 has work to do
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def grid(self) -> dict[str, int]:
        return cost.fa1_grid(self.n, self.d, self.m_elements)

    def validate(self) -> None:
        _check_positive(n=self.n, d=self.d, m_elements=self.m_elements)
        g = self.grid()
        for name, top in (("i", g["Tr"]), ("j", g["Tc"])):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or not 1 <= value <= top:
                raise ValueError(f"{name} must be in 1..{top} (the paper's 1-based block "
                                 f"index), got {value!r}")
        rows = min(g["Br"], self.n - (self.i - 1) * g["Br"])
        self.query = int(min(max(self.query, 1), rows))

    def _run(self) -> tiled.Run:
        rng = np.random.default_rng(self.seed)
        self._qkv = tuple(2.0 * rng.standard_normal((self.n, self.d)) for _ in range(3))
        budget = sum(cost.fa1_sram_elements(self.m_elements, self.d).values())
        return tiled.algorithm1(*self._qkv, self.m_elements, trace=True, sram_elements=budget)

    def step(self, j: int | None = None) -> tiled.Step:
        """The :class:`flashtext.tiled.Step` at (i, j), 1-based (``j`` defaults to this j)."""
        j = self.j if j is None else j
        run = self._run()  # tiled.Step counts its blocks from 0
        return next(s for s in run.steps if (s.i, s.j) == (self.i - 1, j - 1))

    def query_row(self) -> int:
        """The chosen query's row of the N x N matrix, 1-based."""
        return (self.i - 1) * self.grid()["Br"] + self.query

    def weights(self, j: int | None = None) -> dict[str, np.ndarray]:
        """For the chosen query row after key block ``j``: the weights O_i uses, the exact
        softmax over the keys seen so far, and the row's scores (arrays indexed by key - 1)."""
        st = self.step(j)
        q, k, _ = self._qkv
        row = self.query_row() - 1
        r = self.query - 1
        s = reference.scores(q[row:row + 1], k)[0]
        used = np.exp(s - st.m_new[r]) / st.l_new[r]
        used[st.keys_seen.stop:] = 0.0  # keys not seen yet carry no weight
        exact = np.zeros_like(used)
        exact[:st.keys_seen.stop] = reference.softmax(s[:st.keys_seen.stop])
        return {"used": used, "exact": exact, "scores": s}

    def _keys(self, sl: slice) -> str:
        return f"keys {sl.start + 1}-{sl.stop}" if sl.stop - sl.start > 1 else f"key {sl.stop}"

    def caption(self) -> str:
        st = self.step()
        r = self.query - 1
        w = self.weights()
        err = np.abs(w["used"] - w["exact"]).max()
        return (f"row block i={self.i}, key block j={self.j} ({self._keys(st.cols)} on chip); "
                f"query row {self.query_row()} of {self.n} (row {self.query} of the block): "
                f"m {st.m_old[r]:.3f} -> {st.m_new[r]:.3f}, l {st.l_old[r]:.3f} -> "
                f"{st.l_new[r]:.3f}; max |weights - exact softmax so far| = {err:.1e}")

    def _draw_weights(self, ax, j: int) -> float:
        """Bars and crosses for the query row after key block j; returns the tallest."""
        st = self.step(j)
        w = self.weights(j)
        keys = np.arange(1, self.n + 1)
        colors = [GREEN if kk <= st.cols.start else YELLOW if kk <= st.cols.stop else FUTURE
                  for kk in keys]
        ax.bar(keys, w["used"], color=colors, edgecolor="k", lw=0.5,
               label="weights O_i uses now: e^(s - m_new) / l_new")
        seen = keys <= st.keys_seen.stop
        ax.plot(keys[seen], w["exact"][seen], "kx", ms=8,
                label="exact softmax over the keys seen so far")
        ax.set_xticks(keys if self.n <= 16 else keys[::max(1, self.n // 8)])
        ax.set_xlabel("key (1-based)")
        return max(1e-9, w["used"].max(), w["exact"].max())

    def frame_figure(self):
        """One step (i, j): the tile grid and the chosen query row's weights."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap

        g = self.grid()
        fig, (ax, wx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
        status = np.zeros((g["Tr"], g["Tc"]))
        status[self.i - 1, :self.j - 1] = 1
        status[self.i - 1, self.j - 1] = 2
        rows, cols = _edges(self.n, g["Br"]), _edges(self.n, g["Bc"])
        ax.pcolormesh(cols, rows, status, cmap=ListedColormap([FUTURE, GREEN, YELLOW]),
                      vmin=0, vmax=2, edgecolors="k", linewidth=0.8)
        for jj in range(g["Tc"]):
            ax.text((cols[jj] + cols[jj + 1]) / 2, -0.3, f"j={jj + 1}", ha="center", fontsize=8)
        for ii in range(g["Tr"]):
            ax.text(-0.3, (rows[ii] + rows[ii + 1]) / 2, f"i={ii + 1}", ha="right",
                    va="center", fontsize=8)
        row = self.query_row()
        ax.axhline(row - 0.5, color="k", ls=":", lw=1)
        ax.set_xlim(0, self.n)
        ax.set_ylim(self.n, 0)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"green: folded into O_{self.i}   yellow: on chip now\n"
                     f"(dotted: query row {row})", fontsize=9, pad=22)
        wx.set_ylim(0, self._draw_weights(wx, self.j) * 1.25)
        wx.set_ylabel(f"weight of each key in query row {row}")
        wx.legend(fontsize=8, loc="upper left")
        fig.suptitle(textwrap.fill(self.caption(), 150), fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        return fig

    def figure(self):
        """The static page's view: the chosen query row's weights after each key block
        j = 1..Tc of row block i. Earlier keys shrink whenever a later block raises the max;
        the bars stay on the crosses at every step."""
        import matplotlib.pyplot as plt

        tc = self.grid()["Tc"]
        fig, axes = plt.subplots(1, tc, figsize=(3.1 * tc, 3.3), sharey=True, squeeze=False)
        tallest = 0.0
        for j, ax in enumerate(axes[0], start=1):
            st = self.step(j)
            r = self.query - 1
            tallest = max(tallest, self._draw_weights(ax, j))
            ax.set_title(f"after j={j} ({self._keys(st.keys_seen)} seen)\n"
                         f"m {st.m_old[r]:.2f} -> {st.m_new[r]:.2f}", fontsize=8)
        axes[0][0].set_ylim(0, tallest * 1.15)
        axes[0][0].set_ylabel(f"weight in query row {self.query_row()}")
        axes[0][-1].legend(fontsize=7, loc="upper left")
        fig.suptitle(f"row block i={self.i}, query row {self.query_row()}: the weights O_{self.i} "
                     "uses after each key block (green: folded in before, yellow: this block; "
                     "crosses: the exact softmax over the keys seen)", fontsize=9)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        g = self.grid()
        i = w.IntSlider(value=self.i, min=1, max=g["Tr"], description="row block i")
        j = w.IntSlider(value=self.j, min=1, max=g["Tc"], description="key block j")
        query = w.IntSlider(value=self.query, min=1, max=g["Br"], description="row in block")
        for control, cls in ((i, "ft-line12-i"), (j, "ft-line12-j"), (query, "ft-line12-row")):
            control.add_class(cls)
            control.style = {"description_width": "initial"}

        def redraw(_=None):
            self.i, self.j, self.query = i.value, j.value, query.value
            self.validate()
            redraw_into(out, CurrentFrame(self.frame_figure))

        for control in (i, j, query):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([i, j, query]), out])
        box.add_class("ft-line12-stepper")
        return box


# ------------------------------------------------------------------------ traffic (chapter 6)

N_CHOICES = [2 ** k for k in range(8, 18)]


@dataclass
class TrafficCurves:
    """Chapter 6's Play: HBM accesses of Algorithm 1 vs standard attention, per head.

    Left: against N for the chosen (M, d). Right: against M for the chosen (N, d), with the M
    at which Algorithm 1 starts to move less than standard attention. Counts are elements.
    """

    m_elements: int = 116_736  # an H100/H200's 228 KB of shared memory in fp16
    d: int = 64
    n: int = 4096

    def __post_init__(self) -> None:
        _check_positive(m_elements=self.m_elements, d=self.d, n=self.n)

    def state(self) -> dict:
        fa1 = cost.fa1_hbm_total(self.n, self.d, self.m_elements)
        std = cost.standard_attention_hbm_total(self.n, self.d)
        return {"fa1": fa1, "standard": std, "ratio": std / fa1,
                "compulsory": cost.compulsory_hbm_elements(self.n, self.d),
                "four_step": cost.fa1_hbm_four_step(self.n, self.d, self.m_elements),
                "crossover_m": cost.fa1_crossover_m(self.n, self.d),
                "Tc": cost.fa1_grid(self.n, self.d, self.m_elements)["Tc"]}

    def caption(self) -> str:
        s = self.state()
        verdict = (f"{s['ratio']:.1f}x fewer than standard" if s["ratio"] > 1 else
                   f"{1 / s['ratio']:.1f}x MORE than standard")
        cross = ("never" if s["crossover_m"] is None else f"M >= {s['crossover_m']:,}")
        return (f"M = {self.m_elements:,}, d = {self.d}, N = {self.n:,}: Algorithm 1 moves "
                f"{s['fa1']:,} elements (Tc = {s['Tc']}), {verdict} ({s['standard']:,}); "
                f"it wins for {cross} (about 3d^2 = {3 * self.d ** 2:,})")

    def figure(self):
        import matplotlib.pyplot as plt

        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
        ns = np.array(N_CHOICES)
        ax.loglog(ns, [cost.standard_attention_hbm_total(n, self.d) for n in ns], "C3-",
                  label="standard: 4Nd + 4N^2")
        ax.loglog(ns, [cost.fa1_hbm_total(n, self.d, self.m_elements) for n in ns], "C0-",
                  label="Algorithm 1 (exact)")
        ax.loglog(ns, [cost.fa1_hbm_four_step(n, self.d, self.m_elements) for n in ns], "C0:",
                  label="four-step estimate 16N^2 d^2/M")
        ax.loglog(ns, [cost.compulsory_hbm_elements(n, self.d) for n in ns], "k--", lw=1,
                  label="compulsory: 4Nd")
        s = self.state()
        ax.plot([self.n], [s["fa1"]], "C0o")
        ax.plot([self.n], [s["standard"]], "C3o")
        ax.set_xlabel("N")
        ax.set_ylabel("HBM accesses per head (elements)")
        ax.set_title(f"against N (M = {self.m_elements:,}, d = {self.d})", fontsize=9)
        ax.legend(fontsize=7)
        ms = np.unique(np.geomspace(self.d, self.n * self.d, 200).astype(int))
        bx.loglog(ms, [cost.fa1_hbm_total(self.n, self.d, int(m)) for m in ms], "C0-",
                  label="Algorithm 1 (exact)")
        bx.axhline(s["standard"], color="C3", label="standard attention")
        bx.axhline(s["compulsory"], color="k", ls="--", lw=1, label="compulsory 4Nd")
        if s["crossover_m"] is not None:
            bx.axvline(s["crossover_m"], color="C2", ls=":", label=f"crossover M = "
                       f"{s['crossover_m']:,}")
        bx.axvline(self.m_elements, color="C0", lw=0.8, alpha=0.6)
        bx.plot([self.m_elements], [s["fa1"]], "C0o")
        bx.set_xlabel("M, SRAM size in elements (d <= M <= Nd)")
        bx.set_title(f"against M (N = {self.n:,}, d = {self.d}): bigger SRAM, fewer accesses",
                     fontsize=9)
        bx.legend(fontsize=7)
        fig.suptitle(self.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        m, gpu, d = _memory_controls(self.m_elements, self.d, "ft-traffic")
        n = w.SelectionSlider(options=sorted(set(N_CHOICES) | {self.n}), value=self.n,
                              description="N", continuous_update=False)
        n.add_class("ft-traffic-n")

        def redraw(_=None):
            self.m_elements, self.d, self.n = m.value, d.value, n.value
            redraw_into(out, self)

        for control in (m, d, n):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([m, gpu]), w.HBox([d, n]), out])
        box.add_class("ft-traffic-curves")
        return box
