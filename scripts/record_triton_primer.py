"""Time chapter 9's three kernels on a CUDA GPU and store the result for readers without one.

    python scripts/record_triton_primer.py          # flashtext/data/triton_primer_<gpu>.json
    python scripts/record_triton_primer.py --quick  # smaller sizes, print only

What it records (medians of ``triton.testing.do_bench``, fresh inputs per size):

* ``add``: vector add, fp32, n = 2^20 ... 2^28, ours (BLOCK=1024) and ``x + y``; GB/s counts the
  minimum traffic, 3 * 4 * n bytes (read x, read y, write out).
* ``softmax``: rows x cols fp32 (4096 rows, 256 ... 4096 columns): ours (one read, one write),
  ``torch.softmax`` (also fused) and PyTorch op by op (max, subtract, exp, sum, divide: five
  kernels, about four times the traffic); GB/s counts the fused minimum, 2 * 4 * rows * cols.
* ``matmul``: fp16 4096^3: our pointer kernel and our descriptor kernel at 128 x 128 x 64 tiles
  (8 warps, 3 stages) and at the chapter's 32 x 32 x 32, and ``torch.matmul`` (cuBLAS).

About a minute on an H200. Without CUDA it stops with a message: nothing is invented.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))


def _ms(fn) -> float:
    import triton

    return float(triton.testing.do_bench(fn, return_mode="median"))


def measure(quick: bool, log=print) -> dict:
    import torch
    import triton

    from flashtext.kernels import primer

    start = time.perf_counter()
    out: dict = {"add": [], "softmax": [], "matmul": []}
    for p in ([20, 24] if quick else [20, 22, 24, 26, 28]):
        n = 2**p
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        res = torch.empty_like(x)
        grid = (triton.cdiv(n, 1024),)
        ours = _ms(lambda x=x, y=y, res=res, grid=grid, n=n:
                   primer.add_kernel[grid](x, y, res, n, BLOCK=1024))
        torch_ms = _ms(lambda x=x, y=y: x + y)
        assert torch.equal(primer.add(x, y, block=1024), x + y)
        gbs = lambda ms, n=n: 12 * n / ms / 1e6  # noqa: E731
        out["add"].append({"n": n, "ours_ms": ours, "torch_ms": torch_ms,
                           "ours_GBps": gbs(ours), "torch_GBps": gbs(torch_ms)})
        log(f"add n=2^{p}: ours {gbs(ours):.0f} GB/s, torch {gbs(torch_ms):.0f} GB/s")
        del x, y, res

    rows = 4096
    for cols in ([256, 1024] if quick else [256, 512, 1024, 2048, 4096]):
        x = torch.randn(rows, cols, device="cuda")

        def naive(x=x):
            m = x.max(dim=1, keepdim=True).values
            e = torch.exp(x - m)
            return e / e.sum(dim=1, keepdim=True)

        torch.testing.assert_close(primer.softmax(x), torch.softmax(x, dim=1))
        t = {"ours": _ms(lambda x=x: primer.softmax(x)),
             "torch_softmax": _ms(lambda x=x: torch.softmax(x, dim=1)),
             "torch_op_by_op": _ms(naive)}
        gb = 8 * rows * cols / 1e9
        row = {"rows": rows, "cols": cols, **{f"{k}_ms": v for k, v in t.items()},
               **{f"{k}_GBps": gb / (v / 1e3) for k, v in t.items()}}
        out["softmax"].append(row)
        log(f"softmax {rows}x{cols}: " + ", ".join(f"{k} {gb / (v / 1e3):.0f} GB/s"
                                                  for k, v in t.items()))

    n = 2048 if quick else 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    flops = 2 * n**3
    primer._ensure_allocator()
    results = {}
    for name, kernel, (bm, bn, bk, warps, stages) in (
            ("ours_pointers_128x128x64", primer.matmul_kernel, (128, 128, 64, 8, 3)),
            ("ours_descriptors_128x128x64", primer.matmul_descriptor_kernel,
             (128, 128, 64, 8, 3)),
            ("ours_pointers_32x32x32", primer.matmul_kernel, (32, 32, 32, 4, 2))):
        grid = (triton.cdiv(n, bm), triton.cdiv(n, bn))
        if kernel is primer.matmul_kernel:
            args = (a, b, c, n, n, n, *a.stride(), *b.stride(), *c.stride())
        else:
            args = (a, b, c, n, n, n, a.stride(0), b.stride(0), c.stride(0))

        def run(kernel=kernel, grid=grid, args=args, bm=bm, bn=bn, bk=bk, warps=warps,
                stages=stages):
            kernel[grid](*args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, INPUT_PRECISION="tf32",
                         num_warps=warps, num_stages=stages)

        run()
        torch.testing.assert_close(c.float(), (a @ b).float(), atol=0.5, rtol=1e-2)
        results[name] = flops / (_ms(run) / 1e3) / 1e12
    results["torch_cublas"] = flops / (_ms(lambda: a @ b) / 1e3) / 1e12
    out["matmul"] = {"n": n, "dtype": "float16", "TFLOPs": results}
    log(f"matmul fp16 {n}^3 TFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in results.items()))
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, print, do not save")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("record_triton_primer.py times kernels on a CUDA GPU and this machine "
                         "has none. Chapter 9 shows the recorded H200 results instead.")
    import flashtext  # noqa: F401  (before triton: decides compiled vs interpreter)
    from flashtext import recorded

    payload = measure(args.quick, log=lambda *a: print(*a, flush=True))
    print(f"done in {payload['seconds']} s")
    if args.quick:
        return
    gpu = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(0).lower().replace("nvidia", ""))
    name = "triton_primer_" + gpu.strip("_").split("_")[0]
    print("wrote", recorded.save(name, payload, measured=("flashtext.kernels.primer",)))


if __name__ == "__main__":
    main()
