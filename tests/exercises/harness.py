"""What every exercise test proves: the reference solution passes, the untouched stub is reported
as not attempted, and each known-wrong answer fails with a message that says something useful."""

from __future__ import annotations

from collections.abc import Callable

from flashtext.exercises import verify


def stub(*args, **kwargs):
    raise NotImplementedError


def assert_exercise(exercise_id: str, solution: Callable, wrong: dict[str, Callable],
                    message_must_mention: dict[str, str] | None = None) -> None:
    good = verify(exercise_id, solution)
    assert good.status == "passed", f"reference solution fails {exercise_id}: {good.message}"
    untouched = verify(exercise_id, stub)
    assert untouched.status == "not_attempted", untouched
    assert len(wrong) >= 2, "every exercise needs at least two known-wrong answers"
    for name, fn in wrong.items():
        bad = verify(exercise_id, fn)
        assert bad.status == "failed", f"wrong answer {name!r} passed {exercise_id}"
        assert bad.message, f"wrong answer {name!r} failed with no message"
        needle = (message_must_mention or {}).get(name)
        if needle:
            assert needle in bad.message, f"{name!r}: message {bad.message!r} lacks {needle!r}"
