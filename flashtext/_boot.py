"""Decide, before anything imports triton, whether Triton must run under its interpreter.

Imported first by ``flashtext/__init__.py`` and, through a ``.pth`` file that ``make`` writes into
the environment, at every interpreter start-up. That second path is what makes the rule hold
"whatever the import order in a notebook": even a cell that imports triton before flashtext
sees ``TRITON_INTERPRET=1`` on a machine without a CUDA device.

It must stay cheap (it runs in every Python process of the environment), so it asks the CUDA
driver directly through ctypes instead of importing torch.
"""

from __future__ import annotations

import ctypes
import os


def cuda_device_count() -> int:
    """Number of CUDA devices the driver reports; 0 when there is no driver or no device."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        try:
            if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                return 0
        except AttributeError:
            return 0
        return int(count.value)
    return 0


def ensure_interpreter_if_no_gpu() -> bool:
    """Set TRITON_INTERPRET=1 when no CUDA device exists. Returns whether it is set.

    A reader may force either path by setting TRITON_INTERPRET themselves; we never override it.
    """
    if "TRITON_INTERPRET" not in os.environ and cuda_device_count() == 0:
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


INTERPRETING = ensure_interpreter_if_no_gpu()
