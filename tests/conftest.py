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


def pytest_runtest_logreport(report):
    """With FLASHTEXT_TEST_TIMES=PATH, append each test phase's seconds to PATH as it ends (in
    the controlling process only), so a run cut short by a time limit still says where its
    time went."""
    path = os.environ.get("FLASHTEXT_TEST_TIMES")
    if path and "PYTEST_XDIST_WORKER" not in os.environ and report.duration >= 0.05:
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")
