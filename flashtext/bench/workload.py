"""The benchmark's workload for the measurement scripts: its inputs and one call to time.

``scripts/`` times, profiles and tunes the kernels at the setting of the sweep and of the H200
anchors (:class:`flashtext.bench.core.Settings`): batch * N = 16384 tokens and heads * d = 2048,
so every N does the same number of tokens. :func:`inputs` makes the tensors of that setting and
:func:`attention_call` a call to time on them; a script run with another ``flashtext`` tree first
on the import path (``scripts/probe_variants.py``) gets that tree's kernels through them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TOKENS = 16384  # batch * N
HIDDEN = 2048  # heads * d
# the scripts' --dtype spelling -> the torch dtype's name
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
_TORCH_DTYPES = ("float16", "bfloat16", "float32")
MODES = ("fwd", "fwd_bwd")


def batch_heads(d: int, n: int, *, tokens: int = TOKENS, hidden: int = HIDDEN) -> tuple[int, int]:
    """(batch, heads) of the setting at head dim ``d`` and sequence length ``n``."""
    for name, value in (("d", d), ("n", n)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if hidden % d:
        raise ValueError(f"d must divide hidden = {hidden}, got d = {d}")
    return max(1, tokens // n), hidden // d


def inputs(dtype: str, d: int, n: int, *, seed: int = 0, device: str = "cuda",
           tokens: int = TOKENS, hidden: int = HIDDEN
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal Q, K, V and dO of shape (batch, heads, n, d), seeded: the same numbers on
    every run. ``dtype`` is a torch dtype's name ("float16", "bfloat16", "float32")."""
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {_TORCH_DTYPES}, got {dtype!r}")
    batch, heads = batch_heads(d, n, tokens=tokens, hidden=hidden)
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, heads, n, d)
    q, k, v, do = (torch.randn(shape, device=device, dtype=getattr(torch, dtype), generator=g)
                   for _ in range(4))
    return q, k, v, do


def attention_call(dtype: str, d: int, n: int, causal: bool, mode: str = "fwd_bwd",
                   **setting) -> Callable[[], object]:
    """A call of :func:`flashtext.kernels.flash_attention` on fresh :func:`inputs` (``setting``:
    their keywords): the forward alone (``mode="fwd"``), or forward + backward with the
    gradients reset first, so every call does the same work and none accumulates."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    from flashtext.kernels import flash_attention

    q, k, v, do = inputs(dtype, d, n, **setting)
    if mode == "fwd":
        return lambda: flash_attention(q, k, v, causal=causal)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def call() -> None:
        for t in (q, k, v):
            t.grad = None
        flash_attention(q, k, v, causal=causal).backward(do)

    return call
