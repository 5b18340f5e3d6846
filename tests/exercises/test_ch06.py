import math

from solutions import ch06
from tests.exercises.harness import assert_exercise


def test_fa1_hbm_bytes():
    def floor_tc(n, d, m, size):
        bc = math.ceil(m / (4 * d))
        tc = max(n // bc, 1)
        return ((n * d + 2 * n) + 2 * n * d + tc * (3 * n * d + 4 * n)) * size

    def kv_every_iteration(n, d, m, size):
        bc = math.ceil(m / (4 * d))
        br = min(bc, d)
        tr = math.ceil(n / br)
        return ch06.fa1_hbm_bytes(n, d, m, size) + (tr - 1) * 2 * n * d * size

    assert_exercise(
        "ch06.fa1_hbm_bytes",
        ch06.fa1_hbm_bytes,
        wrong={
            "four-step estimate": lambda n, d, m, s: 16 * n * n * d * d / m * s,
            "floor for Tc": floor_tc,
            "no line 2": lambda n, d, m, s: ch06.fa1_hbm_bytes(n, d, m, s) - (n * d + 2 * n) * s,
            "K, V at every iteration": kv_every_iteration,
        },
        message_must_mention={"four-step estimate": "four-step"},
    )


def test_predict_dram_bytes(capsys):
    def flash_as_fa1(impl, n, d, b, h, s):
        if impl == "naive":
            return ch06.predict_dram_bytes(impl, n, d, b, h, s)
        return (3 * n * d + 2 * n + 12 * n * d) * b * h * s

    assert_exercise(
        "ch06.predict_dram_bytes",
        ch06.predict_dram_bytes,
        wrong={
            "flash as Algorithm 1": flash_as_fa1,
            "naive without P": lambda i, n, d, b, h, s: (4 * n * d + (2 if i == "naive" else 0)
                                                         * n * n) * b * h * s,
            "forgot heads": lambda i, n, d, b, h, s: ch06.predict_dram_bytes(i, n, d, b, 1, s),
        },
    )
    assert "measured" in capsys.readouterr().out  # the passing run shows the H200 comparison


def test_crossover_m():
    assert_exercise(
        "ch06.crossover_m",
        ch06.crossover_m,
        wrong={
            "3 d^2": lambda n, d: 3 * d * d,
            "off by one": lambda n, d: None if ch06.crossover_m(n, d) is None
            else ch06.crossover_m(n, d) - 1,
            "never None": lambda n, d: ch06.crossover_m(n, d) or 1,
        },
        message_must_mention={"off by one": "off by one", "never None": "None"},
    )


def test_crossover_m_steps_over_a_tie():
    def at_most(n, d):  # "moves no more than" instead of "strictly fewer"
        standard = 4 * n * d + 4 * n * n
        if ch06.fa1_hbm_bytes(n, d, 4 * n * d, 1) > standard:
            return None
        lo, hi = 0, 4 * n * d
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ch06.fa1_hbm_bytes(n, d, mid, 1) <= standard:
                hi = mid
            else:
                lo = mid
        return hi

    assert_exercise("ch06.crossover_m", ch06.crossover_m, wrong={
        "<= instead of <": at_most,
        "returns a float": lambda n, d: None if ch06.crossover_m(n, d) is None
        else ch06.crossover_m(n, d) + 0.5,
    }, message_must_mention={"<= instead of <": "exactly as many"})


def test_the_tie_cases_are_ties():
    from flashtext import cost

    for n, d in ((10, 2), (100, 10), (266, 13)):
        m = cost.fa1_crossover_m(n, d)
        ties = [x for x in range(1, m) if cost.fa1_hbm_total(n, d, x)
                == cost.standard_attention_hbm_total(n, d)]
        assert ties, (n, d)
