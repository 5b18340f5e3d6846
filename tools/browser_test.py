"""The book as a reader sees it: every chapter run in real JupyterLab, in headless Chromium.

nbval runs each chapter's kernel but never renders a widget; this test does what a reader does.
It starts JupyterLab from this environment (``sys.executable -m jupyter lab``) on 127.0.0.1, on a
free port, with a random token and *live* widgets (``FLASHTEXT_STATIC`` unset), serving a copy of
``chapters/`` in a temporary directory (so running cells never touches the committed notebooks,
and exercise progress goes to a temporary ``FLASHTEXT_PROGRESS_FILE``). For every chapter it
opens the notebook, waits for an idle kernel, clicks Run > Run All Cells, waits for the kernel
to finish (bounded), and asserts that

* every code cell ran and none shows an error output;
* every widget output is rendered (no "Loading widget...", "Error displaying widget" or
  "model not found" fallback), and every cell that stores a static figure in the committed
  notebook (the ``FLASHTEXT_STATIC=1`` stand-in for a widget) shows a live widget instead;
* the browser asked for nothing outside 127.0.0.1 (other hosts are also unresolvable for it).

Then it plays with every book widget on the page the way a reader would (keyboard on sliders,
typed slider readouts, clicks on buttons and options): the seed lesson's tile stepper, memory bars
and checkpoint (chapter 2 must show all three) and the others in ``INTERACTIONS`` are checked
against what the text says; any other ``ft-`` widget must redraw when its first slider moves.
A screenshot per chapter and per widget checked, the server log and ``summary.txt`` (timings,
what was played with) go to ``artifacts/browser/`` (ignored by git). The server it started is
stopped by its PID, kernels included, also when a test fails.

Run with ``make test-browser`` (needs Debian's ``chromium`` and the ``playwright`` package;
``tools/ci_setup.sh`` installs chromium). Knobs: ``FLASHTEXT_BROWSER_NB_TIMEOUT`` (seconds one
chapter may take to run, default 180), ``FLASHTEXT_BROWSER_TOTAL_TIMEOUT`` (the whole run,
default 1200), ``FLASHTEXT_CHROMIUM`` (browser binary),
``FLASHTEXT_BROWSER_CHAPTERS`` (comma-separated name prefixes to run, e.g. ``00,02``),
``FLASHTEXT_BROWSER_CHAPTERS_DIR`` (another folder of chapters, to try the harness itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from headless_chromium import launched

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = Path(os.environ.get("FLASHTEXT_BROWSER_CHAPTERS_DIR") or ROOT / "chapters")
ARTIFACTS = ROOT / "artifacts" / "browser"
NB_TIMEOUT_S = float(os.environ.get("FLASHTEXT_BROWSER_NB_TIMEOUT", "180"))
# the whole run: past it, the remaining chapters fail at once instead of holding CI
TOTAL_TIMEOUT_S = float(os.environ.get("FLASHTEXT_BROWSER_TOTAL_TIMEOUT", "1200"))
RUN_STARTED = time.monotonic()
SERVER_START_S = 60.0  # a cold JupyterLab start on the 2-core CI machine takes ~2-5 s
KERNEL_IDLE_S = 90.0  # kernel start, before Run All
WIDGETS_SETTLE_S = 30.0  # after the kernel is idle, widget views still render asynchronously
STEP_MS = 15_000  # any single click/wait inside a widget interaction
STATIC_MARKER = "(static figure: open this chapter in JupyterLab"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _chapters() -> list[Path]:
    found = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    only = [p.strip() for p in os.environ.get("FLASHTEXT_BROWSER_CHAPTERS", "").split(",")
            if p.strip()]
    return [p for p in found if not only or any(p.name.startswith(o) for o in only)]


# ----------------------------------------------------------------------------- the server

@dataclass
class Lab:
    base: str
    token: str
    root: Path
    log: Path
    proc: subprocess.Popen
    progress: Path  # FLASHTEXT_PROGRESS_FILE of the kernels: exercise checks record here

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def _summary(line: str) -> None:
    """Print (shown with -s or on failure) and keep in artifacts/browser/summary.txt."""
    print(line)
    with open(ARTIFACTS / "summary.txt", "a") as f:
        f.write(line + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings: Path) -> None:
    """User settings a reader could set too: no news/update checks (no network), all cells in
    the DOM (so every output can be inspected), no toast notifications over the widgets."""
    files = {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {
            "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
    }
    for name, value in files.items():
        path = settings / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (kernels run in their own session, so a process-group kill
    of the server does not reach them)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                kids.append(int(stat.parent.name))
    return kids


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server we started, and the kernels it started, by PID; TERM then KILL."""
    kernels = _children(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the server leads its own process group
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    for pid in kernels:  # normally already shut down by the server on SIGTERM
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    tmp = Path(tempfile.mkdtemp(prefix="flashtext-browser-"))
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # this run's screenshots only
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root = tmp / "chapters"
    shutil.copytree(CHAPTERS, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    _write_settings(tmp / "lab-settings")
    env = dict(os.environ)
    for var in ("FLASHTEXT_STATIC", "MPLBACKEND"):  # live widgets, inline figures: a reader's lab
        env.pop(var, None)
    env.update(
        FLASHTEXT_PROGRESS_FILE=str(tmp / "progress.json"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"),
        JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
        IPYTHONDIR=str(tmp / "ipython"),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    token = secrets.token_hex(24)
    port = _free_port()
    log = tmp / "jupyterlab.log"
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
        f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
        "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", token, root, log, proc, tmp / "progress.json")
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{server.log_tail()}")
            with contextlib.suppress(OSError):
                server.api("/api/status")
                break
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within {SERVER_START_S:.0f} s:\n"
                            f"{server.log_tail()}")
            time.sleep(0.25)
        yield server
    finally:
        _stop(proc)
        # keep the server log next to the screenshots; it is what explains a failure
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copy(log, ARTIFACTS / "jupyterlab.log")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    with launched() as b:
        # one context: its HTTP cache spares reloading JupyterLab's bundles per chapter;
        # each chapter still gets its own page and its own reset workspace
        context = b.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(STEP_MS)
        yield context


# ----------------------------------------------------------------------------- one chapter

# Everything the page knows about the notebook, read from JupyterLab's own models (what the
# kernel sent) and from the DOM (what the reader sees). Observation only: actions are clicks.
STATE_JS = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  let panel = null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path) { panel = w; }
  }
  if (!panel || !panel.content || !panel.content.model) return null;
  const cells = panel.content.widgets.map((cell, i) => {
    const m = cell.model;
    if (m.type !== 'code') return {i, type: m.type};
    const prompt = cell.node.querySelector('.jp-InputPrompt');
    const children = cell.outputArea ? [...cell.outputArea.node.children] : [];
    return {
      i, type: 'code', count: m.executionCount,
      running: !!(prompt && prompt.textContent.includes('*')),
      source: m.sharedModel.getSource(),
      outputs: m.outputs.toJSON().map(o => ({
        type: o.output_type, ename: o.ename || null, evalue: o.evalue || null,
        widget: !!(o.data && o.data['%(mime)s']),
        text: [].concat(o.text || (o.data && o.data['text/plain']) || []).join('').slice(0, 400),
      })),
      views: children.map(ch => {
        const out = ch.querySelector(':scope > .jp-OutputArea-output') || ch;
        return {
          widget: !!out.querySelector('.jupyter-widgets:not(.jp-OutputArea-output)'),
          hidden: out.classList.contains('lm-mod-hidden') || ch.classList.contains('lm-mod-hidden'),
          text: out.textContent.slice(0, 200),
        };
      }),
    };
  });
  const fallbacks = [...panel.node.querySelectorAll('.jp-OutputArea-output')]
    .map(n => n.textContent.trim())
    .filter(t => t.startsWith('Loading widget') || t.startsWith('Error displaying widget'))
    .map(t => t.slice(0, 200));
  const status = panel.node.closest('body').querySelector('.jp-Notebook-ExecutionIndicator');
  return {cells, fallbacks, indicator: status ? status.dataset.status : null};
}
""".replace("%(mime)s", WIDGET_MIME)


def _kernel_state(lab: Lab, path: str) -> str | None:
    for s in lab.api("/api/sessions"):
        if s.get("path") == path and s.get("kernel"):
            return s["kernel"].get("execution_state")
    return None


def _shutdown_sessions(lab: Lab, path: str) -> None:
    with contextlib.suppress(OSError):
        for s in lab.api("/api/sessions"):
            if s.get("path") == path:
                lab.api(f"/api/sessions/{s['id']}", method="DELETE")


def _wait(what: str, predicate: Callable[[], object], timeout_s: float,
          interval_s: float = 0.5) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def _static_cells(nb_path: Path) -> set[int]:
    """Cells whose committed output is a widget's static stand-in: live, they must be widgets."""
    nb = nbformat.read(nb_path, as_version=4)
    found = set()
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if STATIC_MARKER in str(out.get("text", "")) + str(out.get("data", {})):
                found.add(i)
    return found


def _first_line(src: str) -> str:
    lines = [ln for ln in src.splitlines() if ln.strip() and not ln.startswith("#")]
    return (lines[0] if lines else src.strip())[:90]


def _problems(state: dict, static_cells: set[int]) -> list[str]:
    found = []
    code = [c for c in state["cells"] if c["type"] == "code"]
    for c in code:
        where = f"cell {c['i']} ({_first_line(c['source'])!r})"
        for o in c["outputs"]:
            if o["type"] == "error":
                found.append(f"{where} raised {o['ename']}: {o['evalue']}")
            if STATIC_MARKER in o["text"]:
                found.append(f"{where} drew its static figure, not a live widget "
                             "(FLASHTEXT_STATIC leaked into the kernel, or no widget frontend?)")
        for j, o in enumerate(c["outputs"]):
            if not o["widget"]:
                continue
            view = c["views"][j] if j < len(c["views"]) else None
            if view is None or not (view["widget"] or view["hidden"]):
                shown = view["text"] if view else "<no output node>"
                found.append(f"{where}: widget output {j} is not rendered (shows {shown!r})")
        if c["i"] in static_cells and not any(o["widget"] for o in c["outputs"]):
            found.append(f"{where} shows a widget in the committed notebook (static stand-in) "
                         "but created no live widget here")
    never = [c["i"] for c in code if c["source"].strip() and c["count"] is None]
    if never:
        found.append(f"cells {never} never ran (Run All stops at the first error)")
    found += [f"widget fallback on the page: {t!r}" for t in state["fallbacks"]]
    return found


def _run_all(page: object) -> None:
    """Run > Run All Cells, from the menu bar, as a reader does."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel",
                 has_text=re.compile(r"^Run All Cells$")).click()


def _scroll_to(page: object, selector: str) -> None:
    with contextlib.suppress(Exception):
        page.locator(selector).first.scroll_into_view_if_needed(timeout=STEP_MS)


def _open_and_run(page: object, lab: Lab, name: str, settle_s: float = WIDGETS_SETTLE_S
                  ) -> tuple[dict, float]:
    """Open ``name`` in its own fresh workspace, Run All, wait for the kernel and the widgets."""
    t0 = time.monotonic()
    if t0 - RUN_STARTED > TOTAL_TIMEOUT_S:
        pytest.fail(f"the browser run is past its {TOTAL_TIMEOUT_S:.0f} s budget "
                    f"(FLASHTEXT_BROWSER_TOTAL_TIMEOUT); not starting {name}")
    # a workspace of its own, reset: no other notebook is restored (and started) with it
    page.goto(lab.url(f"/lab/workspaces/ft-{Path(name).stem}/tree/{name}?reset"), timeout=60_000)
    _wait(f"{name} to open", lambda: page.evaluate(STATE_JS, name) is not None, KERNEL_IDLE_S)
    t_open = time.monotonic()
    _wait("an idle kernel", lambda: _kernel_state(lab, name) == "idle", KERNEL_IDLE_S)
    t_idle = time.monotonic()
    _run_all(page)
    first_code = next(c["i"] for c in page.evaluate(STATE_JS, name)["cells"]
                      if c["type"] == "code")

    def finished() -> dict | None:
        st = page.evaluate(STATE_JS, name)
        if next(c for c in st["cells"] if c["i"] == first_code)["count"] is None:
            return None  # Run All has not reached the kernel yet
        if any(c.get("running") for c in st["cells"]):
            return None  # a cell is running or queued ([*])
        return st if _kernel_state(lab, name) == "idle" else None

    try:
        _wait(f"{name} to finish running", finished, NB_TIMEOUT_S)
    except TimeoutError as e:
        running = [c["i"] for c in page.evaluate(STATE_JS, name)["cells"] if c.get("running")]
        raise AssertionError(f"{e}; cells still running or queued: {running}") from None
    ran_s = time.monotonic() - t0
    _summary(f"{name}: opened in {t_open - t0:.1f} s, kernel idle after "
             f"{t_idle - t_open:.1f} s, Run All took {time.monotonic() - t_idle:.1f} s")
    with contextlib.suppress(TimeoutError):  # widget views render after the kernel is idle
        _wait("widgets to render", lambda: not page.evaluate(STATE_JS, name)["fallbacks"],
              settle_s)
    return page.evaluate(STATE_JS, name), ran_s


@contextlib.contextmanager
def _page(browser: object, lab: Lab, name: str, stem: str) -> Iterator[object]:
    """A fresh page for one notebook; on failure a screenshot and the logs; always the
    notebook's kernel shut down (one kernel at a time on a 2-core machine)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page()
    page.remote_requests = []
    console_errors: list[str] = []

    def on_request(req: object) -> None:
        host = urllib.parse.urlsplit(req.url).hostname
        if req.url.split(":", 1)[0] in ("http", "https", "ws", "wss") and host != "127.0.0.1":
            page.remote_requests.append(req.url)

    page.on("request", on_request)
    page.on("console", lambda m: console_errors.append(m.text[:300]) if m.type == "error"
            else None)
    try:
        yield page
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(ARTIFACTS / f"{stem}-failure.png"))
        if console_errors:
            print(f"browser console errors ({len(console_errors)}):\n  "
                  + "\n  ".join(console_errors[:10]))
        print(f"server log (last lines):\n{lab.log_tail(20)}")
        raise
    finally:
        _shutdown_sessions(lab, name)
        page.close()


@pytest.mark.parametrize("nb_path", _chapters(), ids=lambda p: p.stem)
def test_chapter_in_jupyterlab(nb_path: Path, lab: Lab, browser: object) -> None:
    name, stem = nb_path.name, nb_path.stem
    with _page(browser, lab, name, stem) as page:
        state, ran_s = _open_and_run(page, lab, name)
        problems = _problems(state, _static_cells(nb_path))
        first_bad = next((p for p in problems if p.startswith("cell ")), None)
        if first_bad:  # the screenshot shows the first broken cell, else the first widget
            _scroll_to(page, f".jp-Notebook-cell >> nth={int(first_bad.split()[1])}")
        else:
            _scroll_to(page, TOP_WIDGETS)
        page.screenshot(path=str(ARTIFACTS / f"{stem}.png"))
        n_widgets = sum(o["widget"] for c in state["cells"] if c["type"] == "code"
                        for o in c["outputs"])
        _summary(f"{name}: ran in {ran_s:.1f} s, {n_widgets} widget output(s) rendered, "
                 f"{len(problems)} problem(s)")
        assert not problems, f"{name}:\n  " + "\n  ".join(problems)
        if any("check(" in c["source"] for c in state["cells"] if c["type"] == "code"):
            # the kernel got our environment: its exercise checks went to the temporary file
            assert lab.progress.exists(), (
                f"{name} ran exercise checks but {lab.progress} was not written: did "
                "FLASHTEXT_PROGRESS_FILE reach the kernel (and .progress.json get written)?")
        _interact_all(page, name, stem)
        assert not page.remote_requests, (
            f"{name}: the browser asked for hosts other than 127.0.0.1: {page.remote_requests}")


def test_harness_sees_failures(lab: Lab, browser: object) -> None:
    """The checks above can fail: a scratch notebook (in the server's temporary root, never in
    chapters/) with one good widget, an unrenderable widget view, a static stand-in, an error
    and a cell after it. Each must be reported, and the good widget must not be."""
    name = "zz_harness_selftest.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                  "language": "python"}}
    bogus = {WIDGET_MIME: {"model_id": "no-such-model", "version_major": 2, "version_minor": 0}}
    nb.cells = [
        nbformat.v4.new_code_cell("import ipywidgets as w\nw.IntSlider(description='ok')"),
        nbformat.v4.new_code_cell(f"from IPython.display import display\n"
                                  f"display({bogus!r}, raw=True)"),
        nbformat.v4.new_code_cell(f"print({STATIC_MARKER + ' ...)'!r})"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print('after the error')"),
    ]
    nbformat.write(nb, lab.root / name)
    with _page(browser, lab, name, "zz_harness_selftest") as page:
        state, _ = _open_and_run(page, lab, name, settle_s=3.0)
        problems = _problems(state, static_cells={2})
    text = "\n".join(problems)
    assert not any(p.startswith("cell 0 ") for p in problems), text
    assert "cell 1 " in text and "widget output 0 is not rendered" in text, text
    assert "cell 2 " in text and "static figure" in text and "no live widget" in text, text
    assert "cell 3 " in text and "ZeroDivisionError" in text, text
    assert "never ran" in text and "[4]" in text, text
    assert "widget fallback on the page" in text, text


# ----------------------------------------------------------------------------- interactions
# Widgets are found by the CSS classes (``ft-...``) and ``description``s their modules give them.

def _readout_set(page: object, slider: object, value: int) -> None:
    """Type a value into an ipywidgets slider's readout (click, select all, type, Enter)."""
    readout = slider.locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


class CaptionMissing(AssertionError):
    pass


class Captions:
    """Caption checks that fail softly: the rest of an interaction (the figure checks) still
    runs, a missing caption is reported once, and everything is raised by :meth:`done`."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.missing: set[str] = set()

    def check(self, box: object, pattern: re.Pattern, expect: tuple, what: str,
              caption_cls: str) -> None:
        if caption_cls in self.missing:
            return
        try:
            _wait_caption(box, pattern, expect, what, caption_cls)
        except CaptionMissing as e:
            self.missing.add(caption_cls)
            self.problems.append(str(e))
        except AssertionError as e:
            self.problems.append(str(e))

    def done(self) -> None:
        if self.problems:
            raise AssertionError("\n".join(self.problems))


def _wait_caption(box: object, pattern: re.Pattern, expect: tuple, what: str,
                  caption_cls: str) -> None:
    """Wait until the widget's own text (not its figure: a browser can't read pixels as text)
    shows a caption matching ``pattern`` whose groups are ``expect``; fail saying what it shows."""
    last: list[tuple] = []

    def probe() -> bool:
        m = pattern.search(" ".join(box.inner_text().split()))
        got = tuple(g.replace(",", "") for g in m.groups()) if m else None  # 10,000 == 10000
        last[:] = [got] if m else []
        return got == expect

    try:
        # a caption that is there at all shows within a moment; then wait for the right one
        with contextlib.suppress(TimeoutError):
            _wait(what, lambda: probe() or bool(last), 5.0, 0.2)
        if last:
            _wait(what, probe, STEP_MS / 1000, 0.2)
    except TimeoutError:
        pass
    if not probe():
        if not last:
            raise CaptionMissing(
                f"{what}: no text matching {pattern.pattern!r} in the widget; a caption drawn "
                f"only inside the figure can't be read by the browser test. The widget needs "
                f"it as text too, e.g. w.HTML(self.caption()) with add_class({caption_cls!r}), "
                f"updated on every redraw. Its text now: {box.inner_text()[:300]!r}")
        raise AssertionError(f"{what}: expected {expect}, the widget shows {last[0]}")


def _png(img: object) -> object:
    """The pixels of an <img> with a data: PNG (what the kernel drew), as an RGB float array."""
    import base64
    import io

    import matplotlib.image

    src = img.get_attribute("src") or ""
    assert src.startswith("data:image/png;base64,"), f"expected an inline PNG, got {src[:60]!r}"
    rgba = matplotlib.image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), "png")
    return rgba[..., :3]


def _centroid(rgb: object, color: str, tol: float = 0.04) -> tuple[float, float]:
    """(x, y) centre of the pixels drawn in ``color`` (hex), in pixels."""
    import numpy as np

    target = np.array([int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    ys, xs = np.nonzero(np.abs(rgb - target).max(axis=-1) < tol)
    assert len(xs) > 50, f"no {color} tile found in the figure"
    return float(xs.mean()), float(ys.mean())


TILE_CAPTION = re.compile(r"step (\d+) of (\d+) [—-] query-block (\d+), key-block (\d+)")
BARS_CAPTION = re.compile(r"at n = (\d+): naive peak memory grows to ([\d,]+) scores; "
                          r"tiled peak memory stays at ([\d,]+)")
TILE_ORANGE = "#f0a35e"  # the tile on chip, in TileStepper.figure


def _readout(box: object, cls: str) -> str:
    return box.locator(f".{cls} .widget-readout").first.inner_text().strip()


def _snapshot(box: object) -> str:
    """What a widget shows that the kernel computed: its figures and its output/HTML text (not
    the controls' own readouts, which change in the browser alone)."""
    return box.evaluate("""n => [...n.querySelectorAll('img')].map(i => i.src).join('|') +
        [...n.querySelectorAll('.widget-output, .widget-html-content')]
          .map(e => e.innerText).join('|')""")


def _interact_generic(page: object, box: object, shot: str) -> str:
    """Any other book widget: move its first slider with the keyboard (else pick another option
    of its first dropdown, else press another of its toggle buttons) and see the kernel redraw
    something: a comm round trip through a real frontend."""
    before = _snapshot(box)

    def redrew(what: str, timeout_s: float = 8.0) -> bool:
        try:
            _wait(f"a redraw after {what}", lambda: _snapshot(box) != before, timeout_s, 0.2)
        except TimeoutError:
            return False
        box.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
        return True

    handles = box.locator(".widget-slider .noUi-handle")
    if handles.count():
        label = box.locator(".widget-slider .widget-label").first.inner_text().strip()
        for key in ("ArrowRight", "ArrowLeft", "ArrowLeft"):  # it may start at its maximum
            handles.first.focus()
            page.keyboard.press(key)
            if redrew(f"moving {label!r}"):
                return f"moved {label!r}, it redrew"
        raise AssertionError(f"moving its first slider ({label!r}) with the keyboard changed "
                             "nothing the kernel draws (figure or text)")
    selects = box.locator(".widget-dropdown select")
    if selects.count():
        select = selects.first
        label = box.locator(".widget-dropdown .widget-label").first.inner_text().strip()
        options = select.locator("option").evaluate_all("os => os.map(o => o.value)")
        other = next((o for o in options if o != select.input_value()), None)
        if other is not None:
            select.select_option(other)
            if redrew(f"choosing {label!r}"):
                return f"chose another {label!r}, it redrew"
            raise AssertionError(f"choosing another option of its first dropdown ({label!r}) "
                                 "changed nothing the kernel draws (figure or text)")
    toggles = box.locator(".widget-toggle-buttons button:not(.mod-active)")
    if toggles.count():
        text = toggles.first.inner_text().strip()
        toggles.first.click()
        if redrew(f"pressing {text!r}"):
            return f"pressed {text!r}, it redrew"
        raise AssertionError(f"pressing its toggle button {text!r} changed nothing the kernel "
                             "draws (figure or text)")
    return "rendered (no slider, dropdown or toggle to try)"


def _interact_tensor_sizes(page: object, box: object, shot: str) -> str:
    """Chapter 0, tensor sizes: a larger N redraws the figure (its caption is in the image)."""
    img = box.locator(".widget-output img").first
    before = img.get_attribute("src")
    n = box.locator(".widget-slider", has=page.locator("label", has_text=re.compile(r"^N$")))
    _readout_set(page, n.first, 65536)
    _wait("the tensor-size figure to redraw",
          lambda: img.get_attribute("src") not in (None, before), STEP_MS / 1000, 0.2)
    box.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
    return "N -> 65536, it redrew"


def _interact_roofline(page: object, box: object, shot: str) -> str:
    """Roofline: pick each other GPU; the caption names it with its ridge point
    (peak matmul FLOP/s over HBM bandwidth, from flashtext.hardware)."""
    from flashtext.hardware import GPUS

    select = box.locator(".ft-roofline-gpu select").first
    caption = box.locator(".ft-roofline-caption").first
    options = select.locator("option").all_inner_texts()
    current = select.input_value()
    done = []
    for key in [o for o in options if o != current] + [current]:
        select.select_option(key)
        g = GPUS[key]
        want = (g.name, f"ridge {g.ridge_point():.0f} FLOP/B")
        try:
            _wait(f"the roofline caption for {key}",
                  lambda w=want: all(x in caption.inner_text() for x in w), STEP_MS / 1000, 0.2)
        except TimeoutError:
            raise AssertionError(f"roofline with GPU {key}: caption {caption.inner_text()!r} "
                                 f"lacks {want}") from None
        done.append(key)
    box.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
    return f"GPU {' -> '.join(done)}, captions and ridge points right"


def _interact_choice(page: object, box: object, shot: str) -> str:
    """A multiple-choice checkpoint: every option gets feedback; some are wrong ("Not quite"),
    some right ("Right"); the reader ends on a right one."""
    feedback = box.locator(".ft-choice-feedback").first
    labels = box.locator(".ft-choice-options .widget-radio-box label")
    verdicts = {}
    for k in range(labels.count()):
        text = labels.nth(k).inner_text().strip()
        before = feedback.inner_text()
        labels.nth(k).click()
        with contextlib.suppress(TimeoutError):
            _wait(f"feedback for {text!r}", lambda b=before: feedback.inner_text() != b,
                  STEP_MS / 1000, 0.2)
        got = " ".join(feedback.inner_text().split())
        if got.startswith("Right"):
            verdicts[k] = True
        elif got.startswith("Not quite"):
            verdicts[k] = False
        elif got != before or k == 0:
            raise AssertionError(f"option {text!r}: unexpected feedback {got!r}")
        else:  # same verdict text as the previous option (two wrong answers, same reason)
            verdicts[k] = verdicts[k - 1]
    assert any(verdicts.values()) and not all(verdicts.values()), (
        f"expected right and wrong options, got {verdicts}")
    right = next(k for k, ok in verdicts.items() if ok)
    if right != labels.count() - 1:
        labels.nth(right).click()
        _wait("the right answer's feedback", lambda: feedback.inner_text().startswith("Right"),
              STEP_MS / 1000, 0.2)
    box.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
    return f"{sum(not v for v in verdicts.values())} wrong, {sum(verdicts.values())} right"


def _interact_tile_stepper(page: object, box: object, shot: str) -> str:
    """Step the tile stepper with the keyboard: the caption counts up and names the tile the
    loop order visits next, and the highlighted tile moves to it."""
    n, block = int(_readout(box, "ft-tile-n")), int(_readout(box, "ft-tile-block"))
    order = box.locator(".ft-tile-order button.mod-active").first.inner_text().strip()
    t = -(-n // block)  # tiles per side
    visit = [divmod(k, t) if order == "query-major" else divmod(k, t)[::-1] for k in range(t * t)]
    step = int(_readout(box, "ft-tile-step"))
    img = box.locator(".widget-output img").first
    captions = Captions()
    captions.check(box, TILE_CAPTION, tuple(map(str, (step, t * t, *visit[step - 1]))),
                   "the tile stepper's first caption", "ft-tile-caption")
    centres = [_centroid(_png(img), TILE_ORANGE)]
    box.screenshot(path=str(ARTIFACTS / f"{shot}-step{step}.png"))
    handle = box.locator(".ft-tile-step .noUi-handle").first
    for _ in range(2):  # two steps: along the row, then (query-major, 2x2) to the next row
        if step == t * t:
            break
        src = img.get_attribute("src")
        handle.focus()
        page.keyboard.press("ArrowRight")
        step += 1
        i, j = visit[step - 1]
        captions.check(box, TILE_CAPTION, tuple(map(str, (step, t * t, i, j))),
                       f"the caption after stepping to {step}", "ft-tile-caption")
        _wait("the tile figure to redraw", lambda s=src: img.get_attribute("src") != s,
              STEP_MS / 1000, 0.2)
        centres.append(_centroid(_png(img), TILE_ORANGE))
        box.screenshot(path=str(ARTIFACTS / f"{shot}-step{step}.png"))
        (x0, y0), (x1, y1) = centres[-2], centres[-1]
        di, dj = i - visit[step - 2][0], j - visit[step - 2][1]
        # the highlight moves the way the tile index does: right with the key block (columns),
        # down with the query block (rows); a tile is many pixels, so signs are unambiguous
        for moved, d, what in ((x1 - x0, dj, "key-block (x)"), (y1 - y0, di, "query-block (y)")):
            if d == 0:
                assert abs(moved) < 3, f"highlight moved in {what} by {moved:.0f} px, expected not"
            else:
                assert moved * d > 3, (f"highlight moved {moved:.0f} px in {what}; "
                                       f"expected {'+' if d > 0 else '-'} (tile {i},{j})")
    captions.done()
    return f"stepped to {step} of {t * t}: caption and highlighted tile followed"


def _interact_memory_bars(page: object, box: object, shot: str) -> str:
    """Move the memory-bars slider: at n = 16 (block 2) naive holds 256 scores and tiled 4;
    at n = 100 naive holds 10,000 and tiled still 4."""
    img = box.locator(".widget-output img").first
    captions = Captions()
    if _readout(box, "ft-bars-block") != "2":
        _readout_set(page, box.locator(".ft-bars-block").first, 2)
    for n, naive, tiled in ((16, 256, 4), (100, 10_000, 4), (16, 256, 4)):
        src = img.get_attribute("src")
        if _readout(box, "ft-bars-n") != str(n):
            _readout_set(page, box.locator(".ft-bars-n").first, n)
            _wait("the memory-bars figure to redraw", lambda s=src: img.get_attribute("src") != s,
                  STEP_MS / 1000, 0.2)
        captions.check(box, BARS_CAPTION, (str(n), str(naive), str(tiled)),
                       f"the memory bars at n = {n}", "ft-bars-caption")
        box.screenshot(path=str(ARTIFACTS / f"{shot}-n{n}.png"))
    captions.done()
    return "n = 16 -> 100 -> 16: 256 vs 4, 10000 vs 4, 256 vs 4"


def _interact_checkpoint(page: object, box: object, shot: str) -> str:
    """Answer the checkpoint wrongly (too small, then too big), then rightly: the feedback says
    so each time. With block 2 the ratio is n^2/4, so the first candidate >= 1000x is the
    smallest n with n^2 >= 4000, i.e. n >= 64."""
    if _readout(box, "ft-checkpoint-block") != "2":
        _readout_set(page, box.locator(".ft-checkpoint-block").first, 2)
    buttons = box.locator(".ft-checkpoint-pick button")
    cands = sorted(int(b) for b in buttons.all_inner_texts())
    right = next(n for n in cands if n * n >= 4000)
    small = [n for n in cands if n < right]
    big = [n for n in cands if n > right]
    assert small and big, f"checkpoint candidates {cands} leave no wrong answer on both sides"
    feedback = box.locator(".ft-checkpoint-feedback").first
    for pick, verdict in ((small[-1], r"^Not yet"), (big[0], r"smaller candidate"),
                          (right, r"^Right")):
        before = feedback.inner_text()
        box.locator(".ft-checkpoint-pick button", has_text=re.compile(f"^{pick}$")).click()
        _wait(f"checkpoint feedback after picking {pick}",
              lambda b=before: feedback.inner_text() != b, STEP_MS / 1000, 0.2)
        text = " ".join(feedback.inner_text().split())
        assert re.search(verdict, text), f"picked {pick}: feedback {text!r}, expected {verdict!r}"
        assert f"n = {pick}" in text, f"picked {pick}: the feedback does not name it: {text!r}"
        box.screenshot(path=str(ARTIFACTS / f"{shot}-{pick}.png"))
    return f"picked {small[-1]} (too small), {big[0]} (not the smallest), {right} (right)"


# Interactions by the widget's top-level CSS class; other ``ft-`` widgets get the generic one.
INTERACTIONS: dict[str, Callable[[object, object, str], str]] = {
    "ft-tile-stepper": _interact_tile_stepper,
    "ft-memory-bars": _interact_memory_bars,
    "ft-checkpoint": _interact_checkpoint,
    "ft-tensor-sizes": _interact_tensor_sizes,
    "ft-roofline": _interact_roofline,
    "ft-choice": _interact_choice,
}
# Widgets a chapter must show (the seed lesson's, in chapter 2): missing is a failure.
REQUIRED: dict[str, tuple[str, ...]] = {
    "02_": ("ft-tile-stepper", "ft-memory-bars", "ft-checkpoint"),
}
TOP_WIDGETS = ".jp-OutputArea-output > .jupyter-widgets"


def _interact_all(page: object, name: str, stem: str) -> None:
    """Play with every book widget on the page (each tried even when another fails)."""
    classes = page.evaluate(f"""() => [...document.querySelectorAll('{TOP_WIDGETS}')]
        .map(n => [...n.classList].find(c => c.startsWith('ft-')) || null)""")
    failures, done = [], []
    for prefix, needed in REQUIRED.items():
        if name.startswith(prefix):
            failures += [f"{cls}: not on the page (this chapter must show it)"
                         for cls in needed if cls not in classes]
    for k, cls in enumerate(classes):
        if cls is None:
            continue  # a plain ipywidget (e.g. a tqdm bar): rendering was checked above
        box = page.locator(TOP_WIDGETS).nth(k)
        box.scroll_into_view_if_needed()
        interact = INTERACTIONS.get(cls, _interact_generic)
        try:
            done.append(f"{cls}: {interact(page, box, f'{stem}-{cls}-{k}')}")
        except Exception as e:  # noqa: BLE001 - playwright's own errors too; report them all
            failures.append(f"{cls} (widget {k}) {interact.__name__}: {type(e).__name__}: {e}")
    _summary(f"{name}: widgets played with: " + ("".join(f"\n  {d}" for d in done) or "none"))
    if failures:
        raise AssertionError(f"{name}:\n" + "\n".join(failures))
