"""flashtext: the code shared by the chapters of the FlashAttention textbook.

Importing it first decides whether Triton runs compiled (CUDA GPU) or under its interpreter (CPU):
see :mod:`flashtext._boot`. One module per idea; each chapter imports what it needs.
"""

from flashtext import _boot  # noqa: F401  (must run before anything imports triton)
from flashtext.device import environment, on_gpu, report, torch_device

__all__ = ["environment", "on_gpu", "report", "torch_device"]
__version__ = "0.1.0"
