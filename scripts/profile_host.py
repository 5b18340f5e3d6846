"""Host (CPU) time per call against GPU time per call, by how the kernels load their tiles.

    python scripts/profile_host.py [--d 128] [--n 512 4096] [--dtype fp16] [--json PATH]
                                   [--cprofile N] [--launch] [--pieces] [--name host_h200]
    python scripts/profile_host.py --forward-kernels --d 128 64 --n 512 1024 2048 \
                                   --dtype fp16 bf16 --name host_forward_h200

A call is *host-bound* when Python and the launcher take longer to enqueue its kernels than the
GPU takes to run them: the GPU then waits, and a benchmark that times the call measures the host.
For each configuration this enqueues ``calls`` calls back to back and reads two clocks: the
host's (``perf_counter`` until the last call returns, before any synchronisation) and the GPU's
(CUDA events around the same calls). ``--cprofile N`` also prints the N most expensive functions
(cumulative) of the host side of one fwd+bwd at the first N and d, descriptors on.

``--forward-kernels``: the forward alone through each kernel ``flash_attention`` can run (its
choice, the Gluon forward, the Triton forward) and SDPA's cuDNN backend, at both masks, three
clocks each: the host's (median of single calls), the GPU's (the calls back to back behind a
sleeping kernel) and ``triton.testing.do_bench``'s with its L2 flush, as the sweep times a row.
Where the host takes longer than the flush and the kernel together, the GPU waits for the host
between the benchmark's two events, and do_bench's time is the host's, not the kernel's.

``--decode``: batch-1 decode steps (32 query heads over 8 K/V heads, d = 128, fp16) over each
``--n`` keys, dense and paged (256-token blocks) caches, ``--rounds`` times: do_bench's time, the
host's and the GPU's alone per step (:func:`flashtext.bench.core.host_and_gpu_ms`).
``--cprofile N`` adds the N most expensive functions (own time) of 2000 dense steps at the
first ``--n``. Run it with another flashtext tree first on ``PYTHONPATH`` to time that tree's
decode; the recording then goes to that tree's ``flashtext/data``.
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

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

from flashtext.bench.workload import DTYPES, attention_call, inputs  # noqa: E402

VARIANTS = ("descriptors", "pointers")


def _set_loads(variant: str) -> None:
    """Tile loads of every kernel's tuned configuration (the table and the short forward's):
    tensor descriptors where the layout allows (the library's default) or pointers everywhere."""
    from flashtext.kernels import config as _config

    if not hasattr(_set_loads, "saved"):
        _set_loads.saved = (dict(_config.TUNED), _config.FWD_SHORT)
    table, short = _set_loads.saved
    pointers = variant == "pointers"
    for key, cfg in table.items():
        _config.TUNED[key] = dataclasses.replace(cfg, tma=cfg.tma and not pointers)
    _config.FWD_SHORT = dataclasses.replace(short, tma=short.tma and not pointers)


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


def forward_kernels(dtype: str, d: int, n: int, causal: bool, calls: int = 60) -> list[dict]:
    """One row per forward kernel (``flash_attention``'s choice, ``gluon``, ``triton``) and
    SDPA cuDNN: host us per call (the median of ``calls`` single calls, each timed alone, so a
    garbage collection or a stray interrupt moves one call, not the figure), GPU us per call
    (back to back behind a sleep: the kernels alone) and do_bench's median (L2 flushed before
    each call, CUDA events around it). Every output is checked against the first's."""
    import statistics

    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtext.kernels import flash_attention

    q, k, v, _ = inputs(dtype, d, n)

    def ours(kernel):
        return lambda: flash_attention(q, k, v, causal=causal, forward_kernel=kernel)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    calls_by_name = {"ours": ours("auto"), "gluon": ours("gluon"), "triton": ours("triton"),
                     "cudnn": cudnn}
    rows, first = [], None
    for name, call in calls_by_name.items():
        out = call()
        if first is None:
            first = out
        err = ((out.float() - first.float()).abs().max() / first.float().abs().max()).item()
        assert err < 2e-2, f"{name} disagrees with {next(iter(calls_by_name))}: {err:.2e}"
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(1e9))  # ~0.5 s of GPU: no call below waits for the GPU
        single = []
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            single.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        host = statistics.median(single) * 1e6
        r = measure(call, calls)
        bench = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
        rows.append({"kernel": name, "dtype": dtype, "d": d, "n": n, "causal": causal,
                     "batch": q.shape[0], "heads": q.shape[1],
                     "host_us": round(host, 1), "gpu_us": round(r["gpu_ms"] * 1e3, 1),
                     "do_bench_us": round(bench * 1e3, 1)})
    return rows


def host_us(fn, reps: int, sleep_cycles: int) -> float:
    """Host microseconds per call of ``fn`` over ``reps`` calls, queued behind a sleeping kernel
    of ``sleep_cycles`` GPU cycles: the GPU stays busy, so no call waits for a free slot and
    the clock times Python and the launcher alone."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / reps
    torch.cuda.synchronize()
    return round(us, 2)


def launch_cost(d: int = 128, n: int = 512, calls: int = 150) -> dict:
    """Host microseconds per launch of the forward kernel: through Triton's JIT entry point
    (``kernel[grid](...)``: argument binding, specialisation, cache lookup) and through the
    compiled kernel's own launcher, the path ``flashtext.kernels.launcher.launch`` reuses.
    Both launch the same compiled kernel on the arguments the library's causal forward passes
    (recorded from ``forward()``, so they follow the kernel); the outputs must agree."""
    import torch

    from flashtext.bench.static_compile import recorded_launches
    from flashtext.kernels import forward as fwd

    q, k, v, _ = inputs("float16", d, n)
    with recorded_launches([fwd]) as seen:
        fwd.forward(q, k, v, True, d ** -0.5)
    (launch,) = seen
    kernel, grid, meta = launch.fn, launch.grid, launch.constexprs
    opts = dict(num_warps=launch.num_warps, num_stages=launch.num_stages)
    args = list(launch.args)
    out = fwd._attn_fwd.arg_names.index("O")
    compiled = kernel[grid](*args, **meta, **opts)
    names = kernel.arg_names[len(args):]
    runner = compiled[(*grid, 1)]

    jit_us = host_us(lambda: kernel[grid](*args, **meta, **opts), calls, int(3e8))
    args2 = list(args)
    args2[out] = torch.empty_like(args[out])
    compiled_us = host_us(lambda: runner(*args2, *(meta[name] for name in names)), calls,
                          int(3e8))
    torch.cuda.synchronize()
    assert torch.equal(args[out], args2[out]), "the compiled kernel's launcher gave another output"
    return {"d": d, "n": n, "config": {"BLOCK_M": meta["BLOCK_M"], "BLOCK_N": meta["BLOCK_N"],
                                       **opts, "tma": meta.get("USE_TMA")},
            "jit_launch_us": jit_us, "compiled_launch_us": compiled_us}


def host_pieces(d: int = 128, n: int = 512, causal: bool = True, calls: int = 150) -> dict:
    """Host microseconds of each piece of one fwd+bwd call, timed alone with the GPU kept busy
    (so no piece waits for the GPU): validation, the configuration, tensor descriptors, the
    output allocation, the forward with and without descriptors, autograd around empty
    kernels, the backward, the whole call. Where the ~1 ms of a short fwd+bwd goes."""
    import dataclasses

    import torch

    from flashtext.kernels import api, descriptors, flash_attention
    from flashtext.kernels import backward as bwd
    from flashtext.kernels import config as _config
    from flashtext.kernels import forward as fwd

    q, k, v, do = inputs("float16", d, n)
    z, h, n_q, _ = q.shape
    scale = d ** -0.5
    cfg = _config.launch_config("fwd", d, 2, causal, n, n)
    plain = dataclasses.replace(cfg, tma=False)
    o, lse = fwd.forward(q, k, v, causal, scale)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    class Empty(torch.autograd.Function):  # autograd's own cost, no kernel at all
        @staticmethod
        def forward(ctx, a, b, c):
            ctx.save_for_backward(a, b, c)
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, g):
            a, b, c = ctx.saved_tensors
            return torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)

    def through(fn):
        def call():
            for t in (qg, kg, vg):
                t.grad = None
            fn(qg, kg, vg).backward(do)
        return call

    pieces = {
        "validate inputs": lambda: api._validate(q, k, v, causal, None),
        "launch_config": lambda: _config.launch_config("fwd", d, 2, causal, n, n),
        "one tensor descriptor": lambda: descriptors.descriptor(k, cfg.BLOCK_N),
        "allocate O and lse": lambda: (torch.empty_like(q),
                                       torch.empty((z, h, n_q), dtype=torch.float32,
                                                   device=q.device)),
        "forward(), descriptors": lambda: fwd.forward(q, k, v, causal, scale),
        "forward(), pointers": lambda: fwd.forward(q, k, v, causal, scale, config=plain),
        "backward(), descriptors": lambda: bwd.backward(do, q, k, v, o, lse, causal, scale),
        "autograd fwd+bwd around empty kernels": through(Empty.apply),
        "flash_attention fwd+bwd": through(lambda a, b, c: flash_attention(a, b, c,
                                                                           causal=causal)),
    }
    # a whole call enqueues ~10 operations: 50 of them stay under the launch queue's ~1k
    # entries, so no call waits for the sleeping GPU to free a slot
    reps = {"backward(), descriptors": 80, "flash_attention fwd+bwd": 50}
    return {"d": d, "n": n, "causal": causal,
            "host_us": {name: host_us(fn, reps.get(name, calls), int(2e9))  # ~1 s of GPU work
                        for name, fn in pieces.items()}}


def host_profile(call, top: int, calls: int = 20, sort: str = "cumulative") -> str:
    """cProfile of ``calls`` calls (after 5 warm-up calls): the ``top`` functions by ``sort``."""
    import torch

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(top)
    return out.getvalue()


def decode_steps(n: int) -> dict:
    """One batch-1 decode step over ``n`` keys on a dense and on a paged (256-token) cache."""
    import torch

    from flashtext.bench.models import _paged
    from flashtext.kernels import flash_decode

    torch.manual_seed(0)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 8, n, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lengths = torch.full((1,), n, dtype=torch.int32, device="cuda")
    k_paged, v_paged, table = _paged(k, v, 256)
    return {"dense": lambda: flash_decode(q, k, v, lengths, check_inputs=False),
            "paged_256": lambda: flash_decode(q, k_paged, v_paged, lengths, block_table=table,
                                              check_inputs=False)}


def decode_clocks(steps: dict, n: int, rounds: int) -> list[dict]:
    """do_bench, host and GPU µs of each of ``steps`` (over ``n`` keys), ``rounds`` times."""
    import torch
    import triton

    from flashtext.bench.core import host_and_gpu_ms

    for step in steps.values():
        for _ in range(20):
            step()
    torch.cuda.synchronize()
    rows = []
    for r in range(rounds):
        for cache, step in steps.items():
            do_bench_ms = triton.testing.do_bench(step, rep=100)
            host_ms, gpu_ms = host_and_gpu_ms(step, do_bench_ms)
            rows.append({"n": n, "cache": cache, "round": r, "do_bench_us": do_bench_ms * 1e3,
                         "host_us": host_ms * 1e3, "gpu_us": gpu_ms * 1e3})
    return rows


def main_decode(args) -> None:
    rows, profile = [], None
    for n in args.n:
        steps = decode_steps(n)
        rows += decode_clocks(steps, n, args.rounds)
        print(f"decode, batch 1, {n} keys, do_bench / host / GPU us per step: " + " | ".join(
            f"{r['cache']} {r['do_bench_us']:.0f} / {r['host_us']:.0f} / {r['gpu_us']:.0f}"
            for r in rows if r["n"] == n), flush=True)
        if args.cprofile and profile is None:  # the first length's dense step
            profile = host_profile(steps["dense"], args.cprofile, calls=2000, sort="tottime")
            print(profile)
    _save(args.name, "host_vs_gpu_decode",
          "batch-1 decode steps, 32 query heads over 8 K/V heads, d = 128, fp16, dense and "
          "paged-256 caches: do_bench_us = triton.testing.do_bench median (rep 100 ms, L2 "
          "flushed before each call); host_us, gpu_us = flashtext.bench.core.host_and_gpu_ms "
          "per step", {"cprofile": profile, "rows": rows}, ("flashtext.kernels.decode",))


def _save(name: str | None, kind: str, what: str, payload: dict, measured: tuple = ()) -> None:
    """The run as ``flashtext/data/<name>.json`` (:func:`flashtext.recorded.save`), if named."""
    if name:
        from flashtext import recorded

        print("saved", recorded.save(name, {"kind": kind, "argv": sys.argv[1:], "what": what,
                                            **payload}, measured=measured))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--n", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["fp16"])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--cprofile", type=int, default=0, metavar="N")
    ap.add_argument("--launch", action="store_true",
                    help="also time one launch through Triton's JIT entry and through the "
                         "compiled kernel's launcher (what launcher.launch reuses)")
    ap.add_argument("--pieces", action="store_true",
                    help="also time the host side of each piece of one fwd+bwd (d, N: the "
                         "first of --d, --n; causal)")
    ap.add_argument("--forward-kernels", action="store_true",
                    help="instead: the forward through each kernel and cuDNN, host / GPU / "
                         "do_bench time per call (every --d, --n, --dtype, both masks)")
    ap.add_argument("--decode", action="store_true",
                    help="instead: batch-1 decode steps over every --n, dense and paged, "
                         "do_bench / host / GPU time per step, --rounds times")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default=None,
                    help="save the rows as flashtext/data/NAME.json (e.g. host_h200)")
    args = ap.parse_args()
    if args.forward_kernels:
        return main_forward_kernels(args)
    if args.decode:
        return main_decode(args)
    dtype = DTYPES[args.dtype[0]]
    rows = []
    for variant in args.variants:
        _set_loads(variant)
        for d in args.d:
            for n in args.n:
                for causal in (False, True):
                    for mode in ("fwd", "fwd_bwd"):
                        call = attention_call(dtype, d, n, causal, mode)
                        r = measure(call, args.calls)
                        r.update(loads=variant, d=d, n=n, causal=causal, mode=mode)
                        rows.append(r)
                        print(f"{variant:11} d={d} N={n:5} causal={causal!s:5} {mode:7}: host "
                              f"{r['host_ms']:.3f} ms, GPU {r['gpu_ms']:.3f} ms per call"
                              + ("  HOST-BOUND" if r["host_bound"] else ""), flush=True)
    profile = None
    if args.cprofile:
        _set_loads("descriptors")
        profile = host_profile(attention_call(dtype, args.d[0], args.n[0], True),
                               args.cprofile)
        print(profile)
    pieces = None
    if args.pieces:
        _set_loads("descriptors")
        pieces = host_pieces(args.d[0], args.n[0])
        for name, us in pieces["host_us"].items():
            print(f"{us:9.1f} us  {name}")
    launch = launch_cost() if args.launch else None
    if launch:
        print(f"one forward launch (d=128, N=512, causal): Triton's JIT entry "
              f"{launch['jit_launch_us']} us, the compiled kernel's launcher "
              f"{launch['compiled_launch_us']} us of host time")
    _save(args.name, "host_vs_gpu",
          "host ms = Python + launch time per call, enqueued back to back; GPU ms = the same "
          "calls queued behind a sleeping kernel (kernels alone)",
          {"calls": args.calls, "launch": launch, "pieces": pieces, "cprofile": profile,
           "rows": rows})


def main_forward_kernels(args) -> None:
    rows = []
    for dtype in args.dtype:
        for d in args.d:
            for n in args.n:
                for causal in (False, True):
                    got = forward_kernels(DTYPES[dtype], d, n, causal, args.calls)
                    rows += got
                    print(f"{dtype} d={d} N={n:5} causal={causal!s:5} host / GPU / do_bench us: "
                          + " | ".join(f"{r['kernel']} {r['host_us']:.0f} / {r['gpu_us']:.0f}"
                                       f" / {r['do_bench_us']:.0f}" for r in got), flush=True)
    _save(args.name, "host_vs_gpu_forward",
          "forward alone, per kernel: host_us = median of single calls (Python + launch), "
          "gpu_us = the calls back to back behind a sleeping kernel, do_bench_us = "
          "triton.testing.do_bench median (L2 flushed before each call), as the sweep times a "
          "row; ours = flash_attention's own choice",
          {"calls": args.calls, "rows": rows}, ("flashtext.kernels.api",))


if __name__ == "__main__":
    main()
