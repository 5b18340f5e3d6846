"""Recordings the chapters cite are the ones flashtext.claims lists, and a recording of the
library's kernels is of the kernel sources as they are now (flashtext.recorded.staleness).

``test_cited_kernel_recordings_are_of_the_current_sources`` fails, by design, for every cited
recording that was made before recordings stored what they measured, or from kernel sources that
have changed since: its message says how to record each one again.
"""

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest

from flashtext import claims, recorded
from flashtext.bench import __main__ as cli
from flashtext.bench import report

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
STEMS = sorted(p.stem for p in recorded.DATA_DIR.glob("*.json"))
# calls that load a recording without naming it
IMPLICIT = {r"\brecorded_results\(": report.RECORDED_NAME,
            r"\bRECORDED_NAME\b": report.RECORDED_NAME,
            r"\bload_anchors\(": report.ANCHORS_NAME}


def loaded_recordings(source: str) -> set[str]:
    """Names of recordings a chapter's code loads: every string literal that names a file of
    flashtext/data, and the calls that load one implicitly. A name built at run time (an
    f-string starting like a recording's name) is refused: the chapter must spell it out."""
    built = [m for m in re.findall(r"""f["']([A-Za-z0-9_]+)\{""", source)
             if any(s.startswith(m) for s in STEMS)]
    assert not built, f"recording names built at run time: {built}; write each one out"
    names = {s for s in re.findall(r"""["']([A-Za-z0-9_]+)(?:\.json)?["']""", source)
             if s in STEMS}
    return names | {name for pattern, name in IMPLICIT.items() if re.search(pattern, source)}


def chapter_code(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_chapter_loads_exactly_the_recordings_cited_for_it(path):
    chapter = path.name[:2]
    listed = {name for name, c in claims.CITED.items() if chapter in c.chapters}
    assert loaded_recordings(chapter_code(path)) == listed, (
        "flashtext.claims.CITED lists the recordings each chapter loads; a recording kept "
        "for history belongs in BENCHMARKS.md, not in a chapter")


def test_every_cited_recording_exists():
    assert set(claims.CITED) <= set(STEMS)
    assert all(c.chapters and c.record for c in claims.CITED.values())


KERNEL_RECORDINGS = sorted(name for name, c in claims.CITED.items() if c.kernels)


@pytest.mark.parametrize("name", KERNEL_RECORDINGS)
def test_cited_kernel_recordings_are_of_the_current_sources(name):
    why = recorded.staleness(recorded.load(name))
    cited = claims.CITED[name]
    assert why is None, (f"{name}.json, cited by chapter(s) {', '.join(cited.chapters)}, is "
                         f"stale ({why}). Record it again: {cited.record}")


def test_the_stale_list_names_what_the_provenance_test_fails_on(monkeypatch, capsys):
    name = KERNEL_RECORDINGS[0]
    real = recorded.load

    def made_elsewhere(stem):
        data = real(stem)
        other = {"sha256": "0" * 64, "code_sha256": "0" * 64}  # bytes and code elsewhere
        return {**data, "kernel_sources": {**data["kernel_sources"], **other}} \
            if stem == name else data

    monkeypatch.setattr(recorded, "load", made_elsewhere)
    assert name in claims.stale()
    assert claims.main([]) == 1
    out = capsys.readouterr().out
    assert f"{name}: kernel sources changed since" in out and claims.CITED[name].record in out
    monkeypatch.setattr(recorded, "staleness", lambda data: None)  # all made from these sources
    assert claims.stale() == {} and claims.main([]) == 0
    assert "every cited kernel recording is of the current sources" in capsys.readouterr().out


# ------------------------------------------------------------------ the mechanism, on a toy tree

def _toy_package(root: Path) -> Path:
    kernels = root / "flashtext" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "__init__.py").write_text("")
    (kernels / "api.py").write_text("from flashtext.kernels.forward import forward\n"
                                    "def run():\n    from flashtext.kernels import helper\n")
    (kernels / "forward.py").write_text("from .config import TABLE\ndef forward(): pass\n")
    (kernels / "config.py").write_text("TABLE = {'fwd': (128, 128)}\n")
    (kernels / "helper.py").write_text("X = 1\n")
    (kernels / "unrelated.py").write_text("Y = 2\n")
    return kernels


def test_the_fingerprint_follows_the_imports_of_the_measured_path(tmp_path):
    _toy_package(tmp_path)
    fp = recorded.kernel_fingerprint(["flashtext.kernels.api"], root=tmp_path)
    assert sorted(fp["files"]) == [f"flashtext/kernels/{n}.py"
                                   for n in ("api", "config", "forward", "helper")]
    with pytest.raises(ValueError, match="flashtext.kernels"):
        recorded.kernel_fingerprint(["flashtext.hopper"], root=tmp_path)


def test_a_stale_recording_is_caught(tmp_path):
    kernels = _toy_package(tmp_path)
    data = {"kernel_sources": recorded.kernel_fingerprint(["flashtext.kernels.api"], tmp_path)}
    assert recorded.staleness(data, tmp_path) is None
    (kernels / "unrelated.py").write_text("Y = 3\n")  # not on the measured path
    assert recorded.staleness(data, tmp_path) is None
    (kernels / "config.py").write_text("TABLE = {'fwd': (64, 64)}\n")  # two imports away
    assert recorded.staleness(data, tmp_path) == ("kernel sources changed since: "
                                                  "flashtext/kernels/config.py")
    assert "before recordings stored" in recorded.staleness({}, tmp_path)
    (kernels / "helper.py").unlink()
    assert "no longer resolve" in recorded.staleness(
        {"kernel_sources": {"sha256": "x", "entry_points": ["flashtext.kernels.helper"]}},
        tmp_path)


def test_the_code_digest_ignores_comments_docstrings_and_layout_only():
    base = recorded.code_digest('def f(x):\n    """Twice x."""\n    return 2 * x\n')
    assert recorded.code_digest("def f(x):  # doubles\n    return 2*x\n") == base
    assert recorded.code_digest('"""A module."""\ndef f(x):\n    return (2 *\n  x)\n') == base
    assert recorded.code_digest("def f(x):\n    return 3 * x\n") != base
    assert recorded.code_digest("def f(y):\n    return 2 * y\n") != base
    assert recorded.code_digest('def f(x):\n    """Twice x."""\n') != base  # body gone
    # a string that is not a docstring is code (an error message, a Triton constant)
    assert (recorded.code_digest('def f(x):\n    raise ValueError("a")\n')
            != recorded.code_digest('def f(x):\n    raise ValueError("b")\n'))


def test_a_comment_edit_leaves_a_code_stamped_recording_current(tmp_path):
    kernels = _toy_package(tmp_path)
    stamp = recorded.kernel_fingerprint(["flashtext.kernels.api"], tmp_path)
    bytes_only = {k: stamp[k] for k in ("sha256", "entry_points", "files")}
    (kernels / "config.py").write_text("# the searched tile\nTABLE = {'fwd': (128, 128)}\n")
    assert recorded.staleness({"kernel_sources": stamp}, tmp_path) is None
    assert recorded.staleness({"kernel_sources": bytes_only}, tmp_path) == (
        "kernel sources changed since: flashtext/kernels/config.py")
    (kernels / "config.py").write_text("TABLE = {'fwd': (64, 64)}\n")
    assert recorded.staleness({"kernel_sources": stamp}, tmp_path) == (
        "kernel sources changed since: flashtext/kernels/config.py")


def test_code_hashes_are_added_only_where_the_bytes_prove_the_sources(tmp_path):
    kernels = _toy_package(tmp_path)
    now = recorded.kernel_fingerprint(["flashtext.kernels.api"], tmp_path)
    bytes_only = {k: now[k] for k in ("sha256", "entry_points", "files")}
    data = {"kernel_sources": dict(bytes_only)}
    assert recorded.add_code_hashes(data, tmp_path) and data["kernel_sources"] == now
    assert not recorded.add_code_hashes(data, tmp_path)  # already there
    (kernels / "forward.py").write_text("from .config import TABLE\ndef forward(): return 1\n")
    stale_one = {"kernel_sources": dict(bytes_only)}  # made from forward.py as it was
    assert not recorded.add_code_hashes(stale_one, tmp_path)
    assert "code_sha256" not in stale_one["kernel_sources"]
    assert not recorded.add_code_hashes({"kernel_sources": {"sha256": "mixed"}}, tmp_path)
    assert not recorded.add_code_hashes({}, tmp_path)


def test_save_stores_what_was_measured_and_a_merge_of_other_sources_is_mixed(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(recorded, "DATA_DIR", tmp_path)
    now = recorded.kernel_fingerprint(["flashtext.kernels.api"])
    recorded.save("fresh", {"rows": []}, measured=["flashtext.kernels.api"])
    assert recorded.load("fresh")["kernel_sources"] == now
    assert recorded.staleness(recorded.load("fresh")) is None
    recorded.save("same", {"rows": [], "kernel_sources": now}, measured=["flashtext.kernels.api"])
    assert recorded.load("same")["kernel_sources"] == now
    reworded = {**now, "sha256": "1" * 64}  # other bytes (comments), the same code: not mixed
    recorded.save("reworded", {"rows": [], "kernel_sources": reworded},
                  measured=["flashtext.kernels.api"])
    assert recorded.load("reworded")["kernel_sources"] == now
    older = {**now, "sha256": "0" * 64, "code_sha256": "0" * 64}
    recorded.save("mixed", {"rows": [], "kernel_sources": older},
                  measured=["flashtext.kernels.api"])
    mixed = recorded.load("mixed")["kernel_sources"]
    assert mixed["sha256"] == "mixed" and mixed["parts"] == [older, now]
    assert recorded.staleness(recorded.load("mixed")).startswith("merged from runs")
    recorded.save("none", {"rows": []})  # measures none of our kernels: nothing stamped
    assert "kernel_sources" not in recorded.load("none")


def test_a_bench_merge_into_a_run_of_older_kernels_is_mixed(tmp_path, monkeypatch):
    monkeypatch.setattr(recorded, "DATA_DIR", tmp_path)
    run = {"kind": "flashtext.bench", "settings": {"providers": ["ours"]}, "rows": []}
    old = report.stamp({**run, "kernel_sources": {"sha256": "0" * 64, "entry_points": [
        "flashtext.kernels.api"], "files": {}}, "runs": [{"started": "before"}]})
    recorded.path("bench_x").write_text(json.dumps(old))
    cli.save("bench_x", {**run, "started": "now"}, do_merge=True)
    assert recorded.load("bench_x")["kernel_sources"]["sha256"] == "mixed"
    cli.save("bench_y", {**run, "started": "now"}, do_merge=True)  # nothing to merge into
    assert recorded.staleness(recorded.load("bench_y")) is None
    cli.save("bench_y", {**run, "started": "later"}, do_merge=True)  # same sources again
    assert recorded.staleness(recorded.load("bench_y")) is None


def test_loaded_recordings_are_found_in_chapter_code():
    code = ('x = recorded.load("accuracy_h200")\nh = bench.recorded_results()\n'
            'y = "not_a_recording"\n')
    assert loaded_recordings(code) == {"accuracy_h200", report.RECORDED_NAME}
    with pytest.raises(AssertionError, match="built at run time"):
        loaded_recordings('recorded.load(f"accuracy_{machine}")')


# ------------------------------------------ scripts/record_hopper.py records as dispatched

def _record_hopper():
    spec = importlib.util.spec_from_file_location("record_hopper",
                                                  ROOT / "scripts" / "record_hopper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_hopper_captures_the_launches_flash_attention_makes():
    from flashtext.kernels.config import launch_config

    rh = _record_hopper()
    seen, _ = rh.dispatched_launches("float16", 64, True, 100, "cpu", run=False,
                                     backward_kernel="triton")
    names = [c.kernel_fn.__name__ for c in seen]
    assert names == ["_attn_fwd", "_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq"]
    fwd = seen[0]
    assert fwd.config == launch_config("fwd", 64, 2, True, 100, 100)
    from flashtext.kernels.descriptors import TensorDescriptor

    descs = [type(a).__name__ for a in fwd.resolved(fwd.config)
             if isinstance(a, TensorDescriptor)]
    assert fwd.constexprs["USE_TMA"] == fwd.config.tma and len(descs) == (2 if fwd.config.tma
                                                                          else 0)
    assert rh.MEASURED == ("flashtext.kernels.api", "flashtext.kernels.splitkv")


def test_record_hopper_describes_each_launch_with_what_ran():
    from types import SimpleNamespace

    rh = _record_hopper()
    seen, _ = rh.dispatched_launches("float16", 64, False, 64, "cpu", run=False,
                                     forward_kernel="triton", backward_kernel="triton")
    compiled = SimpleNamespace(asm={"ptx": "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                                           "cp.async.bulk.tensor.4d.shared::cluster.global x"},
                               metadata=SimpleNamespace(num_warps=4, num_stages=2, shared=1024))
    rows = [rh.describe_launch(c, lambda c_, cfg: compiled, with_sass=False) for c in seen]
    fwd = rows[0]
    assert fwd["name"] == "_attn_fwd" and fwd["config"]["BLOCK_M"] == seen[0].config.BLOCK_M
    assert fwd["descriptor_args"] == (["K", "V"] if seen[0].config.tma else [])
    assert fwd["ptx"]["wgmma"] == 1 and fwd["ptx"]["tma_load"] == 1 and fwd["sass"] is None
    assert fwd["wgmma_shapes"] == ["m64n64k16.f32.f16.f16"] and fwd["shared_bytes"] == 1024


def test_record_hopper_captures_the_gluon_forward_where_sm90_runs_it():
    """Without a GPU the capture takes sm_90's choice of kernels: the Gluon forward for a
    long d = 128 call, the Triton one for a short causal one; the Gluon dK/dV for long calls at
    d = 64 and 128 (after the Triton preprocessing, with dQ fused in where the rule says, else
    before the Triton dQ pass), the Triton one for short calls and where asked for."""
    from types import SimpleNamespace

    from flashtext.kernels import dispatch
    from flashtext.kernels import gluon_forward as gf

    if not gf.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon: sm_90's dispatch cannot be mirrored")

    def names(seen):
        return [f"gluon {c.kind}" if isinstance(c, rh.GluonCaptured) else c.kernel_fn.__name__
                for c in seen]

    rh = _record_hopper()
    gluon_backward = ["_attn_bwd_preprocess", "gluon dkdv", "_attn_bwd_dq"]
    fused_backward = ["_attn_bwd_preprocess", "gluon dkdv"]
    triton_backward = ["_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq"]
    for d, causal, n in ((128, False, 256), (128, True, 2048), (128, True, 1024),
                         (64, True, 2048), (64, False, 2048), (64, False, 100)):
        seen, _ = rh.dispatched_launches("float16", d, causal, n, "cpu", run=False)
        forward = "gluon forward" if dispatch.prefers_gluon(d, n, n, causal) else "_attn_fwd"
        backward = triton_backward
        if forward == "gluon forward":
            assert seen[0].persistent == dispatch.prefers_persistent(d, n, n, causal)
        if dispatch.prefers_gluon_backward(d, n, n, causal):
            fused = dispatch.prefers_fused_dq(d, causal)
            backward = fused_backward if fused else gluon_backward
            dkdv = [c for c in seen if getattr(c, "kind", "") == "dkdv"]
            assert [(c.fused_dq, c.deferred_dq) for c in dkdv] == [
                (fused, fused and dispatch.prefers_deferred_dq(d, causal))]
        assert names(seen) == [forward, *backward], (d, causal, n)
    seen, _ = rh.dispatched_launches("float16", 128, True, 2048, "cpu", run=False)
    assert names(seen) == ["gluon forward", *fused_backward]  # d = 128: dQ fused in
    assert seen[0].persistent and seen[-1].deferred_dq  # a short masked pass; a tile late
    # d = 64 causal: the Triton forward below 4k keys; dK/dV (and dQ) Gluon from 2k queries
    assert [tuple(names(rh.dispatched_launches("float16", 64, True, n, "cpu", run=False)[0]))
            for n in (100, 2048, 4096)] == [("_attn_fwd", *triton_backward),
                                            ("_attn_fwd", *fused_backward),
                                            ("gluon forward", *fused_backward)]
    seen, _ = rh.dispatched_launches("float16", 128, False, 256, "cpu", run=False,
                                     forward_kernel="triton", backward_kernel="triton")
    assert names(seen) == ["_attn_fwd", *triton_backward]
    seen, _ = rh.dispatched_launches("float32", 128, False, 256, "cpu", run=False)
    assert names(seen) == ["_attn_fwd", *triton_backward]  # float32: Triton's kernels only
    dkdv = rh.dispatched_launches("float16", 64, True, 2048, "cpu", run=False)[0][2]
    assert dkdv.kind == "dkdv" and (dkdv.head_dim, dkdv.causal) == (64, True)
    dkdv.kernel = SimpleNamespace(
        name="_attn_bwd_dkdv_ws", asm={"ptx": "setmaxnreg.inc.sync.aligned.u32 240; "
                                              "wgmma.mma_async.sync.aligned.m64n128k16.f32"
                                              ".f16.f16"},
        metadata=SimpleNamespace(num_warps=12, num_stages=3, shared=4096))
    row = rh.describe_launch(dkdv, None, with_sass=False)
    assert row["name"] == "_attn_bwd_dkdv_ws" and row["kind"] == "dkdv"
    assert row["config"] == {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "num_warps": 12}
    assert row["descriptor_args"] == ["q_desc", "k_desc", "v_desc", "do_desc", "dk_desc",
                                      "dv_desc", "dq_desc"]
    assert row["fused_dq"] is True and row["deferred_dq"] is True  # d = 64 causal: a tile late
    seen, _ = rh.dispatched_launches("float16", 128, False, 256, "cpu", run=False)
    seen[0].kernel = SimpleNamespace(
        name="_attn_fwd_ws", asm={"ptx": "setmaxnreg.dec.sync.aligned.u32 24; "
                                         "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"},
        metadata=SimpleNamespace(num_warps=12, num_stages=3, shared=4096))
    row = rh.describe_launch(seen[0], None, with_sass=False)
    assert row["name"] == "_attn_fwd_ws" and row["gluon"] and row["ptx"]["setmaxnreg"] == 1
    assert row["kind"] == "forward"
    assert row["config"] == {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "num_warps": 12}
    assert row["descriptor_args"] == ["q_desc", "k_desc", "v_desc", "o_desc"]


def test_a_decode_recording_names_only_the_decode_kernels():
    """The decode rows run flash_decode alone: their stamp must not cover the dense kernels
    (a change to those would mark them stale for nothing), and must cover what decode runs."""
    from flashtext.bench import models

    files = {p.name for p in recorded.measured_files(models.DECODE_MEASURED)}
    assert {"decode.py", "checks.py"} <= files
    assert not files & {"api.py", "dispatch.py", "gluon_forward.py", "gluon_backward.py"}
    dense = {p.name for p in recorded.measured_files(models.DENSE_MEASURED)}
    assert {"gluon_forward.py", "gluon_backward.py", "dispatch.py"} <= dense
