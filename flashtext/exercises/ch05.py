"""Chapter 5's exercise: line 12 of Algorithm 1 from its three moves. The checker feeds the
reader's function the exact inputs of every (i, j) step of real runs and, when the output is
wrong, probes it term by term to say which part is wrong: the green term (old output), the
yellow term (current block) or the normalisation."""

from __future__ import annotations

import numpy as np

from flashtext import cost, tiled
from flashtext.exercises.core import ExerciseFailed, expect, expect_close
from flashtext.exercises.core import exercise as register


def _cases() -> list[tuple[str, dict]]:
    rng = np.random.default_rng(5)

    def normal(n, d, n_k=None, spread=1.0):
        n_k = n if n_k is None else n_k
        return (spread * rng.standard_normal((n, d)), rng.standard_normal((n_k, d)),
                rng.standard_normal((n_k, d)))

    rising_k = np.linspace(-3, 3, 14)[:, None]
    return [
        ("random scores, N=23, d=4, M=48 (ragged last blocks)",
         dict(qkv=normal(23, 4), m=48)),
        ("scores rising along the keys (every block raises the max), N=6, Nk=14, d=1",
         dict(qkv=(np.ones((6, 1)), rising_k, rng.standard_normal((14, 1))), m=8, scale=2.0)),
        ("scores falling along the keys (the max comes in the first block)",
         dict(qkv=(np.ones((6, 1)), rising_k[::-1].copy(), rng.standard_normal((14, 1))), m=8,
              scale=2.0)),
        ("huge scores (thousands: exp(m) on its own overflows), N=16, d=4",
         dict(qkv=normal(16, 4, spread=600.0), m=48)),
        ("Nq=9 queries, Nk=31 keys, d=8, M=100", dict(qkv=normal(9, 8, 31), m=100)),
        ("causal, Nq=20 > Nk=7 (bottom-right: some rows see no key at all, m = -inf, l = 0)",
         dict(qkv=normal(20, 4, 7), m=48, causal=True)),
    ]


def _diagnose(fn, step: tiled.Step, v_j: np.ndarray, got: np.ndarray, case: str) -> str:
    inv = np.divide(1.0, step.l_new, out=np.zeros_like(step.l_new), where=step.l_new > 0)
    green, yellow = step.green, step.yellow
    args = [step.o_old, step.l_old, step.m_old, step.p_tilde, step.m_tilde, v_j, step.l_new,
            step.m_new]

    def call(**swap):
        names = ["o_i", "l_i", "m_i", "p_tilde", "m_tilde", "v_j", "l_new", "m_new"]
        a = [swap.get(n, x).copy() for n, x in zip(names, args, strict=True)]
        with np.errstate(all="ignore"):
            return np.asarray(fn(*a), dtype=np.float64)

    def close(x, y):
        return x.shape == y.shape and np.allclose(x, y, rtol=1e-9, atol=1e-12)

    total = green + yellow
    if close(got, total):
        return "you returned the numerator without move 3: divide by l_new (diag(l_new)^-1)."
    if close(got, step.l_new[:, None] * total):
        return ("you multiplied by diag(l_new) instead of its inverse: this is the typo in the "
                "FA1 proof (flash-attention #273). Move 3 divides by l_new.")
    if close(got, np.divide(total, step.l_old[:, None], where=step.l_old[:, None] > 0,
                            out=np.zeros_like(total))) and not close(got, inv[:, None] * total):
        return "you re-normalised by the old l_i; move 3 divides by the new l (l_new)."
    g = call(v_j=np.zeros_like(v_j))  # with V_j = 0 only the green term is left
    y = call(o_i=np.zeros_like(step.o_old))  # with O_i = 0 only the yellow term is left
    alpha = np.exp(np.where(np.isneginf(step.m_old), -np.inf, step.m_old - np.where(
        np.isneginf(step.m_new), 0.0, step.m_new)))
    problems = []
    if not close(g, inv[:, None] * green):
        which = ("it lacks the re-basing factor e^(m_i - m_new) (move 2)"
                 if close(g, inv[:, None] * step.l_old[:, None] * step.o_old) else
                 "it lacks diag(l_i): O_i was normalised, undo that first (move 1)"
                 if close(g, inv[:, None] * alpha[:, None] * step.o_old) else
                 "it should be diag(l_i) e^(m_i - m_new) O_i")
        problems.append(f"the GREEN term (the old output O_i) is wrong: {which}")
    if not close(y, inv[:, None] * yellow):
        which = ("it lacks the re-basing factor e^(m~_ij - m_new) (move 2)"
                 if close(y, inv[:, None] * (step.p_tilde @ v_j)) else
                 "it should be e^(m~_ij - m_new) P~_ij V_j")
        problems.append(f"the YELLOW term (the current block) is wrong: {which}")
    if problems:
        return "; ".join(problems) + "."
    return ("each term is right on its own, but not their sum: line 12 must be linear in "
            "O_i and V_j, diag(l_new)^-1 (green + yellow).")


@register(
    "ch05.line12",
    "Line 12 of Algorithm 1, from its three moves",
    hints=(
        "Move 1: O_i was divided by l_i; diag(l_i) O_i (l_i[:, None] * o_i) is the raw "
        "weighted sum over past keys, still relative to the old max m_i.",
        "Move 2: re-base both halves on m_new: the old raw sum times exp(m_i - m_new), and "
        "P~_ij V_j (p_tilde @ v_j, computed against the tile's own max m~_ij) times "
        "exp(m~_ij - m_new). Both factors are <= 1: compute the difference, then exp.",
        "Move 3: divide the sum by l_new, row by row (l_new[:, None]).",
        "Rows that have seen no unmasked key have m = -inf: exp(-inf - (-inf)) is NaN. Use a "
        "factor 0 when the old max is -inf (flashtext.online.rescale_factor does this), and "
        "keep output 0 where l_new is 0.",
    ),
)
def check_line12(fn) -> None:
    for case, spec in _cases():
        q, k, v = spec["qkv"]
        m, d = spec["m"], q.shape[1]
        room = sum(cost.fa1_sram_elements(m, d).values())
        kwargs = dict(causal=spec.get("causal", False), scale=spec.get("scale"),
                      sram_elements=room)
        run = tiled.algorithm1(q, k, v, m, trace=True, **kwargs)
        for step in run.steps:
            v_j = v[step.cols]
            where = (f"{case}; step (i={step.i + 1}, j={step.j + 1}) in the paper's 1-based "
                     f"indices")
            with np.errstate(all="ignore"):
                got = fn(step.o_old.copy(), step.l_old.copy(), step.m_old.copy(),
                         step.p_tilde.copy(), step.m_tilde.copy(), v_j.copy(),
                         step.l_new.copy(), step.m_new.copy())
            expect(got is not None, f"{where}: your function returned None. Forgot `return`?")
            got = np.asarray(got, dtype=np.float64)
            expect(got.shape == step.o_new.shape,
                   f"{where}: the new O_i should have shape {step.o_new.shape} (Br x d), got "
                   f"{got.shape}")
            try:
                expect_close(got, step.o_new, what="the new O_i", case=where, rtol=1e-9,
                             atol=1e-12)
            except ExerciseFailed as failure:
                if np.isnan(got).any():
                    raise ExerciseFailed(
                        f"{failure} A NaN: a row whose old max m_i is -inf needs a rescale "
                        f"factor of 0, not exp(-inf - (-inf)); rows with l_new = 0 stay 0."
                    ) from None
                raise ExerciseFailed(f"{failure} Diagnosis: "
                                     f"{_diagnose(fn, step, v_j, got, where)}") from None
