"""The framework itself: verdicts, messages, progress recording, and registry hygiene."""

import json

import numpy as np
import pytest

from flashtext.exercises import ExerciseFailed, check, core, load_all, progress, verify


def test_registry_covers_every_chapter_module_and_has_hints():
    exercises = load_all()
    assert "ch00.score_matrix_bytes" in exercises
    for ex in exercises.values():
        assert ex.hints, f"{ex.id} has no hints"
        assert ex.id.startswith(f"ch{ex.chapter:02d}.")


def test_every_exercise_has_a_solution_and_a_test():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for ex in load_all().values():
        chapter = f"ch{ex.chapter:02d}"
        name = ex.id.split(".", 1)[1]
        sol = (root / "solutions" / f"{chapter}.py").read_text()
        assert f"def {name}(" in sol, f"solutions/{chapter}.py lacks {name}()"
        test = (root / "tests" / "exercises" / f"test_{chapter}.py").read_text()
        assert ex.id in test, f"tests/exercises/test_{chapter}.py never tests {ex.id}"


def test_check_prints_not_attempted_for_a_stub(capsys):
    def stub(*a):
        raise NotImplementedError

    assert check("ch00.score_matrix_bytes", stub) is None
    assert "not attempted yet" in capsys.readouterr().out


def test_check_raises_with_the_failing_case():
    with pytest.raises(ExerciseFailed, match=r"batch=1, heads=1, N=4.*expected 64"):
        check("ch00.score_matrix_bytes", lambda b, h, n, s: b * h * n * n)


def test_crashing_answer_is_a_failure_with_the_exception():
    out = verify("ch00.score_matrix_bytes", lambda *a: 1 / 0)
    assert out.status == "failed" and "ZeroDivisionError" in out.message


def test_expect_close_reports_index_and_nan():
    with pytest.raises(ExerciseFailed, match=r"index \(1,\).*NaN"):
        core.expect_close(np.array([1.0, np.nan]), np.array([1.0, 2.0]), what="x", case="c")
    core.expect_close(np.array([-np.inf, 1.0]), np.array([-np.inf, 1.0]), what="x", case="c")


def test_progress_is_recorded_and_tabulated(tmp_path, monkeypatch):
    file = tmp_path / "progress.json"
    monkeypatch.setenv("FLASHTEXT_PROGRESS_FILE", str(file))
    from solutions import ch00

    check("ch00.score_matrix_bytes", ch00.score_matrix_bytes)
    assert json.loads(file.read_text())["ch00.score_matrix_bytes"]["status"] == "passed"
    assert "done" in progress.table().split("ch00.score_matrix_bytes")[0].splitlines()[-1]
