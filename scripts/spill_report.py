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

from flashtext.bench import tuning  # noqa: E402


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
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashtext.kernels import backward, forward
    from flashtext.kernels.config import block_d

    fn = {"fwd": forward._attn_fwd, "bwd_dkdv": backward._attn_bwd_dkdv,
          "bwd_dq": backward._attn_bwd_dq}[kernel]
    bm, bn, warps, stages = cfg
    const = {"HEAD_DIM": d, "BLOCK_D": block_d(d), "BLOCK_M": bm, "BLOCK_N": bn,
             "CAUSAL": causal, "INPUT_PRECISION": "tf32"}
    # the plain-load path (USE_TMA=False): a tensor descriptor's signature type needs its
    # block shape spelled out, and the registers of the loop body are what this report is for
    const["USE_TMA"] = False
    if kernel == "fwd":
        const["NEGATE_Q"] = False
    pointers = {"LSE": "*fp32", "DELTA": "*fp32"}
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name == "sm_scale":
            sig[name] = "fp32"
        elif name.startswith("stride_") or name in ("H", "N_Q", "N_K"):
            sig[name] = "i32"
        else:
            sig[name] = pointers.get(name, "*fp16")
    compiled = triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
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
