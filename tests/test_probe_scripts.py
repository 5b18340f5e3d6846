"""scripts/probe_variants.py: how a variant is written on the command line, and what it refuses."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "probe_variants.py"


def _module():
    spec = importlib.util.spec_from_file_location("probe_variants", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_with_environment():
    name, tree, env = _module().parse_variant("fused=probe/bwd:FLASHTEXT_BWD=fused,CFG=64x64x4")
    assert name == "fused" and tree == Path("probe/bwd").resolve()
    assert env == {"FLASHTEXT_BWD": "fused", "CFG": "64x64x4"}


def test_variant_without_environment():
    assert _module().parse_variant("base=probe/base")[2] == {}


@pytest.mark.parametrize("text", ["base", "=probe/base", "base="])
def test_refuses_a_variant_without_name_or_tree(text):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=TREE"):
        _module().parse_variant(text)


def test_refuses_a_tree_without_the_package(tmp_path):
    with pytest.raises(SystemExit, match="no flashtext package"):
        _module().run_variant("x", tmp_path, {}, [], tmp_path, profile=False)


def test_ncu_summary_orders_stalls_and_converts_time():
    spec = importlib.util.spec_from_file_location("record_ncu_kernels",
                                                  SCRIPT.parent / "record_ncu_kernels.py")
    ncu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ncu)
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio".format
    kernel = {"kernel": "_attn_bwd_dkdv(float*, ...)", "gpu__time_duration.sum": 2.5e6,
              "smsp__issue_active.avg.pct_of_peak_sustained_active": 41.0,
              "sm__warps_active.avg.pct_of_peak_sustained_active": 12.5,
              "launch__registers_per_thread": 232.0,
              stall("wait"): 0.7, stall("math_pipe_throttle"): 1.9, stall("barrier"): 0.2}
    out = ncu.summarize(kernel)
    assert out["kernel"] == "_attn_bwd_dkdv" and out["ms"] == 2.5 and out["registers"] == 232
    assert list(out["stalls"]) == ["math_pipe_throttle", "wait", "barrier"]
    assert "tensor_pipe_pct" not in out


def test_spill_report_compiles_for_sm90_without_a_gpu():
    # a fresh process: flashtext turns the interpreter on at start-up when there is no GPU,
    # and an interpreted kernel cannot be compiled
    code = ("import sys; sys.path.insert(0, 'scripts'); import spill_report as s; "
            "r = s.compile_one('bwd_dq', (64, 32, 4, 2), 64, False); print(r)")
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parents[1], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    row = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert 0 < row["registers"] <= 255 and row["wgmma"] > 0
    assert row["spill_store_bytes"] >= 0 and row["shared_bytes"] > 0


def test_profile_host_switches_the_tile_loads(monkeypatch):
    import importlib

    from flashtext.kernels import config as _config

    monkeypatch.setattr(_config, "TUNED", dict(_config.TUNED))
    monkeypatch.setattr(_config, "FWD_SHORT", _config.FWD_SHORT)
    monkeypatch.setattr(_config._boot, "INTERPRETING", False)
    spec = importlib.util.spec_from_file_location(
        "profile_host", SCRIPT.parent / "profile_host.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    default, short = dict(_config.TUNED), _config.FWD_SHORT
    assert all(c.tma for c in default.values()) and short.tma
    mod._set_loads("pointers")
    # every configuration launch_config hands out, the short forward's included, loads by pointer
    picked = {_config.launch_config(k, d, 2, c, n, n) for k in ("fwd", "bwd_dkdv", "bwd_dq")
              for d in (64, 128) for c in (False, True) for n in (512, 4096)}
    assert _has_short_tiles(picked, short) and not any(c.tma for c in picked)
    mod._set_loads("descriptors")
    assert _config.TUNED == default and _config.FWD_SHORT == short


def _has_short_tiles(picked, short):
    """The short forward's tiles are among the configurations picked (so it was checked)."""
    return any((c.BLOCK_M, c.BLOCK_N) == (short.BLOCK_M, short.BLOCK_N) for c in picked)


def test_a_variant_tree_on_pythonpath_wins_over_the_checkout(tmp_path):
    """probe_variants.py runs profile_kernels.py with a variant's flashtext first on PYTHONPATH;
    importing tune_kernels (for its inputs) must not put this checkout's flashtext ahead of it."""
    (tmp_path / "flashtext").mkdir()
    (tmp_path / "flashtext" / "__init__.py").write_text("VARIANT = True\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tune_kernels, flashtext; "
            "print(getattr(flashtext, 'VARIANT', False))")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # -S: no site packages, so no start-up hook has imported a flashtext before the test does
    out = subprocess.run([sys.executable, "-S", "-c", code, str(SCRIPT.parent)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
