"""Where the time of one forward + backward goes, kernel by kernel (torch.profiler, CUDA).

    python scripts/profile_kernels.py [--d 128] [--n 4096] [--dtype fp16] [--json PATH]

The benchmark's setting (batch * N = 16k tokens, heads * d = 2048), both masks. Prints the
mean device time of each kernel per call and the wall time of a call (CUDA events); kernels on
different streams may overlap, so their sum can exceed the wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

from flashtext.bench import workload  # noqa: E402


def profile_one(d: int, n: int, dtype: str, causal: bool, calls: int = 10) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    call = workload.attention_call(workload.DTYPES[dtype], d, n, causal)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    wall_ms = start.elapsed_time(end) / calls
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us:
            kernels[e.key] = round(us / calls / 1000, 4)
    return {"d": d, "n": n, "dtype": dtype, "causal": causal, "wall_ms": round(wall_ms, 4),
            "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--n", type=int, nargs="+", default=[4096])
    ap.add_argument("--dtype", choices=sorted(workload.DTYPES), default="fp16")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    rows = [profile_one(d, n, args.dtype, causal)
            for d in args.d for n in args.n for causal in (False, True)]
    for r in rows:
        print(f"d={r['d']} N={r['n']} causal={r['causal']}: {r['wall_ms']:.3f} ms per call")
        for name, ms in r["kernels_ms"].items():
            print(f"    {ms:8.3f} ms  {name[:90]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
