"""The exercise framework shared by every chapter.

An exercise is a stub the reader fills in, a checker that tries the idea hard, hints, and a
reference solution kept outside the reader's path (``solutions/`` at the top of the repo).

In a notebook the reader calls ``check("ch02.online_update", my_function)``:

* the stub still raises ``NotImplementedError`` -> prints "not attempted yet" and returns, so
  Run All and ``make test`` stay green;
* a wrong answer -> raises :class:`ExerciseFailed` whose message names the input, what was expected,
  what came back and where they differ; the cell fails, and so does ``make test``;
* a right answer -> prints that it passed.

Each call is recorded for ``make progress``. Checkers are plain functions that call the reader's
code and raise :class:`ExerciseFailed` (use :func:`expect_close` / :func:`expect`).
"""

from __future__ import annotations

import importlib
import pkgutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Status = Literal["passed", "failed", "not_attempted"]


class ExerciseFailed(AssertionError):
    """A reader's answer is wrong; the message says how."""


@dataclass(frozen=True)
class Exercise:
    id: str  # "ch02.online_update": chapter prefix, then a short name
    title: str
    checker: Callable[[Callable[..., Any]], None]
    hints: tuple[str, ...] = field(default_factory=tuple)

    @property
    def chapter(self) -> int:
        return int(self.id.split(".")[0].removeprefix("ch"))


@dataclass(frozen=True)
class Outcome:
    exercise_id: str
    status: Status
    message: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


REGISTRY: dict[str, Exercise] = {}


def exercise(exercise_id: str, title: str, hints: tuple[str, ...] | list[str] = ()):
    """Decorator: register ``checker(fn)`` as the checker of exercise ``exercise_id``."""

    def register(checker: Callable[[Callable[..., Any]], None]):
        if exercise_id in REGISTRY:
            raise ValueError(f"exercise {exercise_id!r} is registered twice")
        REGISTRY[exercise_id] = Exercise(exercise_id, title, checker, tuple(hints))
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


def _raised_not_implemented(exc: BaseException) -> bool:
    return isinstance(exc, NotImplementedError)


def verify(exercise_id: str, fn: Callable[..., Any]) -> Outcome:
    """Run the checker on ``fn`` and report, without printing or recording anything."""
    ex = get(exercise_id)
    try:
        ex.checker(fn)
    except ExerciseFailed as failure:
        return Outcome(exercise_id, "failed", str(failure))
    except NotImplementedError:
        return Outcome(exercise_id, "not_attempted", "the stub still raises NotImplementedError")
    except Exception as exc:  # the reader's code crashed: show where, in their code
        tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return Outcome(exercise_id, "failed", f"your function raised an exception: {tb}")
    return Outcome(exercise_id, "passed", "all cases agree with the reference")


def check(exercise_id: str, fn: Callable[..., Any]) -> None:
    """Notebook entry point: verify, print the verdict, record progress, raise if wrong.

    Returns nothing, so a notebook cell shows only the verdict; tests use :func:`verify`.
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
                             f"Stuck? hints('{exercise_id}') shows a hint.")


def hints(exercise_id: str, upto: int | None = None) -> list[str]:
    """Print the exercise's hints (all, or the first ``upto``) and return them."""
    ex = get(exercise_id)
    shown = list(ex.hints[:upto] if upto else ex.hints)
    for n, text in enumerate(shown, 1):
        print(f"Hint {n}/{len(ex.hints)}: {text}")
    return shown


# ---------------------------------------------------------------- helpers for writing checkers

def describe(value: Any, limit: int = 6) -> str:
    """A short, readable rendering of an input or output for failure messages."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        flat = np.array2string(value.ravel()[:limit], precision=4, separator=", ")
        more = ", ..." if value.size > limit else ""
        return f"array(shape={value.shape}, dtype={value.dtype}, values={flat[:-1]}{more}])"
    return repr(value)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ExerciseFailed(message)


def expect_close(got: Any, expected: Any, *, what: str, case: str,
                 rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Raise ExerciseFailed unless ``got`` matches ``expected`` (shape and values).

    ``what`` names the quantity ("the output O"), ``case`` the input it came from.
    """
    if got is None:
        raise ExerciseFailed(f"{case}: {what} came back as None. Did you forget `return`?")
    if hasattr(got, "detach"):
        got = got.detach().cpu().numpy()
    got_arr = np.asarray(got, dtype=np.float64)
    exp_arr = np.asarray(expected, dtype=np.float64)
    if got_arr.shape != exp_arr.shape:
        raise ExerciseFailed(f"{case}: {what} has shape {got_arr.shape}, expected {exp_arr.shape}.")
    same_inf = np.isinf(exp_arr) & (got_arr == exp_arr)
    ok = same_inf | np.isclose(got_arr, exp_arr, rtol=rtol, atol=atol)
    if np.all(ok):
        return
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0]) if got_arr.ndim else ()
    g = got_arr[first] if got_arr.ndim else float(got_arr)
    e = exp_arr[first] if exp_arr.ndim else float(exp_arr)
    where = f" at index {first}" if first else ""
    hint = " (NaN: an overflow, or inf - inf?)" if np.isnan(g) else ""
    raise ExerciseFailed(
        f"{case}: {what} is wrong{where}: expected {e!r}, got {g!r}{hint}; "
        f"{len(bad)} of {exp_arr.size} entries differ."
    )


def adversarial_rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Score vectors that catch the usual mistakes in streaming softmax code.

    Random normal scores, huge positive scores (naive exp overflows), huge negative scores
    (naive exp underflows to 0/0), all ties, a max that arrives last (forces a rescale), and
    a row with -inf entries (masked keys).
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
