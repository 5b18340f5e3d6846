"""Chapter 12's benchmark explorer: its state picks the panel; its figure draws that panel."""

import pytest

from flashtext.bench import report
from flashtext.widgets.bench import BenchExplorer


@pytest.fixture(scope="module")
def anchors():
    return report.load_anchors()


def test_state_picks_the_series(anchors):
    ex = BenchExplorer(anchors)
    assert (ex.d, ex.causal, ex.dtype, ex.mode) == (128, False, "float16", "fwd")
    assert set(ex.series()) == {"tutorial", "flex", "flash", "cudnn"}
    assert ex.series()["cudnn"][-1] == (16384, 575.5)
    ex.set(d=64, causal=True, mode="fwd_bwd")
    assert ex.series()["flash"][0] == (1024, 153.6)
    assert "tutorial" in ex.series()  # the anchors have its causal backward
    ex.set(causal=False)
    assert "tutorial" not in ex.series()  # ... and no non-causal one


def test_bad_state_is_refused(anchors):
    ex = BenchExplorer(anchors)
    with pytest.raises(ValueError, match="dtype must be one of"):
        ex.set(dtype="bfloat16")  # the anchors are fp16 only
    with pytest.raises(ValueError, match="unknown control"):
        ex.set(heads=3)


def test_defaults_fall_back_to_what_the_results_have(anchors):
    ex = BenchExplorer(anchors, dtype="bfloat16", d=256)
    assert ex.dtype == "float16" and ex.d == 128


def test_figure_follows_the_state(anchors):
    import matplotlib.pyplot as plt

    ex = BenchExplorer(anchors).set(d=64, causal=True, mode="fwd")
    fig = ex.figure()
    ax = fig.axes[0]
    assert "d=64" in ax.get_title() and "causal" in ax.get_title()
    assert "forward," in ax.get_title()
    assert len(ax.get_lines()) == 4
    plt.close(fig)


def test_widget_controls_redraw(anchors):
    ex = BenchExplorer(anchors)
    box = ex.widget()
    assert "ft-bench-explorer" in box._dom_classes
    d_control = box.children[0].children[0]
    assert d_control.description == "d"
    d_control.value = 64
    assert ex.d == 64


def test_the_roof_is_the_ceiling_measured_in_the_run_for_the_dtype():
    meta = {"kind": "flashtext.bench", "gpu": "NVIDIA H200",
            "ceilings": {"matmul_flops": {"float16": 664e12, "bfloat16": 700e12},
                         "copy_bandwidth": 4.25e12}}
    rows = [{"provider": "ours", "mode": "fwd", "dtype": dt, "d": 128, "causal": False,
             "n": 1024, "status": "ok", "tflops": 400.0} for dt in ("float16", "bfloat16")]
    ex = BenchExplorer(report.Results(meta, rows))
    assert ex.roof() == (664.0, 664.0)
    assert ex.set(dtype="bfloat16").roof() == (700.0, 700.0)
    del meta["ceilings"]  # a recorded H200 run without ceilings: chapter 1's measured range
    assert ex.roof() == (690.0, 790.0)
