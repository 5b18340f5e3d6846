"""Time the Gluon FA3-style dK/dV backward against the Triton one and cuDNN on an H200.

    PYTHONPATH=. python3 scripts/probe_gluon_backward.py [--budget 200] [--json PATH]

One subprocess per (dtype, d) (an illegal memory access or a hang costs that group only), at
the benchmark's setting (batch * N = 16k tokens, heads * d = 2048), N in {2k, 4k, 8k, 16k},
causal and not; medians of ``triton.testing.do_bench``:

* ``cudnn``: SDPA's cuDNN backward alone (autograd on a saved graph),
* ``triton``: ``flashtext.kernels.backward.backward`` (preprocess + dK/dV + dQ, all Triton),
* ``gluon``: the same backward with its dK/dV pass from the Gluon kernel (preprocess, Gluon
  dK/dV, Triton dQ),
* ``fused``: the same with dQ computed in the Gluon kernel too (preprocess, Gluon dK/dV/dQ
  into a zeroed fp32 buffer, its copy to dQ's dtype),
* ``fused_deferred``: the same as ``fused`` with each tile's dQ share computed one tile later
  (``defer_dq``: a warpgroup does not wait for the other's dS of the tile it is on),
* ``gluon_dkdv`` and every tile variant in ``VARIANTS``: the Gluon dK/dV launch alone,
* ``dq``: the Triton dQ pass alone (so Triton's dK/dV time is ``triton - dq - preprocess``).

dK and dV of both kernels, and the fused dQ against the Triton one, are compared (max
|gluon - triton| over max |triton|) in every row.
JSON (GPU, versions, date, rows, the kernel sources measured) to ``--json`` if given, else to
``$OUT/gluon_backward_probe.json`` when ``$OUT`` is set. Chapter 13 reads
``flashtext/data/gluon_backward_probe_h200.json``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"m64_s2": dict(block_m=64, stages=2), "m128_s2": dict(block_m=128, stages=2)}


def only_dq(kernel_fn, grid_fn, config, *args, **constexprs):
    """``launcher.launch`` for the dQ kernel only (stands in for it in ``dq_only``)."""
    from flashtext.kernels import launcher

    if kernel_fn.__name__ == "_attn_bwd_dq":
        return launcher.launch(kernel_fn, grid_fn, config, *args, **constexprs)
    return config


def time_group(dtype_name: str, d: int, ns: list[int], variants: list[str]) -> list[dict]:
    import torch

    rows = []
    for n in ns:
        for causal in (False, True):
            row = time_row(dtype_name, d, n, causal, variants)
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
    return rows


def time_row(dtype_name: str, d: int, n: int, causal: bool, variants: list[str]) -> dict:
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtext.kernels import backward as bw
    from flashtext.kernels import gluon_backward as gb
    from flashtext.kernels.api import attention_forward

    dtype = getattr(torch, dtype_name)
    batch, heads = max(1, 16384 // n), 2048 // d
    g = torch.Generator(device="cuda").manual_seed(n + causal)
    q, k, v, do = (torch.randn(batch, heads, n, d, device="cuda", generator=g).to(dtype)
                   for _ in range(4))
    scale = d ** -0.5
    o, lse = attention_forward(q, k, v, causal=causal, sm_scale=scale)
    delta = bw.preprocess(o, do)
    flops = 2.5 * 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    row = {"dtype": dtype_name, "d": d, "n": n, "causal": causal, "batch": batch,
           "heads": heads, "ms": {}, "tflops": {}}
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_ref = F.scaled_dot_product_attention(*leaves, is_causal=causal)

    def dq_only():
        """The Triton backward's dQ launch alone (its dK/dV launch is skipped)."""
        dq = torch.empty_like(q)
        dense = (q, k, v, do, dq, torch.empty_like(k), torch.empty_like(v))
        with mock.patch.object(bw, "launch", only_dq):
            bw._launch_backward(dense, lse, delta, causal, (-1, -1), scale, None, n, n,
                                strides=[x for t in dense for x in t.stride()], batch=batch,
                                lse_strides=(heads * n, n), cu=None)
        return dq

    def dkdv(**sw):
        return gb.launch_dkdv(q, k, v, do, lse, delta, causal, scale, **sw)

    def hybrid():
        """The backward with its dK/dV pass from the Gluon kernel: preprocess, Gluon dK/dV,
        Triton dQ (in that order, as a wired-in backward would launch them)."""
        fresh_delta = bw.preprocess(o, do)
        dk, dv, _ = gb.launch_dkdv(q, k, v, do, lse, fresh_delta, causal, scale)
        return dq_only(), dk, dv

    def fused():
        return bw.backward(do, q, k, v, o, lse, causal, scale, dkdv_kernel="gluon",
                           fuse_dq=True)

    def fused_deferred():
        return bw.backward(do, q, k, v, o, lse, causal, scale, dkdv_kernel="gluon",
                           fuse_dq=True, defer_dq=True)

    providers = {
        "cudnn": lambda: torch.autograd.grad(o_ref, leaves, do, retain_graph=True),
        "triton": lambda: bw.backward(do, q, k, v, o, lse, causal, scale),
        "gluon": hybrid,
        "fused": fused,
        "fused_deferred": fused_deferred,
        "gluon_dkdv": dkdv,
        "dq": dq_only,
        "preprocess": lambda: bw.preprocess(o, do),
    }
    for name, sw in VARIANTS.items():
        if name in variants:
            providers[f"gluon_dkdv_{name}"] = functools.partial(dkdv, **sw)
    for name, fn in providers.items():
        try:
            ms = triton.testing.do_bench(fn, warmup=25, rep=100)
            row["ms"][name] = round(ms, 4)
            if name in ("cudnn", "triton", "gluon", "fused", "fused_deferred"):
                row["tflops"][name] = round(flops / ms / 1e9, 1)
        except Exception as exc:  # noqa: BLE001 - one failing provider, not the row
            row["ms"][name] = None
            row.setdefault("errors", {})[name] = str(exc).splitlines()[0][:300]
    try:
        dq_t, dk_t, dv_t = bw.backward(do, q, k, v, o, lse, causal, scale)
        _, dk_g, dv_g = hybrid()
        dq_f = fused()[0]
        dq_d, dk_d, dv_d = fused_deferred()

        def rel(a, b):
            return float((a.float() - b.float()).abs().max() / b.float().abs().max())

        row["rel_diff"] = {"dk": rel(dk_g, dk_t), "dv": rel(dv_g, dv_t),
                           "dq_fused": rel(dq_f, dq_t), "dq_deferred": rel(dq_d, dq_t),
                           "dk_deferred": rel(dk_d, dk_t), "dv_deferred": rel(dv_d, dv_t)}
    except Exception as exc:  # noqa: BLE001
        row.setdefault("errors", {})["compare"] = str(exc).splitlines()[0][:300]
    ms = row["ms"]
    if ms.get("triton") and ms.get("dq") and ms.get("preprocess"):
        ms["triton_dkdv_derived"] = round(ms["triton"] - ms["dq"] - ms["preprocess"], 4)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the whole run")
    ap.add_argument("--ns", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                    help="tile variants of the Gluon dK/dV launch to time (default: all)")
    ap.add_argument("--group", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.group:
        time_group(args.group[0], int(args.group[1]), args.ns, args.variants)
        return 0
    import torch
    import triton

    from flashtext import recorded

    t0 = time.time()
    rows, notes = [], []
    for d in (128, 64):
        for dtype in ("float16", "bfloat16"):
            left = args.budget - (time.time() - t0)
            if left < 20:
                notes.append(f"{dtype} d={d}: skipped, budget spent")
                continue
            cmd = [sys.executable, __file__, "--group", dtype, str(d), "--ns",
                   *map(str, args.ns), "--variants", *args.variants]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=left,
                                      cwd=ROOT)
                out, err, rc = done.stdout, done.stderr, done.returncode
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
                err, rc = "timeout", "timeout"
            got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            rows += got
            if rc != 0:
                notes.append(f"{dtype} d={d}: rc={rc}: {err.strip().splitlines()[-3:]}")
            for r in got:
                ms = r["ms"]
                print(f"{r['dtype']:8s} d={r['d']:3d} N={r['n']:5d} causal={r['causal']!s:5s} "
                      + " ".join(f"{k}={v}" for k, v in ms.items())
                      + f" diff={r.get('rel_diff')}", flush=True)
    for note in notes:
        print("NOTE", note)
    record = {"gpu": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "triton": triton.__version__,
              "seconds": round(time.time() - t0, 1), "rows": rows, "notes": notes,
              # what was measured, so that a later change to the kernels marks the file stale
              recorded.SOURCES_KEY: recorded.kernel_fingerprint(("flashtext.kernels.api",))}
    out = args.json or (Path(os.environ["OUT"]) / "gluon_backward_probe.json"
                        if os.environ.get("OUT") else None)
    if out:
        out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
