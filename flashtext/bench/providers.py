"""The providers a sweep compares: this book's kernel, PyTorch's SDPA backends, FlexAttention.

Each :class:`Provider` turns a configuration into a :class:`Prepared` ``attn(q, k, v) -> O``
(and the context it runs in), and may skip a configuration with a reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the configuration types; core imports this module for its validation
    from flashtext.bench.core import Config, Settings


@dataclass(frozen=True)
class Prepared:
    """A provider ready for one configuration: ``attn(q, k, v) -> O`` and the context to run
    it in (SDPA's backend selection wraps whole measurements, not each call)."""

    attn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@dataclass(frozen=True)
class Provider:
    name: str
    label: str
    description: str
    prepare: Callable[[Config, str, Settings], Prepared]
    skip: Callable[[Config, Settings, bool], str | None] = lambda cfg, s, gpu: None


def _prepare_flashtext(forward_kernel: str, backward_kernel: str,
                       ) -> Callable[[Config, str, Settings], Prepared]:
    def prepare(cfg: Config, device: str, s: Settings) -> Prepared:
        from flashtext.kernels import (
            flash_attention,  # lazily: the kernel may be under repair
            gluon_backward,
        )

        # "gluon": the Gluon dK/dV at every length, where it has the head dimension
        backward = backward_kernel if backward_kernel != "gluon" or \
            cfg.d in gluon_backward.HEAD_DIMS else "triton"

        def attn(q, k, v):
            return flash_attention(q, k, v, causal=cfg.causal, sm_scale=cfg.scale,
                                   forward_kernel=forward_kernel, backward_kernel=backward)

        return Prepared(attn)

    return prepare


def _sdpa(backend_name: str) -> Callable[[Config, str, Settings], Prepared]:
    def prepare(cfg: Config, device: str, s: Settings) -> Prepared:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def attn(q, k, v):
            return sdpa(q, k, v, is_causal=cfg.causal, scale=cfg.scale)

        return Prepared(attn, lambda: sdpa_kernel(backend))

    return prepare


# How FlexAttention is compiled, and what torch.compile's ``dynamic`` argument is for each.
FLEX_COMPILE = {
    # torch.compile(flex_attention) as a user writes it, as the anchors were measured: the
    # first N of each (dtype, d, mask) group gets a static kernel, the later ones share one
    # kernel with dynamic batch and N (about 2 compiles per group and pass instead of 6).
    "auto": None,
    # a kernel per shape, as FlexAttention's own benchmarks run it; the slowest sweep
    "static": False,
    # one dynamic-shape kernel from the first call
    "dynamic": True,
}
_FLEX_COMPILED: dict[str, Callable] = {}


def _flex_compiled(how: str) -> Callable:
    """torch.compile(flex_attention, dynamic=FLEX_COMPILE[how]), made once per process.

    The recompile limits are raised so a sweep of many shapes never falls back to eager.
    """
    dynamic = FLEX_COMPILE[how]
    if how not in _FLEX_COMPILED:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 1024))
        _FLEX_COMPILED[how] = torch.compile(flex_attention, dynamic=dynamic)
    return _FLEX_COMPILED[how]


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _prepare_flex(cfg: Config, device: str, s: Settings) -> Prepared:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # Compiled on a GPU; under the interpreter (CPU smoke test) eager is enough and fast.
    fn = _flex_compiled(s.flex_compile) if device == "cuda" else flex_attention
    # The block mask is built once per shape, outside the timed region.
    mask = (create_block_mask(_causal_mask_mod, None, None, cfg.n, cfg.n, device=device)
            if cfg.causal else None)

    def attn(q, k, v):
        return fn(q, k, v, block_mask=mask, scale=cfg.scale)

    return Prepared(attn)


def _skip_math(cfg: Config, s: Settings, gpu: bool) -> str | None:
    if cfg.n > s.math_max_n:
        return (f"math backend run only up to N = {s.math_max_n} (--math-max-n): it "
                f"materialises the N x N scores")
    return None


def _skip_ours(cfg: Config, s: Settings, gpu: bool) -> str | None:
    if not gpu and cfg.dtype == "bfloat16":
        return "bf16 tl.dot is wrong under Triton's CPU interpreter: bf16 needs a CUDA GPU"
    return None


def _skip_gluon(cfg: Config, s: Settings, gpu: bool) -> str | None:
    from flashtext.kernels import gluon_forward

    if not gpu or not gluon_forward.HAVE_GLUON or torch.cuda.get_device_capability() != (9, 0):
        return "the Gluon forward runs only on an sm_90 GPU with a Triton that has Gluon"
    if getattr(torch, cfg.dtype) not in gluon_forward.SUPPORTED_DTYPES \
            or cfg.d not in gluon_forward.HEAD_DIMS:
        return (f"the Gluon forward runs {gluon_forward.SUPPORTED_DTYPES} at head_dim "
                f"{gluon_forward.HEAD_DIMS}, not {cfg.dtype} at {cfg.d}")
    return None


PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Provider("ours", "flashtext (ours)", "flashtext.kernels.flash_attention as it runs by "
             "default (on sm_90 the Gluon FA3-style forward and dK/dV where they are faster, "
             "dQ fused into the latter where that is, else the Triton FA2 kernels)",
             _prepare_flashtext("auto", "auto"), _skip_ours),
    Provider("triton", "flashtext Triton", "flashtext.kernels.flash_attention with "
             "forward_kernel='triton', backward_kernel='triton' (this book's Triton "
             "FlashAttention-2 kernels alone)", _prepare_flashtext("triton", "triton"),
             _skip_ours),
    Provider("gluon", "flashtext Gluon", "flashtext.kernels.flash_attention with "
             "forward_kernel='gluon', backward_kernel='gluon' (the Gluon FA3-style forward "
             "and dK/dV at every length, the latter at d = 64 and 128, with dQ fused in where "
             "flash_attention fuses it, else Triton's dQ pass)",
             _prepare_flashtext("gluon", "gluon"), _skip_gluon),
    Provider("cudnn", "SDPA cuDNN", "torch SDPA, CUDNN_ATTENTION backend",
             _sdpa("CUDNN_ATTENTION")),
    Provider("flash", "SDPA flash (FA2)", "torch SDPA, FLASH_ATTENTION backend "
             "(FlashAttention-2)", _sdpa("FLASH_ATTENTION")),
    Provider("efficient", "SDPA efficient", "torch SDPA, EFFICIENT_ATTENTION backend "
             "(memory-efficient, xFormers-style)", _sdpa("EFFICIENT_ATTENTION")),
    Provider("flex", "FlexAttention", "torch.compile(flex_attention); causal through a "
             "BlockMask built once per shape (eager on CPU)", _prepare_flex),
    Provider("math", "SDPA math", "torch SDPA, MATH backend (materialises the scores)",
             _sdpa("MATH"), _skip_math),
)}
