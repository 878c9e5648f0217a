"""End to end in a real browser: JupyterLab renders the panel, a click on Run burst trains, the plots grow.

Widget logic is tested without a browser elsewhere; this test covers what only a front end shows: that
the FigureWidget inside the panel renders, receives live points while the burst runs (read from
plotly's own ``.data`` in the page, since autoranged SVG paths can look unchanged), and that the runs
table gains a row. It needs Debian's chromium (``apt-get install -y chromium``) and skips without it.
Everything Jupyter writes goes to a temp dir; the server and its kernels are stopped in a finally.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import psutil
import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install -y chromium"),
    pytest.mark.slow,
]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1900}
NARROW_WIDTH = 1000
SERVER_START_S = 60.0
KERNEL_READY_MS = 120_000
BURST_S = 4  # long enough to see several live pushes to the figure

NOTEBOOK_CELLS = [
    f"""import torch
import torch.nn.functional as F
from torch import nn

import accel_widgets as aw


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))

    def forward(self, x):
        return self.layers(x)


g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 32, generator=g)
workload = aw.Workload(model=Net(), dataset=(x, x[:, :4].argmax(1)), loss_fn=F.cross_entropy, batch_size=64,
                       name="browser-mlp")
panel = aw.TuningPanel(workload, steps=20)
panel.length_unit.value = "seconds"
panel.length_value.value = {BURST_S}
panel""",
    "panel.run_burst()\npanel.wait()\nprint('runs:', len(panel.runs), panel.runs[-1].status)",
]

# Browser-side reads: plotly's own data on the plot div, and the panel's widgets.
JS_KERNEL_IDLE = """() => {
  const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const context = widget && widget.sessionContext;
  const kernel = context && context.session && context.session.kernel;
  return !!(context && context.isReady && kernel && kernel.connectionStatus === 'connected'
            && kernel.status === 'idle');
}"""
JS_TRACES = """() => {
  const plot = document.querySelector('.aw-plots.js-plotly-plot, .aw-plots .js-plotly-plot');
  if (!plot || !plot.data) return null;
  return plot.data.map(t => ({meta: t.meta || null, n: (t.x || []).filter(v => v !== null).length}));
}"""
JS_ROWS = "() => document.querySelectorAll('.aw-runs .widget-checkbox').length"
JS_STATUS = "() => (document.querySelector('.aw-status') || {innerText: ''}).innerText"
JS_WIDTHS = """() => {
  const width = selector => document.querySelector(selector).getBoundingClientRect().width;
  const runs = document.querySelector('.aw-runs');
  const panel = width('.aw-panel'), plots = width('.aw-plots .main-svg');
  const fits = panel - 40 < plots && plots <= panel;
  return {panel, plots, runs: runs.scrollWidth, runs_room: runs.clientWidth, fits};
}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_notebook(path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in NOTEBOOK_CELLS]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def jupyter_env(home: Path) -> dict[str, str]:
    """Every directory Jupyter, IPython and JupyterLab write to, inside the test's temp dir."""
    env = dict(os.environ)
    for variable in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
                     "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        directory = home / variable.lower()
        directory.mkdir(parents=True, exist_ok=True)
        env[variable] = str(directory)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    # No news toast over the panel (and no request to the outside for it).
    notification = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    return env


@contextlib.contextmanager
def jupyter_lab(root: Path, home: Path) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on a free loopback port; yields (base URL, token); always stops it and its kernels."""
    port, token = free_port(), "aw-test-token"
    env = jupyter_env(home)
    log = open(home / "jupyterlab.log", "wb")  # noqa: SIM115 -- closed in the finally, after the server
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False"]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/api/status?token={token}",
                                                                       timeout=2) as reply:
                if reply.status == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start: {(home / 'jupyterlab.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield base, token
    finally:
        stop_process_tree(server)
        log.close()


def stop_process_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server (it shuts its kernels down), then kill whatever of its tree is still there."""
    try:
        family = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        family = []
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    _, alive = psutil.wait_procs(family, timeout=5)
    for member in alive:
        with contextlib.suppress(psutil.Error):
            member.kill()
    psutil.wait_procs(alive, timeout=5)


def points(traces: list[dict], run: int, kind: str) -> int:
    return sum(t["n"] for t in traces if t["meta"] and t["meta"].get("run") == run and t["meta"].get("kind") == kind)


def test_run_burst_click_updates_plots_and_table_in_jupyterlab(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    write_notebook(root / "panel.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyter_lab(root, home) as (base, token), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{base}/lab/tree/panel.ipynb?token={token}&reset")
            page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=200)
            page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); window.jupyterapp.shell.collapseRight(); }")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # The notebook itself runs one burst programmatically; wait for it and for the kernel.
            page.wait_for_selector(".aw-panel .aw-run-burst", timeout=KERNEL_READY_MS)
            page.wait_for_function(f"() => ({JS_ROWS})() === 1", timeout=KERNEL_READY_MS, polling=200)
            page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=200)
            before = page.evaluate(JS_TRACES)
            assert before is not None, "the plotly figure did not render inside the panel"
            assert points(before, 0, "step") > 0 and points(before, 0, "util") > 0, before

            page.locator(".aw-run-burst").click()
            updates = watch_live_updates(page, run=1)
            page.wait_for_function(f"() => ({JS_STATUS})().includes('finished')", timeout=30_000, polling=100)
            traces = page.evaluate(JS_TRACES)
            rows = page.evaluate(JS_ROWS)
            status = page.evaluate(JS_STATUS)
            page.wait_for_function(f"() => ({JS_WIDTHS})().fits", timeout=10_000, polling=100)
            wide = page.evaluate(JS_WIDTHS)
            page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / "panel.png"))
            narrow = narrow_layout(page)
            reloaded = traces_after_reload(page)
        finally:
            browser.close()

    assert rows == 2, f"the runs table should have gained a row; status: {status!r}"
    assert "finished" in status, status
    assert points(traces, 1, "step") > 0, traces
    assert points(traces, 1, "util") > 0, traces
    rate = (len(updates) - 1) / (updates[-1][0] - updates[0][0]) if len(updates) > 1 else 0.0
    (ARTIFACTS / "browser_update_rate.json").write_text(json.dumps({"updates": updates, "rate_hz": rate}))
    assert len(updates) >= 3, f"the plots should grow live while the burst runs, saw {updates}"
    # The figure takes the panel's width, in a wide window and a narrow one; the table scrolls inside the panel.
    for widths in (wide, narrow):
        assert widths["panel"] - 40 < widths["plots"] <= widths["panel"], widths
        assert widths["runs_room"] <= widths["panel"], widths
    assert narrow["panel"] < wide["panel"], (narrow, wide)
    # The FigureWidget trap: a view created later (page reload) must show the same data, not the empty figure.
    for run in (0, 1):
        for kind in ("step", "util", "warmup"):
            assert points(reloaded, run, kind) == points(traces, run, kind), (run, kind)


def narrow_layout(page: Page) -> dict[str, float]:
    """Look at the panel in a 1000 px window (panel-1000.png): how wide its parts are next to the room they have."""
    page.set_viewport_size({"width": NARROW_WIDTH, "height": VIEWPORT["height"]})
    page.wait_for_function(f"() => ({JS_WIDTHS})().panel < {NARROW_WIDTH} && ({JS_WIDTHS})().fits",
                           timeout=10_000, polling=100)
    page.wait_for_timeout(300)  # the relayout's redraw
    page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / f"panel-{NARROW_WIDTH}.png"))
    return page.evaluate(JS_WIDTHS)


def traces_after_reload(page: Page) -> list[dict]:
    """Save, reload the page and read the figure again: the restored view is built from widget state alone."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    page.reload()
    page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=200)
    page.wait_for_function(f"() => ({JS_TRACES})() !== null && ({JS_ROWS})() === 2", timeout=60_000, polling=200)
    return page.evaluate(JS_TRACES)


def watch_live_updates(page: Page, run: int, timeout_s: float = 120.0) -> list[tuple[float, int]]:
    """Poll the browser's copy of the figure while the burst runs: (time, points) at each change."""
    seen: list[tuple[float, int]] = []
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        traces = page.evaluate(JS_TRACES) or []
        count = points(traces, run, "step") + points(traces, run, "util")
        if count and (not seen or count != seen[-1][1]):
            seen.append((round(time.monotonic() - started, 3), count))
        if page.evaluate(JS_ROWS) > run:
            return seen
        page.wait_for_timeout(50)
    raise AssertionError(f"the burst did not finish within {timeout_s:.0f} s; updates seen: {seen}")
