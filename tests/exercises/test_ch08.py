import numpy as np

from solutions import ch08
from tests.exercises.harness import assert_exercise


def test_delta():
    assert_exercise(
        "ch08.delta", ch08.delta,
        wrong={
            "summed over the rows (D in R^d)": lambda o, do: np.sum(do * o, axis=-2),
            "forgot O": lambda o, do: np.sum(do, axis=-1),
            "kept a trailing axis": lambda o, do: np.sum(do * o, axis=-1, keepdims=True),
            "rowsum(O * O)": lambda o, do: np.sum(o * o, axis=-1),
        },
        message_must_mention={"summed over the rows (D in R^d)": "#2555",
                              "kept a trailing axis": "shape"},
    )


def _variant(scale_dk=True, use_delta=True, p_from_max=False, swap_dv=False, use_mask=True,
             nan_rows=False):
    def fn(q_blk, k_blk, v_blk, do_blk, lse_blk, delta_blk, mask, sm_scale):
        s = (q_blk @ k_blk.T) * sm_scale
        if mask is not None and use_mask:
            s = np.where(mask, s, -np.inf)
        if p_from_max:
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - np.where(np.isneginf(m), 0.0, m))
        elif nan_rows:
            p = np.exp(s - lse_blk[:, None])
        else:
            p = np.exp(s - np.where(np.isneginf(lse_blk), np.inf, lse_blk)[:, None])
        dv = (do_blk.T @ p).T if not swap_dv else p.T @ do_blk[::-1]
        dp = do_blk @ v_blk.T
        ds = p * (dp - delta_blk[:, None]) if use_delta else p * dp
        dk = ds.T @ q_blk * (sm_scale if scale_dk else 1.0)
        dq = ds @ k_blk * sm_scale
        return dk, dv, dq
    return fn


def test_bwd_block():
    assert_exercise(
        "ch08.bwd_block", ch08.bwd_block,
        wrong={
            "dK without the scale": _variant(scale_dk=False),
            "forgot to subtract D": _variant(use_delta=False),
            "P from the max, not lse": _variant(p_from_max=True),
            "dV from the wrong rows": _variant(swap_dv=True),
            "ignored the causal mask": _variant(use_mask=False),
            "NaN for rows with no key": _variant(nan_rows=True),
            "returned dq, dk, dv (wrong order)": lambda *a: ch08.bwd_block(*a)[::-1],
        },
        message_must_mention={
            "dK without the scale": "dK wrong (dQ and dV agree",
            "forgot to subtract D": "dQ and dK wrong (dV agrees",
            "P from the max, not lse": "all three disagree",
            "dV from the wrong rows": "dV wrong (dQ and dK agree",
            "NaN for rows with no key": "NaN",
            "returned dq, dk, dv (wrong order)": "shape",
        },
    )
