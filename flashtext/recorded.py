"""Results measured on a real GPU, stored in the repo and shown to readers on a CPU.

Each file in ``flashtext/data/`` is JSON with at least ``gpu``, ``date``, ``torch``, ``triton``
(and whatever the measurement needs). :func:`load` reads one; :func:`show_banner` prints the
"recorded on ..." banner that must stand above every recorded figure; :func:`save` is used by the
measurement scripts (``scripts/``) that produce them on the GPU.

A recording of the library's own kernels also stores what it was made from: ``save(...,
measured=("flashtext.kernels.api",))`` adds ``kernel_sources``, sha256s of every file of
``flashtext/kernels/`` that the measured entry points import, of its bytes and of its code
without comments and docstrings (:func:`kernel_fingerprint`). :func:`staleness` compares the
code with the sources as they are now, so a test can refuse a chapter that cites measurements
of code that has since changed (``tests/test_recording_provenance.py``), and a comment fixed in
a kernel file does not send the book back to the GPU.
"""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flashtext.show import banner

DATA_DIR = Path(__file__).parent / "data"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory holding flashtext/
REQUIRED_KEYS = ("gpu", "date", "torch", "triton")
SOURCES_KEY = "kernel_sources"
KERNELS_PACKAGE = "flashtext.kernels"


def path(name: str) -> Path:
    return DATA_DIR / (name if name.endswith(".json") else f"{name}.json")


def load(name: str) -> dict[str, Any]:
    """Load recorded results ``name`` (e.g. ``"h200_memory_wall"``) and check their provenance."""
    p = path(name)
    if not p.exists():
        available = ", ".join(sorted(f.stem for f in DATA_DIR.glob("*.json"))) or "none"
        raise FileNotFoundError(f"no recorded results named {name!r}; available: {available}")
    data = json.loads(p.read_text())
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(f"recorded results {name!r} lack provenance keys {missing}")
    return data


def provenance(data: dict[str, Any]) -> str:
    return (f"Measured on {data['gpu']} on {data['date']} with torch {data['torch']}, "
            f"triton {data['triton']}.")


def show_banner(data: dict[str, Any], live: bool = False) -> None:
    """Print the banner that says where numbers come from."""
    if live:
        return
    from flashtext.device import on_gpu

    if on_gpu():
        note = "These are the stored numbers of that run, not a measurement of this GPU."
    else:
        note = "This machine has no CUDA GPU: these are stored numbers, not a live measurement."
    banner(provenance(data) + "\n" + note)


# ------------------------------------------------------------------ what a recording was made from

def _module_file(module: str, root: Path) -> Path:
    if module != KERNELS_PACKAGE and not module.startswith(KERNELS_PACKAGE + "."):
        raise ValueError(f"measured entry points must be modules of {KERNELS_PACKAGE}, got "
                         f"{module!r}")
    file = root.joinpath(*module.split(".")).with_suffix(".py")
    if module == KERNELS_PACKAGE:
        file = root.joinpath(*module.split("."), "__init__.py")
    if not file.exists():
        raise ValueError(f"no source file for module {module!r} (looked for {file})")
    return file


def _kernel_imports(file: Path, module: str) -> set[str]:
    """Modules of flashtext.kernels that ``file`` (the source of ``module``) imports, at any
    depth of its code (an import inside a function runs when the function does)."""
    found = set()
    package = module.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # "from flashtext.kernels import forward" names a module; "from ...forward import f"
            # names its module already
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(KERNELS_PACKAGE + ".") and name.count(".") == 2:
                found.add(name)
    return found


def measured_files(entry_points: Iterable[str], root: Path = PACKAGE_ROOT) -> list[Path]:
    """Source files of ``flashtext/kernels/`` that the entry-point modules import, directly or
    through each other (the modules a measurement of those entry points runs)."""
    todo, seen = list(entry_points), set()
    if not todo:
        raise ValueError("measured needs at least one entry-point module")
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        file = _module_file(module, root)
        seen.add(module)
        todo += [m for m in _kernel_imports(file, module) if m not in seen
                 and root.joinpath(*m.split(".")).with_suffix(".py").exists()]
    return sorted(_module_file(m, root) for m in seen)


def _canonical(node: Any) -> str:
    """A syntax tree as text, without positions, and without fields that are None or empty:
    the same for one program under Python 3.11 to 3.13 (3.12 added empty ``type_params`` to
    every function, and ast.dump's own output differs between versions)."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
                  if value is not None and value != []]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    return repr(node)


def code_digest(source: str) -> str:
    """sha256 of a module's code: its syntax tree without comments, docstrings or layout. A
    change to any of those leaves it as it was; a change to what runs does not."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()


def _total(digests: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{name}\0{digest}\n" for name, digest in
                                  sorted(digests.items())).encode()).hexdigest()


def kernel_fingerprint(entry_points: Iterable[str] = ("flashtext.kernels.api",),
                       root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """What a measurement of ``entry_points`` is made from: the sha256 of each source file it
    runs (:func:`measured_files`) and one over all of them (paths included, so a rename counts
    as a change), of the bytes (``sha256``, ``files``) and of the code alone
    (``code_sha256``, ``code_files``, :func:`code_digest`): a recording stamped with the
    latter stays current through an edit of comments or docstrings."""
    entry_points = tuple(entry_points)
    sources = measured_files(entry_points, root)
    files = {str(f.relative_to(root).as_posix()): hashlib.sha256(f.read_bytes()).hexdigest()
             for f in sources}
    code = {str(f.relative_to(root).as_posix()): code_digest(f.read_text()) for f in sources}
    return {"sha256": _total(files), "entry_points": list(entry_points), "files": files,
            "code_sha256": _total(code), "code_files": code}


def _same_sources(made_from: dict[str, Any], now: dict[str, Any]) -> bool:
    if "code_sha256" in made_from:
        return made_from["code_sha256"] == now["code_sha256"]
    return made_from.get("sha256") == now["sha256"]


def staleness(data: dict[str, Any], root: Path = PACKAGE_ROOT) -> str | None:
    """None if ``data`` (a loaded recording of the library's kernels) was made from the kernel
    sources as they are now; otherwise why not, in words."""
    made_from = data.get(SOURCES_KEY)
    if made_from is None:
        return "no kernel_sources: recorded before recordings stored what they measured"
    if made_from.get("sha256") == "mixed":
        return ("merged from runs of different kernel sources: "
                + "; ".join(str((p or {}).get("sha256", "unknown"))[:12]
                            for p in made_from.get("parts", [])))
    try:
        now = kernel_fingerprint(made_from["entry_points"], root)
    except ValueError as exc:
        return f"its entry points no longer resolve: {exc}"
    if _same_sources(made_from, now):
        return None
    key = "code_files" if "code_sha256" in made_from else "files"
    before, after = made_from.get(key, {}), now[key]
    changed = sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))
    return "kernel sources changed since: " + ", ".join(changed)


def add_code_hashes(data: dict[str, Any], root: Path = PACKAGE_ROOT) -> bool:
    """Give a recording stamped with byte hashes only the code hashes of its sources, where the
    byte hashes prove it was made from the files as they are now (the code hashes are then of
    exactly what it measured). True if it added them; a stale, mixed or already complete stamp
    is left as it is."""
    made_from = data.get(SOURCES_KEY)
    if not made_from or "code_sha256" in made_from or made_from.get("sha256") == "mixed":
        return False
    try:
        now = kernel_fingerprint(made_from["entry_points"], root)
    except ValueError:
        return False
    if now["sha256"] != made_from["sha256"]:
        return False
    made_from.update(code_sha256=now["code_sha256"], code_files=now["code_files"])
    return True


def sources_note(data: dict[str, Any]) -> str:
    """One line for a chapter to print under a recording of the library's kernels: whether it
    was made from the kernel sources as they are now (tests/test_recording_provenance.py
    fails while a cited one is not)."""
    why = staleness(data)
    if why is None:
        return "Made from the kernel sources as they are now."
    return f"STALE, not a measurement of the kernels as they are now: {why}."


def _stamp_sources(payload: dict[str, Any], measured: tuple[str, ...]) -> dict[str, Any]:
    current = kernel_fingerprint(measured)
    if SOURCES_KEY not in payload:  # a fresh recording
        return current
    prior = payload[SOURCES_KEY]  # merged into an earlier recording: same sources, or mixed
    if prior is not None and prior.get("sha256") != "mixed" and _same_sources(prior, current):
        return current
    parts = prior.get("parts", [prior]) if prior and prior.get("sha256") == "mixed" else [prior]
    return {"sha256": "mixed", "entry_points": list(measured), "parts": [*parts, current]}


def merge_runs(old: dict[str, Any], new: dict[str, Any], key: Callable[[dict], Any],
               run_record: Callable[[dict], dict]) -> dict[str, Any]:
    """A recording finished in several runs (the benchmarks' ``--merge``): ``new``'s rows
    replace ``old``'s rows of the same ``key``, except rows this run skipped for its time
    budget, which never replace a measured one. Both must come from the same GPU and
    versions. ``kernel_sources`` stays the old one, so that :func:`save` keeps it or marks the
    file "mixed"; ``runs`` keeps one ``run_record`` per run (a run's own earlier checkpoints,
    with the same ``started``, are replaced, not repeated)."""
    for name in ("gpu", "torch", "triton"):
        if old.get(name) != new.get(name):
            raise SystemExit(f"--merge refused: the existing recording has {name} = "
                             f"{old.get(name)!r}, this run {new.get(name)!r}. Use another "
                             "--out.")

    def cut_for_time(r):
        return r["status"] == "skipped" and "budget" in (r.get("reason") or "")

    before = {key(r): r for r in old["rows"]}
    rows = [before.get(key(r), r) if cut_for_time(r) else r for r in new["rows"]]
    fresh = {key(r) for r in rows}
    started = new.get("started")
    runs = [r for r in old.get("runs", [run_record(old)])
            if started is None or r.get("started") != started]
    merged = {**new, SOURCES_KEY: old.get(SOURCES_KEY),
              "rows": [r for r in old["rows"] if key(r) not in fresh] + rows,
              "runs": [*runs, run_record(new)]}
    for name in DESCRIBES_THE_WHOLE:  # a run that finishes a few rows describes only those
        if isinstance(old.get(name), dict) and isinstance(new.get(name), dict):
            merged[name] = _union(old[name], new[name])
    return merged


# What a recording says about all of its rows: merged, the first run's values stay and a later
# run only adds (a dtype's ceiling, a sequence length, a provider); each run's own stay in ``runs``
DESCRIBES_THE_WHOLE = ("settings", "ceilings", "providers")


def _union(first: Any, later: Any) -> Any:
    if isinstance(first, dict) and isinstance(later, dict):
        return {**{k: _union(v, later[k]) if k in later else v for k, v in first.items()},
                **{k: v for k, v in later.items() if k not in first}}
    if isinstance(first, list) and isinstance(later, list):
        return first + [v for v in later if v not in first]
    return first


def save(name: str, payload: dict[str, Any], *, measured: Iterable[str] = ()) -> Path:
    """Write results measured on this machine, stamped with GPU, versions and date.

    ``measured``: the modules of :mod:`flashtext.kernels` whose kernels the results measure
    (e.g. ``("flashtext.kernels.api",)``); their :func:`kernel_fingerprint` is stored under
    ``kernel_sources``. A payload that already holds ``kernel_sources`` (a run merged into an
    earlier recording) keeps it if the sources are the same and is marked ``"mixed"`` if not.
    """
    import torch
    import triton

    measured = tuple(measured)
    record = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        **payload,
    }
    if measured:
        record[SOURCES_KEY] = _stamp_sources(payload, measured)
    p = path(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=1) + "\n")
    return p
