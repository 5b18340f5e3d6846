"""Search launch configurations of the attention kernels on a GPU and print the winners.

    python scripts/tune_kernels.py [--d 64 128] [--dtype fp16 bf16] [--n 4096] [--out NAME]

For each (dtype, head_dim, causal) it times every candidate configuration of the forward kernel
and of the two main backward kernels (dK/dV and dQ) at the benchmark's setting (batch * N = 16k
tokens, heads * d = 2048), and writes all timings to ``flashtext/data/<out>.json``. The table in
``flashtext/kernels/config.py`` is then written from these winners by hand, so tests and
notebooks never pay for autotuning. Compilation is done first, in parallel worker processes that
fill Triton's on-disk cache; timing then runs in one process, one kernel at a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

from flashtext.bench import tuning, workload  # noqa: E402


def _run(kernel: str, cfg, dtype: str, d: int, n: int, causal: bool, timed: bool):
    import torch
    import triton

    from flashtext.kernels import backward as bwd
    from flashtext.kernels import forward as fwd
    from flashtext.kernels.config import KernelConfig

    # a configuration that does not fit must fail here, not quietly run a smaller one
    KernelConfig.smaller = lambda self: None
    q, k, v, do = workload.inputs(dtype, d, n)
    scale = d ** -0.5
    config = KernelConfig(*cfg)
    if kernel == "fwd":
        def call():
            return fwd.forward(q, k, v, causal, scale, config=config)
    else:
        o, lse = fwd.forward(q, k, v, causal, scale)
        configs = {kernel: config}

        def call():
            return bwd.backward(do, q, k, v, o, lse, causal, scale, configs=configs)
    call()
    torch.cuda.synchronize()
    if not timed:
        return None
    return triton.testing.do_bench(call, warmup=25, rep=100)


def _compile_one(args):
    try:
        _run(*args, timed=False)
        return None
    except Exception as exc:  # a configuration that does not compile is simply not a candidate
        return f"{type(exc).__name__}: {str(exc)[:120]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtype", nargs="+", choices=sorted(workload.DTYPES), default=["fp16"])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--kernels", nargs="+", choices=tuning.KERNELS,
                        default=list(tuning.KERNELS))
    parser.add_argument("--causal", choices=["both", "true", "false"], default="both")
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    parser.add_argument("--out", default="tune_h200")
    parser.add_argument("--tma", choices=tuning.TMA_CHOICES, default="off",
                        help="tensor-descriptor loads: configs become (BM, BN, warps, stages, tma)")
    args = parser.parse_args()

    import torch

    from flashtext import cost, recorded

    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    jobs = [(kern, cfg, workload.DTYPES[dt], d, args.n, causal)
            for dt in args.dtype for d in args.d for causal in causals
            for kern in args.kernels for cfg in tuning.with_tma(tuning.candidates(kern, d),
                                                                 args.tma)]
    t0 = time.time()
    # compile in parallel (fills the on-disk cache; one CUDA context per worker process)
    import multiprocessing as mp

    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        errors = dict(zip(range(len(jobs)), pool.map(_compile_one, jobs), strict=True))
    print(f"compiled {len(jobs)} configurations in {time.time() - t0:.0f} s", flush=True)

    rows = []
    for idx, job in enumerate(jobs):
        kern, cfg, dtype, d, n, causal = job
        if errors[idx]:
            rows.append({"kernel": kern, "config": cfg, "dtype": dtype, "d": d, "n": n,
                         "causal": causal, "ms": None, "error": errors[idx]})
            continue
        ms = _run(*job, timed=True)
        batch, heads = workload.batch_heads(d, n)
        mode = "fwd" if kern == "fwd" else "bwd"
        tflops = cost.attention_flops(batch, heads, n, d, causal=causal, mode=mode) / ms / 1e9
        rows.append({"kernel": kern, "config": cfg, "dtype": dtype, "d": d, "n": n,
                     "causal": causal, "ms": ms, "tflops_of_whole_pass": tflops})
        torch.cuda.empty_cache()
    best = {}
    for r in rows:
        if r["ms"] is None:
            continue
        key = f"{r['kernel']} {r['dtype']} d={r['d']} causal={r['causal']}"
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    for key, r in sorted(best.items()):
        print(f"{key:40s} best {r['config']}  {r['ms']:.3f} ms", flush=True)
    recorded.save(args.out, {"n": args.n, "rows": rows, "best": best,
                             "seconds": round(time.time() - t0, 1)})
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
