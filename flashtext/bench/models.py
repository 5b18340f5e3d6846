"""The benchmark of attention as real models run it, side by side in one run: grouped-query
attention, sliding windows, packed variable-length batches and KV-cache decoding.

    python -m flashtext.bench.models                 # on a GPU: every mode in --budget-min
    python -m flashtext.bench.models --quick         # CPU smoke test (interpreter, tiny shapes)
    python -m flashtext.bench.models --modes decode  # one mode
    python -m flashtext.bench.models --modes gqa --merge  # add to the existing recording

On a fresh machine FlexAttention's compiles take most of the time (minutes for GQA alone), so
a run the budget cut short says which modes to finish with ``--merge``.

For each configuration every provider runs on the same seeded inputs, is checked against an
fp32 PyTorch reference on a slice of the rows (scaled max error, as in the main sweep), and is
timed with :func:`flashtext.bench.core.time_call` (median of ``triton.testing.do_bench``). On a
GPU each row also records the host's time per call and the GPU's alone (``host_ms``,
``gpu_ms``: :func:`flashtext.bench.core.host_and_gpu_ms`), so a row the host set says so.

* **gqa**: ``flash_attention`` with H_kv in {H, H/4, H/8} K/V heads against SDPA's backends and
  FlexAttention with ``enable_gqa=True``; TFLOP/s = 4 B H N^2 d (x0.5 causal, x3.5 fwd+bwd).
* **window**: a causal sliding window (4096 keys back) at N = 16k and 64k against FlexAttention
  with the same mask as a BlockMask, and our full causal kernel at the same N; TFLOP/s on the
  visible pairs (:func:`flashtext.kernels.plan.visible_pairs`).
* **varlen**: a packed causal batch of lengths drawn from 128 to 8192 against FlexAttention's
  document mask, and our dense kernel on the batch padded to its longest sequence.
* **decode**: one new token per sequence (H = 32, H_kv = 8, d = 128) against a dense cache and
  paged caches of 16- and 256-token blocks, against SDPA's backends on the dense cache; GB/s of
  K/V bytes read and their fraction of the measured copy bandwidth (``roof_fraction``).

Writes ``flashtext/data/<out>.json`` (gqa, window, varlen rows) and ``<out>_decode.json``
(decode rows, ``mode: "decode"``) through :func:`flashtext.recorded.save`, stamped with the
kernel sources measured.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from flashtext import _boot, recorded
from flashtext.bench.core import clock_fields, tflops, time_call

TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-2}
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class Plan:
    """What to measure: the shapes of every mode, small ones for the CPU smoke test."""

    gqa: tuple[tuple[int, int, int, int], ...]  # (batch, heads, heads_kv, n)
    window: tuple[tuple[int, int, int], ...]  # (heads, n, left)
    varlen: tuple[int, int, int, int]  # (heads, total tokens, shortest, longest)
    decode: tuple[tuple[int, int], ...]  # (batch, cache length)
    decode_heads: tuple[int, int] = (32, 8)
    d: int = 128
    dtype: str = "float16"
    warmup_ms: float = 10.0
    rep_ms: float = 40.0


FULL = Plan(gqa=((2, 16, 16, 8192), (2, 16, 4, 8192), (2, 16, 2, 8192)),
            window=((16, 16384, 4096), (16, 65536, 4096)),
            varlen=(16, 32768, 128, 8192),
            decode=((1, 4096), (1, 32768), (1, 131072), (16, 32768), (64, 4096), (64, 32768)))
QUICK = Plan(gqa=((1, 4, 4, 64), (1, 4, 1, 64)), window=((2, 128, 16),),
             varlen=(2, 200, 16, 80), decode=((2, 96),), decode_heads=(4, 2), d=16,
             dtype="float32", warmup_ms=1.0, rep_ms=5.0)


def _device() -> str:
    return "cpu" if _boot.INTERPRETING else "cuda"


def _randn(*shape, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=_device(), dtype=dtype)


def _scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _sdpa(backend: str, q, k, v, causal: bool, attn_mask=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]
    with sdpa_kernel(which):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, attn_mask=attn_mask, enable_gqa=k.shape[1] != q.shape[1])


_FLEX: dict[str, Callable] = {}


def _flex():
    """FlexAttention compiled once per process, a kernel per shape (as its own benchmarks)."""
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def _reference(q, k, v, causal: bool, rows: slice, window_left: int = -1,
               key_lo: int = 0) -> torch.Tensor:
    """fp32 attention of the first batch element's query rows ``rows`` (keys from ``key_lo``),
    bottom-right masks, grouped heads repeated."""
    qs = q[:1, :, rows].float()
    ks, vs = k[:1, :, key_lo:].float(), v[:1, :, key_lo:].float()
    if ks.shape[1] != qs.shape[1]:
        ks = ks.repeat_interleave(qs.shape[1] // ks.shape[1], 1)
        vs = vs.repeat_interleave(qs.shape[1] // vs.shape[1], 1)
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i = torch.arange(rows.start, rows.stop, device=q.device)[:, None] + (k.shape[2] - q.shape[2])
    j = torch.arange(key_lo, k.shape[2], device=q.device)[None, :]
    hide = torch.zeros_like(s[0, 0], dtype=torch.bool)
    if causal:
        hide |= j > i
    if window_left >= 0:
        hide |= j < i - window_left
    s = s.masked_fill(hide, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ vs


class Runner:
    """Times and checks one provider call at a time; every failure becomes a row with a reason."""

    def __init__(self, plan: Plan, budget_s: float | None):
        self.plan, self.rows = plan, []
        self.gpu = not _boot.INTERPRETING
        self.deadline = None if budget_s is None else time.monotonic() + budget_s

    def measure(self, row: dict[str, Any], call: Callable[[], Any], check: Callable[[Any], float]
                | None, flops: float | None = None, kv_bytes: float | None = None,
                grads: list[torch.Tensor] | None = None) -> dict[str, Any]:
        row = {**row, "dtype": self.plan.dtype}
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.rows.append({**row, "status": "skipped", "reason": "time budget"})
            return self.rows[-1]
        try:
            out = call()
            if check is not None:
                row["error"] = check(out)
                row["correct"] = row["error"] <= TOLERANCE[self.plan.dtype]
            t = time_call(call, warmup_ms=self.plan.warmup_ms, rep_ms=self.plan.rep_ms,
                          grad_to_none=grads, gpu=self.gpu)
            row.update(status="ok", ms=t.ms, ms_q20=t.ms_q20, ms_q80=t.ms_q80, reps=t.reps,
                       timer=t.timer)
            if flops is not None:
                row.update(flops=flops, tflops=tflops(flops, t.ms))
            if kv_bytes is not None:
                row.update(kv_bytes=kv_bytes, gbps=kv_bytes / t.ms / 1e6)
            if self.gpu:  # the host's clock and the GPU's alone, as the main sweep records them
                row.update(clock_fields(call, t.ms, grads))
        except Exception as exc:  # unsupported backend, OOM, compile failure: data, not a crash
            row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
            if self.gpu:
                torch.cuda.empty_cache()
        self.rows.append(row)
        print(_line(row), flush=True)
        return row


def _line(r: dict[str, Any]) -> str:
    what = " ".join(f"{k}={r[k]}" for k in ("mode", "pass", "provider", "batch", "heads",
                                            "heads_kv", "n", "window", "block_size")
                    if k in r)
    if r["status"] != "ok":
        return f"{what}: {r['status']} ({r.get('reason', '')})"
    speed = f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else f"{r['gbps']:.0f} GB/s"
    ok = "" if r.get("correct", True) else "  !WRONG"
    return f"{what}: {r['ms']:.3f} ms, {speed}{ok}"


def _passes(run: Runner, base: dict, q, k, v, fwd: Callable, flops_fwd: float,
            check: Callable[[Any], float] | None) -> None:
    """Time ``fwd`` as an inference forward and as forward + backward."""
    run.measure({**base, "pass": "fwd"}, lambda: fwd(q, k, v), check, flops=flops_fwd)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def fwd_bwd():
        fwd(*leaves).backward(do)

    run.measure({**base, "pass": "fwd_bwd"}, fwd_bwd, None, flops=3.5 * flops_fwd, grads=leaves)


def bench_gqa(run: Runner, providers: tuple[str, ...]) -> None:
    from flashtext.kernels import flash_attention

    p = run.plan
    dtype = getattr(torch, p.dtype)
    for batch, heads, heads_kv, n in p.gqa:
        for causal in (False, True):
            q = _randn(batch, heads, n, p.d, dtype=dtype, seed=1)
            k, v = (_randn(batch, heads_kv, n, p.d, dtype=dtype, seed=s) for s in (2, 3))
            rows = slice(n - min(n, 128), n)
            ref = _reference(q, k, v, causal, rows)
            flops = 4 * batch * heads * n * n * p.d * (0.5 if causal else 1.0)
            base = dict(mode="gqa", batch=batch, heads=heads, heads_kv=heads_kv, n=n,
                        d=p.d, causal=causal)

            def check(o, ref=ref, rows=rows):
                return _scaled_error(o[:1, :, rows], ref)

            calls = {"ours": lambda q, k, v, c=causal: flash_attention(q, k, v, causal=c)}
            for backend in SDPA_BACKENDS:
                if backend == "math" and n > 4096:
                    continue
                calls[backend] = lambda q, k, v, b=backend, c=causal: _sdpa(b, q, k, v, c)
            if run.gpu and "flex" in providers:
                calls["flex"] = _flex_call(batch, heads, n, n, causal)
            for name, fn in calls.items():
                if name in providers:
                    _passes(run, {**base, "provider": name}, q, k, v, fn, flops, check)


def _flex_call(batch: int, heads: int, n_q: int, n_k: int, causal: bool, left: int = -1,
               document: torch.Tensor | None = None) -> Callable:
    from torch.nn.attention.flex_attention import create_block_mask

    off = n_k - n_q

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= 0  # all True, shaped like the indices
        if causal:
            keep = keep & (kv_idx <= q_idx + off)
        if left >= 0:
            keep = keep & (kv_idx >= q_idx + off - left)
        if document is not None:
            keep = keep & (document[q_idx] == document[kv_idx])
        return keep

    built: dict[str, Any] = {}

    def call(q, k, v):
        # built on the first call, inside Runner.measure, so that its compiles (tens of
        # seconds) are spent only where the time budget lets the row run at all
        if not built:
            # a fresh compile for every configuration: past dynamo's recompile limit (8
            # graphs) a compiled function silently falls back to eager, far slower than
            # FlexAttention's kernel
            torch._dynamo.reset()
            _FLEX.clear()
            # the mask compiled too: the eager create_block_mask materialises every (q, k)
            built["mask"] = create_block_mask(mask_mod, None, None, n_q, n_k, device="cuda",
                                              _compile=True)
            built["flex"] = _flex()
        return built["flex"](q, k, v, block_mask=built["mask"],
                             enable_gqa=k.shape[1] != q.shape[1])

    return call


def bench_window(run: Runner, providers: tuple[str, ...]) -> None:
    from flashtext.kernels import flash_attention, plan

    p = run.plan
    dtype = getattr(torch, p.dtype)
    for heads, n, left in p.window:
        q, k, v = (_randn(1, heads, n, p.d, dtype=dtype, seed=s) for s in (4, 5, 6))
        rows = slice(n - min(n, 128), n)
        key_lo = max(0, rows.start - left)
        ref = _reference(q, k, v, True, rows, left, key_lo)
        pairs = plan.visible_pairs(n, n, True, (left, -1))
        base = dict(mode="window", batch=1, heads=heads, heads_kv=heads, n=n, d=p.d,
                    causal=True, window=left, visible_pairs=pairs)

        def check(o, ref=ref, rows=rows):
            return _scaled_error(o[:1, :, rows], ref)

        calls = {"ours": lambda q, k, v, w=left: flash_attention(q, k, v, causal=True,
                                                                 window_size=(w, 0))}
        if run.gpu and "flex" in providers:
            calls["flex"] = _flex_call(1, heads, n, n, True, left)
        for name, fn in calls.items():
            if name in providers:
                _passes(run, {**base, "provider": name}, q, k, v, fn, 4 * heads * pairs * p.d,
                        check)
        if "ours" in providers:  # the full causal kernel at the same N, on its own pairs
            full = plan.visible_pairs(n, n, True)
            _passes(run, {**base, "provider": "ours_causal", "visible_pairs": full}, q, k, v,
                    lambda q, k, v: flash_attention(q, k, v, causal=True),
                    4 * heads * full * p.d, None)


def _lengths(total: int, shortest: int, longest: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while sum(out) < total:
        out.append(int(torch.randint(shortest, longest + 1, (1,), generator=g)))
    out[-1] -= sum(out) - total
    if out[-1] < shortest:
        out[-2] += out.pop()
    return out


def bench_varlen(run: Runner, providers: tuple[str, ...]) -> None:
    from flashtext.kernels import flash_attention, flash_attention_varlen

    p = run.plan
    dtype = getattr(torch, p.dtype)
    heads, total, shortest, longest = p.varlen
    lengths = _lengths(total, shortest, longest)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device=_device())
    q, k, v = (_randn(total, heads, p.d, dtype=dtype, seed=s) for s in (7, 8, 9))
    flops = sum(4 * heads * n * n * p.d * 0.5 for n in lengths)
    base = dict(mode="varlen", batch=len(lengths), heads=heads, heads_kv=heads, n=total,
                d=p.d, causal=True, lengths=lengths)
    last = slice(int(cu[-2]), total)
    qd, kd, vd = (t[last].transpose(0, 1)[None] for t in (q, k, v))
    ref = _reference(qd, kd, vd, True, slice(0, qd.shape[2]))

    def check(o, ref=ref):
        return _scaled_error(o[last].transpose(0, 1)[None], ref)

    if "ours" in providers:
        _passes(run, {**base, "provider": "ours"}, q, k, v,
                lambda q, k, v: flash_attention_varlen(q, k, v, cu, cu, max(lengths),
                                                       max(lengths), causal=True),
                flops, check)
        # padded to the longest sequence: right padding is hidden from every real query by
        # the causal mask, so the real rows are right; the padding is wasted work
        padded = [torch.zeros(len(lengths), heads, max(lengths), p.d, dtype=dtype,
                              device=_device()) for _ in range(3)]
        for b, n in enumerate(lengths):
            for dst, src in zip(padded, (q, k, v), strict=True):
                dst[b, :, :n] = src[int(cu[b]):int(cu[b]) + n].transpose(0, 1)
        _passes(run, {**base, "provider": "ours_padded"}, *padded,
                lambda q, k, v: flash_attention(q, k, v, causal=True), flops, None)
    if run.gpu and "flex" in providers:
        document = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                                           torch.tensor(lengths, device="cuda"))
        flex = _flex_call(1, heads, total, total, True, document=document)
        qf, kf, vf = (t.transpose(0, 1)[None] for t in (q, k, v))
        _passes(run, {**base, "provider": "flex"}, qf, kf, vf, flex, flops,
                lambda o: _scaled_error(o[0].transpose(0, 1)[last].transpose(0, 1)[None], ref))


def bench_decode(run: Runner, providers: tuple[str, ...]) -> None:
    from flashtext.kernels import flash_decode

    p = run.plan
    dtype = getattr(torch, p.dtype)
    heads, heads_kv = p.decode_heads
    for batch, n in p.decode:
        q = _randn(batch, heads, 1, p.d, dtype=dtype, seed=10)
        k, v = (_randn(batch, heads_kv, n, p.d, dtype=dtype, seed=s) for s in (11, 12))
        seqlens = torch.full((batch,), n, dtype=torch.int32, device=_device())
        kv_bytes = 2.0 * batch * heads_kv * n * p.d * k.element_size()
        ref = _reference(q, k, v, False, slice(0, 1))
        base = dict(mode="decode", batch=batch, heads=heads, heads_kv=heads_kv, n=n, d=p.d)

        def check(o, ref=ref):
            return _scaled_error(o[:1], ref)

        def ours(kc, vc, table=None, q=q, seqlens=seqlens):
            return flash_decode(q, kc, vc, seqlens, block_table=table, check_inputs=False)

        if "ours" in providers:
            run.measure({**base, "provider": "ours", "cache": "dense"}, lambda k=k, v=v: ours(k, v),
                        check, kv_bytes=kv_bytes)
            for block_size in (16, 256):
                if n % block_size:
                    continue
                kp, vp, table = _paged(k, v, block_size)
                run.measure({**base, "provider": "ours", "cache": "paged",
                             "block_size": block_size},
                            lambda kp=kp, vp=vp, t=table: ours(kp, vp, t), check,
                            kv_bytes=kv_bytes)
                del kp, vp
        for backend in SDPA_BACKENDS:
            if backend in providers and not (backend == "math" and batch * n > 2**20):
                run.measure({**base, "provider": backend, "cache": "dense"},
                            lambda b=backend, q=q, k=k, v=v: _sdpa(b, q, k, v, False), check,
                            kv_bytes=kv_bytes)
        del k, v
        if run.gpu:
            torch.cuda.empty_cache()


def _paged(k: torch.Tensor, v: torch.Tensor, block_size: int):
    """The same cache in shuffled physical blocks, and its block table."""
    batch, heads_kv, n, d = k.shape
    per = n // block_size
    g = torch.Generator().manual_seed(block_size)
    perm = torch.randperm(batch * per, generator=g).to(k.device)
    table = perm.view(batch, per).to(torch.int32)
    blocks = [t.view(batch, heads_kv, per, block_size, d).permute(0, 2, 1, 3, 4)
              .reshape(batch * per, heads_kv, block_size, d) for t in (k, v)]
    kp, vp = (torch.empty_like(b) for b in blocks)
    kp[perm], vp[perm] = blocks
    return kp, vp, table


MODES = {"gqa": bench_gqa, "window": bench_window, "varlen": bench_varlen,
         "decode": bench_decode}
# the command line's order, cheapest first: a mode's unused share of the time budget passes on
# to the modes after it, and GQA's FlexAttention compiles take the longest
RUN_ORDER = ("decode", "varlen", "window", "gqa")
# the kernels each file's rows run, which its stamp names: the decode rows run flash_decode
# alone, so a change to the dense kernels leaves them current
DENSE_MEASURED = ("flashtext.kernels.api",)
DECODE_MEASURED = ("flashtext.kernels.decode",)


def run(plan: Plan, modes: tuple[str, ...], providers: tuple[str, ...],
        budget_s: float | None = None, spent: dict[str, dict] | None = None,
        ) -> list[dict[str, Any]]:
    """Measure every mode in ``modes``; returns the rows (also printed as they come).

    ``budget_s`` is shared out as the run goes: each mode may use an equal part of what is
    left when it starts (time a mode does not use passes on to the next), so a slow mode
    (compiles, say) has its own remaining rows skipped, not every mode after it. A row that
    starts before its mode's deadline runs to the end, so a mode can overrun its share.
    ``spent``, if given, receives per mode its share, the seconds it took, and its rows and
    skipped rows."""
    runner = Runner(plan, None)
    end = None if budget_s is None else time.monotonic() + budget_s
    for i, mode in enumerate(modes):
        start, first = time.monotonic(), len(runner.rows)
        share = None if end is None else max(end - start, 0.0) / (len(modes) - i)
        runner.deadline = None if share is None else start + share
        MODES[mode](runner, providers)
        rows = runner.rows[first:]
        used = {"share_s": None if share is None else round(share, 1),
                "seconds": round(time.monotonic() - start, 1), "rows": len(rows),
                "skipped": sum(r["status"] == "skipped" for r in rows)}
        print(f"mode {mode}: {used['seconds']} s"
              + ("" if share is None else f" of a {used['share_s']} s share")
              + f", {used['skipped']} of {used['rows']} rows skipped for time", flush=True)
        if spent is not None:
            spent[mode] = used
    return runner.rows


ROW_KEY = ("mode", "pass", "provider", "cache", "block_size", "batch", "heads", "heads_kv",
           "n", "window", "causal", "dtype")


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A recording finished in several runs (:func:`flashtext.recorded.merge_runs`), rows
    matched by :data:`ROW_KEY`; the per-mode accounting of both runs is kept."""
    merged = recorded.merge_runs(old, new, lambda r: tuple(r.get(k) for k in ROW_KEY),
                                 _run_record)
    merged["modes"] = {**(old.get("modes") or {}), **(new.get("modes") or {})}
    return merged


def _run_record(payload: dict[str, Any]) -> dict[str, Any]:
    return {"date": payload.get("date"), "argv": payload.get("argv"),
            "seconds": payload.get("seconds"), "modes": payload.get("modes"),
            "rows": len(payload.get("rows", [])), "ceilings": payload.get("ceilings")}


def _save(name: str, payload: dict[str, Any], do_merge: bool, measured: tuple[str, ...]):
    if do_merge and recorded.path(name).exists():
        import json

        from flashtext.bench.report import stamp

        payload = merge(json.loads(recorded.path(name).read_text()), stamp(payload))
        payload = {k: v for k, v in payload.items() if k not in recorded.REQUIRED_KEYS}
    return recorded.save(name, payload, measured=measured)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU smoke test)")
    ap.add_argument("--modes", nargs="+", default=list(RUN_ORDER), choices=list(MODES))
    ap.add_argument("--providers", nargs="+",
                    default=["ours", "flex", *SDPA_BACKENDS])
    ap.add_argument("--out", default=None, help="recording name (default: none on the CPU, "
                    "bench_h200_models on a GPU)")
    ap.add_argument("--budget-min", type=float, default=7.0,
                    help="minutes, shared out mode by mode (0: no budget)")
    ap.add_argument("--merge", action="store_true",
                    help="merge into the existing recording (same GPU and versions), replacing "
                    "the rows measured again: finish a recording in several runs")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick or _boot.INTERPRETING else FULL
    providers = tuple(args.providers)
    if _boot.INTERPRETING:
        providers = tuple(x for x in providers if x in ("ours", "math"))
    started = time.time()
    spent: dict[str, dict] = {}
    rows = run(plan, tuple(args.modes), providers, args.budget_min * 60 or None, spent)
    wrong = [r for r in rows if r.get("provider", "").startswith("ours")
             and r.get("correct") is False]
    out = args.out or (None if _boot.INTERPRETING else "bench_h200_models")
    if out:
        from flashtext.bench.ceilings import measure_ceilings

        ceilings = measure_ceilings((plan.dtype,)) if not _boot.INTERPRETING else None
        for r in rows:
            if r.get("gbps") and ceilings:
                r["roof_fraction"] = r["gbps"] * 1e9 / ceilings["copy_bandwidth"]
        meta = {"plan": plan.__dict__, "seconds": round(time.time() - started, 1),
                "ceilings": ceilings, "tolerance": TOLERANCE,
                "argv": list(sys.argv[1:] if argv is None else argv), "modes": spent}
        dense = [r for r in rows if r["mode"] != "decode"]
        decode = [r for r in rows if r["mode"] == "decode"]
        if dense:
            print("wrote", _save(out, {**meta, "rows": dense}, args.merge, DENSE_MEASURED))
        if decode:
            print("wrote", _save(f"{out}_decode", {**meta, "rows": decode}, args.merge,
                                 DECODE_MEASURED))
    short = [m for m, used in spent.items() if used["skipped"]]
    if short:
        print(f"INCOMPLETE: the time budget skipped rows of {', '.join(short)}; finish with "
              f"python -m flashtext.bench.models --modes {' '.join(short)} --merge"
              + (f" --out {args.out}" if args.out else ""))
    if wrong:
        print(f"OURS WRONG in {len(wrong)} rows")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
