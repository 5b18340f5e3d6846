"""The reader's function as a checker sees it: every call gets copies of its inputs, is recorded
(what it was given, whether it returned), and runs under a time limit.

* Copies: an answer that changes its inputs in place cannot change the arrays the checker
  computes its expected values from.
* The record: when something goes wrong, the verdict can say on which call, whether the
  reader's code raised or the checker could not use what it returned, and how many calls had
  answered before (a function that answers and *then* raises ``NotImplementedError`` still
  has a stub inside; it was attempted).
* The time limit: an endless loop ends with a message instead of a notebook that hangs.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flashtext.exercises.feedback import describe

DEFAULT_TIME_LIMIT = 60.0  # seconds per check; FLASHTEXT_CHECK_TIME_LIMIT overrides (0: none)


class AnswerRaised(Exception):
    """The reader's function raised ``error`` while called with ``call``."""

    def __init__(self, error: BaseException, call: str):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error, self.call = error, call


class CheckTimedOut(BaseException):
    """The time limit ran out. A BaseException, so ``except Exception`` in a reader's code
    cannot swallow it."""


def _copied(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is passed as it is
        return value


class Answer:
    """Wrap ``fn``: call it with copies of the arguments and record what happened."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.calls = 0
        self.returned = 0
        self.last_call = ""
        self.last_result: Any = None
        self.__name__ = getattr(fn, "__name__", "your function")
        self.__doc__ = getattr(fn, "__doc__", None)

    def describe_call(self, args: tuple, kwargs: dict) -> str:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            parts = [f"{name}={describe(value)}" for name, value in bound.arguments.items()]
        except (TypeError, ValueError):
            parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in
                                                   kwargs.items()]
        return f"{self.__name__}({', '.join(parts)})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.last_call = self.describe_call(args, kwargs)
        args = tuple(_copied(a) for a in args)
        kwargs = {k: _copied(v) for k, v in kwargs.items()}
        try:
            result = self.fn(*args, **kwargs)
        except CheckTimedOut:
            raise
        except Exception as error:
            raise AnswerRaised(error, self.last_call) from error
        self.returned += 1
        self.last_result = result
        return result


def time_limit_from_env(default: float) -> float | None:
    raw = os.environ.get("FLASHTEXT_CHECK_TIME_LIMIT", "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"FLASHTEXT_CHECK_TIME_LIMIT must be a number of seconds (0 for no "
                         f"limit), got {raw!r}") from None
    return seconds if seconds > 0 else None


@contextlib.contextmanager
def within_time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CheckTimedOut` in the running code after ``seconds``.

    Uses SIGALRM, so it works in the main thread of a POSIX process (a Jupyter kernel runs cells
    there, pytest its tests); elsewhere, and for ``seconds=None``, there is no limit. A timer
    that was already set (by a test runner, say) is put back afterwards.
    """
    usable = (seconds is not None and hasattr(signal, "SIGALRM")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CheckTimedOut(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:  # the outer timer keeps its deadline (fires at once if it has passed)
            left = max(outer_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)
