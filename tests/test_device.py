"""Device detection and the interpreter rule: TRITON_INTERPRET=1 exactly when there is no GPU."""

import os
import subprocess
import sys

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
