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


def test_chapter_0_finds_the_chapters_from_a_copy_holding_only_some(tmp_path, monkeypatch):
    """The browser test (and a reader) may run chapter 0 from a directory with only a few
    chapters in it: the map of the book is checked against the repository's chapters."""
    import shutil
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "chapters" / "00_how_to_use.ipynb", tmp_path)
    nb = nbformat.read(tmp_path / "00_how_to_use.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "chapter_files" in c.source]
    monkeypatch.chdir(tmp_path)
    namespace = {"flashtext": __import__("flashtext")}
    exec(compile(cell.source, "chapter 0, the map cell", "exec"), namespace)
    assert len(namespace["chapter_files"]) >= 15
