"""Which exercises has the reader done? ``make progress`` prints the table.

Every ``check(...)`` in a notebook records its outcome in a small JSON file: ``.progress.json``
at the top of the repository flashtext is installed from (ignored by git), wherever the notebook
itself runs, or the file ``FLASHTEXT_PROGRESS_FILE`` names. ``FLASHTEXT_PROGRESS_FILE=off``
disables recording (the unit tests do).

The record must never get in the reader's way: a damaged file (not UTF-8, not JSON, not a table
of exercise ids) is copied aside as ``<file>.damaged-<time>`` with a warning, the entries that
can still be read are kept, and recording goes on. Writes go to a temporary file that replaces
the old one in one step, so an interrupted write leaves the previous record whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

from flashtext.exercises.core import Outcome, load_all

STATUSES = ("passed", "failed", "not_attempted")
_ENTRY = re.compile(r'"(ch\d\d\.\w+)"\s*:\s*\{\s*"status"\s*:\s*"(\w+)"(?:\s*,\s*"time"\s*:\s*"'
                    r'([^"]*)")?')


class ProgressFileWarning(UserWarning):
    """The progress file could not be read or written as it is; the check goes on."""


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


def _valid(entry: object) -> bool:
    return isinstance(entry, dict) and entry.get("status") in STATUSES


def _parse(raw: bytes) -> tuple[dict[str, dict], str | None]:
    """(the entries that can be read, what is wrong with the file or None)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        return _salvage(text), "it is not UTF-8 text"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return _salvage(text), f"it is not valid JSON ({e.msg} at line {e.lineno})"
    if not isinstance(data, dict):
        return {}, f"it holds a JSON {type(data).__name__}, not a table of exercises"
    good = {k: v for k, v in data.items() if isinstance(k, str) and _valid(v)}
    bad = sorted(set(data) - set(good))
    return good, (f"entries {bad} are not {{'status': ..., 'time': ...}} records" if bad
                  else None)


def _salvage(text: str) -> dict[str, dict]:
    """The complete entries of a truncated or partly garbled file."""
    found = {}
    for ex_id, status, stamp in _ENTRY.findall(text):
        if status in STATUSES:
            found[ex_id] = {"status": status, **({"time": stamp} if stamp else {})}
    return found


def _set_aside(path: Path, raw: bytes, reason: str) -> None:
    """Copy the damaged file next to itself (once per content: ``make progress`` run twice
    keeps one copy) and warn."""
    earlier = [p for p in sorted(path.parent.glob(f"{path.name}.damaged-*"))
               if p.is_file() and p.stat().st_size == len(raw) and p.read_bytes() == raw]
    if earlier:
        kept = f"kept a copy as {earlier[0].name}"
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        copy, n = path.with_name(f"{path.name}.damaged-{stamp}"), 1
        while copy.exists():
            n += 1
            copy = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
        try:
            copy.write_bytes(raw)
            kept = f"kept a copy as {copy.name}"
        except OSError as e:
            kept = f"could not keep a copy ({e})"
    warnings.warn(f"exercise progress file {path} is damaged: {reason}; {kept}, and went on "
                  "with the entries that could be read.", ProgressFileWarning, stacklevel=3)


def _read(path: Path, *, set_aside: bool) -> dict[str, dict]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        warnings.warn(f"cannot read exercise progress file {path}: {e}", ProgressFileWarning,
                      stacklevel=3)
        return {}
    entries, problem = _parse(raw)
    if problem is not None and set_aside:
        _set_aside(path, raw, problem)
    return entries


def load() -> dict[str, dict]:
    """Every readable entry of the progress file, ``{exercise id: {"status", "time"}}``."""
    path = progress_file()
    return {} if path is None else _read(path, set_aside=True)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record(outcome: Outcome) -> None:
    """Add one verdict to the progress file. Never raises: a problem only warns."""
    path = progress_file()
    if path is None:
        return
    try:
        data = _read(path, set_aside=True)
        data[outcome.exercise_id] = {"status": outcome.status,
                                     "time": time.strftime("%Y-%m-%d %H:%M")}
        _write_atomically(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except Exception as e:  # a read-only checkout, a full disk: the check itself still counts
        warnings.warn(f"could not record exercise progress in {path}: {e}", ProgressFileWarning,
                      stacklevel=2)


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


if __name__ == "__main__":  # make progress: a damaged file is one plain line, not a traceback
    warnings.formatwarning = lambda message, category, *args, **kwargs: (
        f"{category.__name__}: {message}\n")
    print(table())
