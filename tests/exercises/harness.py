"""What every exercise test proves: the reference solution passes, the untouched stub is reported
as not attempted, and each known-wrong answer fails with a message that says something useful."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flashtext.exercises import verify
from flashtext.exercises.kernel_checks import interpreting

# Only Triton's interpreter lets the checker see every address a kernel touches (the CPU path):
# compiled on a GPU, a read past the end whose lanes never reach the output is invisible, and
# a store far out of bounds faults the device instead of being stopped.
needs_interpreter = pytest.mark.skipif(not interpreting(), reason="the access monitor runs "
                                       "under Triton's interpreter only")


def interpreted_only(wrong: dict[str, Callable]) -> dict[str, Callable]:
    """Wrong kernels that only the interpreter's access monitor can reject (see above)."""
    return dict(wrong) if interpreting() else {}


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
