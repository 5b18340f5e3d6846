"""Chapter 2's widgets: set the state, check what the figure and the widget would show."""

import numpy as np
import pytest

from flashtext import reference as ref
from flashtext.widgets.tiles import CheckpointPicker, MemoryBars, TileStepper


def test_stepper_seed_lesson_caption_and_one_tile_on_chip():
    t = TileStepper(n=4, block=2)
    assert t.total_steps == 4
    assert t.caption() == "step 1 of 4 — query-block 0, key-block 0"
    assert t.scores_on_chip() == 4
    t.step = 1
    assert t.tile() == (0, 1)
    t.step = 2
    assert t.caption() == "step 3 of 4 — query-block 1, key-block 0"


def test_stepper_orders_visit_every_tile_once():
    for order in ("query-major", "key-major"):
        t = TileStepper(n=7, block=3, order=order)
        tiles = [t.tile(k) for k in range(t.total_steps)]
        assert sorted(tiles) == [(i, j) for i in range(3) for j in range(3)]
    assert TileStepper(n=4, block=2, order="key-major").tile(1) == (1, 0)


def test_stepper_ragged_edge_tile_is_smaller():
    t = TileStepper(n=5, block=2, step=8)  # the corner tile is 1 x 1
    assert t.tile() == (2, 2) and t.scores_on_chip() == 1


def test_stepper_running_state_is_exact_after_last_step():
    t = TileStepper(n=6, block=4)
    t.step = t.total_steps - 1
    state = t.running_state()
    np.testing.assert_allclose(state.lse(), ref.logsumexp(t.scores()), rtol=1e-14)
    t.step = 0  # rows of query block 1 have seen nothing yet
    assert np.all(np.isneginf(t.running_state().m[4:]))


def test_stepper_rejects_bad_state():
    with pytest.raises(ValueError, match="block"):
        TileStepper(n=4, block=0)
    with pytest.raises(ValueError, match="step"):
        TileStepper(n=4, block=2, step=4)
    with pytest.raises(ValueError, match="order"):
        TileStepper(order="diagonal")


def test_stepper_widget_drives_state():
    t = TileStepper(n=4, block=2)
    box = t.widget()
    play, step = box.children[0].children
    step.value = 3
    assert t.step == 2 and "step 3 of 4" in t.caption()
    assert "step 3 of 4 — query-block 1, key-block 0" in box.children[3].value
    n, block = box.children[1].children
    n.value = 9
    assert t.n == 9 and t.total_steps == 25 and step.max == 25 and t.step == 0
    block.value = 3
    assert t.total_steps == 9


def test_stepper_static_figure_shows_the_key_steps_and_live_view_one():
    import matplotlib.pyplot as plt

    t = TileStepper(n=4, block=2)
    assert t.key_steps() == [0, 1, 2, 3]  # few steps: every one of them
    fig = t.figure()
    titles = [ax.get_title() for ax in fig.axes[:4]]
    assert titles == [f"step {k + 1} of 4\nquery-block {i}, key-block {j}"
                      for k, (i, j) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)])]
    assert "(m, l) after the last tile" in fig.axes[4].texts[0].get_text()
    plt.close(fig)
    big = TileStepper(n=10, block=3)  # 16 steps: first two, where the loop turns, the last
    assert big.key_steps() == [0, 1, 3, 4, 15]
    assert big.step == 0  # drawing other steps leaves the state alone
    t.step = 2
    frame = t.frame_figure()
    assert frame.axes[0].get_title() == t.caption() == "step 3 of 4 — query-block 1, key-block 0"
    plt.close(frame)


def test_stepper_live_view_redraws_the_current_frame(monkeypatch):
    from flashtext.widgets import tiles

    drawn = []
    monkeypatch.setattr(tiles, "redraw_into", lambda out, view: drawn.append(view))
    t = TileStepper(n=4, block=2)
    box = t.widget()
    box.children[0].children[1].value = 2
    assert isinstance(drawn[-1], tiles.CurrentFrame) and drawn[-1].draw == t.frame_figure


def test_memory_bars_seed_numbers_and_flat_tile():
    bars = MemoryBars(n=16, block=2)
    assert (bars.naive_peak(), bars.tiled_peak()) == (256, 4)
    assert bars.caption().startswith("at n = 16: naive peak memory grows to 256 scores")
    assert {bars.tiled_peak(n) for n in (4, 16, 128)} == {4}
    assert bars.naive_peak(128) == 16384
    assert MemoryBars(n=1, block=2).tiled_peak() == 1  # a tile is never larger than the matrix
    box = bars.widget()
    box.children[0].children[0].value = 128
    assert bars.n == 128 and "16384" in bars.caption().replace(",", "")
    assert box.children[1].value == bars.caption()


def test_checkpoint_answer_and_feedback():
    c = CheckpointPicker()  # block 2: tile of 4 scores, so n^2 >= 4000 -> n >= 64 (63^2 = 3969)
    assert c.answer() == 64
    assert c.judge(64).correct and c.judge(64).message.startswith("Right")
    assert not c.judge(63).correct and "below" in c.judge(63).message
    assert not c.judge(128).correct and "smaller candidate" in c.judge(128).message
    c.block = 4
    assert c.answer() == 128  # n >= 4 * sqrt(1000) = 126.5
    with pytest.raises(ValueError, match="candidates"):
        c.judge(65)
    c.set_candidates([3, 2])
    assert c.candidates == (2, 3) and c.answer() is None


def test_checkpoint_widget_gives_feedback():
    c = CheckpointPicker()
    box = c.widget()
    title, picks, feedback, setup = box.children
    picks.value = "48"
    assert "Not yet" in feedback.value and c.choice == 48
    picks.value = "64"
    assert "Right" in feedback.value
    setup.children[0].value = 4  # block
    assert c.choice is None and "block = 4" in title.value
    setup.children[1].value = "100, 127, 130"
    assert c.candidates == (100, 127, 130)
    picks.value = "127"
    assert "Right" in feedback.value


def test_figures_draw():
    import matplotlib.pyplot as plt

    for obj in (TileStepper(n=5, block=2, step=3), MemoryBars(), CheckpointPicker(choice=64)):
        plt.close(obj.figure())


def test_merge_tree_shapes_all_give_the_exact_statistics():
    from flashtext.widgets.tiles import SHAPES, MergeTree, tree_depth, tree_leaves

    for blocks in (1, 2, 5, 8):
        for shape in SHAPES:
            t = MergeTree(n=13, blocks=blocks, shape=shape, seed=blocks)
            tree = t.tree()
            assert sorted(tree_leaves(tree)) == list(range(blocks))
            st = t.evaluate()
            assert st.m == t.row().max()
            np.testing.assert_allclose(st.lse(), ref.logsumexp(t.row()), rtol=1e-14)
    assert tree_depth(MergeTree(blocks=8, shape="left fold").tree()) == 7
    assert tree_depth(MergeTree(blocks=8, shape="balanced").tree()) == 3
    assert MergeTree(blocks=4, shape="left fold").tree() == (((0, 1), 2), 3)
    with pytest.raises(ValueError, match="blocks"):
        MergeTree(n=3, blocks=4).tree()
    with pytest.raises(ValueError, match="shape"):
        MergeTree(shape="heap").tree()


def test_merge_tree_widget_drives_state():
    from flashtext.widgets.tiles import MergeTree

    t = MergeTree()
    box = t.widget()
    blocks, seed = box.children[0].children
    blocks.value = 7
    box.children[1].value = "left fold"
    assert t.blocks == 7 and t.shape == "left fold" and "depth 6" in t.caption()


def test_merge_tree_static_figure_shows_every_shape():
    import matplotlib.pyplot as plt

    from flashtext.widgets.tiles import SHAPES, MergeTree

    t = MergeTree(n=12, blocks=5, shape="random", seed=0)
    fig = t.figure()
    titles = [ax.get_title() for ax in fig.axes]
    assert [title.split(":")[0] for title in titles] == list(SHAPES)
    assert "depth 4" in titles[0] and "depth 3" in titles[1]  # left fold T - 1, balanced log2
    plt.close(fig)
    frame = t.frame_figure()  # the live view: this widget's shape only
    assert len(frame.axes) == 1 and frame.axes[0].get_title().startswith("random")
    plt.close(frame)


def test_multiple_choice():
    from flashtext.widgets.tiles import MultipleChoice

    q = MultipleChoice("2 + 2?", {"4": (True, "yes"), "5": (False, "no")})
    assert q.answers() == ["4"] and q.judge("4").correct and not q.judge("5").correct
    box = q.widget()
    box.children[1].value = "5"
    assert q.choice == "5" and "Not quite" in box.children[2].value
    with pytest.raises(ValueError, match="options"):
        q.judge("6")
    with pytest.raises(ValueError, match="correct"):
        MultipleChoice("?", {"a": (False, "")})
    import matplotlib.pyplot as plt

    plt.close(q.figure())
