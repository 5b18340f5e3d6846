"""The hang watchdog of the Gluon kernels' GPU tests (tests/test_kernels_gluon*.py).

A warp-specialised kernel that waits on an mbarrier nobody arrives at hangs its process forever.
Each GPU test therefore runs under a watchdog that ends the process (pytest-xdist reports the
test as failed and starts a new worker), and leaves a note so that every later Gluon test, in
either module, fails at once naming the one that hung, instead of hanging in turn.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from flashtext.kernels.gluon_forward import HAVE_GLUON
from tests.kernel_helpers import ON_GPU

GLUON_TEST_SECONDS = 240
SM90_REASON = "needs an sm_90 (Hopper) GPU and Triton with Gluon"
SM90 = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
sm90 = pytest.mark.skipif(not SM90, reason=SM90_REASON)
_HANG_NOTES = Path(tempfile.gettempdir()) / (
    "flashtext-gluon-" + os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid())))


@pytest.fixture(autouse=True)
def gluon_watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    """Autouse in the modules that import it: watch the test if it is one of their GPU tests
    (marked :data:`sm90`) and this machine runs them."""
    marks = request.node.iter_markers("skipif")
    if not SM90 or not any(m.kwargs.get("reason") == SM90_REASON for m in marks):
        yield  # a CPU test runs no Gluon kernel
        return
    _HANG_NOTES.mkdir(exist_ok=True)
    for note in _HANG_NOTES.glob("*.running"):
        pid, _, name = note.read_text().partition(" ")
        if not _alive(int(pid)):
            pytest.fail(f"an earlier Gluon test hung or crashed its process: {name}")
    note = _HANG_NOTES / f"{os.getpid()}.running"
    note.write_text(f"{os.getpid()} {request.node.nodeid}")
    faulthandler.dump_traceback_later(GLUON_TEST_SECONDS, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        note.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
