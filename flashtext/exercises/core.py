"""The exercise framework shared by every chapter.

An exercise is a stub the reader fills in, a checker that tries the idea hard, hints, and a
reference solution kept outside the reader's path (``solutions/`` at the top of the repo).

In a notebook the reader calls ``check("ch02.online_update", my_function)``:

* the stub still raises ``NotImplementedError`` on its first call -> prints "not attempted yet"
  and returns, so Run All and ``make test`` stay green;
* a wrong answer -> raises :class:`ExerciseFailed` whose message names the input, what was
  expected, what came back and where they differ; the cell fails, and so does ``make test``;
* a right answer -> prints that it passed.

Each call is recorded for ``make progress``. Checkers are plain functions that call the reader's
code and raise :class:`ExerciseFailed` (use :func:`expect_close` / :func:`expect`). They are
handed an :class:`~flashtext.exercises.answer.Answer` around the reader's function (copies of
the inputs, a record of the calls, a time limit); kernel checkers get the ``@triton.jit``
function itself.
"""

from __future__ import annotations

import importlib
import linecache
import pkgutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from flashtext.exercises.answer import (
    DEFAULT_TIME_LIMIT,
    Answer,
    AnswerRaised,
    CheckTimedOut,
    time_limit_from_env,
    within_time_limit,
)
from flashtext.exercises.feedback import (  # noqa: F401  (the checkers' vocabulary)
    ExerciseFailed,
    describe,
    expect,
    expect_close,
    kind_of,
    number,
)

Status = Literal["passed", "failed", "not_attempted"]


class NotAttempted(Exception):
    """Raised by a checker that can tell the stub is untouched (a kernel whose source still
    says ``raise NotImplementedError``, which it cannot call to find out)."""


@dataclass(frozen=True)
class Exercise:
    id: str  # "ch02.online_update": chapter prefix, then the name of the function to write
    title: str
    checker: Callable[[Callable[..., Any]], None]
    hints: tuple[str, ...] = field(default_factory=tuple)
    builds_on: tuple[str, ...] = ()  # earlier exercises whose functions this one may call
    kernel: bool = False  # the answer is a @triton.jit function, handed to the checker as is
    time_limit: float = DEFAULT_TIME_LIMIT

    @property
    def chapter(self) -> int:
        return int(self.id.split(".")[0].removeprefix("ch"))

    @property
    def name(self) -> str:
        return self.id.split(".", 1)[1]

    @property
    def label(self) -> str:
        """'exercise 2.1 (ch02.online_update)': numbered in the chapter's order."""
        same = [e for e in REGISTRY if REGISTRY[e].chapter == self.chapter]
        return f"exercise {self.chapter}.{same.index(self.id) + 1} ({self.id})"


@dataclass(frozen=True)
class Outcome:
    exercise_id: str
    status: Status
    message: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


REGISTRY: dict[str, Exercise] = {}
_OUTCOMES: dict[str, Outcome] = {}  # the latest verdict of each exercise in this process
_HINTS_SHOWN: dict[str, int] = {}  # how many hints of each exercise hints() has given


def exercise(exercise_id: str, title: str, hints: tuple[str, ...] | list[str] = (), *,
             builds_on: tuple[str, ...] = (), kernel: bool = False,
             time_limit: float = DEFAULT_TIME_LIMIT):
    """Decorator: register ``checker(fn)`` as the checker of exercise ``exercise_id``."""

    def register(checker: Callable[[Callable[..., Any]], None]):
        if exercise_id in REGISTRY:
            raise ValueError(f"exercise {exercise_id!r} is registered twice")
        REGISTRY[exercise_id] = Exercise(exercise_id, title, checker, tuple(hints),
                                         tuple(builds_on), kernel, time_limit)
        return checker

    return register


def load_all() -> dict[str, Exercise]:
    """Import every chapter's checker module so the registry is complete."""
    import flashtext.exercises as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("ch"):
            importlib.import_module(f"flashtext.exercises.{info.name}")
    return REGISTRY


def get(exercise_id: str) -> Exercise:
    if exercise_id not in REGISTRY:
        load_all()
    try:
        return REGISTRY[exercise_id]
    except KeyError:
        known = ", ".join(sorted(REGISTRY)) or "none"
        raise KeyError(f"no exercise named {exercise_id!r}; known exercises: {known}") from None


def forget_outcomes() -> None:
    """Forget this process's verdicts (what the notes about earlier exercises rely on)."""
    _OUTCOMES.clear()


def forget_hints() -> None:
    """Start every exercise's hints from the first one again."""
    _HINTS_SHOWN.clear()


# ------------------------------------------------------------------------------ verdicts

def _frames(error: BaseException) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(error.__traceback__))


def _where(error: BaseException, fn: Callable) -> str:
    """' (line 7 of online_update: `return m / 0`)': the innermost line of the reader's code."""
    code = getattr(fn, "__code__", None)
    frames = _frames(error)
    mine = [f for f in frames if code is not None and f.filename == code.co_filename]
    frame = (mine or frames or [None])[-1]
    if frame is None:
        return ""
    line = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    return f" (line {frame.lineno} of {frame.name}: `{line}`)" if line else ""


def _raised_in_stub(error: BaseException, fn: Callable) -> bool:
    """Did the NotImplementedError come from the reader's function's own body (the stub)?"""
    code = getattr(fn, "__code__", None)
    frames = _frames(error)
    return bool(frames) and code is not None and frames[-1].filename == code.co_filename \
        and frames[-1].name == code.co_name and frames[-1].lineno is not None \
        and code.co_firstlineno <= frames[-1].lineno


def _prerequisite_named(ex: Exercise, error: BaseException) -> Exercise | None:
    """The earlier exercise whose function the error passed through, if any."""
    names = {get(e).name: get(e) for e in ex.builds_on}
    for frame in reversed(_frames(error)):
        if frame.name in names:
            return names[frame.name]
    return None


def _answer_raised(ex: Exercise, answer: Answer, raised: AnswerRaised) -> Outcome:
    error, call = raised.error, raised.call
    earlier = _prerequisite_named(ex, error)
    if isinstance(error, NotImplementedError):
        if answer.returned == 0 and _raised_in_stub(error, answer.fn):
            return Outcome(ex.id, "not_attempted", "the stub still raises NotImplementedError")
        inner = _frames(error)[-1].name if _frames(error) else "a function"
        if earlier is not None:
            return Outcome(ex.id, "failed", (
                f"your function calls {earlier.name}, which still raises NotImplementedError: "
                f"that is {earlier.label}; do it first (on the call {call})."))
        if answer.returned:
            return Outcome(ex.id, "failed", (
                f"your function answered {answer.returned} calls, then raised "
                f"NotImplementedError{_where(error, answer.fn)} on the call {call}: part of it "
                "is still a stub."))
        return Outcome(ex.id, "failed", (
            f"your function calls {inner}, which raises NotImplementedError (still a stub?), "
            f"on the call {call}."))
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    note = f" It happened inside {earlier.name}, {earlier.label}." if earlier else ""
    return Outcome(ex.id, "failed", (f"your function raised {text}{_where(error, answer.fn)}\n"
                                     f"  on the call {call}.{note}"))


def _checker_could_not_use(ex: Exercise, answer: Any, exc: Exception) -> Outcome:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if ex.kernel:
        return Outcome(ex.id, "failed", f"your kernel raised an exception: {text}")
    if isinstance(answer, Answer) and answer.returned:
        return Outcome(ex.id, "failed", (
            f"the checker could not use what your function returned for the call "
            f"{answer.last_call}: {kind_of(answer.last_result)} ({text})."))
    return Outcome(ex.id, "failed", f"the check stopped with an exception: {text}")


def _recorded_status(exercise_id: str) -> str | None:
    """The status the progress file holds for an exercise checked in an earlier session."""
    from flashtext.exercises import progress

    try:
        return progress.load().get(exercise_id, {}).get("status")
    except Exception:  # the record is a convenience: never let it break a verdict
        return None


def _with_prerequisites(ex: Exercise, outcome: Outcome) -> Outcome:
    """Say so when an earlier exercise this one builds on has not passed (in this session, or
    at its last check recorded in the progress file)."""
    if outcome.status != "failed":
        return outcome
    notes = []
    for earlier_id in ex.builds_on:
        if earlier_id in outcome.message:
            continue
        earlier = _OUTCOMES.get(earlier_id)
        status = earlier.status if earlier is not None else _recorded_status(earlier_id)
        if status == "failed":
            state = ("failed its check in this session" if earlier is not None
                     else "failed when it was last checked")
        elif status == "not_attempted":
            state = "is not attempted yet"
        else:
            continue
        notes.append(f"This exercise builds on {get(earlier_id).label}, which {state}: if your "
                     "code uses it, fix that one first.")
    if not notes:
        return outcome
    return Outcome(ex.id, outcome.status, outcome.message + "\n" + "\n".join(notes))


def verify(exercise_id: str, fn: Callable[..., Any], *, time_limit: float | None = None
           ) -> Outcome:
    """Run the checker on ``fn`` and report, without printing or recording anything.

    ``time_limit`` (seconds) defaults to the exercise's own, or ``FLASHTEXT_CHECK_TIME_LIMIT``.
    """
    ex = get(exercise_id)
    limit = time_limit if time_limit is not None else time_limit_from_env(ex.time_limit)
    answer = fn if ex.kernel else Answer(fn)
    try:
        with within_time_limit(limit):
            ex.checker(answer)
    except NotAttempted:
        outcome = Outcome(exercise_id, "not_attempted", "the stub still raises NotImplementedError")
    except ExerciseFailed as failure:
        outcome = Outcome(exercise_id, "failed", str(failure))
    except AnswerRaised as raised:
        outcome = _answer_raised(ex, answer, raised)
    except CheckTimedOut:
        call = f" on the call {answer.last_call}" if isinstance(answer, Answer) else ""
        outcome = Outcome(exercise_id, "failed", (
            f"your {'kernel' if ex.kernel else 'function'} was still running after "
            f"{limit:g} s{call}: an endless loop? (A slow but right answer can have more time: "
            "set FLASHTEXT_CHECK_TIME_LIMIT to a number of seconds, 0 for no limit.)"))
    except Exception as exc:  # the checker could not use what came back
        outcome = _checker_could_not_use(ex, answer, exc)
    else:
        outcome = Outcome(exercise_id, "passed", "all cases agree with the reference")
    outcome = _with_prerequisites(ex, outcome)
    _OUTCOMES[exercise_id] = outcome
    return outcome


def check(exercise_id: str, fn: Callable[..., Any]) -> None:
    """Notebook entry point: verify, print the verdict, record progress, raise if wrong.

    Returns nothing, so a notebook cell shows only the verdict; tests use :func:`verify`.
    Recording progress never fails a check: a damaged or unwritable progress file only warns.
    """
    from flashtext.exercises import progress

    ex = get(exercise_id)
    outcome = verify(exercise_id, fn)
    progress.record(outcome)
    if outcome.status == "not_attempted":
        print(f"[not attempted yet] {ex.title} ({exercise_id}): replace the "
              "`raise NotImplementedError` with your code, then run this cell again.")
    elif outcome.status == "passed":
        print(f"[passed] {ex.title} ({exercise_id}): {outcome.message}.")
    else:
        raise ExerciseFailed(f"{ex.title} ({exercise_id}): {outcome.message}\n"
                             f"Stuck? hints('{exercise_id}') gives a hint, the next one each "
                             "time you call it.")


def hints(exercise_id: str, *, all: bool = False) -> None:  # noqa: A002  (reads well: all=True)
    """Print the next hint of the exercise (one more per call), or every hint with ``all=True``.

    The hints go from a nudge to nearly the answer; ask for one, think, then ask for the next.
    """
    ex = get(exercise_id)
    total = len(ex.hints)
    if all:
        for n, text in enumerate(ex.hints, 1):
            print(f"Hint {n} of {total}: {text}")
        _HINTS_SHOWN[exercise_id] = total
        return
    shown = _HINTS_SHOWN.get(exercise_id, 0)
    if shown >= total:
        print(f"No more hints for {exercise_id}: you have seen all {total}. "
              f"hints('{exercise_id}', all=True) shows them together.")
        return
    print(f"Hint {shown + 1} of {total}: {ex.hints[shown]}")
    if shown + 1 < total:
        print(f"(Run hints('{exercise_id}') again for the next one.)")
    _HINTS_SHOWN[exercise_id] = shown + 1


# ---------------------------------------------------------------- helpers for writing checkers

def adversarial_rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Score vectors that catch the usual mistakes in streaming softmax code.

    Random normal scores, huge positive scores (naive exp overflows), huge negative scores
    (naive exp underflows to 0/0; a running max started at 0 instead of -inf loses every
    term), all ties, a max that arrives last (forces a rescale), and a row with -inf entries
    (masked keys).
    """
    base = rng.standard_normal(n)
    rising = np.sort(base) * 3.0
    masked = base.copy()
    masked[rng.random(n) < 0.3] = -np.inf
    masked[0] = 0.5  # keep at least one finite score
    return {
        "random normal scores": base,
        "huge positive scores (around +1000)": base * 5 + 1000.0,
        "huge negative scores (around -1000)": base * 5 - 1000.0,
        "all scores tied at 1.0": np.ones(n),
        "scores increasing, so the max arrives in the last block": rising,
        "scores with -inf entries (masked keys)": masked,
    }
