from solutions import ch00
from tests.exercises.harness import assert_exercise


def test_score_matrix_bytes():
    assert_exercise(
        "ch00.score_matrix_bytes",
        ch00.score_matrix_bytes,
        wrong={
            "forgot the heads": lambda b, h, n, s: b * n * n * s,
            "bytes per element ignored": lambda b, h, n, s: b * h * n * n,
            "linear in N": lambda b, h, n, s: b * h * n * s,
            "forgot to return": lambda b, h, n, s: None,
        },
        message_must_mention={"forgot to return": "return"},
    )
