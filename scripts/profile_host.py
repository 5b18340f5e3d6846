"""Host (CPU) time per call against GPU time per call, by how the kernels load their tiles.

    python scripts/profile_host.py [--d 128] [--n 512 4096] [--dtype fp16] [--json PATH]
                                   [--cprofile N] [--name host_h200]

A call is *host-bound* when Python and the launcher take longer to enqueue its kernels than the
GPU takes to run them: the GPU then waits, and a benchmark that times the call measures the host.
For each configuration this enqueues ``calls`` calls back to back and reads two clocks: the
host's (``perf_counter`` until the last call returns, before any synchronisation) and the GPU's
(CUDA events around the same calls). ``--cprofile N`` also prints the N most expensive functions
(cumulative) of the host side of one fwd+bwd at the first N and d, descriptors on.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tune_kernels: the inputs
sys.path.append(str(Path(__file__).resolve().parents[1]))

import tune_kernels  # noqa: E402

VARIANTS = ("descriptors", "pointers")


def _set_loads(variant: str) -> None:
    """Tile loads of every kernel's tuned configuration: tensor descriptors where the layout
    allows (the library's default) or pointers everywhere."""
    from flashtext.kernels import _config

    if not hasattr(_set_loads, "saved"):
        _set_loads.saved = dict(_config.TUNED)
    for key, cfg in _set_loads.saved.items():
        _config.TUNED[key] = dataclasses.replace(cfg, tma=cfg.tma and variant != "pointers")


def measure(call, calls: int = 50) -> dict:
    """Host ms and GPU ms per call over ``calls`` back-to-back calls.

    The host clock is read first, with the GPU free to keep up. For the GPU clock the same calls
    are queued behind a sleeping kernel long enough to hide the host's enqueueing, so the events
    time the kernels alone, back to back."""
    import torch

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host_ms = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2 * host_ms * calls * 2e6))  # ~2 GHz: twice the host's time
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end) / calls
    return {"host_ms": round(host_ms, 4), "gpu_ms": round(gpu_ms, 4),
            "host_bound": host_ms > 0.9 * gpu_ms}


def host_profile(call, top: int) -> str:
    import torch

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        call()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--n", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--cprofile", type=int, default=0, metavar="N")
    ap.add_argument("--name", default=None,
                    help="save the rows as flashtext/data/NAME.json (e.g. host_h200)")
    args = ap.parse_args()
    dtype = tune_kernels.DTYPES[args.dtype]
    rows = []
    for variant in args.variants:
        _set_loads(variant)
        for d in args.d:
            for n in args.n:
                for causal in (False, True):
                    for mode in ("fwd", "fwd_bwd"):
                        call = tune_kernels.attention_call(dtype, d, n, causal, mode)
                        r = measure(call, args.calls)
                        r.update(loads=variant, d=d, n=n, causal=causal, mode=mode)
                        rows.append(r)
                        print(f"{variant:11} d={d} N={n:5} causal={causal!s:5} {mode:7}: host "
                              f"{r['host_ms']:.3f} ms, GPU {r['gpu_ms']:.3f} ms per call"
                              + ("  HOST-BOUND" if r["host_bound"] else ""), flush=True)
    if args.cprofile:
        _set_loads("descriptors")
        print(host_profile(tune_kernels.attention_call(dtype, args.d[0], args.n[0], True),
                           args.cprofile))
    if args.name:
        from flashtext import recorded

        print("saved", recorded.save(args.name, {
            "kind": "host_vs_gpu", "argv": sys.argv[1:], "calls": args.calls,
            "what": "host ms = Python + launch time per call, enqueued back to back; GPU ms = "
                    "the same calls queued behind a sleeping kernel (kernels alone)",
            "rows": rows}))


if __name__ == "__main__":
    main()
