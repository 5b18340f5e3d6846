"""The attention kernels compiled for a GPU target without running them: no GPU needed.

:func:`launch_arguments` calls the library's own forward or backward on small CPU tensors with
the launcher replaced by a recorder, so the runtime arguments and compile-time constants are
exactly those the library would launch with (a change to a kernel's signature cannot leave a
script behind). :func:`signature` turns them into Triton's argument types and
:func:`compile_kernel` compiles them for a target, sm_90a by default. ``scripts/spill_report.py``
(registers and spills) and ``scripts/record_hopper.py --sm90-preview`` (chapter 13: what our
forward becomes on Hopper) use it. Compiling needs ``TRITON_INTERPRET=0``: an interpreted
kernel has no compiler front end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
          torch.int32: "i32", torch.int64: "i64"}


@dataclass(frozen=True)
class Launch:
    """One kernel launch as the library makes it: the Triton function, its runtime arguments
    (in order), its compile-time constants (tile sizes included), the launch options and the
    grid."""

    fn: Any
    args: tuple
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    grid: tuple[int, ...]


@contextlib.contextmanager
def recorded_launches(modules: list) -> Iterator[list[Launch]]:
    """Inside the block, ``launch`` in each of ``modules`` (e.g. :mod:`flashtext.kernels.forward`)
    records what it is asked to launch, resolved for its configuration, and launches nothing."""
    from flashtext.kernels.launcher import PerConfig

    seen: list[Launch] = []

    def record(kernel_fn, grid_fn, config, *args, **constexprs):
        resolved = tuple(a(config) if isinstance(a, PerConfig) else a for a in args)
        seen.append(Launch(kernel_fn, resolved, {**constexprs, "BLOCK_M": config.BLOCK_M,
                                                 "BLOCK_N": config.BLOCK_N},
                           config.num_warps, config.num_stages, tuple(grid_fn(config))))
        return config

    saved = [(m, m.launch) for m in modules]
    try:
        for m in modules:
            m.launch = record
        yield seen
    finally:
        for m, fn in saved:
            m.launch = fn


def launch_arguments(kernel: str, config: tuple[int, int, int, int], d: int, causal: bool,
                     dtype: torch.dtype = torch.float16, n: int = 64) -> Launch:
    """How the library launches ``kernel`` ("fwd", "bwd_dkdv", "bwd_dq") with ``config``
    (BLOCK_M, BLOCK_N, num_warps, num_stages) at head dim ``d``, with plain (pointer) loads: a
    tensor descriptor's type would need its tile shape spelled out."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if len(config) != 4:
        raise ValueError("config must be (BLOCK_M, BLOCK_N, num_warps, num_stages), got "
                         f"{config!r}")
    from flashtext.kernels import backward, forward
    from flashtext.kernels.config import KernelConfig

    cfg = replace(KernelConfig(*config), tma=False)
    q, k, v, do = (torch.randn(1, 1, n, d, dtype=dtype) for _ in range(4))
    scale = d ** -0.5
    with recorded_launches([forward, backward]) as seen:
        if kernel == "fwd":
            forward.forward(q, k, v, causal, scale, config=cfg)
        else:
            lse = torch.zeros(1, 1, n, dtype=torch.float32)
            backward.backward(do, q, k, v, q, lse, causal, scale, configs={kernel: cfg})
    fn = {"fwd": forward._attn_fwd, "bwd_dkdv": backward._attn_bwd_dkdv,
          "bwd_dq": backward._attn_bwd_dq}[kernel]
    launches = [s for s in seen if s.fn is fn]
    if len(launches) != 1:
        raise RuntimeError(f"expected one launch of {kernel}'s kernel, saw {len(launches)}")
    return launches[0]


def signature(launch: Launch) -> dict[str, str]:
    """Triton's type for every argument of the launch: pointers by their tensor's dtype, Python
    ints as i32, floats as fp32, the compile-time constants as constexpr."""
    names = launch.fn.arg_names
    sig = {}
    for name, arg in zip(names, launch.args, strict=False):
        if isinstance(arg, torch.Tensor):
            sig[name] = "*" + _TYPES[arg.dtype]
        elif isinstance(arg, bool):
            sig[name] = "i1"
        elif isinstance(arg, int):
            sig[name] = "i32"
        elif isinstance(arg, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"argument {name} is a {type(arg).__name__}: only tensors, ints "
                            "and floats can be typed here")
    rest = names[len(launch.args):]
    missing = [n for n in rest if n not in launch.constexprs]
    if missing:
        raise ValueError(f"no value for the kernel's constants {missing}")
    sig.update({n: "constexpr" for n in rest})
    return sig


def compile_kernel(launch: Launch, capability: int = 90):
    """Compile the launch for ``sm_<capability>`` (never run it): Triton's compiled kernel, with
    ``asm["ptx"]`` and ``metadata``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(launch.fn, signature(launch), dict(launch.constexprs))
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": launch.num_warps,
                                   "num_stages": launch.num_stages})


def cuobjdump() -> str | None:
    """The cuobjdump that Triton bundles, else one on PATH, else None."""
    import shutil
    from pathlib import Path

    import triton

    here = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(here) if here.exists() else shutil.which("cuobjdump")


def sass_of(cubin: bytes) -> str | None:
    """The whole SASS of a compiled kernel (``kernel.asm["cubin"]``), by cuobjdump; None without
    it. Not Triton's ``kernel.asm["sass"]``: its reader takes 4-hex-digit instruction addresses
    only, so it stops after the first 4096 instructions of a longer kernel."""
    import subprocess
    import tempfile

    tool = cuobjdump()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                             timeout=60)
    return run.stdout if run.returncode == 0 else None


__all__ = ["KERNELS", "Launch", "compile_kernel", "cuobjdump", "launch_arguments",
           "recorded_launches", "sass_of", "signature"]
