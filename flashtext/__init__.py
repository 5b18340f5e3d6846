"""flashtext: the code shared by the chapters of the FlashAttention textbook.

Importing it first decides whether Triton runs compiled (CUDA GPU) or under its interpreter (CPU):
see :mod:`flashtext._boot`. One module per idea; each chapter imports what it needs.
"""

from flashtext import _boot  # noqa: F401  (must run before anything imports triton)
from flashtext.device import (
    environment,
    interpreter_usable,
    measure_live,
    on_gpu,
    report,
    torch_device,
)

__all__ = ["environment", "interpreter_usable", "measure_live", "on_gpu", "report",
           "torch_device"]
__version__ = "0.1.0"
_KERNEL_API = ("flash_attention", "flash_attention_varlen", "flash_decode", "attention_forward",
               "attention_backward")


def __getattr__(name: str):
    """The kernels' public API (``flashtext.flash_attention``, ``flash_attention_varlen``,
    ``flash_decode``, ``attention_forward``) and ``flashtext.ring_attention``, imported on first
    use (importing them loads triton, which a chapter that never runs a kernel does not need)."""
    if name in _KERNEL_API:
        from flashtext import kernels

        return getattr(kernels, name)
    if name == "ring_attention":
        from flashtext.context_parallel import ring_attention

        return ring_attention
    raise AttributeError(f"module 'flashtext' has no attribute {name!r}")
