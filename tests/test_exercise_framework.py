"""The framework itself: verdicts, messages, hints, progress recording, and registry hygiene."""

import json
import time
import warnings

import numpy as np
import pytest

from flashtext.exercises import ExerciseFailed, check, core, hints, load_all, progress, verify
from solutions import ch00, ch02


@pytest.fixture
def scratch_exercise():
    """Register a throw-away exercise for the duration of one test."""
    made = []

    def register(checker, exercise_id="ch99.scratch", **kwargs):
        core.exercise(exercise_id, "A scratch exercise", hints=("h1", "h2"), **kwargs)(checker)
        made.append(exercise_id)
        return exercise_id

    yield register
    for exercise_id in made:
        core.REGISTRY.pop(exercise_id, None)


def test_registry_covers_every_chapter_module_and_has_hints():
    exercises = load_all()
    order = list(exercises)
    assert "ch00.score_matrix_bytes" in exercises
    for ex in exercises.values():
        assert ex.hints, f"{ex.id} has no hints"
        assert ex.id.startswith(f"ch{ex.chapter:02d}.")
        for earlier in ex.builds_on:  # an exercise builds on earlier ones of its chapter
            assert earlier in exercises and order.index(earlier) < order.index(ex.id)
            assert exercises[earlier].chapter == ex.chapter, (ex.id, earlier)
    assert exercises["ch02.streaming_softmax"].label == "exercise 2.2 (ch02.streaming_softmax)"


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


def test_crashing_answer_is_a_failure_with_the_exception_and_the_call():
    out = verify("ch00.score_matrix_bytes", lambda batch, heads, n, bytes_per_element: 1 / 0)
    assert out.status == "failed" and "ZeroDivisionError" in out.message
    assert "batch=1, heads=1, n=4, bytes_per_element=4" in out.message  # the call it died on


def test_expect_close_reports_index_and_nan():
    with pytest.raises(ExerciseFailed, match=r"index \(1,\).*NaN"):
        core.expect_close(np.array([1.0, np.nan]), np.array([1.0, 2.0]), what="x", case="c")
    core.expect_close(np.array([-np.inf, 1.0]), np.array([-np.inf, 1.0]), what="x", case="c")


# ----------------------------------------------------------------------- messages read well

def test_messages_show_plain_numbers_not_numpy_reprs():
    with pytest.raises(ExerciseFailed) as failure:
        core.expect_close(np.array([1.0, 2.5]), np.array([1.0, 3.0]), what="the output", case="c")
    assert "np.float64" not in str(failure.value) and "expected 3, got 2.5" in str(failure.value)
    with pytest.raises(ExerciseFailed) as failure:
        core.expect_close(np.float64(0.1), np.int64(1), what="the value", case="c")
    assert "np." not in str(failure.value)
    assert core.describe((np.float64(1.5), np.int64(3), -np.inf)) == "(1.5, 3, -inf)"


def test_plural_quantities_read_grammatically():
    out = verify("ch02.streaming_softmax", lambda x, block: np.ones(len(x)) / len(x))
    assert out.status == "failed"
    assert "the probabilities is" not in out.message and "the probabilities" in out.message


def test_a_returned_string_is_reported_as_such_not_as_a_crash():
    out = verify("ch12.tflops", lambda *args: "fast")
    assert out.status == "failed"
    assert "raised" not in out.message, out.message
    assert "'fast'" in out.message and "str" in out.message


def test_a_right_but_late_stub_is_a_failure_not_not_attempted():
    calls = []

    def half_done(batch, heads, n, size):
        calls.append(1)
        if len(calls) > 2:
            raise NotImplementedError  # the reader left part of it as a stub
        return batch * heads * n * n * size

    out = verify("ch00.score_matrix_bytes", half_done)
    assert out.status == "failed", out
    assert "NotImplementedError" in out.message and "2 calls" in out.message


def test_an_answer_that_mutates_its_inputs_cannot_move_the_expected_values(scratch_exercise):
    def checker(fn):
        xs = np.array([1.0, 2.0, 3.0])
        got = fn(xs)
        core.expect_close(got, 2 * xs, what="2x", case="xs = [1, 2, 3]")  # expected from xs

    ex_id = scratch_exercise(checker)

    def zero_then_double(x):
        x[:] = 0.0  # wrong, and it hides the evidence in the checker's own array
        return 2 * x

    assert verify(ex_id, zero_then_double).status == "failed"
    assert verify(ex_id, lambda x: 2 * x).status == "passed"


def test_an_answer_that_never_returns_is_stopped_with_a_message():
    def endless(batch, heads, n, size):
        deadline = time.monotonic() + 20  # a safety net: without a time limit it would hang
        while time.monotonic() < deadline:
            pass
        return 0

    start = time.monotonic()
    out = verify("ch00.score_matrix_bytes", endless, time_limit=0.5)
    assert time.monotonic() - start < 5
    assert out.status == "failed"
    assert "still running after 0.5 s" in out.message and "batch=1" in out.message


def test_a_stub_of_an_earlier_exercise_is_named_not_reported_as_not_attempted():
    def online_update(m, l, scores):  # noqa: E741  (exercise 2.1 still a stub)
        raise NotImplementedError

    def streaming_softmax(x, block):
        m, l = -np.inf, 0.0  # noqa: E741
        for a in range(0, len(x), block):
            m, l = online_update(m, l, x[a:a + block])  # noqa: E741
        return np.exp(x - m) / l

    out = verify("ch02.streaming_softmax", streaming_softmax)
    assert out.status == "failed", out
    assert "online_update" in out.message and "exercise 2.1" in out.message


def test_a_failing_earlier_exercise_is_mentioned_when_a_later_one_fails():
    def wrong_update(m, l, scores):  # noqa: E741  (forgets the rescale)
        m_new = max(m, float(np.max(scores)))
        shift = 0.0 if m_new == -np.inf else m_new
        return m_new, l + float(np.sum(np.exp(scores - shift)))

    def streaming_softmax(x, block):
        m, l = -np.inf, 0.0  # noqa: E741
        for a in range(0, len(x), block):
            m, l = wrong_update(m, l, x[a:a + block])  # noqa: E741
        return np.exp(x - m) / l if l else np.zeros(len(x))

    core.forget_outcomes()
    assert verify("ch02.online_update", wrong_update).status == "failed"
    out = verify("ch02.streaming_softmax", streaming_softmax)
    assert out.status == "failed"
    assert "builds on exercise 2.1 (ch02.online_update), which failed" in out.message
    assert verify("ch02.online_update", ch02.online_update).passed
    assert "builds on" not in verify("ch02.streaming_softmax", streaming_softmax).message
    core.forget_outcomes()


# ---------------------------------------------------------------------------------- hints

def test_hints_give_one_more_hint_per_call_and_all_on_request(capsys):
    ex = core.get("ch02.online_update")
    core.forget_hints()
    hints("ch02.online_update")
    first = capsys.readouterr().out
    assert ex.hints[0] in first and ex.hints[1] not in first and "1 of 4" in first
    hints("ch02.online_update")
    second = capsys.readouterr().out
    assert ex.hints[1] in second and ex.hints[0] not in second
    hints("ch02.online_update", all=True)
    every = capsys.readouterr().out
    assert all(h in every for h in ex.hints)
    for _ in range(len(ex.hints)):
        hints("ch02.online_update")
    assert "no more hints" in capsys.readouterr().out.lower()
    core.forget_hints()


# ----------------------------------------------------------------------- progress recording

def _use(tmp_path, monkeypatch, content: bytes | None):
    file = tmp_path / "progress.json"
    if content is not None:
        file.write_bytes(content)
    monkeypatch.setenv("FLASHTEXT_PROGRESS_FILE", str(file))
    return file


def test_progress_is_recorded_and_tabulated(tmp_path, monkeypatch):
    file = _use(tmp_path, monkeypatch, None)
    check("ch00.score_matrix_bytes", ch00.score_matrix_bytes)
    assert json.loads(file.read_text())["ch00.score_matrix_bytes"]["status"] == "passed"
    assert "done" in progress.table().split("ch00.score_matrix_bytes")[0].splitlines()[-1]


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"[]", b"null", b'{"id": "passed"}',
                                     b'{"ch00.score_matrix_bytes": "passed"}', b"42",
                                     b'{"ch01.step_times": {"status": 7}}'])
def test_a_damaged_progress_file_never_breaks_a_check_or_the_table(tmp_path, monkeypatch,
                                                                   capsys, content):
    file = _use(tmp_path, monkeypatch, content)
    with pytest.warns(progress.ProgressFileWarning, match="kept a copy"):
        table = progress.table()
    assert "Exercises done" in table
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", progress.ProgressFileWarning)
        check("ch00.score_matrix_bytes", ch00.score_matrix_bytes)  # a right answer: no raise
    assert "[passed]" in capsys.readouterr().out
    assert json.loads(file.read_text())["ch00.score_matrix_bytes"]["status"] == "passed"
    copies = list(tmp_path.glob("progress.json.damaged-*"))
    assert copies and copies[0].read_bytes() == content


def test_a_truncated_progress_file_keeps_its_entries(tmp_path, monkeypatch):
    whole = {"ch01.step_times": {"status": "passed", "time": "2026-01-01 10:00"},
             "ch02.online_update": {"status": "failed", "time": "2026-01-01 10:05"}}
    text = json.dumps(whole, indent=1, sort_keys=True).encode()
    file = _use(tmp_path, monkeypatch, text[:-20])  # cut mid-way through the second entry
    with pytest.warns(progress.ProgressFileWarning):
        check("ch00.score_matrix_bytes", ch00.score_matrix_bytes)
    data = json.loads(file.read_text())
    assert data["ch01.step_times"]["status"] == "passed"  # salvaged, not silently dropped
    assert data["ch00.score_matrix_bytes"]["status"] == "passed"
    assert [p.read_bytes() for p in tmp_path.glob("progress.json.damaged-*")] == [text[:-20]]


def test_progress_writes_are_atomic(tmp_path, monkeypatch):
    file = _use(tmp_path, monkeypatch, None)
    check("ch00.score_matrix_bytes", ch00.score_matrix_bytes)
    before = file.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(progress.os, "replace", crash)
    with pytest.warns(progress.ProgressFileWarning, match="disk full"):
        check("ch02.online_update", ch02.online_update)  # the write fails half-way
    assert file.read_bytes() == before  # the old record is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]  # no temp left


def test_progress_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTEXT_PROGRESS_FILE", "off")
    monkeypatch.chdir(tmp_path)
    assert progress.progress_file() is None
    check("ch00.score_matrix_bytes", ch00.score_matrix_bytes)
    assert list(tmp_path.iterdir()) == []


def test_every_untouched_stub_in_the_chapters_is_reported_as_not_attempted(tmp_path, capsys):
    """What a reader sees before doing anything: each chapter's stub cells, run as they stand,
    print "not attempted yet" and raise nothing (so Run All and make test stay green)."""
    import runpy
    from pathlib import Path

    import nbformat

    header = ("import numpy as np\nimport torch\nimport triton\nimport triton.language as tl\n"
              "from flashtext.exercises import check, hints\n\n")
    checked = set()
    for path in sorted((Path(__file__).resolve().parents[1] / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for n, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or 'check("' not in cell.source:
                continue
            script = tmp_path / f"{path.stem}_{n}.py"
            script.write_text(header + cell.source)
            runpy.run_path(str(script), run_name="__main__")
            out = capsys.readouterr().out
            ids = [line.split('check("')[1].split('"')[0] for line in cell.source.splitlines()
                   if line.startswith('check("')]
            for ex_id in ids:
                assert "[not attempted yet]" in out and f"({ex_id})" in out, (path.name, out)
                checked.add(ex_id)
    assert checked == set(load_all()), set(load_all()) - checked


def test_an_earlier_failure_recorded_in_the_progress_file_is_mentioned(tmp_path, monkeypatch):
    file = _use(tmp_path, monkeypatch, json.dumps(
        {"ch03.merge": {"status": "failed", "time": "2026-01-01 10:00"}}).encode())
    core.forget_outcomes()
    out = verify("ch03.merge_tree", lambda blocks, tree: (0.0, 1.0))
    assert "builds on exercise 3.1 (ch03.merge), which failed when it was last checked" \
        in out.message
    assert file.exists()
