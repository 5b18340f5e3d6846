"""Device detection and the interpreter rule: TRITON_INTERPRET=1 exactly when there is no GPU."""

import os
import subprocess
import sys

import pytest
import torch

import flashtext
from flashtext import _boot


def test_interpreter_set_iff_no_gpu():
    env = flashtext.environment()
    assert env.is_gpu == torch.cuda.is_available()
    if "TRITON_INTERPRET" not in os.environ or _boot.cuda_device_count() == 0:
        assert env.interpreter == (not env.is_gpu)


def test_report_names_the_machine(capsys):
    env = flashtext.report()
    text = capsys.readouterr().out
    assert f"torch {torch.__version__}" in text
    assert ("GPU: " + env.device_name) in text if env.is_gpu else "Triton interpreter" in text


def test_triton_imported_first_still_interprets_without_gpu():
    """The .pth start-up hook: a fresh process that imports triton before flashtext."""
    code = ("import os, triton; from flashtext import _boot; "
            "print(os.environ.get('TRITON_INTERPRET'), _boot.cuda_device_count())")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    interpret, gpus = out[0], int(out[1])
    assert interpret == ("None" if gpus else "1")


def test_interpreter_usable_follows_the_known_incompatibility(monkeypatch):
    import numpy

    from flashtext import device

    def versions(triton_version, numpy_version):
        monkeypatch.setattr(device, "_version", lambda name: triton_version)
        monkeypatch.setattr(numpy, "__version__", numpy_version)
        return device.interpreter_usable()

    assert versions("3.7.1", "2.4.6")  # the book's pins
    assert not versions("3.6.0", "2.5.2")  # the H200 image: its interpreter fails
    assert versions("3.6.0", "2.3.5")
    assert not versions("not installed", "2.4.6")


def test_measure_live_reads_flashtext_measure(monkeypatch):
    from flashtext import device

    monkeypatch.setattr(device, "on_gpu", lambda: True)
    monkeypatch.setenv("FLASHTEXT_MEASURE", "recorded")
    assert not device.measure_live()
    monkeypatch.setenv("FLASHTEXT_MEASURE", "live")
    assert device.measure_live()
    monkeypatch.delenv("FLASHTEXT_MEASURE")
    assert device.measure_live()
    monkeypatch.setattr(device, "on_gpu", lambda: False)
    assert not device.measure_live()
    monkeypatch.setenv("FLASHTEXT_MEASURE", "sometimes")
    with pytest.raises(ValueError, match="FLASHTEXT_MEASURE"):
        device.measure_live()
