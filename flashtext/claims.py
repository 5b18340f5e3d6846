"""What the book says about each recording it cites, in one place.

Every file of ``flashtext/data/`` that a chapter loads has an entry here: which chapters cite it,
whether it measures the library's own kernels, how to record it again, and ``says``, the facts
about it that the chapters' text states and their cells assert (a date, a case count, the run it
was made in). A new recording is then one edit here, not one per chapter.

``tests/test_recording_provenance.py`` holds the chapters to this table: a chapter may load only
the recordings listed for it, and a recording of the library's kernels must have been made from
the kernel sources as they are now (:func:`flashtext.recorded.staleness`). Recordings kept for
history (``BENCHMARKS.md``) are not loaded by chapters at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flashtext.bench.report import ANCHORS_NAME, RECORDED_NAME


@dataclass(frozen=True)
class Cited:
    """One recording a chapter cites."""

    name: str  # the file's stem in flashtext/data
    chapters: tuple[str, ...]  # chapter numbers ("12", ...) whose cells load it
    kernels: bool  # it measures the library's kernels: must be of their current sources
    record: str  # the command that (re-)records it, and where
    says: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))


def _cited(name: str, chapters: str, kernels: bool, record: str,
           **says: Any) -> tuple[str, Cited]:
    return name, Cited(name, tuple(chapters.split()), kernels, record, MappingProxyType(says))


H200 = "on the H200"
CITED: dict[str, Cited] = dict([
    # peers, hardware and PyTorch's own kernels: nothing of flashtext.kernels is measured
    _cited(ANCHORS_NAME, "00 07 08 12", False, "measured once with the peers (fixed anchors)",
           date="2026-11-29",
           # chapter 12's hook: fp16 forward, d = 128, N = 16k, TFLOP/s by provider
           fwd_d128_n16k={"cudnn": 575.5, "tutorial": 520.3, "flex": 461.5, "flash": 341.0}),
    _cited("h200_memory_wall", "01", False, f"python scripts/record_memory_wall.py {H200}"),
    _cited("hbm_traffic", "01 06", False, f"python scripts/record_hbm_traffic.py {H200}"),
    _cited("fa2_schedule", "06 07 08", False, f"python scripts/record_fa2_schedule.py {H200}"),
    # the library's kernels
    _cited("triton_primer_h200", "01 09", True, f"python scripts/record_triton_primer.py {H200}"),
    _cited("accuracy_cpu", "10 11", True,
           "python scripts/record_accuracy.py on a CPU (the interpreter; about a minute)"),
    _cited("accuracy_h200", "10 11", True, f"python scripts/record_accuracy.py --jobs 12 {H200}"),
    # what our kernels compile to on the H200 (every launch of flash_attention, 8 cases), and
    # probes of Hopper features (a standalone loop of scripts/record_hopper.py)
    _cited("h200_hopper", "12 13", True, f"python scripts/record_hopper.py {H200}"),
    # the first run of the Gluon FA3-style forward (flashtext.kernels.gluon_forward): checks
    # against float64, SASS counts, forward TFLOP/s next to cuDNN and our Triton forward
    _cited("gluon_probe_h200", "13", True,
           "PYTHONPATH=. python scripts/probe_gluon.py --json "
           f"flashtext/data/gluon_probe_h200.json {H200}"),
    # the backward with dQ fused into the Gluon dK/dV kernel against the separate dQ pass
    _cited("gluon_backward_probe_h200", "13", True,
           "PYTHONPATH=. python scripts/probe_gluon_backward.py --variants --json "
           f"flashtext/data/gluon_backward_probe_h200.json {H200}"),
    # the short forwards on three clocks (host, GPU alone, do_bench), per kernel and cuDNN
    _cited("host_forward_h200", "13", True,
           "python scripts/profile_host.py --forward-kernels --d 128 64 --n 512 1024 2048 "
           f"--dtype fp16 bf16 --name host_forward_h200 {H200}"),
    _cited("bench_h200_models", "15", True,
           f"python -m flashtext.bench.models {H200}; a run its budget cuts short says which "
           "--modes to finish with --merge"),
    _cited("bench_h200_models_decode", "14 15", True,
           f"python -m flashtext.bench.models --modes decode {H200} (the decode rows)"),
    _cited(RECORDED_NAME, "12 13", True,
           "make bench BENCH_ARGS='--providers ours triton gluon cudnn flash flex "
           f"--flex-compile static --out {RECORDED_NAME}' {H200} (the full sweep; a run its "
           "budget cuts short prints the --merge command that finishes it)"),
])


#: What the text says about the library's code, where it gives a number a cell checks.
CODE = MappingProxyType({
    # chapter 10: "a hundred-odd lines of Triton" (_attn_fwd and _fwd_inner together)
    "forward_kernel_lines": (100, 199),
})


def says(name: str) -> MappingProxyType:
    """What the book says about recording ``name`` (KeyError if no chapter cites it)."""
    return CITED[name].says


def stale() -> dict[str, str]:
    """The cited recordings of the library's kernels that were not made from the kernel
    sources as they are now: name -> why (``tests/test_recording_provenance.py`` fails on
    each). After a kernel change, this is the list to record again."""
    from flashtext import recorded

    out = {}
    for name, cited in CITED.items():
        if cited.kernels:
            why = recorded.staleness(recorded.load(name))
            if why is not None:
                out[name] = why
    return out


def add_code_hashes() -> list[str]:
    """Stamp every recording in ``flashtext/data`` that has byte hashes only, and whose bytes
    are still the kernel sources', with the code hashes of those sources
    (:func:`flashtext.recorded.add_code_hashes`); returns the names rewritten."""
    import json

    from flashtext import recorded

    done = []
    for file in sorted(recorded.DATA_DIR.glob("*.json")):
        data = json.loads(file.read_text())
        if recorded.add_code_hashes(data):
            file.write_text(json.dumps(data, indent=1) + "\n")
            done.append(file.stem)
    return done


def main(argv: list[str] | None = None) -> int:
    """``python -m flashtext.claims``: each stale cited recording, why, and how to record it
    again; exit status 1 if there is any. ``--add-code-hashes`` first stamps the recordings
    made from the current bytes with their code hashes, so that a later edit of comments or
    docstrings in the kernels leaves them current."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flashtext.claims",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--add-code-hashes", action="store_true",
                        help="stamp recordings of the current kernel bytes with code hashes")
    args = parser.parse_args(argv)
    if args.add_code_hashes:
        for name in add_code_hashes():
            print(f"{name}: code hashes added")
    late = stale()
    for name, why in late.items():
        print(f"{name}: {why}\n    record again: {CITED[name].record}")
    print(f"{len(late)} of {sum(c.kernels for c in CITED.values())} cited kernel recordings "
          "are stale" if late else "every cited kernel recording is of the current sources")
    return 1 if late else 0


__all__ = ["CITED", "CODE", "Cited", "add_code_hashes", "main", "says", "stale"]

if __name__ == "__main__":
    raise SystemExit(main())
