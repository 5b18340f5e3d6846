"""The roofline model for attention, and the GPU measurements chapter 1 shows.

Analytic part (NumPy only): the three steps of standard attention as (FLOPs, bytes) pairs, their
arithmetic intensity, and the time the roofline predicts on a :class:`flashtext.hardware.GPU`:

    attainable FLOP/s = min(peak FLOP/s, bandwidth * intensity),   ridge = peak / bandwidth.

Measurement part (CUDA only, used live by chapter 1 on a GPU and by
``scripts/record_memory_wall.py`` to record the H200 numbers shown on a CPU): copy bandwidth,
read bandwidth against buffer size (L2 vs HBM), matmul throughput, the time split of naive
attention (matmul, softmax, matmul) next to PyTorch's fused FlashAttention-2 backend, and the
softmax alone next to a one-pass Triton softmax and a copy of the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flashtext.cost import attention_flops, standard_attention_hbm_elements
from flashtext.hardware import GPU

# Operations per score in the softmax step: compare (max), subtract, exp, add (sum), divide.
SOFTMAX_OPS_PER_SCORE = 5


@dataclass(frozen=True)
class Step:
    """One kernel of a computation: its FLOPs, its HBM bytes, and which units do its math."""

    name: str
    flops: float
    bytes: float
    unit: str = "tensor"  # "tensor" (matmul peak) or "vector" (non-matmul fp32 peak)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte of HBM traffic."""
        return self.flops / self.bytes

    def peak(self, gpu: GPU) -> float:
        return gpu.matmul_flops if self.unit == "tensor" else gpu.fp32_flops

    def ridge(self, gpu: GPU) -> float:
        return self.peak(gpu) / gpu.hbm_bandwidth

    def attainable(self, gpu: GPU) -> float:
        """FLOP/s the roofline allows this step: min(peak, bandwidth * intensity)."""
        return attainable(gpu, self.intensity, self.peak(gpu))

    def time(self, gpu: GPU) -> float:
        """Roofline time in seconds: the slower of doing the math and moving the bytes."""
        return max(self.flops / self.peak(gpu), self.bytes / gpu.hbm_bandwidth)

    def bound(self, gpu: GPU) -> str:
        return "memory" if self.intensity < self.ridge(gpu) else "compute"


def attainable(gpu: GPU, intensity, peak: float | None = None):
    """The roofline: min(peak, HBM bandwidth * intensity), FLOP/s (works on arrays)."""
    peak = gpu.matmul_flops if peak is None else peak
    return np.minimum(peak, gpu.hbm_bandwidth * np.asarray(intensity, dtype=np.float64))


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def standard_attention_steps(batch: int, heads: int, n: int, d: int,
                             bytes_per_element: int = 2) -> list[Step]:
    """The three kernels of standard attention (FA1's Algorithm 0), forward, no mask/dropout.

    1. S = Q K^T: 2 N^2 d FLOPs, reads Q, K and writes S.
    2. P = softmax(S): SOFTMAX_OPS_PER_SCORE FLOPs per score, reads S and writes P.
    3. O = P V: 2 N^2 d FLOPs, reads P, V and writes O.
    HBM elements per head come from :func:`flashtext.cost.standard_attention_hbm_elements`.
    """
    _check_sizes(batch=batch, heads=heads, n=n, d=d, bytes_per_element=bytes_per_element)
    bh = batch * heads
    elements = standard_attention_hbm_elements(n, d)
    matmul = attention_flops(batch, heads, n, d) / 2  # each of the two matmuls
    flops = {"S = QK^T": matmul, "P = softmax(S)": SOFTMAX_OPS_PER_SCORE * bh * n * n,
             "O = PV": matmul}
    units = {"S = QK^T": "tensor", "P = softmax(S)": "vector", "O = PV": "tensor"}
    return [Step(name, flops[name], bh * count * bytes_per_element, units[name])
            for name, count in elements.items()]


def fused_attention_step(batch: int, heads: int, n: int, d: int,
                         bytes_per_element: int = 2) -> Step:
    """Attention as one ideal fused kernel: HBM sees only Q, K, V read once and O written once
    (4 N d elements per head); S and P never leave the chip. FLOPs are the benchmark convention
    4 B H N^2 d (the two matmuls; the softmax's exps are chapter 13's concern)."""
    _check_sizes(batch=batch, heads=heads, n=n, d=d, bytes_per_element=bytes_per_element)
    return Step("fused (ideal)", attention_flops(batch, heads, n, d),
                4 * batch * heads * n * d * bytes_per_element)


def roofline_table(steps: list[Step], gpu: GPU) -> list[dict[str, Any]]:
    """One row per step: FLOPs, bytes, intensity, bound, roofline time (ms) and its share."""
    total = sum(s.time(gpu) for s in steps)
    return [{"step": s.name, "GFLOP": s.flops / 1e9, "GB": s.bytes / 1e9,
             "FLOP/byte": s.intensity, "bound": s.bound(gpu), "ms": s.time(gpu) * 1e3,
             "share": s.time(gpu) / total} for s in steps]


# ------------------------------------------------------------------------ measurements (CUDA)

def _torch_cuda():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("this measurement needs a CUDA GPU; on a CPU the chapters show "
                           "results recorded on an H200 (flashtext.recorded)")
    return torch


def _bench(fn) -> float:
    """Median milliseconds of ``fn`` (triton's do_bench, which also flushes L2 between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, return_mode="median"))


def device_properties() -> dict[str, Any]:
    """What the CUDA driver reports about GPU 0 (sizes in bytes)."""
    torch = _torch_cuda()
    p = torch.cuda.get_device_properties(0)
    keys = ("name", "multi_processor_count", "total_memory", "L2_cache_size",
            "shared_memory_per_multiprocessor", "shared_memory_per_block_optin",
            "regs_per_multiprocessor", "max_threads_per_multi_processor", "warp_size")
    out = {k: getattr(p, k) for k in keys if hasattr(p, k)}
    out["capability"] = f"{p.major}.{p.minor}"
    return out


def measure_copy_bandwidth(sizes_bytes: tuple[int, ...] = (2**26, 2**28, 2**30, 2**32)
                           ) -> list[dict[str, float]]:
    """Device-to-device copy ``dst.copy_(src)``: bytes moved = read + write = 2 * size."""
    torch = _torch_cuda()
    rows = []
    for size in sizes_bytes:
        src = torch.empty(size, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        ms = _bench(lambda dst=dst, src=src: dst.copy_(src))
        rows.append({"bytes": size, "ms": ms, "bandwidth": 2 * size / (ms * 1e-3)})
        del src, dst
        torch.cuda.empty_cache()
    return rows


_READ_KERNEL = None


def _read_kernel():
    """A Triton kernel that reads a buffer over and over (L2-only loads, ``.cg``): when the
    buffer fits in L2 it measures L2 bandwidth, when it does not, HBM bandwidth."""
    global _READ_KERNEL
    if _READ_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def read_sweep(x_ptr, out_ptr, n_chunks, iters, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            nprog = tl.num_programs(0)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for i in range(iters):
                chunk = (pid + i * nprog) % n_chunks
                offs = chunk * BLOCK + tl.arange(0, BLOCK)
                acc += tl.load(x_ptr + offs, cache_modifier=".cg")
            tl.store(out_ptr + pid, tl.sum(acc, axis=0))

        _READ_KERNEL = read_sweep
    return _READ_KERNEL


READ_BLOCK = 2048  # fp32 elements per load per program (8 KiB)


def read_sweep(x, programs: int, iters: int):
    """Launch the read kernel on a flat fp32 tensor ``x`` (length a multiple of READ_BLOCK).
    Returns per-program sums (so the loads cannot be optimised away; tests check them)."""
    import torch

    if x.dtype != torch.float32 or x.ndim != 1 or x.numel() % READ_BLOCK:
        raise ValueError(f"x must be a flat float32 tensor with a multiple of {READ_BLOCK} "
                         f"elements, got {tuple(x.shape)} {x.dtype}")
    out = torch.empty(programs, dtype=torch.float32, device=x.device)
    _read_kernel()[(programs,)](x, out, x.numel() // READ_BLOCK, iters, BLOCK=READ_BLOCK,
                                num_warps=8)
    return out


def measure_read_bandwidth(sizes_bytes: tuple[int, ...], total_bytes: float = 2**33
                           ) -> list[dict[str, float]]:
    """Read bandwidth against buffer size: each point reads ~``total_bytes`` from a buffer of
    the given size, cycling over it (one persistent wave of programs, 8 per SM)."""
    torch = _torch_cuda()
    programs = 8 * torch.cuda.get_device_properties(0).multi_processor_count
    chunk_bytes = READ_BLOCK * 4
    rows = []
    for size in sizes_bytes:
        n_chunks = max(1, size // chunk_bytes)
        x = torch.ones(n_chunks * READ_BLOCK, dtype=torch.float32, device="cuda")
        iters = max(1, int(total_bytes // (programs * chunk_bytes)))
        ms = _bench(lambda x=x, iters=iters: read_sweep(x, programs, iters))
        moved = programs * iters * chunk_bytes
        rows.append({"bytes": n_chunks * chunk_bytes, "ms": ms, "bytes_read": moved,
                     "bandwidth": moved / (ms * 1e-3)})
        del x
        torch.cuda.empty_cache()
    return rows


def measure_matmul(sizes: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192),
                   dtype: str = "bfloat16", tf32: bool = False) -> list[dict[str, float]]:
    """Square n x n x n matmuls: 2 n^3 FLOPs; intensity n^3 * 2 / (3 n^2 * bytes) at best."""
    torch = _torch_cuda()
    dt = getattr(torch, dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    rows = []
    try:
        for n in sizes:
            g = torch.Generator(device="cuda").manual_seed(n)
            a = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
            b = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
            ms = _bench(lambda a=a, b=b: a @ b)
            size = a.element_size()
            rows.append({"n": n, "dtype": dtype, "tf32": tf32, "ms": ms,
                         "flops": 2.0 * n**3 / (ms * 1e-3),
                         "intensity": 2.0 * n**3 / (3 * n * n * size)})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return rows


def measure_exp(elements: int = 2**28, dtype: str = "bfloat16") -> dict[str, float]:
    """An elementwise exp over a large tensor: 1 op per element, reads and writes each once."""
    torch = _torch_cuda()
    x = torch.randn(elements, device="cuda", dtype=getattr(torch, dtype))
    y = torch.empty_like(x)
    ms = _bench(lambda: torch.exp(x, out=y))
    moved = 2 * elements * x.element_size()
    return {"elements": elements, "dtype": dtype, "ms": ms, "flops": elements / (ms * 1e-3),
            "bandwidth": moved / (ms * 1e-3), "intensity": elements / moved}


def measure_naive_attention(batch: int, heads: int, n: int, d: int) -> dict[str, float]:
    """Time each kernel of naive attention in fp16 (S = Q K^T, P = softmax(S), O = P V), the
    three in sequence, and PyTorch's fused FLASH_ATTENTION backend on the same inputs.
    Q is pre-scaled by 1/sqrt(d) so the three kernels are exactly the three steps."""
    torch = _torch_cuda()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(n * 1000 + d)
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    q = q * d**-0.5
    kt = k.transpose(-1, -2)
    s = q @ kt
    p = torch.softmax(s, dim=-1)
    row = {"batch": batch, "heads": heads, "N": n, "d": d,
           "S = QK^T": _bench(lambda: torch.matmul(q, kt, out=s)),
           "P = softmax(S)": _bench(lambda: torch.softmax(s, dim=-1)),
           "O = PV": _bench(lambda: p @ v)}
    row["naive total"] = _bench(lambda: torch.softmax(q @ kt, dim=-1) @ v)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            f = torch.nn.functional.scaled_dot_product_attention
            row["sdpa flash"] = _bench(lambda: f(q, k, v, scale=1.0))
            err = (f(q, k, v, scale=1.0).float() - (p @ v).float()).abs().max().item()
        row["max |flash - naive|"] = err
    except RuntimeError as exc:  # backend unavailable for this shape/GPU: say so, invent nothing
        row["sdpa flash"] = None
        row["sdpa flash error"] = str(exc).splitlines()[0]
    row["score bytes"] = batch * heads * n * n * 2
    return row  # the caller may torch.cuda.empty_cache() once these tensors are gone


def cuda_kernel_names(fn) -> list[str]:
    """The CUDA kernels ``fn`` launches (torch.profiler), so a recording names what it timed."""
    torch = _torch_cuda()
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return sorted({e.name for e in prof.events() if getattr(e, "device_type", None) == cuda})


def measure_softmax_kernels(batch: int, heads: int, n: int) -> dict[str, Any]:
    """Why is ``torch.softmax`` over rows of N fp16 scores slower than its bytes? On one S of
    shape (batch, heads, N, N), the same bytes three ways: ``torch.softmax`` (naive attention's
    second kernel), chapter 9's one-pass Triton softmax (one program per row, the row read once
    and written once, :func:`flashtext.kernels.primer.softmax`), and a plain copy of S (read
    and write, no arithmetic). Also the CUDA kernel ``torch.softmax`` launches. TB/s count the
    4 bytes per score the roofline counts (read S, write P)."""
    torch = _torch_cuda()
    from flashtext.kernels import primer

    _check_sizes(batch=batch, heads=heads, n=n)
    g = torch.Generator(device="cuda").manual_seed(n)
    s = torch.randn(batch, heads, n, n, device="cuda", dtype=torch.float16, generator=g)
    rows = s.view(-1, n)
    dst = torch.empty_like(s)
    sample = rows[:256]
    torch.testing.assert_close(primer.softmax(sample), torch.softmax(sample, dim=-1))
    moved = 2 * s.numel() * s.element_size()
    row: dict[str, Any] = {"batch": batch, "heads": heads, "N": n, "bytes": moved}
    for name, fn in (("torch.softmax", lambda: torch.softmax(s, dim=-1)),
                     ("triton one-pass softmax", lambda: primer.softmax(rows)),
                     ("copy", lambda: dst.copy_(s))):
        ms = _bench(fn)
        row[f"{name} ms"] = ms
        row[f"{name} TB/s"] = moved / (ms * 1e-3) / 1e12
    row["torch.softmax kernels"] = cuda_kernel_names(lambda: torch.softmax(s, dim=-1))
    return row


SOFTMAX_SIZES = (512, 1024, 2048, 4096, 8192)  # rows of N scores, batch * N = 65536, 16 heads


def measure_softmax_sweep(quick: bool = False, log=print) -> list[dict[str, Any]]:
    """:func:`measure_softmax_kernels` over chapter 1's N (two of them when ``quick``)."""
    torch = _torch_cuda()
    rows = []
    for n in ((1024, 4096) if quick else SOFTMAX_SIZES):
        rows.append(measure_softmax_kernels(65536 // n, 16, n))
        torch.cuda.empty_cache()
        log("softmax:", rows[-1])
    return rows


MiB = 2**20


def measure_memory_wall(quick: bool = False, log=print) -> dict[str, Any]:
    """Every chapter-1 measurement, as one payload (what ``scripts/record_memory_wall.py``
    stores, and what chapter 1 measures live on a GPU with ``quick=True`` in ~20 s)."""
    import time

    torch = _torch_cuda()
    start = time.perf_counter()
    payload: dict[str, Any] = {"device": device_properties(), "quick": quick}
    log("device:", payload["device"])
    payload["copy"] = measure_copy_bandwidth(
        (256 * MiB,) if quick else (64 * MiB, 256 * MiB, 1024 * MiB, 4096 * MiB))
    log("copy:", [f"{r['bandwidth'] / 1e12:.2f} TB/s" for r in payload["copy"]])
    sweep = (1, 4, 16, 32, 64, 256, 1024) if quick else (
        1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 1024, 4096)
    payload["read_sweep"] = measure_read_bandwidth(tuple(s * MiB for s in sweep),
                                                   total_bytes=2**32 if quick else 2**33)
    log("read:", [(r["bytes"] // MiB, round(r["bandwidth"] / 1e12, 2))
                  for r in payload["read_sweep"]])
    sizes = (512, 2048, 8192) if quick else (256, 512, 1024, 2048, 4096, 8192)
    payload["matmul"] = measure_matmul(sizes, "bfloat16")
    if not quick:
        payload["matmul"] += measure_matmul((8192,), "float16")
        payload["matmul"] += measure_matmul((8192,), "float32", tf32=True)
    payload["matmul"] += measure_matmul((8192,), "float32", tf32=False)
    log("matmul:", [(r["n"], r["dtype"], r["tf32"], round(r["flops"] / 1e12, 1))
                    for r in payload["matmul"]])
    payload["exp"] = measure_exp(2**26 if quick else 2**28)
    log("exp:", payload["exp"])
    configs = ([(64, 1024), (64, 4096)] if quick else
               [(d, n) for d in (64, 128) for n in (512, 1024, 2048, 4096, 8192)])
    payload["attention"] = []
    for d, n in configs:
        row = measure_naive_attention(65536 // n, 16, n, d)
        payload["attention"].append(row)
        torch.cuda.empty_cache()
        log("attention:", row)
    payload["softmax"] = measure_softmax_sweep(quick, log)  # vs a one-pass kernel and a copy
    payload["seconds"] = round(time.perf_counter() - start, 1)
    return payload
