"""Chapter 2's widgets: the tile stepper, the naive-vs-tiled memory bars, the checkpoint picker.

Each is a small state object with ``figure()`` (static matplotlib) and ``widget()`` (live
ipywidgets); both read the same state, so tests set a value and check what changes. A widget that
steps through frames (:class:`TileStepper`) draws the frames that matter side by side in
``figure()``, for a reader of the static page, and one frame, the current one, in
``frame_figure()``, which is what its live widget redraws.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flashtext.online import SoftmaxState
from flashtext.widgets.base import redraw_into

ORDERS = ("query-major", "key-major")


def _positive(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class CurrentFrame:
    """What a stepping widget's live view redraws: one frame (``draw``), where the widget's own
    ``figure()`` shows several for the static page."""

    draw: Callable

    def figure(self):
        return self.draw()


# ------------------------------------------------------------------------------ tile stepper

@dataclass
class TileStepper:
    """Walk an n x n score matrix one block x block tile at a time.

    ``order="query-major"`` visits every key block of query block 0, then of query block 1, ...
    (FlashAttention-2's loop order); ``"key-major"`` is FlashAttention-1's (outer loop over key
    blocks). ``step`` counts from 0; captions count from 1. Edge tiles are smaller when n is not
    a multiple of ``block``. Scores are a seeded random matrix (fixed by ``seed``).
    """

    n: int = 4
    block: int = 2
    step: int = 0
    order: str = "query-major"
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        self.n = _positive("n", self.n)
        self.block = _positive("block", self.block)
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if not 0 <= self.step < self.total_steps:
            raise ValueError(f"step must be in [0, {self.total_steps}), got {self.step}")

    @property
    def blocks_per_side(self) -> int:
        return math.ceil(self.n / self.block)

    @property
    def total_steps(self) -> int:
        return self.blocks_per_side ** 2

    def tile(self, step: int | None = None) -> tuple[int, int]:
        """(query-block i, key-block j) visited at ``step``."""
        k = self.step if step is None else step
        t = self.blocks_per_side
        return divmod(k, t) if self.order == "query-major" else divmod(k, t)[::-1]

    def _span(self, b: int) -> slice:
        return slice(b * self.block, min((b + 1) * self.block, self.n))

    def caption(self) -> str:
        i, j = self.tile()
        return (f"step {self.step + 1} of {self.total_steps} — query-block {i}, key-block {j}")

    def scores(self) -> np.ndarray:
        """The full (never materialised by the algorithm) score matrix, for drawing."""
        rng = np.random.default_rng(self.seed)
        return np.round(rng.standard_normal((self.n, self.n)) * 2, 1)

    def on_chip(self) -> np.ndarray:
        """Boolean n x n mask of the scores that exist at this step: the current tile only."""
        mask = np.zeros((self.n, self.n), dtype=bool)
        i, j = self.tile()
        mask[self._span(i), self._span(j)] = True
        return mask

    def visited(self) -> np.ndarray:
        """Boolean n x n mask of the scores folded into the running (m, l), this step included."""
        mask = np.zeros((self.n, self.n), dtype=bool)
        for k in range(self.step + 1):
            i, j = self.tile(k)
            mask[self._span(i), self._span(j)] = True
        return mask

    def scores_on_chip(self) -> int:
        return int(self.on_chip().sum())

    def running_state(self) -> SoftmaxState:
        """Each row's (m, l) after the tiles visited so far, folded with the library's update."""
        s = self.scores()
        state = SoftmaxState.empty(self.n)
        seen = self.visited()
        for j in range(self.blocks_per_side):
            cols = self._span(j)
            block = np.where(seen[:, cols], s[:, cols], -np.inf)
            state = state.update(block)
        return state

    def key_steps(self, most: int = 6) -> list[int]:
        """The steps a static page shows: all of them when there are few, else the first two,
        the end of the first row of tiles and the start of the next (where the loop turns),
        and the last."""
        t, total = self.blocks_per_side, self.total_steps
        if total <= most:
            return list(range(total))
        return sorted({0, 1, t - 1, t, total - 1})

    def _draw_tiles(self, ax, step: int, numbers: bool) -> None:
        """The n x n matrix at ``step``: the tile on chip orange, folded tiles blue."""
        import matplotlib.pyplot as plt

        here = TileStepper(n=self.n, block=self.block, step=step, order=self.order,
                           seed=self.seed)
        s, chip, seen = here.scores(), here.on_chip(), here.visited()
        shade = np.where(chip, 2, np.where(seen, 1, 0))
        cmap = plt.matplotlib.colors.ListedColormap(["#f2f2f2", "#c9d7ea", "#f0a35e"])
        ax.imshow(shade, cmap=cmap, vmin=0, vmax=2)
        if numbers:
            for r, c in zip(*np.nonzero(chip), strict=True):
                ax.text(c, r, f"{s[r, c]:g}", ha="center", va="center", fontsize=8)
        for b in range(1, self.blocks_per_side):
            ax.axhline(b * self.block - 0.5, color="k", lw=1)
            ax.axvline(b * self.block - 0.5, color="k", lw=1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("keys")
        ax.set_ylabel("queries")

    def _state_lines(self, state: SoftmaxState, title: str) -> str:
        lines = [title, "", "row      m       l"]
        for r in range(min(self.n, 16)):
            m, l = state.m[r], state.l[r]  # noqa: E741
            shown = f"{m:>6.2f} {l:>7.3f}" if np.isfinite(m) else "  -inf       0"
            lines.append(f"{r:>3} {shown}")
        if self.n > 16:
            lines.append("...")
        return "\n".join(lines)

    def frame_figure(self):
        """One frame, the current step: the tile on chip and every row's running (m, l)."""
        import matplotlib.pyplot as plt

        fig, (ax, side) = plt.subplots(1, 2, figsize=(7.5, 4.6),
                                       gridspec_kw={"width_ratios": [3, 1.3]})
        self._draw_tiles(ax, self.step, numbers=self.n <= 16)
        ax.set_title(self.caption(), fontsize=10)
        side.axis("off")
        side.text(0, 1, self._state_lines(self.running_state(), "running (m, l) per row"),
                  va="top", family="monospace", fontsize=8)
        fig.text(0.02, 0.02, f"orange: the {self.scores_on_chip()} scores that exist now "
                 f"(of {self.n * self.n})\nblue: already folded into the running (m, l) and "
                 "discarded; grey: not computed yet", fontsize=8)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        return fig

    def figure(self):
        """The static page's view: the key steps side by side, then the (m, l) of every row
        after the last tile (the whole row's statistics, although no row was ever complete)."""
        import matplotlib.pyplot as plt

        steps = self.key_steps()
        fig, axes = plt.subplots(1, len(steps) + 1, figsize=(2.4 * len(steps) + 2.6, 3.4),
                                 gridspec_kw={"width_ratios": [1] * len(steps) + [1.1]})
        for ax, k in zip(axes, steps, strict=False):
            self._draw_tiles(ax, k, numbers=self.n <= 8)
            i, j = self.tile(k)
            ax.set_title(f"step {k + 1} of {self.total_steps}\nquery-block {i}, key-block {j}",
                         fontsize=8)
        side = axes[-1]
        side.axis("off")
        last = TileStepper(n=self.n, block=self.block, step=self.total_steps - 1,
                           order=self.order, seed=self.seed)
        side.text(0, 1, self._state_lines(last.running_state(), "(m, l) after the last tile"),
                  va="top", family="monospace", fontsize=8)
        fig.suptitle(f"{self.order} order, n = {self.n}, block = {self.block}: orange, the one "
                     f"tile whose scores exist (at most {min(self.block, self.n) ** 2}); blue, "
                     "folded into (m, l) and discarded; grey, not computed yet", fontsize=9)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        step = w.IntSlider(value=self.step + 1, min=1, max=self.total_steps, description="step")
        play = w.Play(value=self.step + 1, min=1, max=self.total_steps, interval=900,
                      description="play")
        w.jslink((play, "value"), (step, "value"))
        n = w.IntSlider(value=self.n, min=2, max=32, description="n")
        block = w.IntSlider(value=self.block, min=1, max=16, description="block")
        order = w.ToggleButtons(options=ORDERS, value=self.order, description="order")
        caption = w.HTML()
        for control, cls in ((step, "ft-tile-step"), (play, "ft-tile-play"), (n, "ft-tile-n"),
                             (block, "ft-tile-block"), (order, "ft-tile-order"),
                             (caption, "ft-tile-caption")):
            control.add_class(cls)

        def resize(_=None):
            self.n, self.block, self.order = n.value, min(block.value, n.value), order.value
            self.step = 0
            for c in (step, play):
                c.max = self.total_steps
                c.value = 1
            redraw()

        def redraw(_=None):
            self.step = min(step.value, self.total_steps) - 1
            caption.value = (f"<b>{self.caption()}</b> — {self.scores_on_chip()} of "
                             f"{self.n * self.n} scores on chip")
            redraw_into(out, CurrentFrame(self.frame_figure))

        step.observe(redraw, names="value")
        for control in (n, block, order):
            control.observe(resize, names="value")
        redraw()
        box = w.VBox([w.HBox([play, step]), w.HBox([n, block]), order, caption, out])
        box.add_class("ft-tile-stepper")
        return box


# ------------------------------------------------------------------------------ memory bars

@dataclass
class MemoryBars:
    """Peak scores held at once: naive attention holds the whole n x n matrix, tiled attention
    one block x block tile (a tile cannot be larger than the matrix)."""

    n: int = 16
    block: int = 2
    n_max: int = 128

    def naive_peak(self, n: int | None = None) -> int:
        n = self.n if n is None else n
        return n * n

    def tiled_peak(self, n: int | None = None) -> int:
        n = self.n if n is None else n
        return min(self.block, n) ** 2

    def caption(self) -> str:
        return (f"at n = {self.n}: naive peak memory grows to {self.naive_peak()} scores; tiled "
                f"peak memory stays at {self.tiled_peak()}, no matter how large n gets")

    def figure(self):
        import matplotlib.pyplot as plt

        _positive("n", self.n)
        _positive("block", self.block)
        fig, (bars, curve) = plt.subplots(1, 2, figsize=(9, 3.3),
                                          gridspec_kw={"width_ratios": [1, 1.4]})
        values = [self.naive_peak(), self.tiled_peak()]
        bars.bar(["naive:\nfull n×n matrix", "tiled:\none block×block tile"], values,
                 color=["#c44e52", "#4c72b0"])
        for x, v in enumerate(values):
            bars.text(x, v, f"{v:,}", ha="center", va="bottom", fontsize=10)
        bars.set_ylim(0, max(values) * 1.18)
        bars.set_ylabel("scores held at once")
        ns = np.arange(1, max(self.n_max, self.n) + 1)
        curve.plot(ns, ns**2, color="#c44e52", label="naive: n²")
        curve.plot(ns, [self.tiled_peak(int(k)) for k in ns], color="#4c72b0",
                   label=f"tiled: block² (block = {self.block})")
        curve.plot([self.n, self.n], [self.tiled_peak(), self.naive_peak()], "k:", lw=1)
        curve.scatter([self.n, self.n], values, color=["#c44e52", "#4c72b0"], zorder=3)
        curve.set_yscale("log")
        curve.set_xlabel("sequence length n")
        curve.set_ylabel("peak scores (log scale)")
        curve.legend(fontsize=8, loc="upper left")
        fig.suptitle(self.caption(), fontsize=9)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        n = w.IntSlider(value=self.n, min=1, max=self.n_max, description="n")
        block = w.IntSlider(value=self.block, min=1, max=16, description="block")
        caption = w.HTML()
        n.add_class("ft-bars-n")
        block.add_class("ft-bars-block")
        caption.add_class("ft-bars-caption")

        def redraw(_=None):
            self.n, self.block = n.value, block.value
            caption.value = self.caption()
            redraw_into(out, self)

        n.observe(redraw, names="value")
        block.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([n, block]), caption, out])
        box.add_class("ft-memory-bars")
        return box


# ------------------------------------------------------------------------------ checkpoint

@dataclass(frozen=True)
class Verdict:
    correct: bool
    message: str


@dataclass
class CheckpointPicker:
    """"Find the smallest sequence length, among the candidates, where naive peak memory first
    reaches at least ``factor`` x tiled peak memory." The reader picks; :meth:`judge` answers."""

    candidates: tuple[int, ...] = (16, 32, 48, 63, 64, 100, 128, 256)
    block: int = 2
    factor: float = 1000.0
    choice: int | None = None

    def __post_init__(self) -> None:
        self.set_candidates(self.candidates)

    def set_candidates(self, candidates) -> None:
        cands = tuple(sorted({_positive("candidates", int(c)) for c in candidates}))
        if not cands:
            raise ValueError("candidates must contain at least one sequence length")
        self.candidates = cands
        if self.choice is not None and self.choice not in cands:
            self.choice = None

    def question(self) -> str:
        return (f"Find the smallest sequence length, among the candidates, where naive peak "
                f"memory first reaches at least {self.factor:g}x tiled peak memory "
                f"(block = {self.block}).")

    def ratio(self, n: int) -> float:
        bars = MemoryBars(n=n, block=self.block)
        return bars.naive_peak() / bars.tiled_peak()

    def answer(self) -> int | None:
        """The right candidate, or None when no candidate reaches the factor."""
        return next((n for n in self.candidates if self.ratio(n) >= self.factor), None)

    def judge(self, n: int) -> Verdict:
        if n not in self.candidates:
            raise ValueError(f"{n} is not among the candidates {self.candidates}")
        r, best = self.ratio(n), self.answer()
        tile = min(self.block, n) ** 2
        facts = f"at n = {n}, naive holds {n * n:,} scores, {r:,.4g}x the tile's {tile}"
        if n == best:
            return Verdict(True, f"Right: {facts}, and every smaller candidate is below "
                           f"{self.factor:g}x.")
        if r < self.factor:
            return Verdict(False, f"Not yet: {facts}, below {self.factor:g}x.")
        return Verdict(False, f"{facts}: it reaches {self.factor:g}x, but a smaller candidate "
                       "already does.")

    def figure(self):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 2.1))
        ax.axis("off")
        ax.set_xlim(0, len(self.candidates))
        ax.set_ylim(0, 1)
        verdict = self.judge(self.choice) if self.choice is not None else None
        for x, n in enumerate(self.candidates):
            color = "#eeeeee"
            if n == self.choice:
                color = "#8fd19e" if verdict.correct else "#f4a3a3"
            ax.add_patch(plt.Rectangle((x + 0.08, 0.35), 0.84, 0.4, color=color, ec="k"))
            ax.text(x + 0.5, 0.55, f"n = {n}", ha="center", va="center", fontsize=10)
        text = verdict.message if verdict else "Pick a sequence length to try it."
        ax.text(0, 0.12, text, fontsize=9, va="center")
        ax.set_title(textwrap.fill(self.question(), 95), fontsize=9)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        picks = w.ToggleButtons(options=[str(n) for n in self.candidates], value=None,
                                description="n =")
        block = w.IntSlider(value=self.block, min=1, max=16, description="block")
        cands = w.Text(value=", ".join(map(str, self.candidates)), description="candidates")
        feedback = w.HTML("Pick a sequence length to try it.")
        title = w.HTML(f"<b>{self.question()}</b>")
        for control, cls in ((picks, "ft-checkpoint-pick"), (block, "ft-checkpoint-block"),
                             (cands, "ft-checkpoint-candidates"),
                             (feedback, "ft-checkpoint-feedback")):
            control.add_class(cls)

        def on_pick(change):
            if change["new"] is None:
                return
            self.choice = int(change["new"])
            v = self.judge(self.choice)
            color = "#1a7f37" if v.correct else "#b42318"
            feedback.value = f"<b style='color:{color}'>{v.message}</b>"

        def on_setup(_=None):
            try:
                self.set_candidates(int(t) for t in cands.value.replace(",", " ").split())
            except ValueError as exc:
                feedback.value = f"<i>{exc}</i>"
                return
            self.block, self.choice = block.value, None
            picks.value = None
            picks.options = [str(n) for n in self.candidates]
            title.value = f"<b>{self.question()}</b>"
            feedback.value = "Pick a sequence length to try it."

        picks.observe(on_pick, names="value")
        block.observe(on_setup, names="value")
        cands.observe(on_setup, names="value")
        box = w.VBox([title, picks, feedback,
                      w.HBox([block, cands])])
        box.add_class("ft-checkpoint")
        return box


# ------------------------------------------------------------------------------ merge tree

Tree = int | tuple  # a leaf (block index) or a pair of subtrees

SHAPES = ("left fold", "balanced", "random")


def _balanced(leaves: list[int]) -> Tree:
    if len(leaves) == 1:
        return leaves[0]
    half = (len(leaves) + 1) // 2
    return (_balanced(leaves[:half]), _balanced(leaves[half:]))


def _random_tree(leaves: list[int], rng: np.random.Generator) -> Tree:
    if len(leaves) == 1:
        return leaves[0]
    cut = int(rng.integers(1, len(leaves)))
    return (_random_tree(leaves[:cut], rng), _random_tree(leaves[cut:], rng))


def tree_leaves(tree: Tree) -> list[int]:
    return [tree] if isinstance(tree, int) else tree_leaves(tree[0]) + tree_leaves(tree[1])


def tree_depth(tree: Tree) -> int:
    return 0 if isinstance(tree, int) else 1 + max(tree_depth(tree[0]), tree_depth(tree[1]))


@dataclass
class MergeTree:
    """One row of ``n`` scores cut into ``blocks`` blocks, each reduced to its own (m, l), then
    merged along a tree: a left fold (the sequential loop of chapter 2), a balanced tree (a
    parallel reduction), or a random tree over shuffled blocks. Every shape gives the row's
    exact statistics."""

    n: int = 12
    blocks: int = 4
    shape: str = "balanced"
    seed: int = 0

    def validate(self) -> None:
        self.n = _positive("n", self.n)
        self.blocks = _positive("blocks", self.blocks)
        if self.blocks > self.n:
            raise ValueError(f"blocks must be <= n={self.n}, got {self.blocks}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, got {self.shape!r}")

    def row(self) -> np.ndarray:
        return np.round(np.random.default_rng(self.seed).standard_normal(self.n) * 3, 1)

    def pieces(self) -> list[np.ndarray]:
        return np.array_split(self.row(), self.blocks)

    def tree(self) -> Tree:
        self.validate()
        leaves = list(range(self.blocks))
        if self.shape == "left fold":
            tree: Tree = 0
            for leaf in leaves[1:]:
                tree = (tree, leaf)
            return tree
        if self.shape == "balanced":
            return _balanced(leaves)
        rng = np.random.default_rng(self.seed + 1)
        return _random_tree([int(i) for i in rng.permutation(leaves)], rng)

    def evaluate(self, tree: Tree | None = None) -> SoftmaxState:
        """Merge the blocks' local states along ``tree`` (default: this widget's tree)."""
        from flashtext.online import merge

        tree = self.tree() if tree is None else tree
        if isinstance(tree, int):
            return SoftmaxState.from_block(self.pieces()[tree])
        return merge(self.evaluate(tree[0]), self.evaluate(tree[1]))

    def caption(self) -> str:
        t = self.tree()
        return (f"{self.shape}: {self.blocks} blocks, {self.blocks - 1} merges, depth "
                f"{tree_depth(t)}; root log-sum-exp {float(self.evaluate(t).lse()):.12g}")

    def _draw_tree(self, ax, shape: str, width: int | None = None) -> None:
        """The blocks' own (m, l) at the bottom, merged up the ``shape`` tree to its root."""
        from flashtext.reference import logsumexp

        view = MergeTree(n=self.n, blocks=self.blocks, shape=shape, seed=self.seed)
        tree, pieces = view.tree(), view.pieces()
        starts = np.cumsum([0] + [len(p) for p in pieces])
        order = {leaf: i for i, leaf in enumerate(tree_leaves(tree))}
        height = tree_depth(tree)

        def draw(node: Tree) -> tuple[float, float]:
            st = view.evaluate(node)
            label = f"m={float(st.m):.1f}\nℓ={float(st.l):.3f}"
            if isinstance(node, int):
                x, y = float(order[node]), 0.0
                label = f"x[{starts[node]}:{starts[node + 1]}]\n" + label
                color = "#c9d7ea"
            else:
                (x1, y1), (x2, y2) = draw(node[0]), draw(node[1])
                x, y = (x1 + x2) / 2, float(tree_depth(node))
                ax.plot([x1, x], [y1, y], "k-", lw=1, zorder=1)
                ax.plot([x2, x], [y2, y], "k-", lw=1, zorder=1)
                color = "#f0a35e" if node == tree else "#f6d7b0"
            ax.text(x, y, label, ha="center", va="center", fontsize=8, zorder=2,
                    bbox={"boxstyle": "round", "fc": color, "ec": "k", "lw": 0.6})
            return x, y

        draw(tree)
        ax.set_xlim(-0.7, self.blocks - 0.3)
        ax.set_ylim(-0.7, max(height, 1) + 0.7)
        ax.axis("off")
        exact = logsumexp(view.row())
        title = textwrap.fill(view.caption(), width) if width else view.caption()
        ax.set_title(title + f"\n(reference, whole row at once: {exact:.12g})", fontsize=9)

    def frame_figure(self):
        """This widget's tree (``shape``): what the live widget redraws."""
        import matplotlib.pyplot as plt

        height = tree_depth(self.tree())
        fig, ax = plt.subplots(figsize=(max(6.5, 1.9 * self.blocks), 1.3 + 1.0 * height))
        self._draw_tree(ax, self.shape)
        fig.tight_layout()
        return fig

    def figure(self):
        """The static page's view: the same blocks merged along each tree shape, side by side;
        every root carries the same statistics."""
        import matplotlib.pyplot as plt

        depth = max(tree_depth(MergeTree(n=self.n, blocks=self.blocks, shape=shape,
                                         seed=self.seed).tree()) for shape in SHAPES)
        fig, axes = plt.subplots(1, len(SHAPES), figsize=(max(6.5, 1.5 * self.blocks) * 1.6,
                                                          1.6 + 0.9 * depth))
        for ax, shape in zip(axes, SHAPES, strict=True):
            self._draw_tree(ax, shape, width=48)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        blocks = w.IntSlider(value=self.blocks, min=1, max=8, description="blocks")
        shape = w.ToggleButtons(options=SHAPES, value=self.shape, description="tree")
        seed = w.IntSlider(value=self.seed, min=0, max=20, description="seed")
        for control, cls in ((blocks, "ft-tree-blocks"), (shape, "ft-tree-shape"),
                             (seed, "ft-tree-seed")):
            control.add_class(cls)

        def redraw(_=None):
            self.blocks, self.shape, self.seed = blocks.value, shape.value, seed.value
            redraw_into(out, CurrentFrame(self.frame_figure))

        for control in (blocks, shape, seed):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([blocks, seed]), shape, out])
        box.add_class("ft-merge-tree")
        return box


# ------------------------------------------------------------------------------ multiple choice

@dataclass
class MultipleChoice:
    """A checkpoint question with options; ``options`` maps a label to (correct, explanation)."""

    question: str
    options: dict[str, tuple[bool, str]]
    choice: str | None = None

    def __post_init__(self) -> None:
        if not self.options or not any(ok for ok, _ in self.options.values()):
            raise ValueError("options must be non-empty and contain a correct answer")

    def answers(self) -> list[str]:
        return [label for label, (ok, _) in self.options.items() if ok]

    def judge(self, label: str) -> Verdict:
        if label not in self.options:
            raise ValueError(f"{label!r} is not one of the options {list(self.options)}")
        ok, why = self.options[label]
        return Verdict(ok, ("Right: " if ok else "Not quite: ") + why)

    def figure(self):
        import matplotlib.pyplot as plt

        lines = [textwrap.fill(self.question, 100), ""]
        for label in self.options:
            mark = "(x)" if label == self.choice else "( )"
            lines.append(f"{mark} {label}")
        if self.choice is not None:
            lines += ["", textwrap.fill(self.judge(self.choice).message, 100)]
        else:
            lines += ["", "Pick an answer to check it."]
        text = "\n".join(lines)
        fig, ax = plt.subplots(figsize=(8, 0.3 + 0.19 * (text.count("\n") + 1)))
        ax.axis("off")
        ax.text(0, 1, text, va="top", fontsize=9)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        picks = w.RadioButtons(options=list(self.options), value=None,
                               layout=w.Layout(width="auto"))
        feedback = w.HTML("Pick an answer to check it.")
        picks.add_class("ft-choice-options")
        feedback.add_class("ft-choice-feedback")

        def on_pick(change):
            if change["new"] is None:
                return
            self.choice = change["new"]
            v = self.judge(self.choice)
            color = "#1a7f37" if v.correct else "#b42318"
            feedback.value = f"<b style='color:{color}'>{v.message}</b>"

        picks.observe(on_pick, names="value")
        box = w.VBox([w.HTML(f"<b>{self.question}</b>"), picks, feedback])
        box.add_class("ft-choice")
        return box
