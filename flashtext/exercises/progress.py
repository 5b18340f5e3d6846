"""Which exercises has the reader done? ``make progress`` prints the table.

Every ``check(...)`` in a notebook records its outcome in a small JSON file: ``.progress.json``
at the top of the repository (ignored by git), or where ``FLASHTEXT_PROGRESS_FILE`` points.
Setting ``FLASHTEXT_PROGRESS_FILE=off`` disables recording (the unit tests do).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flashtext.exercises.core import Outcome, load_all


def progress_file() -> Path | None:
    env = os.environ.get("FLASHTEXT_PROGRESS_FILE")
    if env == "off":
        return None
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "chapters").is_dir():
        return repo / ".progress.json"
    return Path.home() / ".flashtext" / "progress.json"


def load() -> dict[str, dict]:
    path = progress_file()
    if path is None or not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def record(outcome: Outcome) -> None:
    path = progress_file()
    if path is None:
        return
    data = load()
    data[outcome.exercise_id] = {"status": outcome.status, "time": time.strftime("%Y-%m-%d %H:%M")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only checkout must not break the notebook


def table() -> str:
    exercises = load_all()
    done = load()
    marks = {"passed": "done", "failed": "FAILED", "not_attempted": "not attempted"}
    lines = []
    for ex_id in sorted(exercises, key=lambda e: (exercises[e].chapter, e)):
        status = marks.get(done.get(ex_id, {}).get("status"), "not run yet")
        lines.append(f"  ch{exercises[ex_id].chapter:02d}  {status:13s}  {ex_id:34s} "
                     f"{exercises[ex_id].title}")
    n_done = sum(1 for e in exercises if done.get(e, {}).get("status") == "passed")
    return f"Exercises done: {n_done} of {len(exercises)}\n" + "\n".join(lines)


if __name__ == "__main__":
    print(table())
