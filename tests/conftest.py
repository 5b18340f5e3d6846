"""Shared test setup: exercise progress is not recorded by tests; notebooks get their own
per-cell handling from nbval."""

import os
import sys
from pathlib import Path

os.environ["FLASHTEXT_PROGRESS_FILE"] = "off"
os.environ.setdefault("FLASHTEXT_STATIC", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `solutions` and `tools` live at the repo root
    sys.path.insert(0, str(ROOT))

import flashtext  # noqa: E402,F401  (decides TRITON_INTERPRET before any test imports triton)


def _log_time(line: str) -> None:
    path = os.environ.get("FLASHTEXT_TEST_TIMES")
    if path and "PYTEST_XDIST_WORKER" not in os.environ:  # the controlling process only
        with open(path, "a") as f:
            f.write(line + "\n")


def pytest_sessionstart(session):
    """With FLASHTEXT_TEST_TIMES=PATH, the run's start goes to PATH (see below)."""
    import time

    _log_time(f"{time.time():.2f}\t0\tsession\tstart\t-")


def pytest_runtest_logreport(report):
    """With FLASHTEXT_TEST_TIMES=PATH, each test phase of 0.05 s or more is appended to PATH as
    it ends (wall time at its end, seconds, phase, outcome, test), so that a run cut short by a
    time limit still says where its time went, and when the workers were idle."""
    import time

    if report.duration >= 0.05:
        _log_time(f"{time.time():.2f}\t{report.duration:.2f}\t{report.when}\t{report.outcome}"
                  f"\t{report.nodeid}")


def pytest_collection_modifyitems(config, items):
    """GPU-sized tests (marked ``gpu``; skipped at once on a CPU) go out first: on a GPU runner
    they are the long ones, and started last they would leave one worker finishing them while
    the others stand idle. The order is otherwise the collection's (stable sort)."""
    items.sort(key=lambda item: item.get_closest_marker("gpu") is None)
