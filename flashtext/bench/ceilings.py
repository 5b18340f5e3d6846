"""The roofline's two ceilings, measured in the run, and where each timed row sits under them."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def measure_ceilings(dtypes: tuple[str, ...]) -> dict[str, Any]:
    """The two roofs, measured in this run with chapter 1's probes: an 8192^3 matmul per dtype
    (FLOP/s) and a 1 GiB device-to-device copy (read + write bytes per second)."""
    from flashtext import roofline

    matmul = {dt: roofline.measure_matmul((8192,), dtype=dt)[0]["flops"]
              for dt in dtypes if dt in ("float16", "bfloat16")}
    copy = roofline.measure_copy_bandwidth((2**30,))[0]["bandwidth"]
    torch.cuda.empty_cache()
    return {"matmul_flops": matmul, "copy_bandwidth": copy,
            "how": "8192^3 torch.matmul per dtype; 1 GiB dst.copy_(src), bytes = read + write; "
                   "medians of triton.testing.do_bench (flashtext.roofline)"}


def add_roofline(rows: list[dict[str, Any]], ceilings: dict[str, Any] | None) -> None:
    """Give every timed row its two roofline numbers, from the ceilings measured in the run:
    ``t_compute_ms`` = FLOPs / matmul FLOP/s, ``t_memory_ms`` = minimum bytes / copy
    bandwidth, ``bound`` (chapter 1's verdict, :class:`flashtext.roofline.Step`) and
    ``roof_fraction`` = the roofline's time over the measured time (1.0 = on the roof)."""
    from flashtext import roofline
    from flashtext.hardware import H200

    if not ceilings:
        return
    for r in rows:
        peak = ceilings["matmul_flops"].get(r["dtype"])
        if r["status"] != "ok" or not peak:
            continue
        gpu = dataclasses.replace(H200, name="measured ceilings", matmul_flops=peak,
                                  hbm_bandwidth=ceilings["copy_bandwidth"])
        step = roofline.Step(r["provider"], r["flops"], r["min_bytes"])
        r["t_compute_ms"] = r["flops"] / peak * 1e3
        r["t_memory_ms"] = r["min_bytes"] / ceilings["copy_bandwidth"] * 1e3
        r["bound"] = step.bound(gpu)
        r["roof_fraction"] = step.time(gpu) * 1e3 / r["ms"]
