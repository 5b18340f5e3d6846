"""Exercises: ``check(id, fn)`` in a notebook, ``hints(id)`` when stuck, ``make progress``."""

from flashtext.exercises.core import (
    REGISTRY,
    Exercise,
    ExerciseFailed,
    NotAttempted,
    Outcome,
    check,
    exercise,
    hints,
    load_all,
    verify,
)

__all__ = ["REGISTRY", "Exercise", "ExerciseFailed", "NotAttempted", "Outcome", "check",
           "exercise", "hints", "load_all", "verify"]
