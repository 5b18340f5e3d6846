"""Measure what chapters 7 and 8 predict, on a CUDA GPU, with PyTorch's FlashAttention-2 backend.

    python scripts/record_fa2_schedule.py    # on a CUDA GPU -> flashtext/data/fa2_schedule.json

Three experiments, all fp16, SDPA forced onto its FLASH_ATTENTION backend (FlashAttention-2)
unless a row says otherwise:

1. ``causal``: forward and forward+backward time, causal and not, batch*N = 16384 tokens,
   heads*d = 2048, d in {64, 128}, N from 1k to 16k. Chapter 7 predicts causal block skipping
   saves close to 2x (the FA2 paper measured 1.7-1.8x); chapter 8 predicts the backward costs
   about 2.5x the forward in FLOPs.
2. ``small_batch``: batch 1, 16 heads, d = 128, N from 1k to 32k: FA2's grid splits the query
   blocks, so throughput should hold up with only 16 (batch, head) pairs on 132 SMs.
3. ``memory``: peak memory of forward+backward and the memory held between forward and backward
   (what autograd saved), math backend (stores the N x N probabilities) vs flash (stores the
   log-sum-exp), batch 1, 16 heads, d = 64.

Times are medians of ``triton.testing.do_bench`` (ms). Runtime about a minute on an H200.
On a machine without CUDA the script stops with a clear message: nothing is invented.
"""

from __future__ import annotations

import sys
from pathlib import Path

# appended: a flashtext tree first on PYTHONPATH (scripts/probe_variants.py) wins over the checkout
sys.path.append(str(Path(__file__).resolve().parents[1]))

TOKENS, WIDTH = 16384, 2048
NS = (1024, 2048, 4096, 8192, 16384)


def _require_cuda():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("record_fa2_schedule.py measures a CUDA GPU; this machine has none. "
                         "Chapters 7 and 8 show the recorded H200 results instead.")
    return torch


def _sdpa(torch, backend: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[backend]
    f = torch.nn.functional.scaled_dot_product_attention

    def run(q, k, v, causal: bool):
        with sdpa_kernel(kind):
            return f(q, k, v, is_causal=causal)

    return run


def _inputs(torch, b: int, h: int, n: int, d: int, grad: bool):
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (b, h, n, d)
    qkv = [torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
           .requires_grad_(grad) for _ in range(3)]
    do = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
    return (*qkv, do)


def _time(torch, b: int, h: int, n: int, d: int, causal: bool) -> dict:
    from triton.testing import do_bench

    attn = _sdpa(torch, "flash")
    q, k, v, do = _inputs(torch, b, h, n, d, grad=True)
    with torch.no_grad():
        fwd = do_bench(lambda: attn(q, k, v, causal), return_mode="median")

    def fwd_bwd():
        attn(q, k, v, causal).backward(do)

    both = do_bench(fwd_bwd, grad_to_none=[q, k, v], return_mode="median")
    flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return {"batch": b, "heads": h, "N": n, "d": d, "causal": causal, "fwd_ms": fwd,
            "fwd_bwd_ms": both, "fwd_tflops": flops / fwd * 1e-9,
            "fwd_bwd_tflops": 3.5 * flops / both * 1e-9}


def _memory(torch, backend: str, n: int, b: int = 1, h: int = 16, d: int = 64) -> dict:
    attn = _sdpa(torch, backend)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    q, k, v, do = _inputs(torch, b, h, n, d, grad=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = attn(q, k, v, False)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base  # the output plus what autograd saved
    out.backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out, q, k, v, do
    return {"backend": backend, "batch": b, "heads": h, "N": n, "d": d,
            "held_after_forward_bytes": int(held), "peak_fwd_bwd_bytes": int(peak)}


def main() -> None:
    torch = _require_cuda()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the bare GPU image may lack tqdm; progress bars are optional
        def tqdm(it, **_):
            return it

    from flashtext import recorded

    props = torch.cuda.get_device_properties(0)
    causal_rows = []
    for d in (64, 128):
        for n in tqdm(NS, desc=f"causal vs not, d={d}"):
            for causal in (False, True):
                causal_rows.append(_time(torch, TOKENS // n, WIDTH // d, n, d, causal))
    small = [_time(torch, 1, 16, n, 128, False)
             for n in tqdm((*NS, 32768), desc="batch 1, 16 heads")]
    memory = [_memory(torch, backend, n) for n in tqdm(NS, desc="memory")
              for backend in ("math", "flash")]
    payload = {
        "sms": props.multi_processor_count,
        "dtype": "float16",
        "backend": "SDPA FLASH_ATTENTION (FlashAttention-2); memory rows also MATH",
        "timing": "triton.testing.do_bench median, ms; TFLOP/s = 4*B*H*N^2*d (x0.5 causal) / "
                  "time, x3.5 for forward+backward",
        "causal": causal_rows,
        "small_batch": small,
        "memory": memory,
    }
    print(f"wrote {recorded.save('fa2_schedule', payload)}")


if __name__ == "__main__":
    main()
