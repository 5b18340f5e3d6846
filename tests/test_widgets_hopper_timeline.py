"""The schedule timeline widget: state drives both the figure and the live controls."""

import matplotlib
import pytest

from flashtext import hopper
from flashtext.widgets.hopper_timeline import ScheduleTimeline

matplotlib.use("Agg")


def test_utilisation_follows_state():
    w = ScheduleTimeline(d=128)
    u128 = w.utilisations()
    assert u128["naive"] == pytest.approx(1 / (1 + hopper.softmax_fraction(128)))
    assert u128["pingpong"] == pytest.approx(1.0)
    w.d = 64
    u64 = w.utilisations()
    assert u64["naive"] < u128["naive"]
    assert u64["pipelined"] < 0.7 < u128["pipelined"]
    w.softmax_cost = 3.0  # softmax now 3x the exp time: ping-pong can no longer hide it
    assert w.utilisations()["pingpong"] < 0.7
    assert w.tflops()["naive"] == pytest.approx(w.utilisations()["naive"] * w.matmul_tflops)
    assert "d=64" in w.caption()


def test_figure_has_one_panel_per_schedule_and_a_producer_lane_when_loading():
    import matplotlib.pyplot as plt

    w = ScheduleTimeline(n_iters=3)
    fig = w.figure()
    assert len(fig.axes) == len(hopper.SCHEDULES)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "producer (TMA)" not in labels
    plt.close(fig)
    w.load = 1.0
    fig = w.figure()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "producer (TMA)" and labels[-1] == "tensor cores"
    assert "busy" in fig.axes[1].get_title(loc="left")
    plt.close(fig)


def test_widget_controls_drive_state():
    pytest.importorskip("ipywidgets")
    w = ScheduleTimeline(n_iters=3)
    box = w.widget()
    assert "ft-schedule-timeline" in box._dom_classes
    controls = {c.description: c for row in box.children[:3] for c in row.children}
    controls["head dim d"].value = 64
    assert w.d == 64
    controls["smem stages"].value = 3
    assert w.stages == 3
    controls["softmax cost x exp"].value = 2.0
    assert w.softmax_cost == pytest.approx(2.0)
