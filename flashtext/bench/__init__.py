"""The benchmark harness: this book's kernel against the attention kernels a reader would
otherwise use, on the reader's own GPU (chapter 12, ``make bench``).

    python -m flashtext.bench                      # the full sweep (GPU); CPU: the quick check
    python -m flashtext.bench --quick              # CPU smoke test: tiny shapes, no timing claims
    python -m flashtext.bench --dtype fp16 --d 128 --mode fwd --providers ours cudnn flash
    python -m flashtext.bench --report bench_h200_v2  # re-print the tables of a recorded run

Providers: ``ours`` (flashtext.kernels.flash_attention), SDPA's ``cudnn``, ``flash`` (FA2),
``efficient`` and ``math`` backends, and ``flex`` (torch.compile(flex_attention)). TFLOP/s use
the standard count (:func:`flashtext.cost.attention_flops`); times are medians of
``triton.testing.do_bench``; every provider is checked against float64 in the same run.
:mod:`flashtext.bench.core` says what one measurement is (settings, timing, the float64
check), :mod:`flashtext.bench.providers` what is measured, :mod:`flashtext.bench.sweep` runs it
all (with the roofline ceilings of :mod:`flashtext.bench.ceilings`), and
:mod:`flashtext.bench.report` reads and draws. The measurement scripts in ``scripts/`` share
:mod:`flashtext.bench.workload` (inputs and calls at the benchmark's setting),
:mod:`flashtext.bench.tuning` (the launch-configuration search), :mod:`flashtext.bench.ncu`
(Nsight Compute's output) and :mod:`flashtext.bench.static_compile` (the kernels compiled for a
GPU target as the library launches them).
"""

from flashtext.bench.core import (
    Config,
    Settings,
    attention_min_bytes,
    summarize,
    tflops,
    time_call,
)
from flashtext.bench.providers import PROVIDERS
from flashtext.bench.report import (
    TARGETS,
    Results,
    evaluate_targets,
    figure_memory,
    figure_tflops,
    load,
    load_anchors,
    plot_memory,
    plot_roofline,
    plot_tflops,
    ratio_rows,
    recorded_results,
    summary_text,
)
from flashtext.bench.sweep import classify, run

__all__ = ["PROVIDERS", "TARGETS", "Config", "Results", "Settings", "attention_min_bytes",
           "classify", "evaluate_targets", "figure_memory", "figure_tflops", "load",
           "load_anchors", "plot_memory", "plot_roofline", "plot_tflops", "ratio_rows",
           "recorded_results", "run", "summarize", "summary_text", "tflops", "time_call"]
