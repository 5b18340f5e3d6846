from flashtext.widgets.causal_tiles import CausalBlocks


def test_counts_follow_the_state():
    w = CausalBlocks(n_q=256, n_k=256, BLOCK_M=32, BLOCK_N=32, causal=True)
    c = w.counts()
    assert (c.skipped, c.masked, c.full) == (28, 8, 28)
    w.causal = False
    assert (w.counts().skipped, w.counts().full) == (0, 64)
    w.causal, w.n_q, w.align = True, 64, "top_left"
    assert w.counts().skipped == 2 * 8 - 2 - 1  # 16 tiles, 2 masked, 1 full below the diagonal
    assert "top_left" in w.caption()


def test_widget_controls_drive_the_state_and_figure_draws():
    import matplotlib.pyplot as plt

    w = CausalBlocks()
    box = w.widget()
    n_q_slider = box.children[0].children[0]
    n_q_slider.value = 100
    assert w.n_q == 100 and "Nq=100" in w.caption()
    align = box.children[2]
    align.value = "top_left"
    assert w.align == "top_left"
    fig = w.figure()
    assert "top_left" in fig.axes[0].get_title()
    plt.close(fig)
