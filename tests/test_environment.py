"""One place holds the pins (requirements.txt); environment.yml and the Makefile both use it."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[name.strip().lower()] = version.strip()
    return out


def test_every_requirement_is_pinned_exactly():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        assert not line or "==" in line, f"unpinned requirement: {line!r}"
    assert pins()["torch"] == "2.13.0" and pins()["triton"] == "3.7.1"


def test_environment_yml_installs_requirements_txt_and_pins_nothing_else():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-r requirements.txt" in pip_section
    conda_names = [d.split("=")[0] for d in env["dependencies"] if isinstance(d, str)]
    assert set(conda_names) <= {"python", "pip"}, "pin packages in requirements.txt, not here"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.split("=")[1] >= "3.11"


def test_makefile_installs_requirements_txt():
    makefile = (ROOT / "Makefile").read_text()
    assert "REQS := requirements.txt" in makefile
    assert "pip install -q -r $(REQS)" in makefile
    assert "grep -vE $(COMPUTE) $(REQS)" in makefile  # the GPU wheelhouse reads the same file


def not_on_runner() -> set[str]:
    """The pins a GPU runner's wheelhouse leaves out (the Makefile's NOT_ON_RUNNER)."""
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines()
                if x.startswith("NOT_ON_RUNNER :="))
    return set(re.search(r"\^\((.*)\)==", line).group(1).split("|"))


def test_not_on_runner_names_pinned_packages():
    assert {"jupyterlab", "playwright", "sphinx"} <= not_on_runner() <= set(pins())


def test_installed_versions_match_pins():
    """The running environment is the pinned one (on a GPU runner only the non-compute part)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    compute = {"torch", "triton", "numpy"}
    for name, pinned in pins().items():
        if torch.cuda.is_available() and (name in compute or name in not_on_runner()):
            continue
        try:
            installed = version(name)
        except PackageNotFoundError:
            raise AssertionError(f"{name} is pinned but not installed") from None
        assert installed.split("+")[0] == pinned, f"{name}: installed {installed}, pinned {pinned}"
