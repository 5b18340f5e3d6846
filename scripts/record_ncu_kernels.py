"""Why is a kernel as fast as it is? Nsight Compute's stall reasons for our attention kernels.

    python scripts/record_ncu_kernels.py [--d 64 128] [--n 4096] [--out ncu_kernels_h200]
    # on a CUDA GPU with ncu -> flashtext/data/<out>.json

One forward + backward of ``flash_attention`` per (d, mask) at the benchmark's setting (batch * N
= 16k tokens, heads * d = 2048, fp16), after a warm-up call, is profiled under ``ncu
--profile-from-start off`` (the script runs itself as the driver, each configuration on its own
CUDA stream so its kernels can be grouped). Per kernel: time, issue-slot use, achieved
occupancy, registers per thread, and the average number of warps stalled on each reason per
issued instruction (``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``: the
larger, the more that reason keeps the scheduler from issuing). Whatever ``flashtext`` is first
on the import path is profiled, so a probe tree (``scripts/probe_variants.py``) works too.
If ncu is missing or cannot read the counters, the JSON says so and nothing is invented.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

from flashtext.bench import ncu as nsight  # noqa: E402
from flashtext.bench import workload  # noqa: E402

STALLS = ["long_scoreboard", "short_scoreboard", "wait", "barrier", "math_pipe_throttle",
          "mio_throttle", "lg_throttle", "not_selected", "selected", "no_instruction",
          "dispatch_stall", "branch_resolving", "membar", "sleeping", "drain", "tex_throttle",
          "imc_miss", "misc"]
METRICS = ["gpu__time_duration.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
           *(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS)]
# Hopper's tensor-core (GMMA) and special-function (XU: ex2) pipes, and the L2 and DRAM
# throughput (a dK/dV program streams all of Q and dO past its keys); dropped if ncu lacks them
OPTIONAL = ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
            "lts__throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
OPTIONAL_NAMES = ("tensor_pipe_pct", "xu_pipe_pct", "l2_throughput_pct", "dram_throughput_pct")


def configs(ds: list[int], ns: list[int]) -> list[tuple[int, int, bool]]:
    return [(d, n, causal) for d in ds for n in ns for causal in (False, True)]


def driver(ds: list[int], ns: list[int]) -> None:
    """Runs under ncu: warm each configuration up, then profile exactly one fwd+bwd of it."""
    import torch

    from flashtext.kernels import flash_attention

    order = []
    for d, n, causal in configs(ds, ns):
        q, k, v, do = workload.inputs("float16", d, n)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for profiled in (False, True):
                if profiled:
                    torch.cuda.profiler.start()
                flash_attention(q, k, v, causal=causal).backward(do)
                stream.synchronize()
                if profiled:
                    torch.cuda.profiler.stop()
        order.append({"d": d, "n": n, "causal": causal})
        del q, k, v, do
        torch.cuda.empty_cache()
    nsight.announce_order(order)


def run_ncu(ncu: str, ds: list[int], ns: list[int]) -> dict:
    """This script as the driver under ncu, our kernels only; without the optional metrics if
    this ncu or GPU lacks them."""
    driver = [sys.executable, str(Path(__file__).resolve()), "--driver",
              "--d", *map(str, ds), "--n", *map(str, ns)]
    units = ["--print-units", "base"]
    return nsight.profile(ncu, driver, [(METRICS + OPTIONAL, units), (METRICS, units)],
                          options=["--kernel-name", "regex:_attn_"], timeout=500)


def summarize(kernel: dict) -> dict:
    """The numbers a reader looks at first, and the stall reasons largest first."""
    stalls = {s: kernel[m] for s in STALLS
              if (m := f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio") in kernel}
    out = {"kernel": kernel["kernel"].split("(")[0][:60],
           "ms": kernel.get("gpu__time_duration.sum", float("nan")) / 1e6,  # base unit: ns
           "issue_active_pct": kernel.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
           "occupancy_pct": kernel.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
           "registers": kernel.get("launch__registers_per_thread"),
           "stalls": dict(sorted(stalls.items(), key=lambda kv: -kv[1]))}
    for m, name in zip(OPTIONAL, OPTIONAL_NAMES, strict=True):
        if m in kernel:
            out[name] = kernel[m]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", action="store_true", help="internal: the profiled program")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[4096])
    ap.add_argument("--out", default="ncu_kernels_h200")
    args = ap.parse_args()
    if args.driver:
        driver(args.d, args.n)
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("record_ncu_kernels.py profiles a CUDA GPU; this machine has none.")
    from flashtext import recorded

    ncu = nsight.find_ncu()
    result = {"ok": False, "error": "ncu not found"} if ncu is None else \
        run_ncu(ncu, args.d, args.n)
    groups = []
    if result["ok"]:
        try:
            groups = nsight.group_by_stream(result["kernels"], len(result["order"]))
        except ValueError as exc:
            result = {**result, "ok": False, "error": f"{exc}; raw kernels kept"}
    rows = [{**cfg, "kernels": [summarize(k) for k in ks]}
            for cfg, ks in zip(result.get("order", []), groups, strict=False)]
    out = recorded.save(args.out, {"what": "ncu metrics of one fwd+bwd of flash_attention",
                                   "ncu": result, "rows": rows})
    print(f"wrote {out}; ncu ok: {result['ok']}" + ("" if result["ok"] else
                                                      f" ({result['error'][:300]})"))
    for r in rows:
        print(f"d={r['d']} N={r['n']} causal={r['causal']}")
        for k in r["kernels"]:
            top = ", ".join(f"{s} {v:.2f}" for s, v in list(k["stalls"].items())[:4])
            print(f"  {k['kernel']:24s} {k['ms']:7.3f} ms  issue {k['issue_active_pct']:.0f}%  "
                  f"occupancy {k['occupancy_pct']:.0f}%  regs {k['registers']:.0f}  [{top}]")


if __name__ == "__main__":
    main()
