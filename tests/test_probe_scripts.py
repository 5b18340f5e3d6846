"""scripts/probe_variants.py: how a variant is written on the command line, and what it refuses."""

from __future__ import annotations

import argparse
import importlib.util
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
