"""Measure flashtext.ring_attention over NCCL on several GPUs of one host and store the numbers.

    python scripts/record_ring_nccl.py                     # W = 1, 2, 4, 8 (up to the GPUs
                                                           # present): data/ring_nccl_h200.json
    python scripts/record_ring_nccl.py --worlds 1 --quick  # smoke check on ONE GPU: a ring of
                                                           # one rank (no transfers), not saved
    python scripts/record_ring_nccl.py --cpu-dry-run       # this script's code over gloo on CPU

One process per GPU, started by :func:`flashtext.ring.launch` (torch.multiprocessing spawn on
127.0.0.1, like torchrun), NCCL with NVLink multicast off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1). For each ring size W it records:

* ``correctness``: forward and backward, causal and not, zigzag and striped, fp16 and bf16:
  the largest |ring - flash_attention on the full sequence| of O, lse, dQ, dK, dV over all ranks,
  next to the same kernel's own error against fp32 attention on the full sequence (so a reader
  sees that the ring adds nothing to the kernel's rounding).
* ``steps``: per ring step and rank, the time of the kernels alone, of the K/V transfers alone
  and of the real (overlapped) ring, for a sweep of shard lengths N/W (non-causal, bf16, the
  clean 4 (N/W)^2 d FLOPs per step), with the measured kernel rate R, link bandwidth BW, the
  threshold R b / (2 BW) and the fraction of the transfer time hidden
  (:func:`flashtext.context_parallel.overlap_summary`); and the backward ring likewise.
* ``throughput``: the whole ring (forward, and forward + backward through autograd), no
  per-step synchronisation, causal zigzag and non-causal, at fixed N/W, with and without the
  cross-rank input check (``check_ranks``): seconds per call of the slowest rank and tokens/s
  (N = W * N/W tokens) for the scaling of tokens/s with W.

Without CUDA it stops with a message: nothing is invented.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# NVLink multicast (NVLS) off, for the ring's plain point-to-point sends; set before any process
# group exists (spawned ranks inherit the environment)
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"


def _max_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max().item()) if a.numel() else 0.0


def _correctness(rank, world, device, n_local, heads, head_dim, dtypes):
    import torch
    import torch.nn.functional as F

    from flashtext import context_parallel as cp
    from flashtext.kernels import attention_forward, flash_attention

    rows = []
    for dtype in (getattr(torch, name) for name in dtypes):
        for causal, layout in ((False, "zigzag"), (True, "zigzag"), (False, "striped"),
                               (True, "striped")):
            g = torch.Generator(device=device).manual_seed(1234)  # the same full tensors on all
            q, k, v, do = (torch.randn((1, heads, n_local * world, head_dim), generator=g,
                                       device=device).to(dtype) for _ in range(4))
            full = [t.clone().requires_grad_(True) for t in (q, k, v)]
            o_full = flash_attention(*full, causal)
            o_full.backward(do)
            _, lse_full = attention_forward(q, k, v, causal)
            f32 = [t.to(torch.float32, copy=True).requires_grad_(True) for t in (q, k, v)]
            o32 = F.scaled_dot_product_attention(*f32, is_causal=causal)
            o32.backward(do.float())
            local = [cp.shard(t, rank, world, layout).requires_grad_(True) for t in (q, k, v)]
            o, lse = cp.ring_attention(*local, causal, layout=layout, return_lse=True)
            o.backward(cp.shard(do, rank, world, layout))

            def mine(t, layout=layout):
                return cp.shard(t, rank, world, layout)

            ring = {"o": o, "lse": lse, "dq": local[0].grad, "dk": local[1].grad,
                    "dv": local[2].grad}
            single = {"o": o_full, "lse": lse_full, "dq": full[0].grad, "dk": full[1].grad,
                      "dv": full[2].grad}
            exact = {"o": o32, "dq": f32[0].grad, "dk": f32[1].grad, "dv": f32[2].grad}
            rows.append({
                "dtype": str(dtype).removeprefix("torch."), "causal": causal, "layout": layout,
                "n": n_local * world, "heads": heads, "head_dim": head_dim,
                "ring_vs_kernel": {x: _max_err(ring[x], mine(single[x].detach()))
                                   for x in ring},
                "kernel_vs_fp32": {x: _max_err(mine(single[x].detach()), mine(exact[x].detach()))
                                   for x in exact},
            })
    return rows


def _throughput(rank, world, device, n_local, heads, head_dim, repeats, dtype):
    import torch
    import torch.distributed as dist

    from flashtext import context_parallel as cp

    out = []
    for causal in (False, True):
        g = torch.Generator(device=device).manual_seed(rank)
        q, k, v, do = (torch.randn((1, heads, n_local, head_dim), generator=g, device=device)
                       .to(getattr(torch, dtype)) for _ in range(4))
        for backward, check_ranks in ((False, True), (True, True), (False, False),
                                      (True, False)):
            times = []
            for i in range(repeats + 2):  # two warm-ups (compiles, NCCL connections)
                qs, ks, vs = (t.detach().requires_grad_(backward) for t in (q, k, v))
                dist.barrier()
                cp._sync(device)
                start = time.perf_counter()
                o = cp.ring_attention(qs, ks, vs, causal, layout="zigzag",
                                      check_ranks=check_ranks)
                if backward:
                    o.backward(do)
                cp._sync(device)
                if i >= 2:
                    times.append(time.perf_counter() - start)
            seconds = sorted(times)[len(times) // 2]
            out.append({"causal": causal, "backward": backward, "layout": "zigzag",
                        "check_ranks": check_ranks,
                        "n_local": n_local, "n": n_local * world, "seconds": seconds,
                        "tokens_per_s": n_local * world / seconds})
    return out


def worker(rank, world, device, cfg):
    import torch

    from flashtext import context_parallel as cp

    torch.manual_seed(0)
    result = {"rank": rank}
    result["correctness"] = _correctness(rank, world, device, cfg["check_n_local"],
                                         cfg["heads"], cfg["head_dim"], cfg["check_dtypes"])
    result["steps"] = []
    for n_local in cfg["step_n_local"]:
        for backward in (False, True):
            result["steps"].append(cp.profile_worker(
                rank, world, device, n_local, heads=cfg["heads"], head_dim=cfg["head_dim"],
                dtype=getattr(torch, cfg["time_dtype"]), causal=False, layout="zigzag",
                repeats=cfg["repeats"], backward=backward))
    result["throughput"] = [row for n_local in cfg["throughput_n_local"]
                            for row in _throughput(rank, world, device, n_local, cfg["heads"],
                                                   cfg["head_dim"], cfg["repeats"],
                                                   cfg["time_dtype"])]
    return result


def _merge(world, per_rank) -> dict:
    """One entry per ring size: errors maxed over ranks; per-step times of every rank; the
    overlap summary of each forward profile; throughput = the slowest rank."""
    from flashtext import context_parallel as cp

    correctness = []
    for i, row in enumerate(per_rank[0]["correctness"]):
        merged = {k: v for k, v in row.items() if k not in ("ring_vs_kernel", "kernel_vs_fp32")}
        for key in ("ring_vs_kernel", "kernel_vs_fp32"):
            merged[key] = {x: max(r["correctness"][i][key][x] for r in per_rank)
                           for x in row[key]}
        correctness.append(merged)
    steps = []
    for i, prof in enumerate(per_rank[0]["steps"]):
        ranks = [r["steps"][i] for r in per_rank]
        entry = {k: prof[k] for k in ("n_local", "batch", "heads", "head_dim", "element_size",
                                      "causal", "layout", "backward", "world")}
        entry["per_rank"] = [{k: p[k] for k in ("rank", "compute", "communicate", "ring",
                                                "overlap", "pairs")} for p in ranks]
        if world > 1 and not prof["backward"]:
            entry["summary"] = [cp.overlap_summary(p) for p in ranks]
        steps.append(entry)
    throughput = []
    for i, row in enumerate(per_rank[0]["throughput"]):
        slowest = max(r["throughput"][i]["seconds"] for r in per_rank)
        throughput.append({**row, "seconds": slowest, "tokens_per_s": row["n"] / slowest})
    return {"world_size": world, "correctness": correctness, "steps": steps,
            "throughput": throughput}


def _report(run: dict) -> None:
    for row in run["correctness"]:
        print(f"  {row['dtype']} causal={row['causal']!s:<5} {row['layout']:<8} ring vs "
              f"kernel {max(row['ring_vs_kernel'].values()):.2e}, kernel vs fp32 "
              f"{max(row['kernel_vs_fp32'].values()):.2e}")
    for entry in run["steps"]:
        for s in entry.get("summary", [])[:1]:
            print(f"  N/W={entry['n_local']:>6} rank 0: compute {s['compute'] * 1e6:8.1f} us, "
                  f"transfer {s['communicate'] * 1e6:8.1f} us, ring step "
                  f"{s['ring'] * 1e6:8.1f} us, hidden {s['hidden']:.0%}; R "
                  f"{s['rate'] / 1e12:.0f} TFLOP/s, BW {s['bandwidth'] / 1e9:.0f} GB/s, "
                  f"threshold {s['threshold']:.0f} tokens")
    for row in run["throughput"]:
        print(f"  throughput N/W={row['n_local']} causal={row['causal']!s:<5} "
              f"{'fwd+bwd' if row['backward'] else 'fwd':<7} "
              f"{'checked' if row['check_ranks'] else 'unchecked':<9} "
              f"{row['seconds'] * 1e3:8.2f} ms {row['tokens_per_s'] / 1e6:8.2f} M tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=None,
                        help="ring sizes (default: 1, 2, 4, 8 up to the GPUs present)")
    parser.add_argument("--quick", action="store_true", help="small sizes, print, do not save")
    parser.add_argument("--name", default="ring_nccl_h200", help="output name in flashtext/data")
    parser.add_argument("--timeout", type=float, default=300.0, help="per collective, seconds")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run this script's code over gloo on CPU processes with tiny shapes "
                             "(the kernels under Triton's interpreter), print, do not save: a "
                             "check of the script itself, not a measurement")
    args = parser.parse_args()

    import torch

    if args.cpu_dry_run:
        from flashtext import ring

        cfg = {"quick": True, "heads": 1, "head_dim": 16, "repeats": 1, "check_n_local": 8,
               "check_dtypes": ["float32", "float16"], "time_dtype": "float32",
               "step_n_local": [8], "throughput_n_local": [8]}
        for world in args.worlds or [2]:
            per_rank = ring.launch(worker, world, (cfg,), backend="gloo", timeout=args.timeout)
            _report(_merge(world, per_rank))
        return
    if not torch.cuda.is_available():
        raise SystemExit("record_ring_nccl.py measures rings of CUDA GPUs and this machine has "
                         "none. Chapter 14 shows the recorded results, or its gloo CPU ring.")
    from flashtext import recorded, ring

    gpus = torch.cuda.device_count()
    worlds = args.worlds or [w for w in (1, 2, 4, 8) if w <= gpus]
    if max(worlds) > gpus:
        raise SystemExit(f"--worlds {worlds} needs {max(worlds)} GPUs; this machine has {gpus}")
    cfg = {"quick": args.quick, "heads": 16, "head_dim": 128, "repeats": 3 if args.quick else 7,
           "check_n_local": 256 if args.quick else 512, "check_dtypes": ["float16", "bfloat16"],
           "time_dtype": "bfloat16",
           "step_n_local": [1024, 4096] if args.quick else [256, 512, 1024, 2048, 4096, 8192,
                                                             16384],
           "throughput_n_local": [4096] if args.quick else [2048, 8192, 16384]}
    runs = []
    for world in worlds:
        start = time.perf_counter()
        per_rank = ring.launch(worker, world, (cfg,), backend="nccl", timeout=args.timeout)
        runs.append(_merge(world, per_rank))
        print(f"W={world}: {time.perf_counter() - start:.0f} s", flush=True)
        _report(runs[-1])
    if args.quick:
        return
    payload = {"world_size": max(worlds), "backend": "nccl", "gpus": gpus,
               "cuda": torch.version.cuda,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE",
                                                  "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
               "config": cfg, "runs": runs}
    print("wrote", recorded.save(args.name, payload))


if __name__ == "__main__":
    main()
