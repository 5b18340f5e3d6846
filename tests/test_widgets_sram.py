"""Chapter 4-5 widgets: set the state, check what the figure and caption report."""

import numpy as np
import pytest

from flashtext import cost
from flashtext.widgets.sram import Line12Stepper, SRAMBudget, gpu_presets


def test_budget_state_follows_line1():
    b = SRAMBudget(m_elements=4096, d=64, n=256)
    s = b.state()
    assert (s["Bc"], s["Br"], s["Tr"], s["Tc"]) == (16, 16, 16, 16)
    assert s["collapsed"] and not s["fits"] and "EXCEEDS M by 288" in b.caption()
    b.m_elements = 49152
    s = b.state()
    assert (s["Bc"], s["Br"], s["collapsed"], s["fits"]) == (192, 64, False, True)
    assert "Br capped at d = 64" in b.caption()
    assert s["hbm_fa1"] == cost.fa1_hbm_total(256, 64, 49152)


def test_budget_step_walks_kv_outer_and_is_clamped():
    b = SRAMBudget(m_elements=4096, d=64, n=100, step=0)  # Tr = Tc = 7
    assert b.current() == (0, 0)
    b.step = 8
    assert b.current() == (1, 1)  # j = 8 // 7, i = 8 % 7
    b.step = 10_000
    b.validate()
    assert b.step == 48
    with pytest.raises(ValueError, match="d must be a positive integer"):
        SRAMBudget(d=0)


def test_budget_figure_and_widget():
    import matplotlib.pyplot as plt

    b = SRAMBudget(m_elements=4096, d=64, n=256, step=37)
    fig = b.figure()
    assert "iteration 38 of 256" in fig.axes[0].get_title()
    assert "4,448 of M = 4,096" in fig.axes[1].get_title()
    plt.close(fig)
    box = b.widget()
    m_slider, gpu = box.children[0].children
    d, n, step = box.children[1].children
    d.value = 128
    assert b.d == 128 and b.state()["Bc"] == 8
    gpu.value = next(k for k in gpu_presets() if k.startswith("H100"))
    assert b.m_elements == 228 * 1024 // 2
    n.value = 32
    assert step.max == b.state()["iterations"]
    n.value = 1024
    assert step.max == b.state()["iterations"] > 3
    step.value = 3  # the slider counts from 1, like the figure's title
    assert b.step == 2
    fig = b.figure()
    assert fig.axes[0].get_title().startswith("iteration 3 of")
    plt.close(fig)
    assert "ft-sram-budget" in box._dom_classes


def test_line12_stepper_matches_exact_softmax_everywhere():
    stepper = Line12Stepper()
    g = cost.fa1_grid(stepper.n, stepper.d, stepper.m_elements)
    assert (g["Tr"], g["Tc"]) == (4, 4)
    for i in range(1, 5):  # the paper's 1-based block indices
        for j in range(1, 5):
            for row in range(1, 4):
                stepper.i, stepper.j, stepper.query = i, j, row
                w = stepper.weights()
                np.testing.assert_allclose(w["used"], w["exact"], atol=1e-15)
                assert np.all(w["used"][3 * j:] == 0)  # keys 3j + 1 .. N not seen yet
                assert np.any(w["used"][3 * (j - 1):3 * j] > 0)  # block j's keys are in
    stepper.i, stepper.j, stepper.query = 2, 3, 2
    st = stepper.step()
    assert (st.i, st.j) == (1, 2)  # tiled.Step counts from 0
    assert st.m_new[1] > st.m_old[1]  # the default view shows a max that moves
    assert stepper.query_row() == 5
    assert stepper.caption().startswith("row block i=2, key block j=3 (keys 7-9 on chip); "
                                        "query row 5 of 12 (row 2 of the block)")


def test_line12_stepper_figures():
    import matplotlib.pyplot as plt

    stepper = Line12Stepper()
    fig = stepper.figure()  # static: the weights after every key block, j = 1..Tc
    assert [ax.get_title().splitlines()[0] for ax in fig.axes] == [
        "after j=1 (keys 1-3 seen)", "after j=2 (keys 1-6 seen)", "after j=3 (keys 1-9 seen)",
        "after j=4 (keys 1-12 seen)"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:3] == ["1", "2", "3"]
    plt.close(fig)
    frame = stepper.frame_figure()  # live: one step, the tile grid and one row's weights
    assert len(frame.axes) == 2 and "query row 5" in frame.axes[1].get_ylabel()
    plt.close(frame)


def test_line12_stepper_controls():
    stepper = Line12Stepper()
    box = stepper.widget()
    i, j, row = box.children[0].children
    assert (i.value, j.value, row.value) == (2, 3, 2)  # the sliders show the same 1-based values
    j.value = 1
    assert stepper.j == 1 and "key block j=1 (keys 1-3 on chip)" in stepper.caption()
    row.value = 3
    assert stepper.query_row() == 6
    with pytest.raises(ValueError, match="i must be in 1..4"):
        Line12Stepper(i=9)
    with pytest.raises(ValueError, match="j must be in 1..4"):
        Line12Stepper(j=0)


def test_traffic_curves_state_and_controls():
    import matplotlib.pyplot as plt

    from flashtext.widgets.sram import TrafficCurves

    t = TrafficCurves(m_elements=116_736, d=64, n=4096)
    s = t.state()
    assert s["fa1"] == 8_019_968 and s["standard"] == 68_157_440 and s["Tc"] == 9
    assert "8.5x fewer" in t.caption()
    t.m_elements = 4096  # below the crossover (about 3 d^2): Algorithm 1 moves more
    assert t.state()["ratio"] < 1 and "MORE than standard" in t.caption()
    plt.close(t.figure())
    box = t.widget()
    m, gpu = box.children[0].children
    d, n = box.children[1].children
    d.value = 128
    n.value = 1024
    assert (t.d, t.n) == (128, 1024)
    assert t.state()["crossover_m"] == cost.fa1_crossover_m(1024, 128)
    assert "ft-traffic-curves" in box._dom_classes
