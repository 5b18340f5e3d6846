"""Measure chapter 1's memory wall on a CUDA GPU and store it for readers without one.

    python scripts/record_memory_wall.py          # on an H200: flashtext/data/h200_memory_wall.json
    python scripts/record_memory_wall.py --quick  # a smoke test: fewer sizes, not saved
    python scripts/record_memory_wall.py --only softmax  # add the softmax comparison to the
                                                         # stored recording, keep the rest

What it records (functions in :mod:`flashtext.roofline`; times are medians of triton's do_bench):

* ``device``: what the driver reports (SMs, L2 size, shared memory and registers per SM, ...).
* ``copy``: device-to-device copy bandwidth (read + write) for 64 MiB to 4 GiB buffers.
* ``read_sweep``: read-only bandwidth against buffer size, 1 MiB to 4 GiB (a Triton kernel with
  L2-only loads cycling over the buffer): the step from L2 to HBM.
* ``matmul``: square bf16 matmuls n = 256 ... 8192 (TFLOP/s rises with intensity ~n/3), plus
  fp16, TF32 and true-fp32 (no tensor cores) at 8192.
* ``exp``: an elementwise bf16 exp over 2^28 elements (intensity 0.25 FLOP/byte).
* ``attention``: naive fp16 attention split into its three kernels, and SDPA's FLASH_ATTENTION,
  16 heads, d in {64, 128}, N = 512 ... 8192 with batch * N = 65536 (N = 1024, d = 64 is
  FlashAttention-1's Figure 2 setting: GPT-2 medium, batch 64).
* ``softmax``: the softmax alone on the same S (16 heads, N = 512 ... 8192, batch * N = 65536):
  ``torch.softmax``, chapter 9's one-pass Triton softmax and a plain copy of S, with the CUDA
  kernel ``torch.softmax`` launches. It says whether the softmax's bytes can move at copy speed
  (the roofline's assumption) and which kernel falls short.

Runs about a minute on an H200. Without CUDA it stops with a message: nothing is invented.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few sizes, print, do not save")
    parser.add_argument("--name", default=None, help="output name (default: <gpu>_memory_wall)")
    parser.add_argument("--only", choices=("softmax",), default=None,
                        help="measure only this part and add it to the stored recording; the "
                             "other measurements keep their numbers and provenance")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("record_memory_wall.py measures a CUDA GPU and this machine has none. "
                         "Chapter 1 shows the recorded H200 results instead.")
    from flashtext import recorded, roofline

    log = lambda *a: print(*a, flush=True)
    name = args.name or re.sub(r"[^a-z0-9]+", "_",
                               torch.cuda.get_device_name(0).lower().replace("nvidia", "")
                               ).strip("_").split("_")[0] + "_memory_wall"
    if args.only == "softmax":
        import datetime

        import triton

        stored = recorded.load(name)  # its gpu/date/versions stay those of the first run
        rows = roofline.measure_softmax_sweep(quick=args.quick, log=log)
        if args.quick:
            return
        stamp = {"gpu": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
                 "torch": torch.__version__, "triton": triton.__version__}
        print("wrote", recorded.save(name, {**stored, "softmax": rows, "softmax_recorded": stamp}))
        return
    payload = roofline.measure_memory_wall(quick=args.quick, log=log)
    print(f"done in {payload['seconds']} s")
    if args.quick:
        return
    print("wrote", recorded.save(name, payload))


if __name__ == "__main__":
    main()
