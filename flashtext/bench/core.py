"""What one measurement is: the sweep's settings and configurations, timing, correctness.

One *configuration* is (dtype, head dim d, causal, sequence length N) at the setting of the H200
anchors: batch * N = 16384 tokens and heads * d = 2048, so every N does the same number of
tokens and the FLOPs grow linearly with N. For each configuration every *provider*
(:mod:`flashtext.bench.providers`) runs on the same fresh random inputs, is checked against a
float64 reference on a slice (:func:`reference_slices`), timed (:func:`time_call`: median of
``triton.testing.do_bench``), and has its peak memory measured around one call;
:mod:`flashtext.bench.sweep` runs them all and records why anything failed.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from flashtext import cost
from flashtext.bench.providers import FLEX_COMPILE, PROVIDERS

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "float16": "float16",
                 "bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32",
                 "float32": "float32"}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
MODES = ("fwd", "fwd_bwd")
# Scaled max error max|x - ref| / max|ref| allowed against the float64 reference. A correct
# kernel stays ~10x below these (fp16 ~1e-3, bf16 ~1e-2); a broken one lands near 1.
TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-2}
FULL_NS = (512, 1024, 2048, 4096, 8192, 16384)


# ------------------------------------------------------------------------------ settings

@dataclass(frozen=True)
class Settings:
    """What to measure and how. The defaults are the full H200 sweep (BENCHMARKS.md)."""

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
    # timed passes over a configuration's providers, each pass in another order; a row's
    # times are every call of every pass (1: each provider timed once, one after the other)
    rounds: int = 1
    # the extra rounds only where N <= this (None: every N): the short configurations are the
    # ones one pass times badly (the host's jitter is a large share of a call there), and the
    # long ones take most of a sweep's time
    rounds_max_n: int | None = None

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
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or self.rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {self.rounds!r}")
        if self.rounds_max_n is not None and (not isinstance(self.rounds_max_n, int)
                                              or isinstance(self.rounds_max_n, bool)
                                              or self.rounds_max_n < 1):
            raise ValueError(f"rounds_max_n must be None or an int >= 1, got "
                             f"{self.rounds_max_n!r}")
        if self.warmup_ms < 0 or self.rep_ms <= 0:
            raise ValueError(f"warmup_ms must be >= 0 and rep_ms > 0, got {self.warmup_ms}, "
                             f"{self.rep_ms}")

    def rounds_for(self, n: int) -> int:
        """How many timed passes a configuration of length ``n`` gets."""
        return self.rounds if self.rounds_max_n is None or n <= self.rounds_max_n else 1

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


# ------------------------------------------------------------------------------ timing, memory

@dataclass(frozen=True)
class Timing:
    ms: float  # median
    ms_q20: float
    ms_q80: float
    reps: int
    timer: str  # "do_bench" (CUDA events, L2 flushed) or "perf_counter" (CPU, no claims)
    times: tuple[float, ...] = ()  # every call's time, where the timer gives them


def _quantile(sorted_times: list[float], q: float) -> float:
    pos = q * (len(sorted_times) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_times[lo] + (pos - lo) * (sorted_times[hi] - sorted_times[lo])


def summarize(times_ms: list[float], timer: str) -> Timing:
    """Median and 20th/80th percentiles of a list of per-call times."""
    if not times_ms:
        raise ValueError("times_ms must not be empty")
    t = sorted(float(x) for x in times_ms)
    return Timing(statistics.median(t), _quantile(t, 0.2), _quantile(t, 0.8), len(t), timer,
                  tuple(t))


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


def host_and_gpu_ms(fn: Callable[[], Any], median_ms: float,
                    grads: list[torch.Tensor] | None = None,
                    window_ms: float = 30.0) -> tuple[float, float]:
    """(host ms, GPU ms) per call of ``fn`` over enough back-to-back calls to fill about
    ``window_ms`` of GPU time (5 to 50 calls; ``median_ms`` is do_bench's time of one).

    The host clock times the calls being queued (Python and launches; nothing waits for the
    GPU, whose queue holds far more than these calls). Then the same calls are queued behind a
    sleeping kernel that outlasts their queueing, with CUDA events around them, so the GPU runs
    them back to back: the kernels alone, without the host and without do_bench's L2 flush.
    Where do_bench's time is well above the GPU's, the GPU waited for the host."""
    calls = max(5, min(50, int(window_ms / max(median_ms, 1e-3))))

    def queue() -> None:
        for _ in range(calls):
            for g in grads or ():
                g.grad = None
            fn()

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    queue()
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(1.5 * host_s * 2e9) + 1_000_000)  # ~2 GHz: 1.5x the queueing
    start.record()
    queue()
    end.record()
    torch.cuda.synchronize()
    for g in grads or ():
        g.grad = None
    return host_s * 1e3 / calls, start.elapsed_time(end) / calls


def clock_fields(fn: Callable[[], Any], median_ms: float,
                 grads: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """A GPU row's ``host_ms`` and ``gpu_ms`` (:func:`host_and_gpu_ms`), or ``clocks_error``
    saying why they could not be measured: never fatal, the row's timing stands without them."""
    try:
        host_ms, gpu_ms = host_and_gpu_ms(fn, median_ms, grads)
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"clocks_error": f"{type(exc).__name__}: {first}"}
    return {"host_ms": round(host_ms, 4), "gpu_ms": round(gpu_ms, 4)}


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
