"""Widgets for Part IV (chapters 9-11): what one Triton program touches.

* :class:`MatmulProgram` (chapter 9): the tiled matmul kernel's program (pid_m, pid_n) at step
  ``step`` of its K loop: which tile of A and of B it loads, which tile of C it will write, and
  which lanes of those tiles fall outside the matrices (masked).
* :class:`KernelSchedule` (chapters 10-11): every tile of the attention score matrix as the
  forward / dQ kernel (one program per query block, a row of tiles) or the dK/dV kernel (one
  program per key block, a column) schedules it: without a mask, with a mask, or never loaded,
  from :mod:`flashtext.kernels.plan` (the kernels' own loop bounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashtext.kernels import plan
from flashtext.reference import causal_mask

STAGE_COLORS = {plan.NOT_VISITED: "#e6e6e6", plan.MASKED_STAGE: "#f0a35e",
                plan.UNMASKED_STAGE: "#4c72b0"}
STAGE_LABELS = {plan.NOT_VISITED: "never loaded", plan.MASKED_STAGE: "masked stage",
                plan.UNMASKED_STAGE: "no-mask stage"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _redraw_box(obj, controls: dict, layout, css: str):
    """Wire ipywidgets controls to ``obj``'s attributes and redraw its figure on change."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    out = w.Output()

    def redraw(_=None):
        for name, control in controls.items():
            setattr(obj, name, control.value)
        obj.clamp()
        for name, control in controls.items():  # clamping may have moved a value
            if control.value != getattr(obj, name):
                control.value = getattr(obj, name)
        with out:
            out.clear_output(wait=True)
            fig = obj.figure()
            display(fig)
            plt.close(fig)

    for name, control in controls.items():
        control.observe(redraw, names="value")
        control.add_class(f"{css}-{name.lower().replace('_', '-')}")
    redraw()
    box = w.VBox([*layout, out])
    box.add_class(css)
    return box


@dataclass
class MatmulProgram:
    """State: matrix sizes, tile sizes, the program (pid_m, pid_n) and the K-loop step."""

    M: int = 100  # noqa: N815 (the kernel's names)
    N: int = 72  # noqa: N815
    K: int = 90  # noqa: N815
    BLOCK_M: int = 32  # noqa: N815
    BLOCK_N: int = 32  # noqa: N815
    BLOCK_K: int = 32  # noqa: N815
    pid_m: int = 3
    pid_n: int = 1
    step: int = 2

    @property
    def grid(self) -> tuple[int, int]:
        return _cdiv(self.M, self.BLOCK_M), _cdiv(self.N, self.BLOCK_N)

    @property
    def steps(self) -> int:
        return _cdiv(self.K, self.BLOCK_K)

    def clamp(self) -> None:
        """Keep the program and the step inside the grid after a size changes."""
        gm, gn = self.grid
        self.pid_m = min(max(self.pid_m, 0), gm - 1)
        self.pid_n = min(max(self.pid_n, 0), gn - 1)
        self.step = min(max(self.step, 0), self.steps - 1)

    def tiles(self) -> dict[str, tuple[int, int, int, int]]:
        """(row0, col0, rows, cols) of the A, B and C tiles this program touches at ``step``,
        including the lanes past the edge (which the masks switch off)."""
        r0, c0, k0 = self.pid_m * self.BLOCK_M, self.pid_n * self.BLOCK_N, self.step * self.BLOCK_K
        return {"A": (r0, k0, self.BLOCK_M, self.BLOCK_K),
                "B": (k0, c0, self.BLOCK_K, self.BLOCK_N),
                "C": (r0, c0, self.BLOCK_M, self.BLOCK_N)}

    def masked_lanes(self) -> dict[str, int]:
        """How many lanes of each tile fall outside the matrix (loaded as 0 / not stored)."""
        shapes = {"A": (self.M, self.K), "B": (self.K, self.N), "C": (self.M, self.N)}
        out = {}
        for name, (r0, c0, h, w) in self.tiles().items():
            rows, cols = shapes[name]
            inside = max(0, min(h, rows - r0)) * max(0, min(w, cols - c0))
            out[name] = h * w - inside
        return out

    def reads(self) -> int:
        """Elements all programs read from A and B: each program reads a BLOCK_M-row strip of A
        and a BLOCK_N-column strip of B, so A is read once per column of programs."""
        gm, gn = self.grid
        return self.M * self.K * gn + self.K * self.N * gm

    def caption(self) -> str:
        gm, gn = self.grid
        lanes = self.masked_lanes()
        return (f"program (pid_m={self.pid_m}, pid_n={self.pid_n}) of a {gm} x {gn} grid, "
                f"K step {self.step + 1} of {self.steps}; masked lanes: A {lanes['A']}, "
                f"B {lanes['B']}, C {lanes['C']}\n"
                f"all programs read {self.reads():,} elements of A and B "
                f"({self.reads() / (self.M * self.K + self.K * self.N):.1f}x their size)")

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        shapes = {"A": (self.M, self.K), "B": (self.K, self.N), "C": (self.M, self.N)}
        blocks = {"A": (self.BLOCK_M, self.BLOCK_K), "B": (self.BLOCK_K, self.BLOCK_N),
                  "C": (self.BLOCK_M, self.BLOCK_N)}
        fig, axes = plt.subplots(1, 3, figsize=(10, 3.8),
                                 gridspec_kw={"width_ratios": [self.K, self.N, self.N]})
        colors = {"A": "#4c72b0", "B": "#55a868", "C": "#c44e52"}
        for ax, name in zip(axes, ("A", "B", "C"), strict=True):
            rows, cols = shapes[name]
            bh, bw = blocks[name]
            ax.add_patch(Rectangle((0, 0), cols, rows, facecolor="#f4f4f4", edgecolor="k"))
            for x in range(0, cols, bw):
                ax.axvline(x, color="0.8", lw=0.6)
            for y in range(0, rows, bh):
                ax.axhline(y, color="0.8", lw=0.6)
            r0, c0, h, w = self.tiles()[name]
            ax.add_patch(Rectangle((c0, r0), w, h, facecolor=colors[name], alpha=0.75))
            # lanes outside the matrix, hatched: masked loads read 0, masked stores are dropped
            for x, y, ww, hh in ((cols, r0, c0 + w - cols, h), (c0, rows, w, r0 + h - rows)):
                if ww > 0 and hh > 0:
                    ax.add_patch(Rectangle((x, y), ww, hh, facecolor="white", hatch="///",
                                           edgecolor=colors[name], lw=0.5))
            ax.add_patch(Rectangle((0, 0), cols, rows, fill=False, edgecolor="k", lw=1.5))
            ax.set_xlim(-1, max(cols, c0 + w) + 1)
            ax.set_ylim(max(rows, r0 + h) + 1, -1)
            ax.set_aspect("equal")
            ax.set_title(f"{name} ({rows} x {cols})", fontsize=9)
            ax.tick_params(labelsize=7)
        axes[0].set_xlabel("k")
        axes[1].set_xlabel("n")
        axes[2].set_xlabel("n")
        axes[0].set_ylabel("m")
        fig.suptitle(self.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        s = {"description_width": "60px"}
        sizes = {name: w.IntSlider(value=getattr(self, name), min=1, max=200,
                                   description=name, style=s) for name in ("M", "N", "K")}
        blocks = {name: w.Dropdown(options=[16, 32, 64], value=getattr(self, name),
                                   description=name, style=s)
                  for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
        picks = {name: w.IntSlider(value=getattr(self, name), min=0, max=12, description=name,
                                   style=s) for name in ("pid_m", "pid_n", "step")}
        controls = {**sizes, **blocks, **picks}
        layout = [w.HBox(list(sizes.values())), w.HBox(list(blocks.values())),
                  w.HBox(list(picks.values()))]
        return _redraw_box(self, controls, layout, "ft-matmul-program")


@dataclass
class KernelSchedule:
    """State: lengths, tile sizes, causal, which kernel, and the highlighted program."""

    n_q: int = 200
    n_k: int = 300
    BLOCK_M: int = 64  # noqa: N815
    BLOCK_N: int = 32  # noqa: N815
    causal: bool = True
    kernel: str = "forward"  # "forward" (and dQ) or "dkdv"
    program: int = 1

    def clamp(self) -> None:
        count = _cdiv(self.n_q, self.BLOCK_M) if self.kernel == "forward" \
            else _cdiv(self.n_k, self.BLOCK_N)
        self.program = min(max(self.program, 0), count - 1)

    def stages(self) -> np.ndarray:
        if self.kernel not in ("forward", "dkdv"):
            raise ValueError(f"kernel must be 'forward' or 'dkdv', got {self.kernel!r}")
        fn = plan.forward_stages if self.kernel == "forward" else plan.dkdv_stages
        return fn(self.n_q, self.n_k, self.BLOCK_M, self.BLOCK_N, self.causal)

    def caption(self) -> str:
        g = self.stages()
        counts = {k: int((g == k).sum()) for k in STAGE_LABELS}
        if self.kernel == "forward":
            p = plan.forward_program(self.program * self.BLOCK_M, self.n_q, self.n_k,
                                     self.BLOCK_M, self.BLOCK_N, self.causal)
            who = (f"forward/dQ program {self.program} (rows {p.start_m}..): keys [0, {p.mid}) "
                   f"no mask, [{p.mid}, {p.hi}) masked, [{p.hi}, {self.n_k}) never loaded")
        else:
            p = plan.key_program(self.program * self.BLOCK_N, self.n_q, self.n_k, self.BLOCK_M,
                                 self.BLOCK_N, self.causal)
            who = (f"dK/dV program {self.program} (keys {p.start_n}..): rows [0, {p.lo}) "
                   f"skipped, [{p.lo}, {min(p.mid, self.n_q)}) masked, "
                   f"[{min(p.mid, self.n_q)}, {self.n_q}) no mask")
        return (f"{who}\nall programs: {counts[plan.UNMASKED_STAGE]} tiles without a mask, "
                f"{counts[plan.MASKED_STAGE]} masked, {counts[plan.NOT_VISITED]} never loaded")

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle

        g = self.stages()
        ratio = min(1.3, max(0.45, self.n_q / self.n_k))
        fig, ax = plt.subplots(figsize=(6.5, 5.0 * ratio + 1.6))
        for (i, j), stage in np.ndenumerate(g):
            h = min(self.BLOCK_M, self.n_q - i * self.BLOCK_M)
            w = min(self.BLOCK_N, self.n_k - j * self.BLOCK_N)
            ax.add_patch(Rectangle((j * self.BLOCK_N, i * self.BLOCK_M), w, h,
                                   facecolor=STAGE_COLORS[int(stage)], edgecolor="white", lw=1))
        if self.kernel == "forward":
            r0 = self.program * self.BLOCK_M
            ax.add_patch(Rectangle((0, r0), self.n_k, min(self.BLOCK_M, self.n_q - r0),
                                   fill=False, edgecolor="k", lw=2.5))
        else:
            c0 = self.program * self.BLOCK_N
            ax.add_patch(Rectangle((c0, 0), min(self.BLOCK_N, self.n_k - c0), self.n_q,
                                   fill=False, edgecolor="k", lw=2.5))
        if self.causal:
            last = causal_mask(self.n_q, self.n_k).sum(axis=1)
            ax.step(np.r_[last, last[-1]], np.arange(self.n_q + 1), where="post", color="k",
                    lw=1.0)
        ax.set_xlim(0, self.n_k)
        ax.set_ylim(self.n_q, 0)
        ax.set_xlabel("key index j")
        ax.set_ylabel("query index i")
        ax.set_title(self.caption(), fontsize=7.5)
        fig.legend(handles=[Patch(color=STAGE_COLORS[k], label=STAGE_LABELS[k])
                            for k in STAGE_LABELS] +
                   [Patch(facecolor="none", edgecolor="k", lw=2, label="the chosen program")],
                   fontsize=7, loc="lower center", ncol=4)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        return fig

    def widget(self):
        import ipywidgets as w

        s = {"description_width": "70px"}
        controls = {
            "n_q": w.IntSlider(value=self.n_q, min=1, max=512, description="Nq", style=s),
            "n_k": w.IntSlider(value=self.n_k, min=1, max=512, description="Nk", style=s),
            "BLOCK_M": w.Dropdown(options=[16, 32, 64, 128], value=self.BLOCK_M,
                                  description="BLOCK_M", style=s),
            "BLOCK_N": w.Dropdown(options=[16, 32, 64, 128], value=self.BLOCK_N,
                                  description="BLOCK_N", style=s),
            "causal": w.Checkbox(value=self.causal, description="causal", style=s),
            "kernel": w.ToggleButtons(options=["forward", "dkdv"], value=self.kernel,
                                      description="kernel", style=s),
            "program": w.IntSlider(value=self.program, min=0, max=31, description="program",
                                   style=s),
        }
        c = controls
        layout = [w.HBox([c["n_q"], c["n_k"]]), w.HBox([c["BLOCK_M"], c["BLOCK_N"], c["causal"]]),
                  w.HBox([c["kernel"], c["program"]])]
        return _redraw_box(self, controls, layout, "ft-kernel-schedule")


__all__ = ["KernelSchedule", "MatmulProgram"]
