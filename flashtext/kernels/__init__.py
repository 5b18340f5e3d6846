"""Triton kernels: the chapter-9 primer (vector add, fused softmax, tiled matmul) and
FlashAttention-2 forward and backward (chapters 10 and 11), behind one public API.

    from flashtext.kernels import flash_attention
    o = flash_attention(q, k, v, causal=True)   # (batch, heads, seq, head_dim), differentiable
    o = flash_attention(q, k, v, window_size=(4096, 0))        # a sliding window; GQA k, v
    o = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k)  # packed
    o = flash_decode(q, k_cache, v_cache, cache_seqlens, block_table=...)  # KV-cache decode
    o, lse = attention_forward(q, k, v)         # the forward kernel alone, with log-sum-exp

Importing flashtext first decides whether Triton compiles for the GPU or runs its interpreter.
"""

from flashtext import _boot  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
from flashtext.kernels.api import (
    attention_backward,
    attention_forward,
    flash_attention,
    flash_attention_varlen,
)
from flashtext.kernels.decode import flash_decode

__all__ = ["attention_backward", "attention_forward", "flash_attention",
           "flash_attention_varlen", "flash_decode"]
