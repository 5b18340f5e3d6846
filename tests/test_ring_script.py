"""scripts/record_ring_nccl.py: without a CUDA GPU it stops with a message and invents nothing;
its merge of the ranks' results keeps the worst error and the slowest rank."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "record_ring_nccl.py"


def _module():
    spec = importlib.util.spec_from_file_location("record_ring_nccl", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_stops_without_a_gpu():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "measures rings of CUDA GPUs and this machine has none" in run.stderr


def test_merge_keeps_the_worst_rank():
    mod = _module()
    row = {"dtype": "bfloat16", "causal": True, "layout": "zigzag", "n": 16, "heads": 1,
           "head_dim": 16}
    ranks = []
    for rank, (err, seconds) in enumerate(((1e-3, 2.0), (4e-3, 3.0))):
        ranks.append({
            "rank": rank,
            "correctness": [{**row, "ring_vs_kernel": {"o": err, "dq": err / 2},
                             "kernel_vs_fp32": {"o": err / 4, "dq": err}}],
            "steps": [],
            "throughput": [{"causal": True, "backward": False, "layout": "zigzag",
                            "check_ranks": True, "n_local": 8, "n": 16, "seconds": seconds,
                            "tokens_per_s": 16 / seconds}]})
    merged = mod._merge(2, ranks)
    assert merged["world_size"] == 2
    assert merged["correctness"][0]["ring_vs_kernel"] == {"o": 4e-3, "dq": 2e-3}
    assert merged["correctness"][0]["kernel_vs_fp32"] == {"o": 1e-3, "dq": 4e-3}
    assert merged["throughput"][0]["seconds"] == 3.0
    assert merged["throughput"][0]["tokens_per_s"] == pytest.approx(16 / 3.0)
