"""Is a sweep's time for a configuration the kernels' own? ``ours`` runs the very kernels one of
the sweep's other flashtext columns runs (the dispatch rules say which), so each such
configuration is timed twice in one run; two times far apart say the timer caught something
besides the kernels (most often on short calls, where the host's time nears the GPU's)."""

from __future__ import annotations

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
