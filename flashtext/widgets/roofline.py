"""Chapter 1's interactive roofline: choose a GPU, N and d; see where attention's steps land."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flashtext.hardware import GPUS, ridge_points
from flashtext.plots import STEP_COLORS
from flashtext.roofline import fused_attention_step, standard_attention_steps

N_CHOICES = tuple(2**k for k in range(8, 18))  # 256 ... 131072
D_CHOICES = (32, 64, 128, 256)


def measured_points(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Recorded (or live) measurements as roofline points: FLOPs per byte and FLOP/s achieved.

    Matmuls at their minimum traffic (each operand read once, the result written once); the
    exp kernel at one op per element; each naive-attention kernel at the intensity of its step
    (:func:`flashtext.roofline.standard_attention_steps`), achieved = step FLOPs / time.
    """
    pts = []
    for r in data.get("matmul", []):
        kind = r["dtype"] + (" tf32" if r.get("tf32") else "")
        pts.append({"label": f"matmul {kind} n={r['n']}", "kind": "matmul",
                    "intensity": r["intensity"], "flops": r["flops"]})
    if "exp" in data:
        e = data["exp"]
        pts.append({"label": f"exp ({e['dtype']})", "kind": "exp", "intensity": e["intensity"],
                    "flops": e["flops"]})
    for r in data.get("attention", []):
        steps = standard_attention_steps(r["batch"], r["heads"], r["N"], r["d"])
        for s in steps:
            pts.append({"label": f"{s.name} N={r['N']} d={r['d']}", "kind": s.name,
                        "intensity": s.intensity, "flops": s.flops / (r[s.name] * 1e-3)})
    return pts


@dataclass
class RooflineExplorer:
    """The roofline of one GPU with the three steps of standard attention (and the ideal fused
    kernel) for one (N, d), fp16. ``measured`` (points from :func:`measured_points`) is drawn
    when ``measured_gpu`` names the GPU on screen."""

    gpu: str = "H200"
    n: int = 4096
    d: int = 64
    batch: int = 1
    heads: int = 16
    measured: list[dict[str, Any]] = field(default_factory=list)
    measured_gpu: str | None = None

    def validate(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {self.gpu!r}")
        for name in ("n", "d", "batch", "heads"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def steps(self):
        self.validate()
        return [*standard_attention_steps(self.batch, self.heads, self.n, self.d),
                fused_attention_step(self.batch, self.heads, self.n, self.d)]

    def caption(self) -> str:
        steps = self.steps()
        g = GPUS[self.gpu]
        parts = [f"{s.name}: {s.intensity:.3g} FLOP/B, {s.bound(g)}-bound"
                 for s in steps]
        return (f"{g.name}, N={self.n}, d={self.d}, fp16 — ridge {g.ridge_point():.0f} FLOP/B; "
                + "; ".join(parts))

    def figure(self):
        import textwrap

        import matplotlib.pyplot as plt

        g = GPUS[self.gpu]
        steps = self.steps()
        x = np.logspace(-2, 4.5, 400)
        fig, ax = plt.subplots(figsize=(8.5, 5))
        ax.loglog(x, np.minimum(g.matmul_flops, g.hbm_bandwidth * x) / 1e12, "k-", lw=2,
                  label=f"roof: tensor-core matmul {g.matmul_flops / 1e12:.0f} TFLOP/s")
        ax.loglog(x, np.minimum(g.fp32_flops, g.hbm_bandwidth * x) / 1e12, "k--", lw=1,
                  label=f"roof: non-matmul fp32 {g.fp32_flops / 1e12:.1f} TFLOP/s")
        ridge = ridge_points(g)
        ax.axvline(ridge["matmul"], color="grey", ls=":", lw=1)
        ax.text(ridge["matmul"] * 1.08, g.matmul_flops / 1e12 * 1.15,
                f"ridge {ridge['matmul']:.0f} FLOP/B", fontsize=8, va="bottom", color="grey")
        ax.text(0.012, g.hbm_bandwidth * 0.012 / 1e12 * 1.6,
                f"slope: HBM {g.hbm_bandwidth / 1e12:.2f} TB/s", rotation=35, fontsize=8)
        for s, size in zip(steps, (13, 10, 7, 10), strict=True):  # S and O coincide: nest them
            ax.plot(s.intensity, s.attainable(g) / 1e12, "o", ms=size, color=STEP_COLORS[s.name],
                    mec="k", label=f"{s.name}: {s.intensity:.3g} FLOP/B ({s.bound(g)}-bound)",
                    zorder=4)
        if self.measured and self.measured_gpu == self.gpu:
            for kind, marker in (("matmul", "x"), ("exp", "+")):
                pts = [p for p in self.measured if p["kind"] == kind]
                if pts:
                    ax.plot([p["intensity"] for p in pts], [p["flops"] / 1e12 for p in pts],
                            marker, color="#333333", ms=7, ls="none",
                            label=f"measured: {kind}")
            for name, color in STEP_COLORS.items():
                pts = [p for p in self.measured if p["kind"] == name]
                if pts:
                    ax.plot([p["intensity"] for p in pts], [p["flops"] / 1e12 for p in pts],
                            "^", color=color, ms=6, ls="none", alpha=0.8,
                            label=f"measured: {name} (all N, d)")
        ax.set_xlim(x[0], x[-1])
        ax.set_ylim(0.01, g.matmul_flops / 1e12 * 3)
        ax.set_xlabel("arithmetic intensity, FLOPs per byte of HBM traffic (log)")
        ax.set_ylabel("attainable TFLOP/s (log)")
        ax.set_title(textwrap.fill(f"{g.name}: standard attention, N={self.n}, d={self.d}, fp16",
                                   90), fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        from flashtext.widgets.base import redraw_into

        out = w.Output()
        gpu = w.Dropdown(options=list(GPUS), value=self.gpu, description="GPU")
        n = w.SelectionSlider(options=sorted({*N_CHOICES, self.n}), value=self.n, description="N")
        d = w.Dropdown(options=sorted({*D_CHOICES, self.d}), value=self.d, description="d")
        caption = w.HTML()
        for control, cls in ((gpu, "ft-roofline-gpu"), (n, "ft-roofline-n"),
                             (d, "ft-roofline-d"), (caption, "ft-roofline-caption")):
            control.add_class(cls)

        def redraw(_=None):
            self.gpu, self.n, self.d = gpu.value, n.value, d.value
            caption.value = f"<small>{self.caption()}</small>"
            redraw_into(out, self)

        for control in (gpu, n, d):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([gpu, n, d]), caption, out])
        box.add_class("ft-roofline")
        return box
