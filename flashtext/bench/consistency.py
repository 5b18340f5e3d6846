"""Is a sweep's time for a configuration the kernels' own? ``ours`` runs the very kernels one of
the sweep's other flashtext columns runs (the dispatch rules say which), so each such
configuration is timed twice in one run; two times far apart say the timer caught something
besides the kernels (most often on short calls, where the host's time nears the GPU's). On a
GPU run every row also has the GPU's own time per call (``gpu_ms``): a row whose do_bench time
is well above it was set by the host (:func:`host_set_rows`)."""

from __future__ import annotations

from typing import Any

from flashtext.bench import report


def same_kernels(mode: str, d: int, n: int, causal: bool) -> str | None:
    """The sweep's column that runs the very kernels ``flash_attention`` picks (``ours``) in
    one square configuration, as the dispatch rules decide on sm_90: "gluon" or "triton", or
    None where ours pairs a Gluon kernel with a Triton one (its forward and backward differ)."""
    from flashtext.kernels import dispatch  # lazily: the rules import the kernels

    gluon_fwd = dispatch.prefers_gluon(d, n, n, causal)
    if mode == "fwd":
        return "gluon" if gluon_fwd else "triton"
    gluon_bwd = dispatch.prefers_gluon_backward(d, n, n, causal)
    return {(True, True): "gluon", (False, False): "triton"}.get((gluon_fwd, gluon_bwd))


def timed_twice(res: report.Results, mode: str, dtype: str, d: int, causal: bool, n: int
                ) -> tuple[float, float] | None:
    """(ours' time, the same kernels' time in their own column) in ms: one computation timed
    twice in one run, or None where no column runs ours' kernels or a time is missing. Two
    times far apart say the timer caught something besides the kernels."""
    same = same_kernels(mode, d, n, causal)
    key = (mode, dtype, d, causal, n)
    ours_ms = res.value("ours", *key, key="ms")
    same_ms = res.value(same, *key, key="ms") if same else None
    return (ours_ms, same_ms) if ours_ms and same_ms else None


HOST_SET = 1.15  # a row's time is the host's where do_bench's median is this far above gpu_ms


def host_set_rows(res: report.Results, factor: float = HOST_SET) -> list[dict[str, Any]]:
    """Timed rows whose do_bench median is more than ``factor`` times the GPU's own time per
    call (``gpu_ms``, GPU runs only): there the GPU waited for the host between do_bench's
    events, and the row times Python and the launches more than the kernels."""
    return [r for r in res.ok() if r.get("gpu_ms") and r["ms"] > factor * r["gpu_ms"]]


def host_set_text(res: report.Results, factor: float = HOST_SET) -> str:
    """Per provider: how many of its rows the host set, and the largest do_bench / GPU."""
    rows = host_set_rows(res, factor)
    clocked = [r for r in res.ok() if r.get("gpu_ms")]
    if not clocked:
        return ""
    lines = [f"Rows the host set (do_bench > {factor:g}x the GPU's own time per call):"]
    for p in dict.fromkeys(r["provider"] for r in clocked):
        mine = [r for r in rows if r["provider"] == p]
        n_all = sum(r["provider"] == p for r in clocked)
        worst = max((r["ms"] / r["gpu_ms"] for r in mine), default=None)
        lines.append(f"  {report.LABELS.get(p, p):22s} {len(mine):3d} of {n_all:3d}"
                     + (f", up to {worst:.2f}x" if worst else ""))
    return "\n".join(lines)
