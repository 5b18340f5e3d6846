import matplotlib.pyplot as plt
import pytest

from flashtext.kernels import plan
from flashtext.widgets.triton_tiles import KernelSchedule, MatmulProgram


def test_matmul_program_tiles_and_masks_follow_the_state():
    w = MatmulProgram(M=100, N=72, K=90, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, pid_m=0, pid_n=0,
                      step=0)
    assert w.grid == (4, 3) and w.steps == 3
    assert w.masked_lanes() == {"A": 0, "B": 0, "C": 0}
    w.pid_m, w.step = 3, 2  # rows 96..127 (4 real), k 64..95 (26 real)
    assert w.tiles()["A"] == (96, 64, 32, 32)
    assert w.masked_lanes()["A"] == 32 * 32 - 4 * 26
    assert w.masked_lanes()["C"] == 32 * 32 - 4 * 32
    # A is read once per column of programs, B once per row of programs
    assert w.reads() == 100 * 90 * 3 + 90 * 72 * 4
    w.BLOCK_N = 64
    assert w.reads() == 100 * 90 * 2 + 90 * 72 * 4
    w.M = 10
    w.clamp()
    assert w.pid_m == 0 and "pid_m=0" in w.caption()


def test_kernel_schedule_reads_the_plan():
    w = KernelSchedule(n_q=64, n_k=64, BLOCK_M=32, BLOCK_N=32, causal=True, program=1)
    assert (w.stages() == plan.forward_stages(64, 64, 32, 32, True)).all()
    assert "keys [0, 32) no mask, [32, 64) masked" in w.caption()
    w.kernel = "dkdv"
    w.program = 0
    assert "rows [0, 0) skipped, [0, 32) masked, [32, 64) no mask" in w.caption()
    w.causal = False
    assert (w.stages() == plan.UNMASKED_STAGE).all()
    w.program = 99
    w.clamp()
    assert w.program == 1
    w.kernel = "sideways"
    with pytest.raises(ValueError, match="kernel must be"):
        w.stages()


def test_widgets_drive_their_state_and_draw():
    m = MatmulProgram()
    box = m.widget()
    m_slider = box.children[0].children[0]
    m_slider.value = 40
    assert m.M == 40 and m.pid_m <= 1  # clamped into the smaller grid
    plt.close(m.figure())
    k = KernelSchedule()
    box = k.widget()
    box.children[2].children[0].value = "dkdv"
    assert k.kernel == "dkdv"
    fig = k.figure()
    assert "dK/dV program" in fig.axes[0].get_title()
    plt.close(fig)
