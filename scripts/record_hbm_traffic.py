"""Measure the DRAM bytes that naive attention and a flash kernel actually move (chapter 6).

    python scripts/record_hbm_traffic.py    # on a CUDA GPU -> flashtext/data/hbm_traffic.json

Naive attention is three PyTorch ops, each its own kernel(s): S = Q K^T (Q pre-scaled by 1/sqrt(d)
outside the measured region), P = softmax(S), O = P V. The flash kernel is PyTorch SDPA forced onto
its FLASH_ATTENTION backend (FlashAttention-2). Bytes come from Nsight Compute's DRAM counters
(dram__bytes_read.sum, dram__bytes_write.sum, plus L2 traffic lts__t_bytes.sum when the metric
exists), summed over every kernel each configuration launches. The script runs itself once under
``ncu --profile-from-start off`` as a driver that opens the profiler only around the measured calls,
each configuration on its own CUDA stream so the kernels can be grouped afterwards.

ncu flushes the caches before each profiled kernel (its default --cache-control all), so each
kernel starts with a cold L2: reads of S and P by the next kernel come from DRAM, as they would for
tensors much larger than L2. A kernel's writes still sitting dirty in L2 when it ends are not
counted; that undercount is at most the L2 size (~50 MB) per kernel, which is why the shapes are
chosen large. Wall-clock times come from a separate run without ncu (CUDA events, median of 20).

If ncu cannot be found or cannot read the counters (permissions, a virtual machine), the JSON says
so in ``ncu.ok``/``ncu.error`` and keeps the timings: nothing is invented. Runtime < 2 min on an
H200.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

from flashtext.bench import ncu as nsight  # noqa: E402

BATCH, HEADS = 4, 16
CONFIGS = [(impl, n, d) for d in (64, 128) for n in (1024, 2048, 4096, 8192)
           for impl in ("naive", "flash")]
METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
OPTIONAL_METRICS = ["lts__t_bytes.sum"]


def _require_cuda():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("record_hbm_traffic.py measures a CUDA GPU; this machine has none. "
                         "The chapter shows the recorded H200 results instead.")
    return torch


def _inputs(torch, n: int, d: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (BATCH, HEADS, n, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    return q * d**-0.5, k, v  # the scale is folded into Q before anything is measured


def _run(torch, impl: str, q, k, v):
    if impl == "naive":
        s = torch.matmul(q, k.transpose(-2, -1))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, v)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)


def driver() -> None:
    """Runs under ncu: warm every configuration up, then profile exactly one call of each."""
    torch = _require_cuda()
    order = []
    for impl, n, d in CONFIGS:
        q, k, v = _inputs(torch, n, d)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            _run(torch, impl, q, k, v)  # warm-up: cuBLAS handles, heuristics, lazy loading
            stream.synchronize()
            torch.cuda.profiler.start()
            _run(torch, impl, q, k, v)
            stream.synchronize()
            torch.cuda.profiler.stop()
        order.append({"impl": impl, "n": n, "d": d})
        del q, k, v
        torch.cuda.empty_cache()
    nsight.announce_order(order)


def time_configs(torch) -> dict[tuple[str, int, int], float]:
    out = {}
    for impl, n, d in CONFIGS:
        q, k, v = _inputs(torch, n, d)
        for _ in range(3):
            _run(torch, impl, q, k, v)
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            _run(torch, impl, q, k, v)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
        out[(impl, n, d)] = sorted(times)[len(times) // 2]
        del q, k, v
        torch.cuda.empty_cache()
    return out


def run_ncu(ncu: str) -> dict:
    """This script as the driver under ncu. Falls back step by step: without the optional L2
    metric, then without --print-units (older ncu; the unit row is converted instead)."""
    driver = [sys.executable, str(Path(__file__).resolve()), "--driver"]
    attempts = [(METRICS + OPTIONAL_METRICS, ["--print-units", "base"]),
                (METRICS, ["--print-units", "base"]), (METRICS, [])]
    return nsight.profile(ncu, driver, attempts, options=["--clock-control", "none"],
                          timeout=200)


def measure() -> dict:
    """Time every configuration, then count its DRAM bytes under ncu; returns the payload.

    Also used live by chapter 6 on a GPU (it loads this file and calls ``measure()``).
    """
    torch = _require_cuda()
    t0 = time.time()
    timings = time_configs(torch)
    ncu = nsight.find_ncu()
    result = {"ok": False, "error": "ncu not found (PATH, /opt/nvidia/nsight-compute/*, "
                                    "/usr/local/cuda*/bin)"} if ncu is None else run_ncu(ncu)
    rows = []
    grouped = None
    if result["ok"]:
        try:
            grouped = nsight.group_by_stream(result["kernels"], len(CONFIGS))
        except ValueError as exc:
            result = {**result, "ok": False, "error": f"{exc}; raw kernels kept"}
    for idx, (impl, n, d) in enumerate(CONFIGS):
        row = {"impl": impl, "n": n, "d": d, "batch": BATCH, "heads": HEADS,
               "bytes_per_element": 2, "seconds": timings[(impl, n, d)]}
        if grouped is not None:
            ks = grouped[idx]
            row["kernels"] = [k["kernel"][:80] for k in ks]
            for m in result["metrics"]:
                row[m] = sum(k.get(m, 0.0) for k in ks)
        rows.append(row)
    ncu_info = {k: v for k, v in result.items() if k != "kernels" or grouped is None}
    if ncu is not None:
        ncu_info["path"] = ncu
        ncu_info["version"] = nsight.ncu_version(ncu)
    return {
        "what": "DRAM bytes moved by one forward attention call, summed over its kernels",
        "naive": "torch.matmul(Q, K^T) -> torch.softmax -> torch.matmul(P, V), fp16, Q pre-scaled",
        "flash": "torch SDPA with SDPBackend.FLASH_ATTENTION (FlashAttention-2), fp16",
        "ncu": ncu_info,
        "rows": rows,
        "total_seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    from flashtext import recorded

    payload = measure()
    out = recorded.save("hbm_traffic", payload)
    print(f"wrote {out} in {payload['total_seconds']} s; ncu ok: {payload['ncu']['ok']}")
    for r in payload["rows"]:
        extra = "" if "dram__bytes_read.sum" not in r else (
            f" read {r['dram__bytes_read.sum'] / 1e6:10.1f} MB"
            f" write {r['dram__bytes_write.sum'] / 1e6:10.1f} MB")
        print(f"{r['impl']:6s} N={r['n']:5d} d={r['d']:3d} {r['seconds'] * 1e3:8.3f} ms{extra}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", action="store_true", help="internal: the profiled program")
    if parser.parse_args().driver:
        driver()
    else:
        main()
