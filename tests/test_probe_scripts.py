"""The measurement scripts (``scripts/``) and what they share: how probe_variants.py reads a
variant and what it refuses, that a variant tree on PYTHONPATH wins over the checkout in every
script, that no script imports another, and the shared helpers of ``flashtext.bench``
(workload, tuning, ncu)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

import flashtext

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "probe_variants.py"


def _module():
    spec = importlib.util.spec_from_file_location("probe_variants", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_with_environment():
    name, tree, env = _module().parse_variant("fused=probe/bwd:FLASHTEXT_BWD=fused,CFG=64x64x4")
    assert name == "fused" and tree == Path("probe/bwd").resolve()
    assert env == {"FLASHTEXT_BWD": "fused", "CFG": "64x64x4"}


def test_variant_without_environment():
    assert _module().parse_variant("base=probe/base")[2] == {}


@pytest.mark.parametrize("text", ["base", "=probe/base", "base="])
def test_refuses_a_variant_without_name_or_tree(text):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=TREE"):
        _module().parse_variant(text)


def test_refuses_a_tree_without_the_package(tmp_path):
    with pytest.raises(SystemExit, match="no flashtext package"):
        _module().run_variant("x", tmp_path, {}, [], tmp_path, profile=False)


def test_ncu_summary_orders_stalls_and_converts_time():
    spec = importlib.util.spec_from_file_location("record_ncu_kernels",
                                                  SCRIPT.parent / "record_ncu_kernels.py")
    ncu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ncu)
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio".format
    kernel = {"kernel": "_attn_bwd_dkdv(float*, ...)", "gpu__time_duration.sum": 2.5e6,
              "smsp__issue_active.avg.pct_of_peak_sustained_active": 41.0,
              "sm__warps_active.avg.pct_of_peak_sustained_active": 12.5,
              "launch__registers_per_thread": 232.0,
              stall("wait"): 0.7, stall("math_pipe_throttle"): 1.9, stall("barrier"): 0.2}
    out = ncu.summarize(kernel)
    assert out["kernel"] == "_attn_bwd_dkdv" and out["ms"] == 2.5 and out["registers"] == 232
    assert list(out["stalls"]) == ["math_pipe_throttle", "wait", "barrier"]
    assert "tensor_pipe_pct" not in out


def test_spill_report_compiles_for_sm90_without_a_gpu():
    # a fresh process: flashtext turns the interpreter on at start-up when there is no GPU,
    # and an interpreted kernel cannot be compiled
    code = ("import runpy; s = runpy.run_path('scripts/spill_report.py'); "
            "r = s['compile_one']('bwd_dq', (64, 32, 4, 2), 64, False); print(r)")
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parents[1], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    row = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert 0 < row["registers"] <= 255 and row["wgmma"] > 0
    assert row["spill_store_bytes"] >= 0 and row["shared_bytes"] > 0


def test_profile_host_switches_the_tile_loads(monkeypatch):
    import importlib

    from flashtext.kernels import config as _config

    monkeypatch.setattr(_config, "TUNED", dict(_config.TUNED))
    monkeypatch.setattr(_config, "FWD_SHORT", _config.FWD_SHORT)
    monkeypatch.setattr(_config._boot, "INTERPRETING", False)
    spec = importlib.util.spec_from_file_location(
        "profile_host", SCRIPT.parent / "profile_host.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    default, short = dict(_config.TUNED), _config.FWD_SHORT
    assert all(c.tma for c in default.values()) and short.tma
    mod._set_loads("pointers")
    # every configuration launch_config hands out, the short forward's included, loads by pointer
    picked = {_config.launch_config(k, d, 2, c, n, n) for k in ("fwd", "bwd_dkdv", "bwd_dq")
              for d in (64, 128) for c in (False, True) for n in (512, 4096)}
    assert _has_short_tiles(picked, short) and not any(c.tma for c in picked)
    mod._set_loads("descriptors")
    assert _config.TUNED == default and _config.FWD_SHORT == short


def _has_short_tiles(picked, short):
    """The short forward's tiles are among the configurations picked (so it was checked)."""
    return any((c.BLOCK_M, c.BLOCK_N) == (short.BLOCK_M, short.BLOCK_N) for c in picked)


SCRIPTS = sorted(SCRIPT.parent.glob("*.py"))

# Runs every script's module-level code (imports, the path to the checkout) in one process with
# a variant tree first on the path, and prints each script's flashtext modules that did NOT come
# from the variant. -S (no site processing): no start-up hook or editable install has imported
# a flashtext before the script does, so only the script's own path decides.
_PROBE = """
import json, runpy, sys
variant, scripts = sys.argv[1], sys.argv[2:]
base_path = list(sys.path)
foreign = {}
for script in scripts:
    for name in [m for m in sys.modules if m == "flashtext" or m.startswith("flashtext.")]:
        del sys.modules[name]
    sys.path[:] = [script.rsplit("/", 1)[0], *base_path]  # as `python scripts/x.py` has it
    runpy.run_path(script, run_name="probed")
    import flashtext
    foreign[script] = sorted(
        name for name, mod in sys.modules.items()
        if (name == "flashtext" or name.startswith("flashtext."))
        and getattr(mod, "__file__", None) and not mod.__file__.startswith(variant))
print(json.dumps(foreign))
"""


def test_a_variant_tree_on_pythonpath_wins_over_the_checkout_in_every_script(tmp_path):
    """probe_variants.py runs each variant with its flashtext tree first on PYTHONPATH (and so
    may a reader, to measure a change): whatever a script imports of flashtext, the shared
    helpers of flashtext.bench included, must come from that tree, never from this checkout."""
    import shutil
    import sysconfig

    variant = tmp_path / "variant"
    shutil.copytree(SCRIPT.parents[1] / "flashtext", variant / "flashtext",
                    ignore=shutil.ignore_patterns("data", "__pycache__"))
    site = sysconfig.get_paths()["purelib"]  # torch, triton, numpy; its .pth files are not run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(variant), site]),
           "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(variant),
                          *map(str, SCRIPTS)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    foreign = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(foreign) == set(map(str, SCRIPTS))
    assert {s: mods for s, mods in foreign.items() if mods} == {}


def _imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, and whether it edits sys.path other
    than by appending (an insert puts the checkout ahead of a variant tree)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and ast.unparse(node.func.value) == "sys.path" and node.func.attr != "append"):
            names.add(f"sys.path.{node.func.attr}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                "spec_from_file_location"):
            names.add("spec_from_file_location")
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_script_imports_another_or_reorders_the_path(path):
    """What scripts share lives in flashtext.bench; a script is run, never imported."""
    stems = {p.stem for p in SCRIPTS}
    used = _imports(path)
    assert used & stems == set(), f"{path.name} imports another script"
    assert not {n for n in used if n.startswith("sys.path.")}, f"{path.name} inserts into sys.path"
    assert "spec_from_file_location" not in used, f"{path.name} loads a file as a module"


def test_the_import_check_sees_a_script_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.path.insert(0, 'scripts')\nimport tune_kernels\n"
                   "from record_hbm_traffic import find_ncu\n")
    assert {"tune_kernels", "record_hbm_traffic", "sys.path.insert"} <= _imports(bad)


# ------------------------------------------------------------------ shared helpers: workload

def test_workload_is_the_benchmark_setting_and_seeded():
    from flashtext.bench import workload

    assert workload.batch_heads(128, 4096) == (4, 16)
    assert workload.batch_heads(64, 32768) == (1, 32)  # longer than the tokens: one sequence
    q, k, v, do = workload.inputs("float32", 8, 16, device="cpu", tokens=64, hidden=16)
    assert q.shape == (4, 2, 16, 8) and q.dtype == torch_dtype("float32")
    again = workload.inputs("float32", 8, 16, device="cpu", tokens=64, hidden=16)
    assert all(a.equal(b) for a, b in zip((q, k, v, do), again, strict=True))
    assert not q.equal(k)  # four different tensors, not one four times
    other = workload.inputs("float32", 8, 16, seed=1, device="cpu", tokens=64, hidden=16)
    assert not q.equal(other[0])


@pytest.mark.parametrize("bad, match", [
    (dict(dtype="fp16"), "dtype must be one of"),
    (dict(d=0), "d must be a positive int"),
    (dict(n=16.0), "n must be a positive int"),
    (dict(d=24), "d must divide hidden"),
])
def test_workload_refuses_bad_arguments(bad, match):
    from flashtext.bench import workload

    args = dict(dtype="float32", d=8, n=16, device="cpu", tokens=64, hidden=32) | bad
    with pytest.raises(ValueError, match=match):
        workload.inputs(**args)


def test_attention_call_resets_the_gradients_before_every_call(monkeypatch):
    """fwd+bwd calls are timed back to back: each must do one backward's work on fresh
    gradients, not accumulate into the last call's."""
    from flashtext import kernels
    from flashtext.bench import workload

    seen = []

    def fake_attention(q, k, v, causal):
        seen.append((q.grad is None, k.grad is None, v.grad is None, causal))
        return q * k + v

    monkeypatch.setattr(kernels, "flash_attention", fake_attention)
    setting = dict(device="cpu", tokens=32, hidden=8)
    call = workload.attention_call("float32", 4, 8, True, "fwd_bwd", **setting)
    call()
    call()
    assert seen == [(True, True, True, True)] * 2
    fwd = workload.attention_call("float32", 4, 8, False, "fwd", **setting)
    assert fwd().shape == (4, 2, 8, 4) and seen[-1] == (True, True, True, False)
    with pytest.raises(ValueError, match="mode must be one of"):
        workload.attention_call("float32", 4, 8, False, "bwd", **setting)


def test_attention_call_runs_the_library_kernel():
    import flashtext
    from flashtext import reference
    from flashtext.bench import workload

    device = str(flashtext.torch_device())  # the device the kernels run on here
    call = workload.attention_call("float32", 16, 32, True, "fwd", device=device, tokens=32,
                                   hidden=16)
    o = call().cpu()
    q, k, v, _ = workload.inputs("float32", 16, 32, device=device, tokens=32, hidden=16)
    want = reference.attention(q[0, 0], k[0, 0], v[0, 0], causal=True)
    assert abs(o[0, 0].double().numpy() - want).max() < 1e-5


def torch_dtype(name):
    import torch

    return getattr(torch, name)


# ------------------------------------------------------------------ shared helpers: tuning

def test_candidates_are_the_search_space():
    from flashtext.bench import tuning

    fwd = tuning.candidates("fwd", 128)
    assert len(fwd) == len(set(fwd)) and (128, 128, 8, 3) in fwd
    assert (128, 128, 8, 4) not in fwd  # does not fit in shared memory at d = 128
    assert (128, 128, 8, 4) in tuning.candidates("fwd", 64)
    assert (64, 64, 8, 2) not in fwd  # too small a tile for 8 warps ...
    assert (64, 64, 8, 2) in tuning.candidates("bwd_dkdv", 64)  # ... except dK/dV's
    assert tuning.with_tma([(64, 64, 4, 2)], "both") == [(64, 64, 4, 2, False),
                                                        (64, 64, 4, 2, True)]
    assert tuning.with_tma([(64, 64, 4, 2)], "off") == [(64, 64, 4, 2)]
    with pytest.raises(ValueError, match="kernel must be one of"):
        tuning.candidates("bwd", 64)
    with pytest.raises(ValueError, match="tma must be one of"):
        tuning.with_tma([(64, 64, 4, 2)], "yes")


# ------------------------------------------------------------------ shared helpers: ncu

RAW = ('"ID","Stream","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum"\n'
       '"","","","Kbyte","nsecond"\n'
       '"0","7","gemm(half*)","1,024.5","2000"\n'
       '"1","7","softmax(half*)","2","300"\n'
       '"2","9","flash_fwd(half*)","0.5","100"\n')


def test_parse_raw_csv_converts_units_and_keeps_streams():
    from flashtext.bench import ncu

    rows = ncu.parse_raw_csv("==PROF== noise\n" + RAW, ["dram__bytes_read.sum", "absent"])
    assert [r["kernel"] for r in rows] == ["gemm(half*)", "softmax(half*)", "flash_fwd(half*)"]
    assert rows[0]["dram__bytes_read.sum"] == pytest.approx(1024.5e3)
    assert "absent" not in rows[0]
    no_units = RAW.replace('"","","","Kbyte","nsecond"\n', "")
    assert ncu.parse_raw_csv(no_units, ["dram__bytes_read.sum"])[2]["dram__bytes_read.sum"] == 0.5
    with pytest.raises(ValueError, match="no kernel rows"):
        ncu.parse_raw_csv("==PROF== nothing profiled\n", [])


def test_group_by_stream_wants_one_group_per_configuration():
    from flashtext.bench import ncu

    rows = ncu.parse_raw_csv(RAW, [])
    groups = ncu.group_by_stream(rows, 2)
    assert [[k["kernel"] for k in g] for g in groups] == [["gemm(half*)", "softmax(half*)"],
                                                          ["flash_fwd(half*)"]]
    with pytest.raises(ValueError, match="expected 3 stream groups, found 2"):
        ncu.group_by_stream(rows, 3)


FAKE_NCU = '''import subprocess, sys
args = sys.argv[1:]
metrics = args[args.index("--metrics") + 1]
if "optional" in metrics:  # this "GPU" lacks the optional metric
    sys.exit("==ERROR== Failed to find metric optional")
log = args[args.index("--log-file") + 1]
driver = args[args.index("--log-file") + 2:]
open(log, "w").write(open(sys.argv[0] + ".csv").read())
sys.exit(subprocess.run(driver).returncode)
'''


def test_profile_falls_back_and_reads_the_drivers_order(tmp_path):
    """The whole protocol against a stand-in ncu: the first attempt's metrics fail, the second
    runs the driver, whose announced order and the CSV come back parsed."""
    from flashtext.bench import ncu

    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_NCU)
    fake.chmod(0o755)
    (tmp_path / "ncu.csv").write_text(RAW)
    driver = [sys.executable, "-c", "from flashtext.bench import ncu; "
              "ncu.announce_order([{'n': 1}, {'n': 2}])"]
    attempts = [(["dram__bytes_read.sum", "optional"], []), (["dram__bytes_read.sum"], [])]
    got = ncu.profile(str(fake), driver, attempts)
    assert got["ok"], got
    assert got["metrics"] == ["dram__bytes_read.sum"] and got["order"] == [{"n": 1}, {"n": 2}]
    assert len(ncu.group_by_stream(got["kernels"], len(got["order"]))) == 2
    failed = ncu.profile(str(fake), driver, attempts[:1])
    assert not failed["ok"] and "Failed to find metric optional" in failed["error"]


# ------------------------------------------------------------------ shared helpers: static_compile

def test_launch_arguments_are_what_the_library_launches():
    """Recorded from forward()/backward() themselves: every runtime argument typed, every
    constant given, plain loads, the causal forward's longest-first order on."""
    from flashtext.bench import static_compile
    from flashtext.kernels import backward, forward

    fwd = static_compile.launch_arguments("fwd", (64, 32, 4, 2), 64, causal=True)
    assert fwd.fn is forward._attn_fwd and (fwd.num_warps, fwd.num_stages) == (4, 2)
    assert fwd.constexprs["LONGEST_FIRST"] and not fwd.constexprs["USE_TMA"]
    assert (fwd.constexprs["BLOCK_M"], fwd.constexprs["BLOCK_N"]) == (64, 32)
    sig = static_compile.signature(fwd)
    assert list(sig) == list(forward._attn_fwd.arg_names)
    assert sig["Q"] == "*fp16" and sig["LSE"] == "*fp32" and sig["sm_scale"] == "fp32"
    assert sig["N_K"] == "i32" and sig["HEAD_DIM"] == "constexpr"
    dq = static_compile.launch_arguments("bwd_dq", (64, 32, 4, 2), 64, causal=False)
    assert dq.fn is backward._attn_bwd_dq and list(static_compile.signature(dq)) == list(
        backward._attn_bwd_dq.arg_names)
    with pytest.raises(ValueError, match="kernel must be one of"):
        static_compile.launch_arguments("bwd_pre", (64, 32, 4, 2), 64, causal=False)


def test_signature_names_a_missing_constant():
    import dataclasses

    from flashtext.bench import static_compile

    fwd = static_compile.launch_arguments("fwd", (64, 32, 4, 2), 64, causal=False)
    short = dataclasses.replace(fwd, constexprs={k: v for k, v in fwd.constexprs.items()
                                                 if k != "VARLEN"})
    with pytest.raises(ValueError, match="VARLEN"):
        static_compile.signature(short)


def test_record_hopper_previews_the_forward_for_sm90_without_a_gpu():
    """Chapter 13 runs this live: it must compile the library's current kernels."""
    out = subprocess.run([sys.executable, str(SCRIPT.parent / "record_hopper.py"),
                          "--sm90-preview"], cwd=SCRIPT.parents[1], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    preview = json.loads(out.stdout.strip().splitlines()[-1])
    kernels = {k["name"]: k for k in preview["library"]["kernels"]}
    # what flash_attention launches on sm_90 for this case (fp16, d = 128, causal, N = 4096):
    # the Gluon forward and dK/dV (dQ fused in, added by the copy engine), with their
    # producers' and consumers' register budgets, and Triton's preprocessing
    for name, kind in (("_attn_fwd_ws", "forward"), ("_attn_bwd_dkdv_ws", "dkdv")):
        k = kernels[name]
        assert k["gluon"] and k["kind"] == kind, name
        assert k["sass"]["USETMAXREG"] > 0 and k["sass"]["UTMALDG"] > 0, name
        assert k["ptx"]["wgmma"] > 0 and k["ptx"]["mma_sync"] == 0, name
    assert kernels["_attn_bwd_dkdv_ws"]["fused_dq"]
    assert kernels["_attn_bwd_dkdv_ws"]["sass"]["UTMAREDG"] > 0
    assert set(kernels) == {"_attn_fwd_ws", "_attn_bwd_preprocess", "_attn_bwd_dkdv_ws"}
    assert len(preview["probes"]) == 3


def test_probe_gluon_backward_times_the_triton_dq_pass_alone():
    """The probe's ``dq`` provider launches the Triton backward's dQ kernel and nothing else;
    what it computes is the full backward's dQ (here under the interpreter)."""
    import torch

    from flashtext.kernels import backward as bw
    from flashtext.kernels.api import attention_forward

    spec = importlib.util.spec_from_file_location(
        "probe_gluon_backward", SCRIPT.parent / "probe_gluon_backward.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 40, 16, generator=g).to(flashtext.torch_device())
                   for _ in range(4))  # CPU under the interpreter, CUDA on a GPU runner
    o, lse = attention_forward(q, k, v, causal=True)
    delta = bw.preprocess(o, do)
    launched = []

    def spy(kernel_fn, *args, **kwargs):
        launched.append(kernel_fn.__name__)
        return probe.only_dq(kernel_fn, *args, **kwargs)

    dq = torch.empty_like(q)
    dense = (q, k, v, do, dq, torch.empty_like(k), torch.empty_like(v))
    with mock.patch.object(bw, "launch", spy):
        bw._launch_backward(dense, lse, delta, True, (-1, -1), 0.25, None, 40, 40,
                            strides=[x for t in dense for x in t.stride()], batch=1,
                            lse_strides=(80, 40), cu=None)
    assert launched == ["_attn_bwd_dkdv", "_attn_bwd_dq"]  # the first is passed over
    want, _, _ = bw.backward(do, q, k, v, o, lse, True, 0.25)
    assert torch.equal(dq, want)  # the same kernel on the same inputs
