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
