"""scripts/record_accuracy.py: worker processes (--jobs) record the same rows, in the sweep's
order, as one process."""

from __future__ import annotations

import importlib
from pathlib import Path

import flashtext
from flashtext.kernels.accuracy import sweep_cases

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_jobs_record_what_one_process_records(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # spawned workers import the script by name
    script = importlib.import_module("record_accuracy")
    device = str(flashtext.torch_device())  # as the script runs it: the GPU where there is one
    cases = sweep_cases("cpu", ("float32",))[:3]  # the small cases, on either machine
    one = list(script.measured_rows(cases, device, jobs=1))
    two = list(script.measured_rows(cases, device, jobs=2))
    assert [c for c, *_ in two] == cases  # in the sweep's order
    # the same code on the same machine: bitwise the same numbers
    assert [(row, failed) for _, row, failed in two] == [(row, failed) for _, row, failed in one]
    assert all(row["ours"]["o"] <= row["bound"]["o"] for _, row, _ in one)
