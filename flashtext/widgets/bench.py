"""Chapter 12's Play widget: pick d, causal, dtype and pass; see TFLOP/s against N for every
kernel in a benchmark run (live on a GPU, recorded on a CPU), with the compute roof above."""

from __future__ import annotations

from dataclasses import dataclass, field

from flashtext.bench import report


@dataclass
class BenchExplorer:
    """One panel of :func:`flashtext.bench.report.plot_tflops`, chosen by four controls."""

    results: report.Results
    anchors: report.Results | None = None
    d: int = 128
    causal: bool = False
    dtype: str = "float16"
    mode: str = "fwd"
    choices: dict[str, list] = field(init=False)

    def __post_init__(self) -> None:
        self.choices = {key: self.results.axis(axis) for key, axis in
                        (("d", "d"), ("causal", "causal"), ("dtype", "dtype"), ("mode", "mode"))}
        for key, values in self.choices.items():
            if getattr(self, key) not in values:
                setattr(self, key, values[-1] if key == "d" else values[0])

    def set(self, **state) -> BenchExplorer:
        """Change the state (d=, causal=, dtype=, mode=); refuses values the results lack."""
        for key, value in state.items():
            if key not in self.choices:
                raise ValueError(f"unknown control {key!r}; expected one of {list(self.choices)}")
            if value not in self.choices[key]:
                raise ValueError(f"{key} must be one of {self.choices[key]}, got {value!r}")
            setattr(self, key, value)
        return self

    def series(self) -> dict[str, list[tuple[int, float]]]:
        """(N, TFLOP/s) points per provider for the current state: what the figure draws."""
        out: dict[str, list[tuple[int, float]]] = {}
        for r in self.results.ok(dtype=self.dtype, d=self.d, causal=self.causal,
                                 mode=self.mode):
            out.setdefault(r["provider"], []).append((r["n"], r["tflops"]))
        return {p: sorted(pts) for p, pts in out.items()}

    def roof(self) -> tuple[float, float] | None:
        """The compute roof the figure draws, (low, high) TFLOP/s: the matmul ceiling measured
        in the run for the current dtype (:func:`flashtext.bench.report.roof_band`)."""
        return report.roof_band(self.results, self.dtype)

    def figure(self):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        report.plot_tflops(self.results, dtype=self.dtype, d=self.d, causal=self.causal,
                           mode=self.mode, ax=ax, anchors=self.anchors,
                           roof=self.roof())
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        from flashtext.widgets.base import redraw_into

        out = w.Output()
        d = w.Dropdown(options=self.choices["d"], value=self.d, description="d")
        causal = w.ToggleButtons(options=[("non-causal", False), ("causal", True)]
                                 if len(self.choices["causal"]) == 2 else
                                 [(str(c), c) for c in self.choices["causal"]],
                                 value=self.causal, description="mask")
        dtype = w.Dropdown(options=self.choices["dtype"], value=self.dtype, description="dtype")
        mode = w.ToggleButtons(options=[(m.replace("_", "+"), m) for m in self.choices["mode"]],
                               value=self.mode, description="pass")

        def redraw(_=None):
            self.set(d=d.value, causal=causal.value, dtype=dtype.value, mode=mode.value)
            redraw_into(out, self)

        for control in (d, causal, dtype, mode):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([d, dtype]), w.HBox([causal]), w.HBox([mode]), out])
        box.add_class("ft-bench-explorer")
        return box
