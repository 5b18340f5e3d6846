"""Which Hopper features does Triton use for our kernels, and what does split-KV buy at decode?

    python scripts/record_hopper.py            # on an H200: flashtext/data/h200_hopper.json
    python scripts/record_hopper.py --quick    # smoke test: fewer timings, not saved
    python scripts/record_hopper.py --sm90-preview   # no GPU needed: compile for sm_90, print
    python scripts/record_hopper.py --sm90-preview --d 36 --n 1024   # another case (--full)

Our kernels are compiled exactly as ``flash_attention`` dispatches them: the script runs the
public API (forward and backward) and captures every launch at the launcher
(:func:`dispatched_launches`), and every launch of the Gluon forward, so the choice of forward
kernel comes from ``flashtext.kernels.dispatch``, the tiles, warps and stages from
``flashtext.kernels.config.launch_config`` and the load path (tensor descriptors or pointers)
from ``flashtext.kernels.descriptors.tile_sources``, whatever those are when it runs.

``--sm90-preview`` runs anywhere Triton's bundled ptxas does (a CPU machine included): it
compiles those same launches, and the probes, for an sm_90 target without running them, and
prints the same counts (PTX, and SASS from the bundled cuobjdump) as JSON; ``--forward-kernel
triton`` previews the Triton forward where sm_90 would run the Gluon one. Chapter 13 runs it
live next to the recorded H200 results.

Chapters 13 and 14 show the result on machines without a GPU. What it records:

* ``library``: per case (fp16 and bf16, d = 64 and 128, causal and not, N = 2048), the error of
  ``flash_attention`` against SDPA in fp32, and every kernel its forward and backward launched:
  the launch configuration and load path that ran, and counts of Hopper instructions in the PTX
  (``wgmma.mma_async`` = warpgroup MMA, ``cp.async.bulk.tensor`` = TMA, ``setmaxnreg``,
  ``mbarrier``) and in the SASS from cuobjdump (``HGMMA``, ``UTMALDG``, ``USETMAXREG``, ``HMMA`` =
  the pre-Hopper mma.sync, ``LDGSTS`` = Ampere's cp.async, ``LDG`` = an ordinary global load,
  ``MUFU.EX2``), the wgmma shapes and
  shared memory.
* ``probes``: one small attention loop written three ways (pointer loads; tensor descriptors;
  tensor descriptors + ``tl.range(warp_specialize=True)``), checked against SDPA, timed, and
  counted the same way: what Triton emits for each way of writing the loads.
* ``splitkv``: the split-KV decode kernel (``flashtext.kernels.splitkv``) at batch 1,
  Nq = 1, N = 65536, d = 128, fp16: time for num_splits in 1, 2, 4, ..., 128 and the automatic
  choice, achieved K/V read bandwidth, max error vs SDPA; SDPA and the library forward (no split)
  at the same shape for comparison.
* ``kernel_sources`` (added by ``flashtext.recorded.save``): the sha256 of the kernel sources
  measured, so that a later change to them marks this file as stale.

Under a minute on an H200. Without CUDA it stops with a message: nothing is invented.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

if __name__ == "__main__":
    if "--sm90-preview" in sys.argv:
        if os.environ.get("TRITON_INTERPRET") != "0":
            # compile for a GPU we do not have: restart with the interpreter off from the start
            os.execve(sys.executable, [sys.executable, *sys.argv],
                      {**os.environ, "TRITON_INTERPRET": "0"})
        # the preview reads each compiled kernel directly, so Triton's own cache may answer a
        # second run (its key includes the kernel source)
    else:  # a fresh cache, so every kernel launched is compiled (and kept) here
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="flashtext_hopper_cache_")

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

import flashtext  # noqa: E402,F401  (before triton: decides TRITON_INTERPRET)

# isort: split
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashtext.bench.static_compile import cuobjdump, sass_of  # noqa: E402
from flashtext.kernels.dispatch import BACKWARD_KERNELS, FORWARD_KERNELS  # noqa: E402

# name -> regex, counted in the PTX text
PTX_PATTERNS = {
    "wgmma": r"\bwgmma\.mma_async\b",
    "tma_load": r"\bcp\.async\.bulk\.tensor\.\w+\.shared[:\w]*\.global\b",
    "tma_store": r"\bcp\.async\.bulk\.tensor\.\w+\.global\.shared[:\w]*\b",
    "setmaxnreg": r"\bsetmaxnreg\b",
    "mbarrier": r"\bmbarrier\.",
    "mma_sync": r"\bmma\.sync\b",
    "cp_async": r"\bcp\.async\.(?:ca|cg)\.",
    "ex2": r"\bex2\.approx\b",
    "ld_global": r"\bld\.global\b",
    "st_shared": r"\bst\.shared\b",
}
# SASS opcodes, counted as whole words at the start of an instruction
SASS_OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "UTMAREDG", "USETMAXREG", "HMMA", "LDGSTS", "LDG",
                "MUFU.EX2", "SYNCS")


def count_ptx(ptx: str) -> dict[str, int]:
    """Counts of the Hopper-relevant PTX instructions in ``ptx``."""
    return {name: len(re.findall(pat, ptx)) for name, pat in PTX_PATTERNS.items()}


def count_sass(sass: str) -> dict[str, int]:
    """Counts of SASS opcodes (``HGMMA.64x128x16.F32`` counts as HGMMA)."""
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M)
    out = {}
    for op in SASS_OPCODES:
        out[op] = sum(1 for o in ops if o == op or o.startswith(op + "."))
    return out


def wgmma_shapes(ptx: str) -> list[str]:
    """Distinct wgmma shapes, e.g. ``m64n128k16.f32.f16.f16``: m64 means one warpgroup's tile."""
    return sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.([\w.]+)", ptx)))


def describe(name: str, ptx: str, cubin: bytes | None, meta: dict) -> dict:
    sass = sass_of(cubin) if cubin else None
    return {
        "name": name,
        "num_warps": meta.get("num_warps"),
        "num_stages": meta.get("num_stages"),
        "shared_bytes": meta.get("shared"),
        "ptx": count_ptx(ptx),
        "sass": count_sass(sass) if sass else None,
        "wgmma_shapes": wgmma_shapes(ptx),
    }


def cached_kernels(cache_dir: Path, seen: set[str]) -> list[dict]:
    """Kernels in Triton's cache directory not in ``seen`` (kernel directories already read)."""
    found = []
    for meta_path in sorted(cache_dir.glob("*/*.json")):
        if meta_path.name.startswith("__grp__") or str(meta_path.parent) in seen:
            continue
        ptx_path = meta_path.with_suffix(".ptx")
        if not ptx_path.exists():
            continue
        seen.add(str(meta_path.parent))
        meta = json.loads(meta_path.read_text())
        cubin_path = meta_path.with_suffix(".cubin")
        cubin = cubin_path.read_bytes() if cubin_path.exists() else None
        found.append(describe(meta.get("name", meta_path.stem), ptx_path.read_text(), cubin,
                              meta))
    return found


# --------------------------------------------------------------------------- the probe kernel

PROBE_VARIANTS = (("pointer loads", False, False), ("tensor descriptors", True, False),
                  ("tensor descriptors + warp_specialize", True, True))


@triton.jit
def probe_attention(Q, K, V, Out, N, qk_scale_log2, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, USE_DESC: tl.constexpr, WARP_SPEC: tl.constexpr):
    """A bare attention forward (non-causal, N a multiple of both blocks, contiguous
    (B*H, N, d) tensors): the FA2 loop and nothing else, to see what Triton emits."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * N * HEAD_DIM
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if USE_DESC:
        q_desc = tl.make_tensor_descriptor(Q + base, shape=[N, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        k_desc = tl.make_tensor_descriptor(K + base, shape=[N, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(V + base, shape=[N, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        q = q_desc.load([pid_m * BLOCK_M, 0])
    else:
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in tl.range(0, N, BLOCK_N, warp_specialize=WARP_SPEC):
        if USE_DESC:
            k = k_desc.load([start, 0])
            v = v_desc.load([start, 0])
        else:
            k = tl.load(K + base + (start + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
            v = tl.load(V + base + (start + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             acc.to(Out.dtype.element_ty))


def run_probe(q, k, v, use_desc: bool, warp_spec: bool, block_m: int = 128, block_n: int = 64,
              num_warps: int = 8, num_stages: int = 3):
    """Launch the probe on (B, H, N, d) contiguous tensors; returns (out, compiled kernel)."""
    import torch

    batch, heads, n, d = q.shape
    out = torch.empty_like(q)
    if use_desc and hasattr(triton, "set_allocator"):  # device-side descriptors need scratch
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device=q.device))
    grid = (n // block_m, batch * heads)
    compiled = probe_attention[grid](q, k, v, out, n, 1.4426950408889634 / d**0.5, HEAD_DIM=d,
                                     BLOCK_M=block_m, BLOCK_N=block_n, USE_DESC=use_desc,
                                     WARP_SPEC=warp_spec, num_warps=num_warps,
                                     num_stages=num_stages)
    return out, compiled


# ---------------------------------------------------------------------------------- sections

def _bench(fn, quick: bool) -> float:
    """Median seconds of ``fn`` (triton's do_bench, which flushes L2 between runs)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10 if quick else 25, rep=50 if quick else 200,
                    return_mode="median") * 1e-3


# the entry points whose kernels this script measures (stored with the recording)
MEASURED = ("flashtext.kernels.api", "flashtext.kernels.splitkv")
SM90_MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB)
LIBRARY_CASES = [(dtype, d, causal) for dtype in ("float16", "bfloat16") for d in (64, 128)
                 for causal in (False, True)]
PREVIEW_CASE = ("float16", 128, True, 4096)  # the case chapter 13 describes


class Captured:
    """One launch ``flash_attention`` made: the kernel, the configuration it asked for (the one
    that ran, once launched), its arguments (``PerConfig`` ones unresolved) and compile-time
    constants. (A plain class: chapters load this file without registering it as a module,
    which a dataclass needs.)"""

    def __init__(self, kernel_fn, grid_fn, config, args: list, constexprs: dict):
        self.kernel_fn, self.grid_fn, self.config = kernel_fn, grid_fn, config
        self.args, self.constexprs = args, constexprs

    def resolved(self, config) -> list:
        from flashtext.kernels.launcher import PerConfig

        return [a(config) if isinstance(a, PerConfig) else a for a in self.args]


class GluonCaptured:
    """One launch of a Gluon kernel, which ``flash_attention`` runs on sm_90 where
    :mod:`flashtext.kernels.dispatch` picks it: the forward
    (:mod:`flashtext.kernels.gluon_forward`, ``kind="forward"``) or the dK/dV pass
    (:mod:`flashtext.kernels.gluon_backward`, ``kind="dkdv"``, with ``fused_dq`` when it
    computed dQ too, ``deferred_dq`` when a tile late); ``persistent`` for a forward launched
    one program per SM; its case and, once launched, the kernel that ran."""

    def __init__(self, dtype, head_dim: int, causal: bool, window, kernel=None,
                 kind: str = "forward", fused_dq: bool = False, deferred_dq: bool = False,
                 persistent: bool = False, consumers: int = 2, open_left: bool = False):
        self.dtype, self.head_dim, self.causal, self.window = dtype, head_dim, causal, window
        self.kernel, self.kind, self.fused_dq = kernel, kind, fused_dq
        self.deferred_dq, self.persistent = deferred_dq, persistent
        self.consumers, self.open_left = consumers, open_left


@contextlib.contextmanager
def captured_launches(run: bool):
    """Record every ``flashtext.kernels.launcher.launch`` and every launch of the Gluon forward
    and dK/dV kernels made inside the block; with ``run=False`` nothing is launched (to compile
    for a GPU this machine does not have), and the dispatch is the sm_90 one: the Gluon kernels
    take the cases their rules give them (for the contiguous, aligned inputs made here, the
    only other condition, a layout the copy engine can address, holds)."""
    import torch

    import flashtext.kernels  # noqa: F401  (loads every kernel module)
    from flashtext.kernels import backward, gluon_backward, gluon_forward, launcher

    seen: list = []
    real = launcher.launch
    real_gluon = gluon_forward.launch
    real_dkdv = backward.launch_dkdv

    def capture(kernel_fn, grid_fn, config, *args, **constexprs):
        seen.append(Captured(kernel_fn, grid_fn, config, list(args), dict(constexprs)))
        if run:
            seen[-1].config = real(kernel_fn, grid_fn, config, *args, **constexprs)
        return seen[-1].config

    def capture_gluon(q, k, v, causal, sm_scale, window=(-1, -1), **switches):
        seen.append(GluonCaptured(q.dtype, q.shape[-1], causal, tuple(window),
                                  persistent=bool(switches.get("persistent")),
                                  consumers=switches.get("consumers", 2),
                                  open_left=bool(switches.get("open_left"))))
        if run:
            o, lse, seen[-1].kernel = real_gluon(q, k, v, causal, sm_scale, window, **switches)
            return o, lse, seen[-1].kernel
        return (torch.empty(q.shape, dtype=q.dtype),
                torch.zeros(q.shape[:-1], dtype=torch.float32), None)

    def capture_dkdv(q, k, v, do, lse, delta, causal, sm_scale, window=(-1, -1), **overrides):
        seen.append(GluonCaptured(q.dtype, q.shape[-1], causal, tuple(window), kind="dkdv",
                                  fused_dq=overrides.get("dq_accum") is not None,
                                  deferred_dq=bool(overrides.get("defer_dq"))))
        if run:
            dk, dv, seen[-1].kernel = real_dkdv(q, k, v, do, lse, delta, causal, sm_scale,
                                                window, **overrides)
            return dk, dv, seen[-1].kernel
        return torch.zeros_like(k), torch.zeros_like(v), None

    users = [m for name, m in sys.modules.items() if name.startswith("flashtext.kernels")
             and getattr(m, "launch", None) is real]
    with contextlib.ExitStack() as stack:
        for module in users:
            stack.enter_context(mock.patch.object(module, "launch", capture))
        stack.enter_context(mock.patch.object(gluon_forward, "launch", capture_gluon))
        stack.enter_context(mock.patch.object(backward, "launch_dkdv", capture_dkdv))
        if not run:
            for module, check in ((gluon_forward, "gluon_supported"),
                                  (gluon_backward, "gluon_dkdv_supported")):
                stack.enter_context(mock.patch.object(module, check, functools.partial(
                    _sm90_would_run, module)))
        yield seen


def _sm90_would_run(module, q, *args) -> bool:
    """A Gluon kernel's support check as an sm_90 GPU would answer it for the contiguous,
    aligned inputs made here: Gluon installed, the dtype and the head dimension."""
    return module.HAVE_GLUON and q.dtype in module.SUPPORTED_DTYPES \
        and q.shape[-1] in module.HEAD_DIMS


def dispatched_launches(dtype: str, d: int, causal: bool, n: int, device: str, run: bool,
                        seed: int = 0, forward_kernel: str = "auto",
                        backward_kernel: str = "auto"):
    """Run ``flash_attention`` forward and backward on (2, 4, n, d) inputs and return its
    launches (and the output, when ``run``). Without ``run`` the inputs may live on the CPU:
    the API's device check is then told the kernels are interpreted (only it: the launch table,
    the load path and the choice of forward kernel are an sm_90 GPU's)."""
    import torch

    from flashtext.kernels import api, checks

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, n, d, generator=gen).to(device, getattr(torch, dtype))
               .requires_grad_() for _ in range(3))
    with contextlib.ExitStack() as stack:
        if not run:
            for module in (api, checks):
                stack.enter_context(mock.patch.object(module, "_boot", SimpleNamespace(
                    INTERPRETING=True)))
        seen = stack.enter_context(captured_launches(run))
        out = api.flash_attention(q, k, v, causal=causal, forward_kernel=forward_kernel,
                                  backward_kernel=backward_kernel)
        out.backward(torch.ones_like(out))
    return seen, (q, k, v, out)


def compile_for_sm90(fn, args: list, kwargs: dict):
    """Compile ``fn(*args, **kwargs)`` for sm_90 without a GPU, the way Triton's JIT would: the
    same binder specialises the arguments (dtypes, 16-byte alignment, descriptor shapes)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = {**kwargs, "debug": knobs.runtime.debug,
              "instrumentation_mode": knobs.compilation.instrumentation_mode}
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def compile_sm90(c: Captured, config):
    """One captured launch, compiled for sm_90 (see :func:`compile_for_sm90`)."""
    return compile_for_sm90(c.kernel_fn, c.resolved(config), {
        **c.constexprs, "BLOCK_M": config.BLOCK_M, "BLOCK_N": config.BLOCK_N,
        "num_warps": config.num_warps, "num_stages": config.num_stages})


def compiled_on_gpu(c: Captured, config):
    """The kernel the launch compiled on this GPU (Triton's cache answers the warmup)."""
    return c.kernel_fn.warmup(*c.resolved(config), grid=tuple(c.grid_fn(config)),
                              **c.constexprs, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N,
                              num_warps=config.num_warps, num_stages=config.num_stages)


def _described(kernel, with_sass: bool) -> tuple[dict, dict]:
    """:func:`describe`'s row of a compiled Gluon kernel, and its metadata as a dict."""
    meta = kernel.metadata
    meta = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta))
    return describe(kernel.name, kernel.asm["ptx"],
                    kernel.asm.get("cubin") if with_sass else None, meta), meta


def describe_gluon(c: GluonCaptured, with_sass: bool) -> dict:
    """What one launch of a Gluon kernel ran (compiled here for sm_90 if it was not
    launched), in the shape of :func:`describe_launch`'s rows."""
    from flashtext.kernels import gluon_backward as gb
    from flashtext.kernels import gluon_forward as gf

    if c.kind == "dkdv":
        kernel = c.kernel or gb.compile_sm90_dkdv(c.head_dim, c.dtype, c.causal, c.window,
                                                  fuse_dq=c.fused_dq, defer_dq=c.deferred_dq)
        constants = gb.kernel_constants(c.head_dim, c.causal, c.window, fuse_dq=c.fused_dq,
                                        defer_dq=c.deferred_dq)
        row, meta = _described(kernel, with_sass)
        return {**row, "gluon": True, "kind": "dkdv", "fused_dq": c.fused_dq,
                "deferred_dq": c.deferred_dq, "use_tma": True,
                "descriptor_args": ["q_desc", "k_desc", "v_desc", "do_desc", "dk_desc",
                                    "dv_desc", "dq_desc"],
                "config": {"BLOCK_M": constants["BLOCK_M"], "BLOCK_N": gb.BLOCK_N,
                           "STAGES": constants["STAGES"], "num_warps": meta.get("num_warps")}}
    switches = dict(persistent=c.persistent, consumers=c.consumers, open_left=c.open_left)
    kernel = c.kernel or gf.compile_sm90(c.head_dim, c.dtype, c.causal, c.window, **switches)
    constants = gf.kernel_constants(c.head_dim, c.causal, c.window, **switches)
    row, meta = _described(kernel, with_sass)
    # num_warps counts every partition's: the producer's 4 and each consumer's 4
    warps = meta.get("num_warps")
    return {**row, "gluon": True, "kind": "forward", "persistent": c.persistent,
            "consumers": c.consumers, "open_left": c.open_left, "use_tma": True,
            "descriptor_args": ["q_desc", "k_desc", "v_desc", "o_desc"],
            "config": {"BLOCK_M": gf.WG_M * c.consumers, "BLOCK_N": constants["BLOCK_N"],
                       "STAGES": constants["STAGES"], "num_warps": warps}}


def describe_launch(c: Captured | GluonCaptured, compile_fn, with_sass: bool) -> dict:
    """What one launch ran: kernel, configuration, which arguments were tensor descriptors, and
    the instruction counts of its compiled code. Without a GPU a configuration that needs more
    shared memory than sm_90 has steps down as ``launcher.launch`` does on the H200."""
    from dataclasses import asdict

    from flashtext.kernels.descriptors import TensorDescriptor

    if isinstance(c, GluonCaptured):
        return describe_gluon(c, with_sass)

    config = c.config
    kernel = compile_fn(c, config)
    while compile_fn is compile_sm90 and kernel.metadata.shared > SM90_MAX_SHARED:
        smaller = config.smaller()
        if smaller is None:
            break
        config = smaller
        kernel = compile_fn(c, config)
    names = c.kernel_fn.arg_names  # (a JITFunction, or the interpreter's stand-in)
    descs = [names[i] for i, a in enumerate(c.resolved(config))
             if TensorDescriptor is not None and isinstance(a, TensorDescriptor)]
    meta = kernel.metadata
    meta = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta))
    row = describe(c.kernel_fn.__name__, kernel.asm["ptx"],
                   kernel.asm.get("cubin") if with_sass else None, meta)
    return {**row, "config": asdict(config), "use_tma": c.constexprs.get("USE_TMA"),
            "descriptor_args": descs}


def library(quick: bool) -> dict:
    """Every case of :data:`LIBRARY_CASES`: flash_attention forward + backward on the GPU, its
    error against SDPA, and what each of its launches compiled to."""
    import torch

    runs, errors = [], []
    cases = LIBRARY_CASES[-2:] if quick else LIBRARY_CASES
    for dtype, d, causal in cases:
        try:
            seen, (q, k, v, out) = dispatched_launches(dtype, d, causal, 2048, "cuda", run=True)
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=causal)
            runs.append({"dtype": dtype, "d": d, "causal": causal, "n": 2048,
                         "max_err_vs_sdpa_fp32": float((out.float() - ref).abs().max()),
                         "kernels": [describe_launch(c, compiled_on_gpu, True) for c in seen]})
        except Exception as exc:  # record, do not hide
            errors.append(f"{dtype} d={d} causal={causal}: {type(exc).__name__}: {exc}")
    torch.cuda.synchronize()
    return {"api": "flash_attention", "runs": runs, "errors": errors}


def probes(quick: bool) -> list[dict]:
    import torch

    batch, heads, n, d = 4, 16, 4096, 128
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16)
               for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    flops = 4.0 * batch * heads * n * n * d
    rows = []
    for label, desc, ws in PROBE_VARIANTS:
        row = {"variant": label, "use_desc": desc, "warp_specialize": ws}
        try:
            out, compiled = run_probe(q, k, v, desc, ws)
            torch.cuda.synchronize()
            row["max_err_vs_sdpa"] = float((out.float() - ref.float()).abs().max())
            seconds = _bench(lambda desc=desc, ws=ws: run_probe(q, k, v, desc, ws), quick)
            row["tflops"] = flops / seconds / 1e12
            meta = compiled.metadata
            meta = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta))
            row.update(describe("probe_attention", compiled.asm["ptx"],
                                compiled.asm.get("cubin"), meta))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        print("probe:", {k_: v_ for k_, v_ in row.items() if k_ != "sass"}, flush=True)
        rows.append(row)
    return rows


def _decode_case(heads: int, n: int, d: int, sms: int, quick: bool) -> dict:
    import torch

    from flashtext.kernels.splitkv import splitkv_attention
    from flashtext.splitkv import choose_num_splits

    q = torch.randn(1, heads, 1, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(2))
    kv_bytes = 2 * heads * n * d * 2
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    auto = choose_num_splits(1, heads, 1, n, sms=sms)
    entry = {"heads": heads, "kv_bytes": kv_bytes, "auto_splits": auto, "sweep": []}
    for splits in sorted({1, 2, 4, 8, 16, 32, 64, 128, auto}):
        out = splitkv_attention(q, k, v, num_splits=splits)
        err = float((out.float() - ref).abs().max())
        seconds = _bench(lambda s=splits: splitkv_attention(q, k, v, num_splits=s), quick)
        entry["sweep"].append({"num_splits": splits, "seconds": seconds,
                               "bandwidth": kv_bytes / seconds, "max_err_vs_sdpa_fp32": err})
        print(f"split-KV H={heads} splits={splits}: {seconds * 1e6:.1f} us, "
              f"{kv_bytes / seconds / 1e12:.2f} TB/s, err {err:.1e}", flush=True)
    entry["sdpa_seconds"] = _bench(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), quick)
    try:
        import flashtext.kernels as kernels

        fn = getattr(kernels, "flash_attention", None) or kernels.attention_forward
        entry["library_forward_seconds"] = _bench(lambda: fn(q, k, v), quick)
    except Exception as exc:
        entry["library_forward_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(f"H={heads}: SDPA {entry['sdpa_seconds'] * 1e6:.1f} us, library forward "
          f"{entry.get('library_forward_seconds', float('nan')) * 1e6:.1f} us", flush=True)
    return entry


def splitkv(quick: bool, cache_dir: Path, seen: set[str]) -> dict:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n, d = 65536, 128
    result = {"n_k": n, "d": d, "batch": 1, "n_q": 1, "dtype": "float16", "sms": sms,
              "by_heads": []}
    for heads in ((8,) if quick else (8, 32)):
        result["by_heads"].append(_decode_case(heads, n, d, sms, quick))
    result["kernels"] = cached_kernels(cache_dir, seen)
    return result


def sm90_preview(case: tuple = PREVIEW_CASE, forward_kernel: str = "auto",
                 backward_kernel: str = "auto") -> dict:
    """Compile (never launch) what ``flash_attention(..., forward_kernel=forward_kernel,
    backward_kernel=backward_kernel)`` launches on sm_90 for :data:`PREVIEW_CASE` (forward and
    backward), and the three probes, for sm_90; count PTX and SASS instructions."""
    dtype, d, causal, n = case
    seen, _ = dispatched_launches(dtype, d, causal, n, "cpu", run=False,
                                  forward_kernel=forward_kernel,
                                  backward_kernel=backward_kernel)
    import torch

    batch_heads, n_probe, d_probe = 4, 4096, 128  # the GPU run's shape, as (B*H, N, d)
    q, k, v, o = (torch.empty(batch_heads, n_probe, d_probe, dtype=torch.float16)
                  for _ in range(4))

    def probe(variant: tuple) -> dict:
        label, desc, ws = variant
        row = {"variant": label, "use_desc": desc, "warp_specialize": ws}
        try:
            kernel = compile_for_sm90(probe_attention, [q, k, v, o, n_probe, 0.1], {
                "HEAD_DIM": d_probe, "BLOCK_M": 128, "BLOCK_N": 64, "USE_DESC": desc,
                "WARP_SPEC": ws, "num_warps": 8, "num_stages": 3})
            row.update(describe("probe_attention", kernel.asm["ptx"], kernel.asm.get("cubin"),
                                kernel.metadata._asdict()))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return row

    # most of the time is the disassembler, a process per kernel: run them side by side
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        kernels = list(pool.map(lambda c: describe_launch(c, compile_sm90, True), seen))
        probes = list(pool.map(probe, PROBE_VARIANTS))
    return {"triton": triton.__version__, "target": "sm_90", "probes": probes,
            "library": {"dtype": dtype, "d": d, "causal": causal, "n": n,
                        "forward_kernel": forward_kernel, "backward_kernel": backward_kernel,
                        "kernels": kernels}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timings, print, do not save")
    parser.add_argument("--name", default="h200_hopper", help="output name in flashtext/data")
    parser.add_argument("--sm90-preview", action="store_true",
                        help="no GPU: compile for sm_90 and print the counts as JSON")
    parser.add_argument("--d", type=int, default=PREVIEW_CASE[1],
                        help=f"--sm90-preview: head dim of the case (default {PREVIEW_CASE[1]})")
    parser.add_argument("--n", type=int, default=PREVIEW_CASE[3],
                        help=f"--sm90-preview: sequence length (default {PREVIEW_CASE[3]})")
    parser.add_argument("--full", action="store_true", help="--sm90-preview: no causal mask")
    parser.add_argument("--forward-kernel", default="auto", choices=FORWARD_KERNELS,
                        help="--sm90-preview: flash_attention's forward_kernel (default auto: "
                             "the one it runs on sm_90)")
    parser.add_argument("--backward-kernel", default="auto", choices=BACKWARD_KERNELS,
                        help="--sm90-preview: flash_attention's backward_kernel (default auto: "
                             "the one it runs on sm_90)")
    args = parser.parse_args()
    if args.sm90_preview:
        print(json.dumps(sm90_preview((PREVIEW_CASE[0], args.d, not args.full, args.n),
                                      args.forward_kernel, args.backward_kernel)))
        return

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("record_hopper.py compiles and times kernels on a CUDA GPU, and this "
                         "machine has none. Chapters 13 and 14 show the recorded H200 results.")
    from flashtext import recorded

    start = time.perf_counter()
    cache_dir = Path(os.environ.get("TRITON_CACHE_DIR", ""))
    if not cache_dir.is_dir():
        raise SystemExit("run this file as a script (it sets a fresh TRITON_CACHE_DIR)")
    seen: set[str] = set()
    props = torch.cuda.get_device_properties(0)
    payload: dict = {"device": {"name": props.name, "sms": props.multi_processor_count,
                                "capability": list(torch.cuda.get_device_capability(0))},
                     "cuobjdump": cuobjdump() is not None}
    try:
        payload["library"] = library(args.quick)
    except Exception as exc:  # say so in the record
        payload["library"] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    for run in payload["library"].get("runs", []):
        for kern in run["kernels"]:
            print(f"library {run['dtype']} d={run['d']} causal={run['causal']}:", kern["name"],
                  kern["config"], "descriptors", kern["descriptor_args"], kern["sass"],
                  flush=True)
    cached_kernels(cache_dir, seen)  # the library's cache entries are described above
    payload["probes"] = probes(args.quick)
    cached_kernels(cache_dir, seen)  # the probes' cache entries are already described above
    payload["splitkv"] = splitkv(args.quick, cache_dir, seen)
    payload["seconds"] = time.perf_counter() - start
    if args.quick:
        print(json.dumps(payload, indent=1)[:4000])
        return
    print("saved", recorded.save(args.name, payload, measured=MEASURED),
          f"in {payload['seconds']:.0f} s")


if __name__ == "__main__":
    main()
