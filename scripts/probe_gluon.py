"""Probe the Gluon FA3-style forward on an H200 in one run: compile, check, time.

    PYTHONPATH=. python3 scripts/probe_gluon.py [--quick] [--jobs 12] [--budget 230]
        [--variants NAME ...] [--variant-dtypes float16 bfloat16] [--rounds 3]

1. Checks, one subprocess per kernel variant (so that an illegal memory access or a hang, which
   would take the CUDA context down with it, costs that variant only): compile it (filling
   Triton's cache for step 2), run a few small shapes (ragged lengths, N_q != N_k, GQA, a
   sliding window) against float64 attention, report max errors next to PyTorch's own error in
   the same dtype, the SASS instruction counts and registers.
2. Timing, one subprocess per (dtype, d): the forward at batch * N = 16k tokens and heads * d =
   2048, N in {2k, 4k, 16k}, causal and not, with ``triton.testing.do_bench`` (median):
   SDPA's cuDNN backend, our Triton forward (``flashtext.kernels.forward.forward``) and every
   Gluon variant whose check ran to the end (a result outside the bound is flagged, not
   hidden; a crash or hang is not run again): the FA4 switches and ablations (``--variants``,
   default all) at fp16 (``--variant-dtypes``). With ``--rounds R`` every provider of a
   configuration is timed R times, round after round, so that a slow spell of the host falls
   on all of them alike; ``ms`` is the median of the rounds, ``ms_rounds`` keeps each.
3. A compact table on stdout; JSON (GPU, versions, date, all rows) to ``$OUT/gluon_probe.json``
   when ``$OUT`` is set, else to ``--json`` if given.

Each step stops before the time budget (seconds, whole run) would be exceeded and says so.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> keyword switches of gluon_forward (see flashtext.kernels.gluon_forward.kernel_constants)
VARIANTS = {
    "gluon": {},
    "persistent": {"persistent": True},
    "no_pingpong": {"pingpong": False},
    "stages_alt": {"stages": None},  # filled per d: 3 at d=128, 2 at d=64
    "rescale8": {"rescale_threshold": 8.0},
    "poly1": {"poly_per_8": 1},
    "poly2": {"poly_per_8": 2},
    "rescale8_poly1": {"rescale_threshold": 8.0, "poly_per_8": 1},
    "unpacked_p": {"pack_p": False},
    "three_wg": {"consumers": 3},  # FA3's d = 64 split: 192 query rows on three warpgroups
    "three_wg_n64": {"consumers": 3, "block_n": 64, "stages": 4},  # no spill under a mask
    "open_left": {"open_left": True},  # a left edge that hides nothing: ptxas spills less
    "three_wg_open": {"consumers": 3, "open_left": True},
    "three_wg_open_persistent": {"consumers": 3, "open_left": True, "persistent": True},
    # the ping-pong turns on named barriers (bar.sync / bar.arrive), as FlashAttention-3 does
    "named_turn": {"named_turn": True},
    "persistent_named": {"persistent": True, "named_turn": True},
    "three_wg_open_persistent_named": {"consumers": 3, "open_left": True, "persistent": True,
                                       "named_turn": True},
}
ALT_STAGES = {64: 2, 128: 3, 256: 1}
# head dims a variant is checked and timed at (default: 64 and 128); three consumers of 160
# registers spill at d = 128 (O alone is 64 of them)
VARIANT_DIMS = {"three_wg": (64,), "three_wg_n64": (64,), "three_wg_open": (64,),
                "three_wg_open_persistent": (64,), "three_wg_open_persistent_named": (64,)}


def switches_for(variant: str, d: int) -> dict:
    sw = dict(VARIANTS[variant])
    if "stages" in sw:
        sw["stages"] = ALT_STAGES[d]
    return sw


def first_lines(exc: BaseException, n: int = 6) -> str:
    lines = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return " | ".join(lines[:n])[:600]


# ------------------------------------------------------------------ step 1: one variant


def reference64(q, k, v, causal, scale, window=(-1, -1)):
    """float64 attention on the GPU: GQA by repeating kv heads, bottom-right causal, window."""
    import torch

    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double() for t in (q, k, v))
    k64, v64 = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    s = (q64 @ k64.transpose(-1, -2)) * scale
    n_q, n_k = q.shape[2], k.shape[2]
    i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
    j = torch.arange(n_k, device=q.device)[None, :]
    keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    left, right = window
    if causal:
        keep &= j <= i
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v64, lse, keep


def max_err(a, b) -> float:
    import torch

    a, b = a.double(), b.double()
    if not torch.equal(torch.isneginf(a), torch.isneginf(b)):
        return math.inf
    fin = torch.isfinite(b)
    return float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0


def check_variant(spec: dict) -> dict:
    """Compile one variant and check it on small shapes; returns a JSON-able record."""
    import torch

    from flashtext.bench.static_compile import sass_of
    from flashtext.fa4_softmax import exp2_relative_error
    from flashtext.kernels import gluon_forward as gf

    d, dtype, causal = spec["d"], getattr(torch, spec["dtype"]), spec["causal"]
    sw = switches_for(spec["variant"], d)
    shapes = [  # (batch, heads, kv heads, N_q, N_k, window)
        (2, 3, 3, 1000, 1000, (-1, -1)), (1, 4, 4, 129, 1000, (-1, -1)),
        (1, 4, 4, 1000, 129, (-1, -1)), (2, 8, 2, 777, 777, (-1, -1)), (1, 2, 2, 1, 17, (-1, -1)),
        (4, 16, 4, 1000, 1000, (-1, -1)),  # 512 work tiles: several per persistent program
    ]
    if spec["variant"] == "gluon":
        shapes.append((1, 4, 2, 1000, 1500, (200, 0 if causal else 30)))
    record = {**spec, "switches": sw, "cases": [], "ok": True}
    t0 = time.time()
    g = torch.Generator(device="cuda").manual_seed(0)
    allowance = exp2_relative_error(sw.get("poly_degree", 3)) if sw.get("poly_per_8") else 0.0
    for b, h, hk, n_q, n_k, window in shapes:
        q = torch.randn(b, h, n_q, d, device="cuda", generator=g).to(dtype)
        k = torch.randn(b, hk, n_k, d, device="cuda", generator=g).to(dtype)
        v = torch.randn(b, hk, n_k, d, device="cuda", generator=g).to(dtype)
        scale = d ** -0.5
        o, lse, kernel = gf.launch(q, k, v, causal, scale, window, **sw)
        torch.cuda.synchronize()
        o_ref, lse_ref, keep = reference64(q, k, v, causal, scale, window)
        # PyTorch in the same dtype: the error a reader would otherwise get
        group = h // hk
        s = (q @ k.repeat_interleave(group, 1).transpose(-1, -2)) * scale
        s = s.masked_fill(~keep, float("-inf"))
        o_pt = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.repeat_interleave(group, 1)
        lse_pt = torch.logsumexp(s.float(), dim=-1)
        e = {"o": max_err(o, o_ref), "lse": max_err(lse, lse_ref),
             "o_torch": max_err(o_pt, o_ref), "lse_torch": max_err(lse_pt, lse_ref)}
        u = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
        o_bound = 2 * e["o_torch"] + 2 * u * float(o_ref.abs().max()) + \
            2 * allowance * float(v.abs().max()) + 1e-6
        fin = lse_ref[torch.isfinite(lse_ref)]
        lse_bound = 2 * e["lse_torch"] + 2 * 2.0**-24 * float(fin.abs().max()) * 8 + allowance \
            + 1e-5
        case_ok = e["o"] <= o_bound and e["lse"] <= lse_bound
        record["ok"] &= case_ok
        record["cases"].append({"shape": [b, h, hk, n_q, n_k, list(window)], **e,
                                "ok": case_ok})
    # a long sequence (128 key tiles: the ring and the turn barriers wrap many times), against
    # our Triton forward (both accumulate in fp32): catches a hang or a wrong phase late
    from flashtext.kernels.forward import forward as triton_forward

    q, k, v = (torch.randn(1, 2, 16384, d, device="cuda", generator=g).to(dtype)
               for _ in range(3))
    o, lse = gf.gluon_forward(q, k, v, causal, d ** -0.5, **sw)
    o_t, lse_t = triton_forward(q, k, v, causal, d ** -0.5)
    torch.cuda.synchronize()
    record["long_16k_vs_triton"] = {"o": max_err(o, o_t), "lse": max_err(lse, lse_t)}
    record["seconds"] = round(time.time() - t0, 1)
    try:
        # the whole kernel: Triton's own asm["sass"] stops after 4096 instructions
        sass = sass_of(kernel.asm["cubin"])
        if sass is None:
            raise RuntimeError("no cuobjdump to disassemble the kernel with")
        record["sass"] = {op: sass.count(op) for op in (
            "HGMMA", "MUFU.EX2", "USETMAXREG", "UTMALDG", "UTMASTG", "SYNCS.PHASECHK", "BAR.SYNC",
            "STL", "LDL", "FFMA", "FMUL", "FADD", "FMNMX")}
    except Exception as exc:  # noqa: BLE001 - a disassembler problem must not hide the check
        record["sass_error"] = first_lines(exc)
    record["n_regs"], record["n_spills"] = kernel.n_regs, kernel.n_spills
    record["shared"] = kernel.metadata.shared
    return record


# ------------------------------------------------------------------ step 2: timing


def time_group(spec: dict) -> list[dict]:
    """Time every provider at every configuration of one (dtype, d)."""
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtext.kernels import gluon_forward as gf
    from flashtext.kernels.forward import forward as triton_forward

    d, dtype = spec["d"], getattr(torch, spec["dtype"])
    rows = []
    rounds = spec.get("rounds", 1)
    for n in spec["ns"]:
        for causal in spec["causals"]:
            batch, heads = max(1, 16384 // n), 2048 // d
            g = torch.Generator(device="cuda").manual_seed(n + causal)
            q, k, v = (torch.randn(batch, heads, n, d, device="cuda", generator=g).to(dtype)
                       for _ in range(3))
            scale = d ** -0.5
            flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
            providers = {
                "cudnn": lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(
                    q, k, v, is_causal=c),
                "triton": lambda q=q, k=k, v=v, c=causal, s=scale: triton_forward(q, k, v, c, s),
            }
            for variant in spec["variants"].get(str(causal), []):
                sw = switches_for(variant, d)
                providers[variant] = lambda q=q, k=k, v=v, c=causal, s=scale, sw=sw: \
                    gf.gluon_forward(q, k, v, c, s, **sw)
            o_ref = None
            config_rows = {}
            for round_ in range(rounds):
                for name, fn in providers.items():
                    row = config_rows.setdefault(name, {
                        "dtype": spec["dtype"], "d": d, "n": n, "causal": causal,
                        "batch": batch, "heads": heads, "provider": name, "ms_rounds": []})
                    if "error" in row:
                        continue
                    try:
                        with (sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "cudnn"
                              else contextlib.nullcontext()):
                            if round_ == 0:
                                out = fn()
                                torch.cuda.synchronize()
                                o = (out[0] if isinstance(out, tuple) else out).float()
                                o_ref = o if o_ref is None else o_ref
                                row["max_diff_vs_first"] = float((o - o_ref).abs().max())
                            row["ms_rounds"].append(triton.testing.do_bench(
                                fn, warmup=10, rep=60, return_mode="median"))
                    except Exception as exc:  # noqa: BLE001 - one provider must not hide the rest
                        row["error"] = first_lines(exc)
            for row in config_rows.values():
                if row["ms_rounds"] and "error" not in row:
                    row["ms"] = statistics.median(row["ms_rounds"])
                    row["tflops"] = flops / row["ms"] * 1e-9
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------ driver


def run_child(kind: str, spec: dict, timeout: float) -> tuple[list[dict], str]:
    """Run ``--child KIND SPEC`` in a fresh process; returns its JSON rows and its stderr tail."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return rows, f"timed out after {timeout:.0f} s (a hang?)"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    tail = "" if proc.returncode == 0 else " | ".join(proc.stderr.strip().splitlines()[-6:])
    return rows, tail


def child_main(kind: str, spec_text: str) -> None:
    spec = json.loads(spec_text)
    if kind == "check":
        try:
            print(json.dumps(check_variant(spec)), flush=True)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as a failed check
            print(json.dumps({**spec, "ok": False, "error": first_lines(exc)}), flush=True)
    elif kind == "time":
        time_group(spec)
    else:
        raise SystemExit(f"unknown child kind {kind!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="time N = 4k only, FA4/ablation variants non-causal only")
    parser.add_argument("--jobs", type=int, default=12, help="check subprocesses at once")
    parser.add_argument("--budget", type=float, default=230.0, help="seconds for the whole run")
    parser.add_argument("--variants", nargs="+", choices=[v for v in VARIANTS if v != "gluon"],
                        default=None, help="the variants besides gluon to check and time "
                        "(default: all)")
    parser.add_argument("--variant-dtypes", nargs="+", choices=("float16", "bfloat16"),
                        default=["float16"], help="dtypes the variants are checked and timed at")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each configuration's providers this many times, in turn")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON "
                        "(default: $OUT/gluon_probe.json when $OUT is set)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.child:
        child_main(*args.child)
        return

    import torch
    import triton

    from flashtext import recorded

    start = time.time()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"gluon probe on {gpu}: torch {torch.__version__}, triton {triton.__version__}",
          flush=True)
    extra = args.variants or [v for v in VARIANTS if v != "gluon"]
    extra_causals = (False,) if args.quick else (False, True)
    specs = [dict(variant="gluon", d=d, dtype=dt, causal=c) for dt in ("float16", "bfloat16")
             for d in (64, 128, 256) for c in (False, True)]
    specs += [dict(variant=v, d=d, dtype=dt, causal=c) for v in extra
              for dt in args.variant_dtypes for d in VARIANT_DIMS.get(v, (64, 128))
              for c in extra_causals]

    # 1. checks, in parallel (compiles dominate; each in its own process and CUDA context)
    checks = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_child, "check", s, 120.0): s for s in specs}
        for fut in concurrent.futures.as_completed(futures):
            s = futures[fut]
            rows, tail = fut.result()
            rec = rows[-1] if rows else {**s, "ok": False}
            if tail:
                rec.setdefault("error", tail)
            checks.append(rec)
            errs = " ".join(f"{c['o']:.1e}/{c['o_torch']:.1e}" for c in rec.get("cases", []))
            long = rec.get("long_16k_vs_triton", {}).get("o")
            errs += f" 16k vs triton {long:.1e}" if long is not None else ""
            print(f"check {s['variant']:>14} d={s['d']:<3} {s['dtype']:<8} "
                  f"causal={s['causal']!s:<5} {'ok  ' if rec.get('ok') else 'FAIL'} "
                  f"O err ours/torch: {errs} "
                  f"{rec.get('error', '')}", flush=True)
    # a variant is timed when its check ran to the end (a wrong result is reported, not hidden;
    # a crash or a hang is not timed again)
    ran = {(r["variant"], r["d"], r["dtype"], r["causal"]) for r in checks
           if "seconds" in r and "error" not in r}
    n_ok = sum(bool(r.get("ok")) for r in checks)
    print(f"checks: {n_ok}/{len(specs)} within the bound, {len(ran)} ran to the end, "
          f"{time.time() - start:.0f} s", flush=True)

    # 2. timing, one group at a time on the otherwise idle GPU
    ns = (4096,) if args.quick else (2048, 4096, 16384)
    groups = [("float16", 128), ("float16", 64), ("bfloat16", 128), ("bfloat16", 64)]
    timings, skipped = [], []
    for dt, d in groups + ([] if args.quick else [("float16", 256)]):
        left = args.budget - (time.time() - start)
        if left < 25:
            skipped.append(f"{dt} d={d}: out of time budget")
            continue
        variants = {str(c): [v for v in VARIANTS if (v, d, dt, c) in ran]
                    for c in (False, True)}
        group_ns = (4096,) if d == 256 else ns
        spec = dict(dtype=dt, d=d, ns=list(group_ns), causals=[False, True], variants=variants,
                    rounds=args.rounds)
        rows, tail = run_child("time", spec, min(left - 5, 100.0))
        timings += rows
        if tail:
            skipped.append(f"{dt} d={d}: {tail}")
            print(f"timing {dt} d={d}: {tail}", flush=True)

    # 3. table and JSON
    table(timings)
    for line in skipped:
        print("not timed:", line)
    record = {"gpu": gpu, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "triton": triton.__version__, "args": {"quick": args.quick, "variants": extra,
                                               "variant_dtypes": args.variant_dtypes,
                                               "rounds": args.rounds},
              "seconds": round(time.time() - start, 1), "variants": VARIANTS, "checks": checks,
              "timings": timings, "not_timed": skipped,
              # what was measured, so that a later change to the kernel marks the file stale
              recorded.SOURCES_KEY: recorded.kernel_fingerprint(
                  ("flashtext.kernels.gluon_forward",))}
    target = args.json or (Path(os.environ["OUT"]) / "gluon_probe.json"
                           if os.environ.get("OUT") else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {target}")
    print(f"total {time.time() - start:.0f} s")


def table(rows: list[dict]) -> None:
    """TFLOP/s per configuration: cuDNN, Triton, Gluon, the ratio, then the variants."""
    cells = {}
    for r in rows:
        if "tflops" in r:
            cells[(r["dtype"], r["d"], r["n"], r["causal"], r["provider"])] = r["tflops"]
    configs = sorted({k[:4] for k in cells})
    names = [v for v in VARIANTS if v != "gluon"]
    print("\nfwd TFLOP/s (median)   cudnn  triton  gluon  gl/cudnn | " +
          " ".join(f"{n:>8.8}" for n in names))
    for dt, d, n, c in configs:
        get = lambda p, dt=dt, d=d, n=n, c=c: cells.get((dt, d, n, c, p))  # noqa: E731
        fmt = lambda x: f"{x:6.0f}" if x else "     -"  # noqa: E731
        ratio = f"{get('gluon') / get('cudnn'):7.2f}x" if get("gluon") and get("cudnn") else \
            "       -"
        print(f"{dt[:4]} d={d:<3} N={n:<5} {'causal' if c else '      '} {fmt(get('cudnn'))} "
              f"{fmt(get('triton'))}  {fmt(get('gluon'))} {ratio} | " +
              " ".join(f"{fmt(get(v)):>8}" for v in names))


if __name__ == "__main__":
    main()
