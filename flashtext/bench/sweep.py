"""The sweep: every provider and mode on every configuration, failures recorded, not fatal.

Anything that fails is recorded with its reason (unsupported, out of memory, error) instead of
stopping the sweep; an error that kills the CUDA context skips what is left with that reason.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import flashtext
from flashtext.bench.ceilings import add_roofline, measure_ceilings
from flashtext.bench.core import (
    TOLERANCE,
    Config,
    Settings,
    clock_fields,
    compare,
    peak_memory,
    reference_slices,
    summarize,
    tflops,
    time_call,
)
from flashtext.bench.providers import PROVIDERS, Prepared

# Statuses a row can have. Only "ok" rows carry a time.
STATUSES = ("ok", "skipped", "unsupported", "unavailable", "oom", "error")
# What each field of a row means; written into every results file so it explains itself.
FIELDS = {
    "provider": "ours, cudnn, flash (FA2), efficient, flex, math: see 'providers'",
    "mode": "fwd (inference forward, inputs without requires_grad) or fwd_bwd "
            "(attn(q, k, v).backward(dO), gradients reset before each call)",
    "dtype, d, causal, n, batch, heads": "one configuration; Q, K, V are (batch, heads, n, d)",
    "status": "ok, or why there is no time: skipped (by design or time budget), unsupported "
              "(backend refuses this input), unavailable (import failed), oom, error",
    "reason": "the exception or skip reason, first line",
    "flops": "standard count: 4*batch*heads*n^2*d, x0.5 causal, x3.5 fwd_bwd",
    "min_bytes": "bytes no kernel can avoid: Q, K, V read and O written once; x3 fwd_bwd",
    "ms, ms_q20, ms_q80, reps, timer": "median, 20th and 80th percentile of reps timed calls",
    "tflops": "flops / ms",
    "ms_rounds": "with --rounds R > 1: the median of each round (the providers of a "
                 "configuration timed R times in rotated orders; ms and its quantiles pool "
                 "every call)",
    "first_call_s": "wall time of the first call (compilation, autotuning), not in ms",
    "host_ms, gpu_ms": "GPU only: per call over 5-50 calls queued back to back, the host's "
                       "time to queue them and the GPU's to run them (behind a sleeping "
                       "kernel: the kernels alone, no L2 flush); ms well above gpu_ms means "
                       "the GPU waited for the host",
    "clocks_error": "why host_ms and gpu_ms are missing, where measuring them failed",
    "max_error": "max |x - ref| / max |ref| per output against float64 on the first and last "
                 "(batch, head); correct = every error <= tolerance",
    "peak_bytes, peak_bytes_per_token": "max_memory_allocated over one call minus what was "
                                        "allocated before it; per token = / (batch * n)",
    "t_compute_ms, t_memory_ms, bound, roof_fraction": "flops / measured matmul FLOP/s, "
        "min_bytes / measured copy bandwidth, which is larger, and max(both) / ms",
}


def classify(exc: BaseException, caught: list[warnings.WarningMessage] | None = None
             ) -> tuple[str, str]:
    """(status, reason) for an exception raised by a provider."""
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "oom", text
    if isinstance(exc, ImportError):
        return "unavailable", text
    unsupported = ("no available kernel", "no viable backend", "not supported",
                   "does not support", "unsupported")
    if isinstance(exc, NotImplementedError | ValueError) or any(
            s in str(exc).lower() for s in unsupported):
        why = [str(w.message).strip().splitlines()[0] for w in caught or ()
               if "because" in str(w.message) or "not" in str(w.message)]
        return "unsupported", "; ".join([text] + why[:2])
    return "error", text


@contextlib.contextmanager
def _capture_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _cuda_alive() -> bool:
    """After an error: can this process still use the GPU? (An illegal memory access kills
    the CUDA context for good; every later call would fail too.)"""
    try:
        torch.ones(1, device="cuda").add_(1).item()
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 (any failure means the context is gone)
        return False


def _free(collect: bool = False) -> None:
    """Return freed blocks to the driver between measurements. A full gc pass costs ~0.2 s
    with torch and dynamo loaded, so it runs only after a failure (an exception's traceback
    can hold tensors in a reference cycle) and once per configuration."""
    if collect:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_inputs(cfg: Config, device: str, seed: int, need_do: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Fresh standard-normal Q, K, V (and dO) for one configuration, seeded by the
    configuration so a rerun sees the same numbers. Never zeros: with all scores tied, a
    kernel that forgot the running max or the rescale would still look right."""
    g = torch.Generator(device=device).manual_seed(seed + zlib.crc32(cfg.label().encode()))
    shape = (cfg.batch, cfg.heads, cfg.n, cfg.d)
    q, k, v = (torch.randn(shape, generator=g, device=device, dtype=cfg.torch_dtype)
               for _ in range(3))
    do = torch.randn(shape, generator=g, device=device, dtype=cfg.torch_dtype) if need_do \
        else None
    return q, k, v, do


@dataclass
class _State:
    """Mutable bookkeeping of one sweep."""

    gpu: bool
    device: str
    start: float = field(default_factory=time.perf_counter)
    cuda_lost: str | None = None  # the error that killed the CUDA context, if one did


def _row(cfg: Config, provider: str, mode: str, status: str, reason: str | None = None,
         **extra: Any) -> dict[str, Any]:
    row = {"provider": provider, "mode": mode, **cfg.fields(), "status": status,
           "reason": reason, "flops": cfg.flops(mode), "min_bytes": cfg.min_bytes(mode)}
    row.update(extra)
    return row


# what an extra round re-times: (provider, mode) -> (its prepared provider, the timed call,
# the tensors whose gradients the call fills)
Timers = dict[tuple[str, str], tuple[Prepared, Callable[[], Any], list | None]]


def _measure_mode(p: Prepared, cfg: Config, mode: str, inputs, ref, s: Settings,
                  st: _State, provider: str, timers: Timers | None = None) -> dict[str, Any]:
    q, k, v, do = inputs
    if mode == "fwd":
        args = (q, k, v)
        grads = None

        def fn():
            return p.attn(q, k, v)
    else:
        args = tuple(x.detach().requires_grad_() for x in (q, k, v))
        grads = list(args)

        def fn():
            p.attn(*args).backward(do)

    # First call: compiles / autotunes, and gives the outputs we check.
    with _capture_warnings() as caught:
        try:
            t0 = time.perf_counter()
            out = p.attn(*args)
            if mode == "fwd_bwd":
                out.backward(do)
            if st.gpu:
                torch.cuda.synchronize()
            first_call_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 (recorded, never fatal)
            return _row(cfg, provider, mode, *classify(exc, caught))
    extra: dict[str, Any] = {"first_call_s": round(first_call_s, 3)}
    if ref is not None:
        got = {"o": out}
        if mode == "fwd_bwd":
            got.update(dq=args[0].grad, dk=args[1].grad, dv=args[2].grad)
        errors = compare(ref, got)
        tol = TOLERANCE[cfg.dtype]
        extra["max_error"] = {name: (e if math.isfinite(e) else "non-finite")
                              for name, e in errors.items()}
        extra["correct"] = all(math.isfinite(e) and e <= tol for e in errors.values())
        extra["tolerance"] = tol
    del out
    for g in grads or ():
        g.grad = None
    try:
        timing = time_call(fn, warmup_ms=s.warmup_ms, rep_ms=s.rep_ms, grad_to_none=grads,
                           gpu=st.gpu)
        if s.memory and st.gpu:
            extra["peak_bytes"] = peak_memory(fn, grads)
            extra["peak_bytes_per_token"] = extra["peak_bytes"] / (cfg.batch * cfg.n)
    except Exception as exc:  # noqa: BLE001
        return _row(cfg, provider, mode, *classify(exc), **extra)
    if st.gpu:  # the same call on the host's clock and on the GPU's alone; never fatal
        extra.update(clock_fields(fn, timing.ms, grads))
    if timers is not None:  # more rounds to come: keep the call, and this round's times
        timers[provider, mode] = (p, fn, grads)
        extra["times"] = timing.times
    return _row(cfg, provider, mode, "ok", None, ms=timing.ms, ms_q20=timing.ms_q20,
                ms_q80=timing.ms_q80, reps=timing.reps, timer=timing.timer,
                tflops=tflops(cfg.flops(mode), timing.ms), **extra)


def _measure_provider(name: str, cfg: Config, inputs, ref, s: Settings, st: _State,
                      timers: Timers | None = None) -> list[dict[str, Any]]:
    provider = PROVIDERS[name]
    reason = provider.skip(cfg, s, st.gpu)
    if reason:
        return [_row(cfg, name, mode, "skipped", reason) for mode in s.modes]
    with _capture_warnings() as caught:
        try:
            prepared = provider.prepare(cfg, st.device, s)
        except Exception as exc:  # noqa: BLE001
            status, why = classify(exc, caught)
            return [_row(cfg, name, mode, status, why) for mode in s.modes]
    rows = []
    with prepared.context():
        for mode in s.modes:
            rows.append(_measure_mode(prepared, cfg, mode, inputs, ref, s, st, name, timers))
            if rows[-1]["status"] == "error" and st.gpu and not _cuda_alive():
                st.cuda_lost = f"{name} {mode} {cfg.label()}: {rows[-1]['reason']}"
                break
    return rows


def run_config(cfg: Config, s: Settings, st: _State) -> list[dict[str, Any]]:
    """Every provider and mode on one configuration, from the same inputs."""
    inputs = make_inputs(cfg, st.device, s.seed, need_do="fwd_bwd" in s.modes)
    ref, ref_note = None, None
    if s.check:
        try:
            ref = reference_slices(*inputs, causal=cfg.causal, scale=cfg.scale)
        except Exception as exc:  # noqa: BLE001 (e.g. OOM on a small GPU at N = 16k)
            ref_note = "not checked: float64 reference failed: " + classify(exc)[1]
            _free(collect=True)
    rows = []
    timers: Timers = {}
    rounds = s.rounds_for(cfg.n)
    for name in s.providers:
        if st.cuda_lost:
            rows += [_row(cfg, name, m, "skipped", "CUDA context lost after " + st.cuda_lost)
                     for m in s.modes]
            continue
        got = _measure_provider(name, cfg, inputs, ref, s, st, timers if rounds > 1 else None)
        if ref_note:
            for r in got:
                r["check"] = ref_note
        rows += got
        _free(collect=any(r["status"] in ("oom", "error") for r in got))
    if rounds > 1 and not st.cuda_lost:
        _more_rounds(rows, timers, cfg, rounds, s, st)
    del inputs, ref, timers
    _free(collect=True)
    return rows


def round_order(providers: list[str], round_index: int) -> list[str]:
    """The providers' order in round ``round_index`` (0: the sweep's own order): rotated by
    one each round, so that no provider always runs first after another's compile or last."""
    shift = round_index % len(providers) if providers else 0
    return providers[shift:] + providers[:shift]


def _more_rounds(rows: list[dict[str, Any]], timers: Timers, cfg: Config, rounds: int,
                 s: Settings, st: _State) -> None:
    """Time every measured (provider, mode) again in ``rounds - 1`` more passes, each in
    :func:`round_order`; a row's median and quantiles become those of all its calls, and
    ``ms_rounds`` keeps each pass's median (how far one provider moved between passes)."""
    first = {(r["provider"], r["mode"]): r for r in rows if r["status"] == "ok"}
    timings = {key: [] for key in timers}
    providers = list(dict.fromkeys(name for name, _ in timers))
    for i in range(1, rounds):
        for name in round_order(providers, i):
            for (provider, mode), (prepared, fn, grads) in timers.items():
                if provider != name:
                    continue
                with prepared.context():
                    timings[provider, mode].append(time_call(
                        fn, warmup_ms=s.warmup_ms, rep_ms=s.rep_ms, grad_to_none=grads,
                        gpu=st.gpu))
    for key, extra in timings.items():
        row = first[key]
        if not extra or not all(t.times for t in extra) or not row.get("times"):
            # a timer without per-call times: the median of the rounds' medians
            row["ms_rounds"] = [row["ms"], *(t.ms for t in extra)]
            row.update(ms=statistics.median(row["ms_rounds"]),
                       tflops=tflops(cfg.flops(row["mode"]), statistics.median(row["ms_rounds"])))
            continue
        pooled = summarize([*row.pop("times"), *(x for t in extra for x in t.times)],
                           row["timer"])
        row.update(ms_rounds=[row["ms"], *(t.ms for t in extra)], ms=pooled.ms,
                   ms_q20=pooled.ms_q20, ms_q80=pooled.ms_q80, reps=pooled.reps,
                   tflops=tflops(cfg.flops(row["mode"]), pooled.ms))
    for row in rows:
        row.pop("times", None)


def _progress_line(i: int, total: int, cfg: Config, rows: list[dict[str, Any]],
                   elapsed: float, modes: tuple[str, ...]) -> str:
    parts = []
    for name in dict.fromkeys(r["provider"] for r in rows):
        cells = []
        for mode in modes:
            r = next((x for x in rows if x["provider"] == name and x["mode"] == mode), None)
            if r is None:
                cells.append("?")
            elif r["status"] == "ok":
                wrong = "" if r.get("correct", True) else "!WRONG"
                cells.append(f"{r['tflops']:.0f}{wrong}")
            else:
                cells.append({"skipped": "-", "unsupported": "n/s", "unavailable": "n/a",
                              "oom": "OOM", "error": "ERR"}[r["status"]])
        parts.append(f"{name} {'/'.join(cells)}")
    return f"[{i}/{total} {elapsed / 60:4.1f} min] {cfg.label()}: " + " | ".join(parts)


def run(s: Settings, *, log: Callable[[str], None] | None = print,
        on_config: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the sweep and return the payload (settings, environment, ceilings, rows).

    ``on_config(payload_so_far)`` is called after every configuration, with ``partial`` set
    (the CLI saves the JSON there, so an interrupted run keeps what it measured). Progress
    lines show TFLOP/s per provider as fwd/fwd_bwd; ``!WRONG`` marks a failed float64 check.
    """
    env = flashtext.environment()
    gpu = env.is_gpu and not env.interpreter
    st = _State(gpu=gpu, device="cuda" if env.is_gpu else "cpu")
    log = log or (lambda line: None)
    configs = s.configs()
    ceilings = None
    if gpu:
        try:
            ceilings = measure_ceilings(s.dtypes)
        except Exception as exc:  # noqa: BLE001 (the sweep is still worth running)
            log(f"could not measure the ceilings: {classify(exc)[1]}")
    rows: list[dict[str, Any]] = []

    def payload(partial: bool) -> dict[str, Any]:
        return {
            "kind": "flashtext.bench",
            "schema": 1,
            "partial": partial,
            "settings": s.as_dict(),
            "environment": {**env.as_dict(), "timer": "do_bench" if gpu else "perf_counter",
                            "cuda": torch.version.cuda,
                            "cudnn": torch.backends.cudnn.version() if gpu else None,
                            "argv": sys.argv[1:]},
            "fields": FIELDS,
            "providers": {name: PROVIDERS[name].description
                          + (f" [this run: --flex-compile {s.flex_compile}]" if name == "flex"
                             else "") for name in s.providers},
            "ceilings": ceilings,
            "elapsed_s": round(time.perf_counter() - st.start, 1),
            "cuda_lost": st.cuda_lost,
            "rows": rows,
        }

    group = None
    for i, cfg in enumerate(configs, 1):
        if gpu and "flex" in s.providers and s.flex_compile == "auto" \
                and (cfg.dtype, cfg.d, cfg.causal) != group:
            # auto-dynamic learns which dims change; only N and batch should, never d
            import torch._dynamo as dynamo

            dynamo.reset()
            group = (cfg.dtype, cfg.d, cfg.causal)
        elapsed = time.perf_counter() - st.start
        if s.budget_s is not None and elapsed > s.budget_s:
            rows += [_row(cfg, p, m, "skipped", f"time budget of {s.budget_s:.0f} s used up "
                          "(--budget-min); rerun this subset with --merge")
                     for p in s.providers for m in s.modes]
            continue
        got = run_config(cfg, s, st)
        add_roofline(got, ceilings)
        rows += got
        log(_progress_line(i, len(configs), cfg, got, time.perf_counter() - st.start, s.modes))
        if on_config is not None:
            on_config(payload(partial=True))
    return payload(partial=False)
