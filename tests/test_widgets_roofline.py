"""Chapter 1's roofline widget and measurement figures, driven by a SYNTHETIC payload shaped like
scripts/record_memory_wall.py's output (test data only: never shown to readers)."""

import matplotlib.pyplot as plt
import pytest

from flashtext import plots
from flashtext.hardware import GPUS
from flashtext.widgets.roofline import RooflineExplorer, measured_points


def synthetic_payload():
    rows = []
    for d in (64, 128):
        for n in (1024, 4096):
            rows.append({"batch": 65536 // n, "heads": 16, "N": n, "d": d, "S = QK^T": 1.0,
                         "P = softmax(S)": 2.0, "O = PV": 1.0, "naive total": 4.0,
                         "sdpa flash": 0.5})
    return {
        "gpu": "synthetic", "date": "2000-01-01", "torch": "x", "triton": "x",
        "device": {"L2_cache_size": 50 * 2**20},
        "copy": [{"bytes": 2**30, "ms": 1.0, "bandwidth": 2.0e12}],
        "read_sweep": [{"bytes": s * 2**20, "ms": 1.0, "bytes_read": 1, "bandwidth": b}
                       for s, b in ((1, 9e12), (16, 9e12), (256, 3e12), (1024, 3e12))],
        "matmul": [{"n": 1024, "dtype": "bfloat16", "tf32": False, "ms": 1.0, "flops": 1e14,
                    "intensity": 341.3}],
        "exp": {"elements": 2**20, "dtype": "bfloat16", "ms": 1.0, "flops": 1e12,
                "bandwidth": 4e12, "intensity": 0.25},
        "attention": rows,
    }


def test_explorer_caption_and_bounds():
    r = RooflineExplorer(gpu="H200", n=1024, d=64)
    cap = r.caption()
    assert "ridge 206 FLOP/B" in cap and "P = softmax(S): 1.25 FLOP/B, memory-bound" in cap
    assert "fused (ideal)" in cap and cap.count("compute-bound") == 1
    r.gpu = "A100"
    assert "ridge 208" in r.caption()
    r.gpu = "B200"
    with pytest.raises(ValueError, match="gpu"):
        r.caption()


def test_explorer_widget_drives_state():
    r = RooflineExplorer()
    box = r.widget()
    gpu, n, d = box.children[0].children
    gpu.value, n.value, d.value = "H100", 65536, 256
    assert (r.gpu, r.n, r.d) == ("H100", 65536, 256)
    assert "H100 SXM5, N=65536, d=256" in box.children[1].value


def test_measured_points_and_figures():
    data = synthetic_payload()
    pts = measured_points(data)
    kinds = {p["kind"] for p in pts}
    assert kinds == {"matmul", "exp", "S = QK^T", "P = softmax(S)", "O = PV"}
    soft = next(p for p in pts if p["label"] == "P = softmax(S) N=1024 d=64")
    assert soft["intensity"] == pytest.approx(1.25)
    assert soft["flops"] == pytest.approx(5 * 64 * 16 * 1024**2 / 2e-3)
    r = RooflineExplorer(measured=pts, measured_gpu="H200")
    figures = (r.figure(), plots.hierarchy_figure(GPUS),
               plots.read_sweep_figure(data, GPUS["H200"]),
               plots.attention_split_figure(data, d=64))
    for fig in figures:
        plt.close(fig)
    with pytest.raises(ValueError, match="d=32"):
        plots.attention_split_figure(data, d=32)


def test_attention_split_shows_every_kernel_per_score_on_a_linear_scale():
    data = synthetic_payload()
    fig = plots.attention_split_figure(data, d=64, gpu=GPUS["H200"])
    bars, share = fig.axes
    assert bars.get_yscale() == "linear"  # a log scale hid the smallest kernel
    scores = [64 * 16 * 1024**2, 16 * 16 * 4096**2]  # batch x heads x N^2
    heights = sorted(round(r.get_height(), 9) for r in bars.patches)
    for ms, label in ((1.0, "S = QK^T"), (2.0, "P = softmax(S)"), (0.5, "flash")):
        for count in scores:
            assert round(ms * 1e-3 / count * 1e12, 9) in heights, label
    copy_line = next(line for line in bars.get_lines() if "copy speed" in line.get_label())
    assert copy_line.get_ydata()[0] == pytest.approx(4 / 2.0e12 * 1e12)  # 4 B/score at 2 TB/s
    roof = next(line for line in share.get_lines() if "roofline" in line.get_label())
    assert 40 < roof.get_ydata()[-1] < 55  # the roofline's softmax share, about half
    plt.close(fig)


def test_human_units():
    assert plots.human_bytes(4.8e12) == "4.8 TB" and plots.human_rate(12.8e9) == "12.8 GB/s"
    assert plots.human_bytes(512) == "512 B"
