"""Chapter 13's Play widget: GEMM and softmax timelines of one SM under FA3's schedules.

Four panels (naive, ping-pong, intra-warpgroup pipelining, both) from
:func:`flashtext.hopper.simulate`, with the tensor-core utilisation each reaches and the
TFLOP/s it implies. Controls: head dimension, how much dearer the softmax is than its
exponentials alone, the matmul rate, and an optional producer (TMA) load per K/V block with the
depth of the shared-memory ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashtext import hopper

COLORS = {"GEMM0": "#4c72b0", "GEMM1": "#55a868", "softmax": "#dd8452", "load K": "#a6a6a6",
          "load V": "#595959"}
LABELS = {"GEMM0": "GEMM0: S = Q K^T", "GEMM1": "GEMM1: O += P V", "softmax": "softmax (exp)",
          "load K": "TMA: load K_j", "load V": "TMA: load V_j"}
TITLES = {"naive": "naive (two warpgroups in step)", "pingpong": "ping-pong (2 warpgroups)",
          "pipelined": "intra-warpgroup 2-stage pipeline (in step)",
          "pingpong+pipelined": "ping-pong + pipeline (FA3)"}


@dataclass
class ScheduleTimeline:
    """State: the model's knobs. ``load`` is the producer's time per K/V block as a multiple of
    one GEMM (0 = not drawn); ``stages`` is the depth of the shared-memory ring."""

    d: int = 128
    softmax_cost: float = 1.0
    matmul_tflops: float = 989.0
    n_iters: int = 5
    load: float = 0.0
    stages: int = 2
    schedules: tuple[str, ...] = field(default=hopper.SCHEDULES)

    def times(self) -> hopper.TileTimes:
        return hopper.tile_times(self.d, matmul_flops=self.matmul_tflops * hopper.TERA,
                                 softmax_cost=self.softmax_cost)

    def timelines(self) -> dict[str, hopper.Timeline]:
        t = self.times()
        return {s: hopper.simulate(s, t.gemm, t.softmax, self.n_iters, load=self.load * t.gemm,
                                   stages=self.stages) for s in self.schedules}

    def utilisations(self) -> dict[str, float]:
        """Steady-state tensor-core utilisation of each schedule at the current settings."""
        t = self.times()
        return {s: hopper.steady_utilisation(s, t.gemm, t.softmax, load=self.load * t.gemm,
                                             stages=self.stages) for s in self.schedules}

    def tflops(self) -> dict[str, float]:
        return {s: u * self.matmul_tflops for s, u in self.utilisations().items()}

    def caption(self) -> str:
        t = self.times()
        ratio = t.softmax / (2 * t.gemm)
        return (f"d={self.d}: softmax takes {ratio:.0%} of the two GEMMs' time "
                f"(exp x{self.softmax_cost:g}, matmul {self.matmul_tflops:g} TFLOP/s)")

    def figure(self):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch

        lines = self.timelines()
        util = self.utilisations()
        heights = [len(t.lanes) + 1 for t in lines.values()]
        fig, axes = plt.subplots(len(lines), 1, figsize=(9, 1.0 + 0.62 * sum(heights)),
                                 sharex=True, gridspec_kw={"height_ratios": heights})
        axes = [axes] if len(lines) == 1 else list(axes)
        scale = 1e6  # seconds -> microseconds
        span = max(t.makespan for t in lines.values()) * scale
        for ax, (name, t) in zip(axes, lines.items(), strict=True):
            rows = t.lanes + ["tensor cores"]
            for op in t.ops:
                # GEMMs (and K loads) on the upper half of a lane, softmax (and V loads) on the
                # lower half: in a pipelined warpgroup they overlap in time
                upper = op.unit == "tensor" or op.kind == "load K"
                y = rows.index(op.lane) + (-0.19 if upper else 0.19)
                ax.barh(y, (op.end - op.start) * scale, left=op.start * scale, height=0.38,
                        color=COLORS[op.kind], edgecolor="white", linewidth=0.5)
                if (op.end - op.start) * scale > 0.02 * span:  # the block index, if it fits
                    ax.text((op.start + op.end) / 2 * scale, y, str(op.iteration), fontsize=5.5,
                            ha="center", va="center", color="white")
                if op.unit == "tensor":
                    ax.barh(len(rows) - 1, (op.end - op.start) * scale, left=op.start * scale,
                            height=0.45, color="#333333")
            ax.set_yticks(range(len(rows)), rows, fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{TITLES[name]}: tensor cores busy {util[name]:.0%} in steady state "
                         f"-> {util[name] * self.matmul_tflops:.0f} TFLOP/s", fontsize=9,
                         loc="left")
            ax.grid(axis="x", alpha=0.3)
        axes[-1].set_xlabel("time on one SM (microseconds)")
        kinds = [k for k in COLORS if not k.startswith("load") or self.load > 0]
        fig.legend(handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in kinds],
                   loc="upper center", ncol=len(kinds), fontsize=8, frameon=False)
        fig.suptitle(self.caption(), fontsize=9, y=0.995 - 0.35 / fig.get_size_inches()[1])
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_size_inches()[1]))
        return fig

    def widget(self):
        import ipywidgets as w
        import matplotlib.pyplot as plt
        from IPython.display import display

        out = w.Output()
        style = {"description_width": "150px"}
        d = w.Dropdown(options=[64, 128, 256], value=self.d, description="head dim d",
                       style=style)
        cost = w.FloatSlider(value=self.softmax_cost, min=1.0, max=3.0, step=0.1,
                             description="softmax cost x exp", style=style)
        rate = w.FloatSlider(value=self.matmul_tflops, min=300.0, max=989.0, step=1.0,
                             description="matmul TFLOP/s", style=style)
        iters = w.IntSlider(value=self.n_iters, min=2, max=10, description="K/V blocks",
                            style=style)
        load = w.FloatSlider(value=self.load, min=0.0, max=3.0, step=0.25,
                             description="TMA load x GEMM", style=style)
        stages = w.IntSlider(value=self.stages, min=1, max=4, description="smem stages",
                             style=style)
        controls = (d, cost, rate, iters, load, stages)
        names = ("d", "cost", "rate", "iters", "load", "stages")
        for control, name in zip(controls, names, strict=True):
            control.add_class(f"ft-schedule-{name}")

        def redraw(_=None):
            self.d, self.softmax_cost, self.matmul_tflops = d.value, cost.value, rate.value
            self.n_iters, self.load, self.stages = iters.value, load.value, stages.value
            with out:
                out.clear_output(wait=True)
                fig = self.figure()
                display(fig)
                plt.close(fig)

        for control in controls:
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([d, cost]), w.HBox([rate, iters]), w.HBox([load, stages]), out])
        box.add_class("ft-schedule-timeline")
        return box
