"""Where is this book running? A CUDA GPU with compiled Triton kernels, or a CPU with Triton's
interpreter. Every chapter's first cell calls :func:`report`.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from dataclasses import asdict, dataclass
from functools import cache

from flashtext import _boot


@dataclass(frozen=True)
class Environment:
    """A snapshot of the machine and the versions that matter to the book."""

    kind: str  # "gpu" or "cpu"
    device_name: str  # e.g. "NVIDIA H200" or "CPU, Triton interpreter"
    capability: tuple[int, int] | None  # CUDA compute capability, None on CPU
    interpreter: bool  # Triton kernels run under TRITON_INTERPRET=1
    python: str
    torch: str
    triton: str
    numpy: str

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def is_hopper(self) -> bool:
        return self.capability is not None and self.capability[0] == 9

    def summary(self) -> str:
        if self.is_gpu:
            cc = f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "?"
            where = f"GPU: {self.device_name} ({cc}), compiled Triton kernels"
        else:
            where = "CPU, Triton interpreter (TRITON_INTERPRET=1): small shapes, no bf16 tl.dot"
        return (
            f"{where}\n"
            f"Python {self.python} | torch {self.torch} | triton {self.triton} | numpy {self.numpy}"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def _version(module_name: str) -> str:
    try:
        module = __import__(module_name)
    except ImportError:
        return "not installed"
    return getattr(module, "__version__", "unknown")


@cache
def environment() -> Environment:
    """Detect the machine once per process."""
    import numpy
    import torch

    has_cuda = torch.cuda.is_available()
    interpreter = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if has_cuda:
        name = torch.cuda.get_device_name(0)
        capability = tuple(torch.cuda.get_device_capability(0))
    else:
        name, capability = "CPU, Triton interpreter", None
    return Environment(
        kind="gpu" if has_cuda else "cpu",
        device_name=name,
        capability=capability,
        interpreter=interpreter,
        python=platform.python_version(),
        torch=torch.__version__,
        triton=_version("triton"),
        numpy=numpy.__version__,
    )


def report() -> Environment:
    """Print where the book is running and return the :class:`Environment`."""
    env = environment()
    print(env.summary())
    return env


def on_gpu() -> bool:
    return environment().is_gpu


def measure_live() -> bool:
    """Whether a chapter times and measures on this machine's GPU (on a GPU) or shows the H200
    recording under a banner (on a CPU). ``FLASHTEXT_MEASURE=recorded`` asks for the recording
    on a GPU too: ``make test`` sets it, because there the chapters share one GPU with each
    other and with the unit tests, and a timing or a device-wide byte count taken then measures
    the neighbours as much as the kernel."""
    mode = os.environ.get("FLASHTEXT_MEASURE", "live")
    if mode not in ("live", "recorded"):
        raise ValueError(f"FLASHTEXT_MEASURE must be 'live' or 'recorded', got {mode!r}")
    return on_gpu() and mode == "live"


def interpreter_usable() -> bool:
    """Whether Triton's interpreter can run kernels with the Triton and NumPy installed. The
    book's pins (triton 3.7.1, numpy 2.4.6) can; Triton 3.6's interpreter fails on NumPy 2.4 and
    later ("only 0-dimensional arrays can be converted to Python scalars": the H200 image,
    triton 3.6.0 with numpy 2.5.2)."""
    import numpy

    def major_minor(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split(".")[:2])

    triton_version = _version("triton")
    if not triton_version[:1].isdigit():  # not installed, or no version to read
        return False
    return not (major_minor(triton_version) < (3, 7)
                and major_minor(numpy.__version__) >= (2, 4))


def torch_device() -> str:
    """The device tensors for Triton kernels live on: "cuda", or "cpu" under the interpreter."""
    return "cuda" if on_gpu() else "cpu"


def _check_interpreter_consistency() -> None:
    # Someone imported triton before flashtext, without the .pth hook: kernels they define
    # before this point would try to compile for a GPU that is not there.
    if "triton" in sys.modules and not _boot.INTERPRETING and _boot.cuda_device_count() == 0:
        warnings.warn(
            "triton was imported before flashtext on a machine without a CUDA device, and "
            "TRITON_INTERPRET is not set; set TRITON_INTERPRET=1 or import flashtext first.",
            stacklevel=3,
        )


_check_interpreter_consistency()
