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


def test_bwd_block_uses_the_scale_it_is_given():
    def fixed_scale(q_blk, k_blk, v_blk, do_blk, lse_blk, delta_blk, mask, sm_scale):
        return ch08.bwd_block(q_blk, k_blk, v_blk, do_blk, lse_blk, delta_blk, mask, 8 ** -0.5)

    def p_from_exp_over_exp(q_blk, k_blk, v_blk, do_blk, lse_blk, delta_blk, mask, sm_scale):
        s = (q_blk @ k_blk.T) * sm_scale
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        with np.errstate(all="ignore"):
            p = np.exp(s) / np.exp(lse_blk)[:, None]  # overflows for large scores
        p = np.nan_to_num(p, nan=0.0)
        ds = p * (do_blk @ v_blk.T - delta_blk[:, None])
        return (ds.T @ q_blk) * sm_scale, p.T @ do_blk, (ds @ k_blk) * sm_scale

    assert_exercise("ch08.bwd_block", ch08.bwd_block, wrong={
        "hard-coded 1/sqrt(8)": fixed_scale,
        "P = exp(s) / exp(lse)": p_from_exp_over_exp,
    }, message_must_mention={"hard-coded 1/sqrt(8)": "sm_scale=0.3",
                             "P = exp(s) / exp(lse)": "thousands"})


def test_the_backward_cases_have_the_properties_their_names_claim():
    from flashtext.exercises.ch08 import _step_cases

    for case, (q, k, _, _), causal, bm, bn, scale in _step_cases(np.random.default_rng(12)):
        s = (q @ k.T) * scale
        if "thousands" in case:
            assert np.abs(s).max() > 1000 and s.max() > 709  # exp(s) overflows float64
        if "not a multiple" in case:
            assert q.shape[0] % bm and k.shape[0] % bn
        if "see no key" in case:
            assert causal and q.shape[0] - k.shape[0] == 25
        if "sm_scale=0.3" in case:
            assert scale == 0.3 and q.shape[1] == 5
