import numpy as np

from flashtext import reference as ref
from flashtext.exercises import verify
from solutions import ch07
from tests.exercises.harness import assert_exercise


def _forward_variant(no_rescale=False, normalise_each_step=False, lse_is_max=False,
                     top_left=False):
    def fn(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):  # noqa: N803
        n_q, d = q.shape
        n_k = k.shape[0]
        offset = 0 if top_left else n_k - n_q
        o = np.zeros((n_q, v.shape[1]))
        lse = np.empty(n_q)
        for sm in range(0, n_q, BLOCK_M):
            rows = np.arange(sm, min(sm + BLOCK_M, n_q))
            m_i, l_i = np.full(rows.size, -np.inf), np.zeros(rows.size)
            acc = np.zeros((rows.size, v.shape[1]))
            for sn in range(0, n_k, BLOCK_N):
                cols = np.arange(sn, min(sn + BLOCK_N, n_k))
                s = q[rows] @ k[cols].T / np.sqrt(d)
                if causal:
                    s = np.where(cols[None, :] <= rows[:, None] + offset, s, -np.inf)
                m_new = np.maximum(m_i, s.max(axis=1))
                safe = np.where(np.isneginf(m_new), 0.0, m_new)
                alpha = np.ones_like(m_i) if no_rescale else np.exp(m_i - safe)
                p = np.exp(s - safe[:, None])
                l_new = alpha * l_i + p.sum(axis=1)
                if normalise_each_step:  # divides by l but never undoes the old division
                    acc = np.divide(alpha[:, None] * acc + p @ v[cols], l_new[:, None],
                                    out=np.zeros_like(acc), where=l_new[:, None] > 0)
                else:
                    acc = alpha[:, None] * acc + p @ v[cols]
                l_i, m_i = l_new, m_new
            if normalise_each_step:
                out, ls = acc, ch07.finalize(acc, m_i, l_i)[1]
            else:
                out, ls = ch07.finalize(acc, m_i, l_i)
            o[rows], lse[rows] = out, (m_i if lse_is_max else ls)
        return o, lse
    return fn


def test_forward_q_outer():
    assert_exercise(
        "ch07.forward_q_outer", ch07.forward_q_outer,
        wrong={
            "forgot to rescale by alpha": _forward_variant(no_rescale=True),
            "normalised after every step (FA1 without undoing it)":
                _forward_variant(normalise_each_step=True),
            "saved the max instead of the log-sum-exp": _forward_variant(lse_is_max=True),
            "top-left causal mask": _forward_variant(top_left=True),
            "returned only o": lambda q, k, v, c, bm, bn: ch07.forward_q_outer(q, k, v, c, bm,
                                                                                bn)[0],
        },
        message_must_mention={"saved the max instead of the log-sum-exp": "log-sum-exp",
                              "top-left causal mask": "causal",
                              "returned only o": "pair"},
    )


def _counts_square_formula(n_q, n_k, bm, bn, align):
    t = -(-n_q // bm)
    return t * (t - 1) // 2, t, t * (t - 1) // 2


def _counts_off_by_one(n_q, n_k, bm, bn, align):
    offset = n_k - n_q if align == "bottom_right" else 0
    out = [0, 0, 0]
    for sm in range(0, n_q, bm):
        em = min(sm + bm, n_q)
        for sn in range(0, n_k, bn):
            en = min(sn + bn, n_k)
            out[0 if sn > em - 1 + offset else 2 if en <= sm + offset else 1] += 1
    return tuple(out)


def test_causal_block_counts():
    assert_exercise(
        "ch07.causal_block_counts", ch07.causal_block_counts,
        wrong={
            "always top-left": lambda n_q, n_k, bm, bn, align:
                ch07.causal_block_counts(n_q, n_k, bm, bn, "top_left"),
            "square-matrix formula": _counts_square_formula,
            "full test off by one": _counts_off_by_one,
            "forgot to return": lambda *a: None,
        },
        message_must_mention={"square-matrix formula": "expected (skipped, masked, full)",
                              "forgot to return": "return"},
    )


def test_finalize():
    def naive_lse(acc, m, l):  # noqa: E741
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return ch07.finalize(acc, m, l)[0], np.log(np.exp(m) * l)

    assert_exercise(
        "ch07.finalize", ch07.finalize,
        wrong={
            "log(exp(m) * l) overflows": naive_lse,
            "forgot m": lambda acc, m, l: (ch07.finalize(acc, m, l)[0], np.log(l)),
            "forgot to divide": lambda acc, m, l: (acc, ch07.finalize(acc, m, l)[1]),
            "base-2 log": lambda acc, m, l: (ch07.finalize(acc, m, l)[0], m + np.log2(l)),
        },
        message_must_mention={"log(exp(m) * l) overflows": "+1000"},
    )


def _forward(q, k, v, causal, bm, bn, *, m0=-np.inf, scale=None, tile_max=False):
    """The FA2 forward with one learner's slip switchable on."""
    n_q, d = q.shape
    n_k = k.shape[0]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    o, lse = np.zeros((n_q, v.shape[1])), np.empty(n_q)
    for sm in range(0, n_q, bm):
        rows = np.arange(sm, min(sm + bm, n_q))
        m_i, l_i = np.full(rows.size, m0), np.zeros(rows.size)
        acc = np.zeros((rows.size, v.shape[1]))
        for sn in range(0, n_k, bn):
            cols = np.arange(sn, min(sn + bn, n_k))
            s = q[rows] @ k[cols].T * scale
            if causal:
                s = np.where(cols[None, :] <= rows[:, None] + n_k - n_q, s, -np.inf)
            block_max = np.full(rows.size, s.max()) if tile_max else s.max(axis=1)
            m_new = np.maximum(m_i, block_max)
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            with np.errstate(all="ignore"):
                alpha, p = np.exp(m_i - safe), np.exp(s - safe[:, None])
            l_i = alpha * l_i + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v[cols]
            m_i = m_new
        with np.errstate(all="ignore"):
            o[rows], lse[rows] = ch07.finalize(acc, m_i, l_i)
    return o, lse


def test_forward_q_outer_catches_a_zero_start_a_fixed_scale_and_one_max_per_tile():
    assert_exercise(
        "ch07.forward_q_outer", ch07.forward_q_outer,
        wrong={
            "running max starts at 0": lambda q, k, v, c, bm, bn: _forward(q, k, v, c, bm, bn,
                                                                           m0=0.0),
            "hard-coded 1/sqrt(8)": lambda q, k, v, c, bm, bn: _forward(q, k, v, c, bm, bn,
                                                                        scale=8 ** -0.5),
            "one max for the whole tile": lambda q, k, v, c, bm, bn: _forward(
                q, k, v, c, bm, bn, tile_max=True),
            "no tiles: softmax of the whole S": lambda q, k, v, c, bm, bn: ref.attention(
                q, k, v, c, return_lse=True),
        },
        message_must_mention={"running max starts at 0": "below -1500",
                              "no tiles: softmax of the whole S": "score matrix"},
    )
    assert verify("ch07.forward_q_outer", _forward).passed  # the switchable answer, all off


def test_the_forward_cases_have_the_properties_their_names_claim():
    from flashtext.exercises.ch07 import RULE_CASE, _forward_cases

    dims = set()
    for case, q, k, v, causal, bm, _ in _forward_cases(np.random.default_rng(7)):
        s = q @ k.T / np.sqrt(q.shape[1])
        dims.add(q.shape[1])
        assert q.shape[1] == k.shape[1] == v.shape[1]
        if "below -1500" in case:
            assert s.max() < -1500  # every score: exp(s - 0) underflows in float64
        if "+-1000" in case:
            assert s.max() > 800 and s.min() < -800
        if "rows hundreds apart" in case:
            row_max = s[:bm].max(axis=1)
            assert row_max.max() - row_max.min() > 1000  # > 745: one shared max underflows
        if "tied" in case:
            assert np.ptp(s, axis=1).max() == 0
        if "each block raises the max" in case:
            assert np.all(np.diff(s, axis=1) > 0)
        if "see no key" in case:
            assert causal and q.shape[0] > k.shape[0]
    assert len(dims) >= 4  # no hard-coded 1/sqrt(d) fits every case
    n, d, bm, bn = RULE_CASE
    assert n * n * 8 // 4 > 10 * bm * bn * 8  # the memory budget is far above one tile


def test_causal_block_counts_with_a_ragged_last_block_top_left():
    def unclamped_end(n_q, n_k, bm, bn, align):
        offset = n_k - n_q if align == "bottom_right" else 0
        out = [0, 0, 0]
        for sm in range(0, n_q, bm):
            em = sm + bm  # the padded rows of the last block counted as real
            for sn in range(0, n_k, bn):
                en = min(sn + bn, n_k)
                out[0 if sn > em - 1 + offset else 2 if en - 1 <= sm + offset else 1] += 1
        return tuple(out)

    assert_exercise("ch07.causal_block_counts", ch07.causal_block_counts, wrong={
        "last query block not clamped to Nq": unclamped_end,
        "numpy ints in a list": lambda *a: list(ch07.causal_block_counts(*a))[:2],
    }, message_must_mention={"last query block not clamped to Nq": "top_left"})


def test_finalize_needs_one_max_per_row():
    def one_max_for_all_rows(acc, m, l):  # noqa: E741
        big = np.max(m[np.isfinite(m)]) if np.isfinite(m).any() else 0.0
        with np.errstate(all="ignore"):
            lse = big + np.log(l * np.exp(m - big))
        return ch07.finalize(acc, m, l)[0], lse

    assert_exercise("ch07.finalize", ch07.finalize, wrong={
        "one max for all rows": one_max_for_all_rows,
        "lse as a list": lambda acc, m, l: (ch07.finalize(acc, m, l)[0], "lse"),
    }, message_must_mention={"one max for all rows": "hundreds apart"})


def test_the_finalize_cases_have_the_properties_their_names_claim():
    from flashtext.exercises.ch07 import _finalize_cases

    for case, _, m, l in _finalize_cases(np.random.default_rng(8)):  # noqa: E741
        if case.startswith("running max around +1000"):
            assert m.min() > 990
        if case.startswith("running max around -1000"):
            assert m.max() < -990
        if "hundreds apart" in case:
            assert np.ptp(m) > 1500
        if "saw no key" in case:
            assert np.isneginf(m).sum() == 2 and np.sum(l == 0) == 2
