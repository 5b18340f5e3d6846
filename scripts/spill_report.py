"""Registers and spills of the attention kernels compiled for sm_90a, without a GPU.

    TRITON_INTERPRET=0 python scripts/spill_report.py [--d 64 128] [--out spills_sm90]

Compiles (never runs) the forward, dK/dV and dQ kernels of whatever ``flashtext`` is first on the
import path, for every launch configuration ``scripts/tune_kernels.py`` searches
(:func:`flashtext.bench.tuning.candidates`), fp16, both masks, with the installed Triton, and
asks Triton's bundled ``ptxas -v`` how many registers each thread uses and how many bytes it
spills to local memory. A spilled value lives in local memory (L1, then L2), so spills inside
the main loop cost bandwidth and latency the tensor cores then wait on. This is a static count
from the compiler, not a measurement on a GPU; it points at what the GPU should be asked next.
Set TRITON_INTERPRET=0 (on a machine without a GPU flashtext otherwise turns the interpreter on,
and an interpreted kernel cannot be compiled). Runtime about 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

from flashtext.bench import static_compile, tuning  # noqa: E402


def ptxas_path() -> str:
    import triton.backends.nvidia as nv

    return os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")


def ptxas_report(ptx: str) -> dict:
    """Registers per thread and spill bytes, from ``ptxas -v`` on this PTX for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        Path(src).write_text(ptx)
        proc = subprocess.run([ptxas_path(), "-arch=sm_90a", "-v", src, "-o",
                               os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {text[-500:]}")
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else 0,
            "spill_load_bytes": int(spill.group(2)) if spill else 0}


def compile_one(kernel: str, cfg: tuple[int, int, int, int], d: int, causal: bool) -> dict:
    """Registers, spills, shared memory and WGMMA count of ``kernel`` with launch configuration
    ``cfg``, compiled for sm_90a as the library launches it (plain loads: the loop body's
    registers are what this report is for)."""
    launch = static_compile.launch_arguments(kernel, cfg, d, causal)
    compiled = static_compile.compile_kernel(launch, capability=90)
    ptx = compiled.asm["ptx"]
    return {"kernel": kernel, "config": list(cfg), "d": d, "causal": causal,
            "shared_bytes": compiled.metadata.shared,
            "wgmma": ptx.count("wgmma.mma_async"), **ptxas_report(ptx)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--kernels", nargs="+", choices=tuning.KERNELS, default=list(tuning.KERNELS))
    ap.add_argument("--out", default="spills_sm90")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("set TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    import triton

    from flashtext import recorded

    rows = []
    for kernel in args.kernels:
        for d in args.d:
            configs = tuning.candidates(kernel, d)
            for cfg in configs:
                for causal in (False, True):
                    try:
                        row = compile_one(kernel, cfg, d, causal)
                    except Exception as exc:  # e.g. out of shared memory: not a candidate
                        row = {"kernel": kernel, "config": list(cfg), "d": d, "causal": causal,
                               "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                    rows.append(row)
                    if "error" not in row:
                        print(f"{kernel:9s} d={d:3d} {cfg!s:18s} causal={causal!s:5s} "
                              f"regs {row['registers']:3d}  spill {row['spill_store_bytes']:5d} B "
                              f"stored / {row['spill_load_bytes']:5d} B loaded", flush=True)
    out = recorded.save(args.out, {
        "what": "registers per thread and local-memory spills of each kernel and launch "
                "configuration, from ptxas -v (sm_90a, fp16); compiled, never run",
        "compiled_with": f"triton {triton.__version__} and its bundled ptxas",
        "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
