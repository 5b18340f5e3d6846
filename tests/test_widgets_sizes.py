from flashtext.widgets.sizes import TensorSizes


def test_sizes_scale_as_expected():
    t = TensorSizes(n=1024, d=64, batch=64, heads=16, dtype="fp16")
    s = t.sizes()
    assert s["S (N x N)"] == 2**31  # GPT-2 medium (FA1 Fig. 2): 2 GiB of scores per layer
    assert s["Q"] == 64 * 16 * 1024 * 64 * 2
    t.n *= 2
    assert t.sizes()["S (N x N)"] == 4 * s["S (N x N)"]  # quadratic
    assert t.sizes()["Q"] == 2 * s["Q"]  # linear


def test_caption_says_when_scores_outgrow_the_gpu():
    assert "fits in" in TensorSizes(n=4096).caption()
    assert "does NOT fit in" in TensorSizes(n=65536, heads=32).caption()


def test_widget_controls_drive_the_state_and_redraw(monkeypatch):
    t = TensorSizes()
    drawn = []
    real_figure = t.figure
    monkeypatch.setattr(t, "figure", lambda: drawn.append(t.n) or real_figure())
    box = t.widget()
    n_slider = box.children[0].children[0]
    n_slider.value = 8192
    assert t.n == 8192 and "N=8192" in t.caption()
    assert drawn[-1] == 8192  # the figure was redrawn for the new N


def test_figure_shows_the_growth_with_n():
    import matplotlib.pyplot as plt

    t = TensorSizes(n=4096, d=128, heads=32)
    fig = t.figure()
    bars, growth = fig.axes
    labels = [line.get_label() for line in growth.get_lines()]
    assert "S (N x N): grows as N²" in labels and "Q + K + V + O: grows as N" in labels
    s_curve = next(line for line in growth.get_lines() if line.get_label().startswith("S"))
    xs, ys = s_curve.get_data()
    assert ys[1] / ys[0] == (xs[1] / xs[0]) ** 2  # quadratic in N
    i = list(xs).index(4096)
    assert ys[i] == t.sizes()["S (N x N)"] / 1e9  # the curve passes through this layer's S
    plt.close(fig)
