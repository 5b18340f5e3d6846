import numpy as np

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
