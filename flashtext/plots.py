"""Shared matplotlib figures and styles for chapter 1: the memory hierarchy and measurements.

Functions return a Figure and never call ``plt.show()``; notebooks display them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashtext.hardware import GPU, LEVELS, hierarchy

GPU_COLORS = {"A100": "#4c72b0", "H100": "#55a868", "H200": "#c44e52"}
STEP_COLORS = {"S = QK^T": "#4c72b0", "P = softmax(S)": "#dd8452", "O = PV": "#55a868",
               "fused (ideal)": "#8172b3"}


def human_bytes(x: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.3g} B"


def human_rate(x: float) -> str:
    return human_bytes(x) + "/s"


def hierarchy_figure(gpus: dict[str, GPU]):
    """Capacity and bandwidth of each level, log scale, one bar per GPU: the gaps are the point.
    Levels without a cited number are marked "not quoted" instead of drawn."""
    import matplotlib.pyplot as plt

    fig, (cap, bw) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    n_gpu = len(gpus)
    height = 0.8 / n_gpu
    y_base = np.arange(len(LEVELS))[::-1]
    for g_idx, (key, gpu) in enumerate(gpus.items()):
        levels = hierarchy(gpu)
        y = y_base + (n_gpu - 1 - 2 * g_idx) * height / 2
        color = GPU_COLORS.get(key, f"C{g_idx}")
        for ax, attr, fmt in ((cap, "size", human_bytes), (bw, "bandwidth", human_rate)):
            for yy, level in zip(y, levels, strict=True):
                value = getattr(level, attr)
                if value is None:
                    ax.text(1.3e6 if attr == "size" else 1.3e9, yy, f"{key}: not quoted",
                            va="center", fontsize=7, color=color, style="italic")
                    continue
                ax.barh(yy, value, height=height * 0.92, color=color,
                        label=key if level.name == "HBM" else None)
                ax.text(value * 1.25, yy, fmt(value), va="center", fontsize=7)
    # how many times slower each level is than the one above, per GPU, between the rows
    names = list(gpus)
    for i in range(len(LEVELS) - 1):
        ratios = []
        for key in names:
            levels = hierarchy(gpus[key])
            upper = levels[i]
            below = [lv for lv in levels[i + 1:] if lv.bandwidth]
            if upper.bandwidth and below:
                skip = "" if below[0] is levels[i + 1] else f" (to {below[0].name})"
                ratios.append(f"{key} {upper.bandwidth / below[0].bandwidth:.3g}x{skip}")
        if ratios:
            bw.text(2.2e14, y_base[i] - 0.5, "slower by\n" + "\n".join(ratios), fontsize=7,
                    va="center", ha="left", color="#333333")
    cap.set_yticks(y_base, LEVELS)
    cap.set_xscale("log")
    bw.set_xscale("log")
    cap.set_xlim(1e6, 1e14)
    bw.set_xlim(1e9, 2e15)
    cap.set_xlabel("capacity, bytes (log scale)")
    bw.set_xlabel("bandwidth, bytes/s (log scale)")
    cap.set_title("bigger as you go down ...", fontsize=10)
    bw.set_title("... and slower (ratios between levels on the right)", fontsize=10)
    cap.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def read_sweep_figure(data: dict[str, Any], gpu: GPU | None = None):
    """Measured read bandwidth against buffer size: where the buffer stops fitting in L2."""
    import matplotlib.pyplot as plt

    rows = data["read_sweep"]
    sizes = np.array([r["bytes"] for r in rows], dtype=float)
    bw = np.array([r["bandwidth"] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    ax.plot(sizes / 2**20, bw / 1e12, "o-", color="#c44e52", label="measured read bandwidth")
    l2 = data.get("device", {}).get("L2_cache_size")
    if l2:
        ax.axvline(l2 / 2**20, color="k", ls="--", lw=1)
        ax.text(l2 / 2**20, ax.get_ylim()[1] * 0.95, f" L2 = {l2 / 2**20:.0f} MiB", fontsize=8,
                va="top")
    if gpu is not None:
        ax.axhline(gpu.hbm_bandwidth / 1e12, color="#555555", ls=":", lw=1)
        ax.text(sizes[0] / 2**20, gpu.hbm_bandwidth / 1e12, " vendor HBM peak", fontsize=8,
                va="bottom")
    copies = data.get("copy", [])
    if copies:  # labelled at the left, under its line, where the curve is far above
        best = max(r["bandwidth"] for r in copies)
        ax.axhline(best / 1e12, color="#4c72b0", ls="-.", lw=1)
        ax.text(sizes[0] / 2**20, best / 1e12, f" copy (read + write) {best / 1e12:.2f} TB/s",
                fontsize=8, va="top", color="#4c72b0")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size, MiB (log scale)")
    ax.set_ylabel("TB/s")
    ax.set_ylim(0, None)
    ax.set_title("Reading a buffer over and over: fast while it fits in L2, HBM speed after",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


ATTENTION_STEPS = ("S = QK^T", "P = softmax(S)", "O = PV")


def attention_split_figure(data: dict[str, Any], d: int = 64, gpu: GPU | None = None):
    """Naive attention's three kernels, measured, next to the fused SDPA flash kernel.

    Left: each kernel's time per score (batch x heads x N^2 of them), side by side on a linear
    scale so every kernel shows at every N, and the softmax's time if it ran at the measured
    copy bandwidth for its 4 bytes per score (read S, write P). Right: each kernel's share of
    the naive time, and the softmax share the roofline predicts on ``gpu``."""
    import matplotlib.pyplot as plt

    from flashtext import roofline

    rows = [r for r in data["attention"] if r["d"] == d]
    if not rows:
        raise ValueError(f"no attention rows with d={d} in the recorded data")
    fig, (ax, share) = plt.subplots(1, 2, figsize=(11, 3.8),
                                    gridspec_kw={"width_ratios": [1.5, 1]})
    x = np.arange(len(rows))
    scores = np.array([r["batch"] * r["heads"] * r["N"] ** 2 for r in rows], dtype=float)
    ps = 1e-3 / scores * 1e12  # ms -> picoseconds per score
    width = 0.2
    tallest = 0.0
    for k, step in enumerate(ATTENTION_STEPS):
        t = np.array([r[step] for r in rows]) * ps
        ax.bar(x + (k - 1.5) * width, t, width, color=STEP_COLORS[step], label=f"naive: {step}")
        tallest = max(tallest, float(t.max()))
    flash = np.array([r["sdpa flash"] if r.get("sdpa flash") is not None else np.nan
                      for r in rows]) * ps
    ax.bar(x + 1.5 * width, flash, width, color=STEP_COLORS["fused (ideal)"],
           label="SDPA flash (the whole attention, fused)")
    copies = data.get("copy", [])
    if copies:
        best = max(r["bandwidth"] for r in copies)
        at_copy = 4 / best * 1e12  # 2 bytes read + 2 written per fp16 score
        ax.axhline(at_copy, color=STEP_COLORS["P = softmax(S)"], ls="--", lw=1,
                   label=f"softmax alone at copy speed ({best / 1e12:.2f} TB/s, 4 B/score)")
    ax.set_xticks(x, [f"N={r['N']}\nB={r['batch']}" for r in rows], fontsize=8)
    ax.set_ylabel("picoseconds per score (median)")
    ax.set_title(f"naive attention's 3 kernels vs one fused kernel (16 heads, d={d}, fp16)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_ylim(0, tallest * 1.45)
    naive = np.array([sum(r[step] for step in ATTENTION_STEPS) for r in rows])
    for step in ATTENTION_STEPS:
        frac = np.array([r[step] for r in rows]) / naive
        share.plot(x, 100 * frac, "o-", color=STEP_COLORS[step], label=f"{step}, measured")
    if gpu is not None:
        predicted = [roofline.roofline_table(
            roofline.standard_attention_steps(r["batch"], r["heads"], r["N"], r["d"]),
            gpu)[1]["share"] for r in rows]
        share.plot(x, 100 * np.array(predicted), "--", color=STEP_COLORS["P = softmax(S)"],
                   label=f"softmax, roofline ({gpu.name})")
    share.set_xticks(x, [str(r["N"]) for r in rows])
    share.set_ylim(0, 100)
    share.set_xlabel("N")
    share.set_ylabel("% of naive time")
    share.set_title("share of each kernel", fontsize=9)
    share.legend(fontsize=7)
    fig.tight_layout()
    return fig
