"""The roofline model of standard attention, and the CUDA-only measurements failing clearly."""

import dataclasses

import pytest
import torch

from flashtext import roofline
from flashtext.cost import attention_flops, standard_attention_hbm_elements
from flashtext.hardware import A100, H100, H200


def test_steps_add_up_to_the_standard_counts():
    steps = roofline.standard_attention_steps(64, 16, 1024, 64)
    assert [s.name for s in steps] == ["S = QK^T", "P = softmax(S)", "O = PV"]
    matmul = sum(s.flops for s in steps if s.unit == "tensor")
    assert matmul == attention_flops(64, 16, 1024, 64)
    total = sum(s.bytes for s in steps)
    per_head = sum(standard_attention_hbm_elements(1024, 64).values())
    assert per_head == 4 * 1024 * 64 + 4 * 1024**2
    assert total == 64 * 16 * per_head * 2
    softmax = steps[1]
    assert softmax.intensity == pytest.approx(5 / 4)  # 5 ops per score, 4 bytes per score


def test_matmul_intensity_is_about_d_and_memory_bound_at_d64():
    s = roofline.standard_attention_steps(1, 1, 4096, 64)[0]
    assert s.intensity == pytest.approx(64 / (1 + 2 * 64 / 4096))
    for gpu in (A100, H100, H200):
        assert s.bound(gpu) == "memory"
    big = roofline.standard_attention_steps(1, 1, 4096, 256)[0]
    assert big.bound(A100) == "compute" and big.bound(H100) == "memory"


def test_fused_step_is_compute_bound_and_roofline_time():
    f = roofline.fused_attention_step(1, 16, 4096, 64)
    assert f.intensity > H200.ridge_point() and f.bound(H200) == "compute"
    s = roofline.standard_attention_steps(1, 16, 4096, 64)[1]
    assert s.time(H200) == pytest.approx(s.bytes / H200.hbm_bandwidth)
    fast_memory = dataclasses.replace(H200, hbm_bandwidth=1e18)
    mm = roofline.standard_attention_steps(1, 16, 4096, 64)[0]
    assert mm.time(fast_memory) == pytest.approx(mm.flops / H200.matmul_flops)


def test_attainable_and_table():
    assert roofline.attainable(H100, 1.0) == H100.hbm_bandwidth
    assert roofline.attainable(H100, 1e6) == H100.matmul_flops
    table = roofline.roofline_table(roofline.standard_attention_steps(1, 1, 2048, 64), A100)
    assert sum(r["share"] for r in table) == pytest.approx(1.0)
    assert max(table, key=lambda r: r["ms"])["step"] == "P = softmax(S)"


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="n must be a positive integer"):
        roofline.standard_attention_steps(1, 1, 0, 64)
    with pytest.raises(ValueError, match="d must"):
        roofline.fused_attention_step(1, 1, 8, -1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU failure message")
def test_measurements_need_cuda():
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        roofline.measure_copy_bandwidth()
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        roofline.measure_memory_wall(quick=True)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        roofline.measure_softmax_kernels(1, 1, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_softmax_measurement_names_its_kernel_and_counts_the_bytes():
    row = roofline.measure_softmax_kernels(2, 4, 1024)
    assert row["bytes"] == 2 * 2 * 4 * 1024 * 1024 * 2  # read S + write P, fp16
    for name in ("torch.softmax", "triton one-pass softmax", "copy"):
        assert row[f"{name} ms"] > 0
        assert row[f"{name} TB/s"] == pytest.approx(row["bytes"] / row[f"{name} ms"] / 1e9)
    assert any("softmax" in k.lower() for k in row["torch.softmax kernels"])


def test_read_kernel_sums_what_it_reads():
    # under the interpreter on CPU (compiled on a GPU): program p reads chunks (p + 3 i) % 4
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(4 * roofline.READ_BLOCK, dtype=torch.float32, device=dev)
    out = roofline.read_sweep(x, programs=3, iters=5).cpu()
    blk = roofline.READ_BLOCK
    expected = [sum(float(x[c * blk:(c + 1) * blk].sum()) for c in ((p + 3 * i) % 4
                                                                     for i in range(5)))
                for p in range(3)]
    assert out.tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="float32"):
        roofline.read_sweep(x[:100], programs=1, iters=1)


def test_record_script_adds_the_softmax_part_and_keeps_the_rest(monkeypatch, tmp_path):
    """``record_memory_wall.py --only softmax`` adds the softmax comparison to the stored
    recording: the other numbers and their provenance stay, the new part carries its own."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    from flashtext import recorded

    script = Path(__file__).resolve().parents[1] / "scripts" / "record_memory_wall.py"
    spec = importlib.util.spec_from_file_location("record_memory_wall", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stored = {"gpu": "NVIDIA H200", "date": "2026-11-29", "torch": "2.11.0", "triton": "3.6.0",
              "copy": [{"bytes": 1, "ms": 1.0, "bandwidth": 2.0}]}
    (tmp_path / "h200_memory_wall.json").write_text(json.dumps(stored))
    monkeypatch.setattr(recorded, "DATA_DIR", tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=0: "NVIDIA H200")
    monkeypatch.setattr(roofline, "measure_softmax_sweep", lambda quick, log: [{"N": 8192}])
    monkeypatch.setattr(sys, "argv", ["record_memory_wall.py", "--only", "softmax"])
    module.main()
    out = json.loads((tmp_path / "h200_memory_wall.json").read_text())
    assert {k: out[k] for k in stored} == stored  # the first run's numbers and provenance
    assert out["softmax"] == [{"N": 8192}] and out["softmax_recorded"]["gpu"] == "NVIDIA H200"
    assert out["softmax_recorded"]["torch"] == torch.__version__
