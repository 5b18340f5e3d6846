"""Chapter 0's Play widget: how big is the score matrix next to Q, K, V and O?"""

from __future__ import annotations

from dataclasses import dataclass

from flashtext.hardware import H200
from flashtext.widgets.base import redraw_into

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass
class TensorSizes:
    """Bytes of Q, K, V, O (each batch*heads*N*d) and of S (batch*heads*N*N) for one layer."""

    n: int = 4096
    d: int = 128
    batch: int = 1
    heads: int = 32
    dtype: str = "fp16"

    def sizes(self) -> dict[str, int]:
        b = DTYPE_BYTES[self.dtype]
        qkvo = self.batch * self.heads * self.n * self.d * b
        return {"Q": qkvo, "K": qkvo, "V": qkvo, "O": qkvo,
                "S (N x N)": self.batch * self.heads * self.n * self.n * b}

    def caption(self) -> str:
        s = self.sizes()
        ratio = s["S (N x N)"] / (s["Q"] * 4)
        fits = "fits in" if s["S (N x N)"] <= H200.hbm_bytes else "does NOT fit in"
        return (f"N={self.n}, d={self.d}, batch={self.batch}, heads={self.heads}, {self.dtype}: "
                f"S is {s['S (N x N)'] / 1e9:.3g} GB, {ratio:.3g}x Q+K+V+O, and {fits} "
                f"an H200's {H200.hbm_bytes / 1e9:.0f} GB")

    def figure(self):
        """Left: the tensors of this layer. Right: how they grow with N (log-log): the score
        matrix quadratically, Q, K, V and O linearly, against the H200's memory; this N marked."""
        import matplotlib.pyplot as plt
        import numpy as np

        s = self.sizes()
        fig, (ax, grow) = plt.subplots(1, 2, figsize=(11, 3.2),
                                       gridspec_kw={"width_ratios": [1.3, 1]})
        names = list(s)
        ax.barh(names, [v / 1e9 for v in s.values()],
                color=["#4c72b0"] * 4 + ["#c44e52"])
        ax.axvline(H200.hbm_bytes / 1e9, color="k", ls="--", lw=1)
        ax.text(H200.hbm_bytes / 1e9, -0.6, " H200 HBM", va="bottom", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("GB (log scale)")
        ns = 2.0 ** np.arange(8, 18)
        per_n = {k: v / self.n for k, v in s.items()}
        grow.loglog(ns, per_n["S (N x N)"] / self.n * ns**2 / 1e9, color="#c44e52",
                    label="S (N x N): grows as N²")
        grow.loglog(ns, 4 * per_n["Q"] * ns / 1e9, color="#4c72b0",
                    label="Q + K + V + O: grows as N")
        grow.axhline(H200.hbm_bytes / 1e9, color="k", ls="--", lw=1, label="H200 HBM")
        grow.plot([self.n] * 2, [4 * s["Q"] / 1e9, s["S (N x N)"] / 1e9], "ko", ms=4)
        grow.axvline(self.n, color="0.6", lw=0.8)
        grow.set_xscale("log", base=2)
        grow.set_xlabel("sequence length N (log scale)")
        grow.set_ylabel("GB")
        grow.legend(fontsize=7, loc="upper left")
        fig.suptitle(self.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as w

        out = w.Output()
        n = w.IntSlider(value=self.n, min=256, max=131072, step=256, description="N")
        d = w.Dropdown(options=[64, 128, 256], value=self.d, description="d")
        heads = w.IntSlider(value=self.heads, min=1, max=128, description="heads")
        dtype = w.Dropdown(options=list(DTYPE_BYTES), value=self.dtype, description="dtype")

        def redraw(_=None):
            self.n, self.d, self.heads, self.dtype = n.value, d.value, heads.value, dtype.value
            redraw_into(out, self)

        for control in (n, d, heads, dtype):
            control.observe(redraw, names="value")
        redraw()
        box = w.VBox([w.HBox([n, d]), w.HBox([heads, dtype]), out])
        box.add_class("ft-tensor-sizes")
        return box
