"""Measuring attention kernels side by side: settings, providers, timing, correctness, the sweep.

One *configuration* is (dtype, head dim d, causal, sequence length N) at the setting of the H200
anchors: batch * N = 16384 tokens and heads * d = 2048, so every N does the same number of
tokens and the FLOPs grow linearly with N. For each configuration every *provider* (our Triton
kernel, PyTorch's SDPA backends, FlexAttention) runs on the same fresh random inputs, is checked
against a float64 reference on a slice, timed (median of ``triton.testing.do_bench``), and has
its peak memory measured around one call. Anything that fails is recorded with its reason
(unsupported, out of memory, error) instead of stopping the sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from flashtext import cost

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "float16": "float16",
                 "bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32",
                 "float32": "float32"}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
MODES = ("fwd", "fwd_bwd")
# Scaled max error max|x - ref| / max|ref| allowed against the float64 reference. A correct
# kernel stays ~10x below these (fp16 ~1e-3, bf16 ~1e-2); a broken one lands near 1.
TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-2}
# Statuses a row can have. Only "ok" rows carry a time.
STATUSES = ("ok", "skipped", "unsupported", "unavailable", "oom", "error")
FULL_NS = (512, 1024, 2048, 4096, 8192, 16384)
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
    "first_call_s": "wall time of the first call (compilation, autotuning), not in ms",
    "max_error": "max |x - ref| / max |ref| per output against float64 on the first and last "
                 "(batch, head); correct = every error <= tolerance",
    "peak_bytes, peak_bytes_per_token": "max_memory_allocated over one call minus what was "
                                        "allocated before it; per token = / (batch * n)",
    "t_compute_ms, t_memory_ms, bound, roof_fraction": "flops / measured matmul FLOP/s, "
        "min_bytes / measured copy bandwidth, which is larger, and max(both) / ms",
}


# ------------------------------------------------------------------------------ settings

@dataclass(frozen=True)
class Settings:
    """What to measure and how. The defaults are the full H200 sweep of issue 7."""

    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    ds: tuple[int, ...] = (128, 64)
    causals: tuple[bool, ...] = (False, True)
    modes: tuple[str, ...] = MODES
    ns: tuple[int, ...] = FULL_NS
    providers: tuple[str, ...] = ("ours", "cudnn", "flash", "efficient", "flex", "math")
    tokens: int = 16384  # batch * N, as in the anchors
    hidden: int = 2048  # heads * d, as in the anchors
    warmup_ms: float = 25.0  # do_bench's warm-up time per measurement
    rep_ms: float = 100.0  # do_bench's measuring time per measurement
    math_max_n: int = 4096  # the math backend materialises N x N scores: small N only
    check: bool = True  # correctness against float64 on a slice, in the same run
    memory: bool = True  # peak memory around one call (CUDA only)
    budget_s: float | None = 510.0  # stop starting new configurations after this long
    flex_compile: str = "auto"  # how FlexAttention is compiled: see FLEX_COMPILE
    seed: int = 0
    quick: bool = False  # CPU smoke test: tiny shapes, no timing claims

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtypes", tuple(_dtype_name(x) for x in self.dtypes))
        for name in ("ds", "ns"):
            values = getattr(self, name)
            if not values or any(not isinstance(x, int) or x <= 0 for x in values):
                raise ValueError(f"{name} must be a non-empty tuple of positive ints, "
                                 f"got {values!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes!r}")
        unknown = [p for p in self.providers if p not in PROVIDERS]
        if unknown or not self.providers:
            raise ValueError(f"providers must be a non-empty subset of {tuple(PROVIDERS)}, "
                             f"got {self.providers!r}")
        if not self.causals or any(not isinstance(c, bool) for c in self.causals):
            raise ValueError(f"causals must be a non-empty tuple of bools, got {self.causals!r}")
        for n in self.ns:
            if self.tokens % n:
                raise ValueError(f"tokens (batch * N = {self.tokens}) must be a multiple of "
                                 f"every N, got N = {n}")
        for d in self.ds:
            if self.hidden % d:
                raise ValueError(f"hidden (heads * d = {self.hidden}) must be a multiple of "
                                 f"every d, got d = {d}")
        if self.flex_compile not in FLEX_COMPILE:
            raise ValueError(f"flex_compile must be one of {sorted(FLEX_COMPILE)}, got "
                             f"{self.flex_compile!r}")
        if self.warmup_ms < 0 or self.rep_ms <= 0:
            raise ValueError(f"warmup_ms must be >= 0 and rep_ms > 0, got {self.warmup_ms}, "
                             f"{self.rep_ms}")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> Settings:
        """A CPU smoke test: every provider and mode on tiny shapes, one timed call each.

        bf16 is included on purpose: our kernel refuses it under the interpreter, which
        exercises the "unsupported" path of the harness.
        """
        base = dict(dtypes=("float16", "bfloat16"), ds=(64,), causals=(False, True),
                    ns=(64, 128), tokens=128, hidden=64, warmup_ms=0.0, rep_ms=1.0,
                    math_max_n=128, budget_s=None, quick=True)
        base.update(overrides)
        return cls(**base)

    def configs(self) -> list[Config]:
        """The sweep in the order it runs: dtype, then d, then causal, then N ascending."""
        return [Config(dtype, d, causal, n, self.tokens // n, self.hidden // d)
                for dtype in self.dtypes for d in self.ds for causal in self.causals
                for n in sorted(self.ns)]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _dtype_name(x: str) -> str:
    if x not in DTYPE_ALIASES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_ALIASES)}, got {x!r}")
    return DTYPE_ALIASES[x]


@dataclass(frozen=True)
class Config:
    """One point of the sweep. Q, K, V are (batch, heads, n, d)."""

    dtype: str
    d: int
    causal: bool
    n: int
    batch: int
    heads: int

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.d)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def flops(self, mode: str) -> float:
        return cost.attention_flops(self.batch, self.heads, self.n, self.d, causal=self.causal,
                                    mode=mode)

    def min_bytes(self, mode: str) -> float:
        return attention_min_bytes(self.batch, self.heads, self.n, self.d,
                                   DTYPES[self.dtype].itemsize, mode)

    def label(self) -> str:
        kind = "causal" if self.causal else "full"
        return (f"{SHORT_DTYPE[self.dtype]} d={self.d} N={self.n} {kind} "
                f"(B={self.batch}, H={self.heads})")

    def fields(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "d": self.d, "causal": self.causal, "n": self.n,
                "batch": self.batch, "heads": self.heads}


def attention_min_bytes(batch: int, heads: int, n: int, d: int, element_bytes: int,
                        mode: str = "fwd") -> float:
    """The HBM bytes no exact attention kernel can avoid (the roofline's memory side).

    Forward: read Q, K, V and write O once each (:func:`flashtext.cost.compulsory_hbm_elements`).
    Backward: read Q, K, V, O, dO and write dQ, dK, dV: twice the forward's count. The per-row
    statistics (log-sum-exp, rowsum(dO * O)) are d times smaller and left out.
    """
    factor = {"fwd": 1, "bwd": 2, "fwd_bwd": 3}
    if mode not in factor:
        raise ValueError(f"mode must be one of {sorted(factor)}, got {mode!r}")
    per_head = cost.compulsory_hbm_elements(n, d)
    return float(factor[mode] * batch * heads * per_head * element_bytes)


def tflops(flops: float, ms: float) -> float:
    """Throughput in TFLOP/s of ``flops`` floating-point operations done in ``ms`` milliseconds."""
    if not ms > 0:
        raise ValueError(f"ms must be positive, got {ms!r}")
    return flops / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------ providers

@dataclass(frozen=True)
class Prepared:
    """A provider ready for one configuration: ``attn(q, k, v) -> O`` and the context to run
    it in (SDPA's backend selection wraps whole measurements, not each call)."""

    attn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@dataclass(frozen=True)
class Provider:
    name: str
    label: str
    description: str
    prepare: Callable[[Config, str, Settings], Prepared]
    skip: Callable[[Config, Settings, bool], str | None] = lambda cfg, s, gpu: None


def _prepare_ours(cfg: Config, device: str, s: Settings) -> Prepared:
    from flashtext.kernels import flash_attention  # lazily: the kernel may be under repair

    def attn(q, k, v):
        return flash_attention(q, k, v, causal=cfg.causal, sm_scale=cfg.scale)

    return Prepared(attn)


def _sdpa(backend_name: str) -> Callable[[Config, str, Settings], Prepared]:
    def prepare(cfg: Config, device: str, s: Settings) -> Prepared:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def attn(q, k, v):
            return sdpa(q, k, v, is_causal=cfg.causal, scale=cfg.scale)

        return Prepared(attn, lambda: sdpa_kernel(backend))

    return prepare


# How FlexAttention is compiled, and what torch.compile's ``dynamic`` argument is for each.
FLEX_COMPILE = {
    # torch.compile(flex_attention) as a user writes it, as the anchors were measured: the
    # first N of each (dtype, d, mask) group gets a static kernel, the later ones share one
    # kernel with dynamic batch and N (about 2 compiles per group and pass instead of 6).
    "auto": None,
    # a kernel per shape, as FlexAttention's own benchmarks run it; the slowest sweep
    "static": False,
    # one dynamic-shape kernel from the first call
    "dynamic": True,
}
_FLEX_COMPILED: dict[str, Callable] = {}


def _flex_compiled(how: str) -> Callable:
    """torch.compile(flex_attention, dynamic=FLEX_COMPILE[how]), made once per process.

    The recompile limits are raised so a sweep of many shapes never falls back to eager.
    """
    dynamic = FLEX_COMPILE[how]
    if how not in _FLEX_COMPILED:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 1024))
        _FLEX_COMPILED[how] = torch.compile(flex_attention, dynamic=dynamic)
    return _FLEX_COMPILED[how]


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _prepare_flex(cfg: Config, device: str, s: Settings) -> Prepared:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # Compiled on a GPU; under the interpreter (CPU smoke test) eager is enough and fast.
    fn = _flex_compiled(s.flex_compile) if device == "cuda" else flex_attention
    # The block mask is built once per shape, outside the timed region.
    mask = (create_block_mask(_causal_mask_mod, None, None, cfg.n, cfg.n, device=device)
            if cfg.causal else None)

    def attn(q, k, v):
        return fn(q, k, v, block_mask=mask, scale=cfg.scale)

    return Prepared(attn)


def _skip_math(cfg: Config, s: Settings, gpu: bool) -> str | None:
    if cfg.n > s.math_max_n:
        return (f"math backend run only up to N = {s.math_max_n} (--math-max-n): it "
                f"materialises the N x N scores")
    return None


def _skip_ours(cfg: Config, s: Settings, gpu: bool) -> str | None:
    if not gpu and cfg.dtype == "bfloat16":
        return "bf16 tl.dot is wrong under Triton's CPU interpreter: bf16 needs a CUDA GPU"
    return None


PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Provider("ours", "flashtext (ours)", "flashtext.kernels.flash_attention (this book's "
             "Triton FlashAttention-2 kernels)", _prepare_ours, _skip_ours),
    Provider("cudnn", "SDPA cuDNN", "torch SDPA, CUDNN_ATTENTION backend",
             _sdpa("CUDNN_ATTENTION")),
    Provider("flash", "SDPA flash (FA2)", "torch SDPA, FLASH_ATTENTION backend "
             "(FlashAttention-2)", _sdpa("FLASH_ATTENTION")),
    Provider("efficient", "SDPA efficient", "torch SDPA, EFFICIENT_ATTENTION backend "
             "(memory-efficient, xFormers-style)", _sdpa("EFFICIENT_ATTENTION")),
    Provider("flex", "FlexAttention", "torch.compile(flex_attention); causal through a "
             "BlockMask built once per shape (eager on CPU)", _prepare_flex),
    Provider("math", "SDPA math", "torch SDPA, MATH backend (materialises the scores)",
             _sdpa("MATH"), _skip_math),
)}


# ------------------------------------------------------------------------------ timing, memory

@dataclass(frozen=True)
class Timing:
    ms: float  # median
    ms_q20: float
    ms_q80: float
    reps: int
    timer: str  # "do_bench" (CUDA events, L2 flushed) or "perf_counter" (CPU, no claims)


def _quantile(sorted_times: list[float], q: float) -> float:
    pos = q * (len(sorted_times) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_times[lo] + (pos - lo) * (sorted_times[hi] - sorted_times[lo])


def summarize(times_ms: list[float], timer: str) -> Timing:
    """Median and 20th/80th percentiles of a list of per-call times."""
    if not times_ms:
        raise ValueError("times_ms must not be empty")
    t = sorted(float(x) for x in times_ms)
    return Timing(statistics.median(t), _quantile(t, 0.2), _quantile(t, 0.8), len(t), timer)


_ALL: list[bool] = []


def _do_bench_returns_all() -> bool:
    """Whether this triton's do_bench has return_mode="all" (every call's time), asked once
    with an empty function rather than guessed from a version number."""
    if not _ALL:
        from triton.testing import do_bench

        try:
            out = do_bench(lambda: None, warmup=1, rep=1, return_mode="all")
            _ALL.append(len(out) >= 1)
        except (AssertionError, TypeError, ValueError):
            _ALL.append(False)
    return _ALL[0]


def time_call(fn: Callable[[], Any], *, warmup_ms: float, rep_ms: float,
              grad_to_none: list[torch.Tensor] | None = None, gpu: bool) -> Timing:
    """Time ``fn``: ``triton.testing.do_bench`` on a GPU (all per-call times, then the median);
    a plain CPU clock under the interpreter, where do_bench cannot run."""
    if gpu:
        from triton.testing import do_bench

        if not _do_bench_returns_all():  # an older triton: its own quantiles, count unknown
            q20, q50, q80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                     grad_to_none=grad_to_none, quantiles=[0.2, 0.5, 0.8])
            return Timing(q50, q20, q80, 0, "do_bench")
        times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none,
                         return_mode="all")
        return summarize(times.tolist() if hasattr(times, "tolist") else list(times),
                         "do_bench")
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        fn()
    times: list[float] = []
    stop = time.perf_counter() + rep_ms / 1e3
    while not times or (time.perf_counter() < stop and len(times) < 50):
        for g in grad_to_none or ():
            g.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize(times, "perf_counter")


def peak_memory(fn: Callable[[], Any], grads: list[torch.Tensor] | None = None) -> int:
    """Bytes allocated above what was live before one call of ``fn`` (CUDA caching allocator):
    everything the call creates, its output and gradients included."""
    for g in grads or ():
        g.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    for g in grads or ():
        g.grad = None
    return int(peak)


def measure_ceilings(dtypes: tuple[str, ...]) -> dict[str, Any]:
    """The two roofs, measured in this run with chapter 1's probes: an 8192^3 matmul per dtype
    (FLOP/s) and a 1 GiB device-to-device copy (read + write bytes per second)."""
    from flashtext import roofline

    matmul = {dt: roofline.measure_matmul((8192,), dtype=dt)[0]["flops"]
              for dt in dtypes if dt in ("float16", "bfloat16")}
    copy = roofline.measure_copy_bandwidth((2**30,))[0]["bandwidth"]
    torch.cuda.empty_cache()
    return {"matmul_flops": matmul, "copy_bandwidth": copy,
            "how": "8192^3 torch.matmul per dtype; 1 GiB dst.copy_(src), bytes = read + write; "
                   "medians of triton.testing.do_bench (flashtext.roofline)"}


def add_roofline(rows: list[dict[str, Any]], ceilings: dict[str, Any] | None) -> None:
    """Give every timed row its two roofline numbers, from the ceilings measured in the run:
    ``t_compute_ms`` = FLOPs / matmul FLOP/s, ``t_memory_ms`` = minimum bytes / copy
    bandwidth, ``bound`` (chapter 1's verdict, :class:`flashtext.roofline.Step`) and
    ``roof_fraction`` = the roofline's time over the measured time (1.0 = on the roof)."""
    from flashtext import roofline
    from flashtext.hardware import H200

    if not ceilings:
        return
    for r in rows:
        peak = ceilings["matmul_flops"].get(r["dtype"])
        if r["status"] != "ok" or not peak:
            continue
        gpu = dataclasses.replace(H200, name="measured ceilings", matmul_flops=peak,
                                  hbm_bandwidth=ceilings["copy_bandwidth"])
        step = roofline.Step(r["provider"], r["flops"], r["min_bytes"])
        r["t_compute_ms"] = r["flops"] / peak * 1e3
        r["t_memory_ms"] = r["min_bytes"] / ceilings["copy_bandwidth"] * 1e3
        r["bound"] = step.bound(gpu)
        r["roof_fraction"] = step.time(gpu) * 1e3 / r["ms"]


# ------------------------------------------------------------------------------ correctness

def reference_slices(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     do: torch.Tensor | None, causal: bool, scale: float
                     ) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """Float64 O (and dQ, dK, dV if ``do`` is given) for the first and the last (batch, head).

    Computed with SDPA's math backend in float64 on the GPU itself (a NumPy reference would take
    seconds per head at N = 16k); tests/test_bench.py checks it against flashtext.reference.
    Heads are independent, so a slice's gradients are exact, not approximations.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b_last, h_last = q.shape[0] - 1, q.shape[1] - 1
    out = {}
    for b, h in dict.fromkeys([(0, 0), (b_last, h_last)]):
        qs, ks, vs = (x[b:b + 1, h:h + 1].detach().double().requires_grad_(do is not None)
                      for x in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,
                                                                 scale=scale)
        entry = {"o": o.detach()}
        if do is not None:
            o.backward(do[b:b + 1, h:h + 1].double())
            entry.update(dq=qs.grad, dk=ks.grad, dv=vs.grad)
        out[(b, h)] = entry
        del qs, ks, vs, o
    return out


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|: 0 is exact, ~1 is garbage; inf if got is not finite."""
    got = got.detach().double()
    if not torch.isfinite(got).all():
        return math.inf
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def compare(ref: dict[tuple[int, int], dict[str, torch.Tensor]],
            got: dict[str, torch.Tensor]) -> dict[str, float]:
    """Scaled errors of each tensor in ``got`` (full (B, H, N, d) tensors) on the slices."""
    errors: dict[str, float] = {}
    for (b, h), entry in ref.items():
        for name, tensor in got.items():
            e = scaled_error(tensor[b:b + 1, h:h + 1], entry[name])
            errors[name] = max(errors.get(name, 0.0), e)
    return errors


# ------------------------------------------------------------------------------ the sweep

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


def _measure_mode(p: Prepared, cfg: Config, mode: str, inputs, ref, s: Settings,
                  st: _State, provider: str) -> dict[str, Any]:
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
    return _row(cfg, provider, mode, "ok", None, ms=timing.ms, ms_q20=timing.ms_q20,
                ms_q80=timing.ms_q80, reps=timing.reps, timer=timing.timer,
                tflops=tflops(cfg.flops(mode), timing.ms), **extra)


def _measure_provider(name: str, cfg: Config, inputs, ref, s: Settings, st: _State
                      ) -> list[dict[str, Any]]:
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
            rows.append(_measure_mode(prepared, cfg, mode, inputs, ref, s, st, name))
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
    for name in s.providers:
        if st.cuda_lost:
            rows += [_row(cfg, name, m, "skipped", "CUDA context lost after " + st.cuda_lost)
                     for m in s.modes]
            continue
        got = _measure_provider(name, cfg, inputs, ref, s, st)
        if ref_note:
            for r in got:
                r["check"] = ref_note
        rows += got
        _free(collect=any(r["status"] in ("oom", "error") for r in got))
    del inputs, ref
    _free(collect=True)
    return rows


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
