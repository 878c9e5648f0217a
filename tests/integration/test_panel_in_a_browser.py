"""End to end in a real browser: JupyterLab renders the panel, a click on Run burst trains, the plots grow.

Widget logic is tested without a browser elsewhere; this test covers what only a front end shows: that
the FigureWidget inside the panel renders, receives live points while the burst runs (read from
plotly's own ``.data`` in the page, since autoranged SVG paths can look unchanged), that the runs
table gains a row and never scrolls sideways, and that the controls lay out whole (nothing clipped, nothing
overlapping, in every family of knobs) in JupyterLab with its file browser open and in Notebook 7. It needs
Debian's chromium (``apt-get install -y chromium``) and skips without it. Everything Jupyter writes goes to a
temp dir; the server and its kernels are stopped in a finally.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.browsers import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    JS_EXECUTE,
    JS_KERNEL_IDLE,
    KERNEL_READY_MS,
    NEEDS_CHROMIUM,
    jupyter_lab,
    save_and_reload,
    write_notebook,
)

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from tests.conftest import Alone

pytestmark = NEEDS_CHROMIUM

VIEWPORT = {"width": 1400, "height": 1900}
NARROW_WIDTH = 1000
LAYOUT_WIDTHS = (1400, NARROW_WIDTH)  # the panel's layout is checked at these window widths, file browser open
LAYOUT_SETTLE_MS = 5_000  # a resize reaches the kernel (the width probe) and its relayout comes back
BURST_S = 4  # long enough to see the page hold still while the window measures, then draw it
CHART_DRAW_S = 3  # the live chart draws at most once a second: its last drawing comes within this of the row
COMPARE_S = 6  # the clicked run is compared with the baseline (the same config: the noise floor) for this long

# The MLP's step takes ~1.3 ms here (IQR 14% of it): at 0.65 ms (IQR 23%) the scheduler's jitter set its spread, and
# a loaded suite once read both runs past the unreliable line, which leaves "Use in my code" no run to offer.
NOTEBOOK_CELLS = [
    f"""import torch
import torch.nn.functional as F
from torch import nn

import accel_widgets as aw


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 4))

    def forward(self, x):
        return self.layers(x)


g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 256, generator=g)
workload = aw.Workload(model=Net(), dataset=(x, x[:, :4].argmax(1)), loss_fn=F.cross_entropy, batch_size=64,
                       name="browser-mlp")
panel = aw.TuningPanel(workload, steps=20, budget_s={COMPARE_S})
panel.length_unit.value = "seconds"
panel.length_value.value = {BURST_S}
panel""",
    "panel.run_burst()\npanel.wait()\nprint('runs:', len(panel.runs), panel.runs[-1].status)",
]

# Browser-side reads. The timeline's canvas says what it draws (for screen readers): "Timeline. run 0 #0
# baseline: 57 steps, 12 utilisation samples; run 1 ...". Read per run, or null before it has drawn.
JS_TIMELINE = """() => {
  const canvas = document.querySelector('.aw-plots canvas');
  const label = canvas && canvas.getAttribute('aria-label');
  if (!label) return null;
  const runs = {};
  for (const m of label.matchAll(/run (\\d+) [^;]*?: (\\d+) steps, (\\d+) utilisation samples/g))
    runs[m[1]] = {step: Number(m[2]), util: Number(m[3])};
  return runs;
}"""
JS_ROWS = "() => document.querySelectorAll('.aw-runs tr.aw-run').length"
JS_SPEEDUP = """() => [...document.querySelectorAll('.aw-runs tr.aw-run')].map(row => {
  const cell = row.querySelector('td.aw-col-speedup');
  return cell ? cell.innerText.trim() : null;
})"""
JS_ROW_HOVERS = "() => [...document.querySelectorAll('.aw-runs tr.aw-run [title]')].map(cell => cell.title)"
JS_STATUS = "() => (document.querySelector('.aw-status') || {innerText: ''}).innerText"
JS_WIDTHS = """() => {
  const width = selector => document.querySelector(selector).getBoundingClientRect().width;
  const runs = document.querySelector('.aw-runs-box');
  const panel = width('.aw-panel'), plots = width('.aw-plots canvas'), room = width('.aw-plots');
  const fits = room - 2 < plots && plots <= room + 0.5 && room <= panel;
  return {panel, plots, plots_room: room, runs: runs.scrollWidth, runs_room: runs.clientWidth, fits};
}"""


# Every control of the panel (a knob's name, input, ⓘ and note; the families' buttons; the actions' buttons and
# inputs) against its column, the panel and every other control, by the boxes the browser drew: returns what is wrong,
# one line each, empty when the layout is whole. Text is measured with the element's own font.
JS_LAYOUT = """() => {
  const panel = document.querySelector('.aw-panel');
  if (!panel) return ['no panel'];
  const problems = [];
  const rect = el => el.getBoundingClientRect();
  const fmt = r => `[${Math.round(r.left)},${Math.round(r.top)} ${Math.round(r.width)}x${Math.round(r.height)}]`;
  const inside = (r, o) => r.left >= o.left - 0.5 && r.right <= o.right + 0.5 && r.top >= o.top - 0.5
                           && r.bottom <= o.bottom + 0.5;
  const canvas = document.createElement('canvas').getContext('2d');
  const textWidth = (el, text) => { canvas.font = getComputedStyle(el).font; return canvas.measureText(text).width; };
  const room = el => { const s = getComputedStyle(el);
                       return el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight); };
  const shown = el => el.getClientRects().length > 0;
  const leaves = [];  // [what, element, column]
  const shownFamilies = [...panel.querySelectorAll('.aw-knobs .aw-family')].filter(shown);
  for (const column of [...shownFamilies, ...panel.querySelectorAll('.aw-actions, .aw-knobs')]) {
    const where = column.classList.contains('aw-family') ? 'family' : column.classList.contains('aw-knobs')
      ? 'knobs' : 'actions';
    if (where === 'knobs')
      for (const button of column.querySelectorAll('.aw-family-tab, .aw-reset, .aw-fold'))
        if (shown(button)) leaves.push([`knobs button "${button.innerText.trim()}"`, button, column]);
    if (where === 'family') for (const knob of [...column.querySelectorAll('.aw-knob')].filter(shown)) {
      const name = knob.querySelector('.aw-knob-name').innerText.trim();
      const span = knob.querySelector('.aw-knob-name span');
      leaves.push([`${name} label`, span, column]);
      for (const field of knob.querySelectorAll('.aw-knob-input input, .aw-knob-input select'))
        leaves.push([`${name} ${field.tagName.toLowerCase()}`, field, column]);
      leaves.push([`${name} ⓘ`, knob.querySelector('.aw-knob-info'), column]);
      const note = knob.querySelector('.aw-knob-note');
      if (shown(note)) leaves.push([`${name} note`, note, column]);
    }
    if (where === 'actions')
      for (const field of column.querySelectorAll('button, input, select'))
        leaves.push([`actions ${field.tagName.toLowerCase()} "${(field.innerText || field.value || '').trim()}"`,
                     field, column]);
  }
  if (!leaves.length) return ['no controls found'];
  for (const [what, el, column] of leaves) {
    if (!shown(el)) { problems.push(`${what} is not displayed`); continue; }
    el.scrollIntoView({block: 'nearest', inline: 'nearest'});  // the notebook scrolls; the status bar covers
    const box = rect(el), panelBox = rect(panel);
    if (!inside(box, panelBox)) problems.push(`${what} ${fmt(box)} is outside the panel ${fmt(panelBox)}`);
    if (!inside(box, rect(column))) problems.push(`${what} ${fmt(box)} is outside its column ${fmt(rect(column))}`);
    const x = box.left + box.width / 2, y = box.top + box.height / 2;
    const top = document.elementFromPoint(x, y);
    if (!(top && (el.contains(top) || top.contains(el))))
      problems.push(`${what} is covered by ${top ? top.className || top.tagName : 'nothing'} at its centre`);
    if (el.tagName === 'INPUT' && ['text', 'number'].includes(el.type)) {
      const text = el.value || el.placeholder;
      if (el.scrollWidth > el.clientWidth || textWidth(el, text) > room(el))
        problems.push(`${what} clips "${text}": ${Math.ceil(textWidth(el, text))} px of text in ${room(el)} px`);
    }
    if (el.tagName === 'SELECT') {
      const longest = Math.max(...[...el.options].map(o => textWidth(el, o.text)));
      if (longest > room(el))
        problems.push(`${what} is narrower (${room(el)} px) than its longest option (${Math.ceil(longest)} px)`);
    }
  }
  for (let i = 0; i < leaves.length; i++) {
    for (let j = i + 1; j < leaves.length; j++) {
      const [a, b] = [rect(leaves[i][1]), rect(leaves[j][1])];
      const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (dx > 0.5 && dy > 0.5)
        problems.push(`${leaves[i][0]} ${fmt(a)} overlaps ${leaves[j][0]} ${fmt(b)}`);
    }
  }
  return problems;
}"""
JS_OPEN_FAMILY = """group => {
  const tab = [...document.querySelectorAll('.aw-family-tab')].find(t => t.innerText.trim().split(' ')[0] === group);
  if (!tab.classList.contains('mod-active')) tab.click();
}"""
JS_FAMILIES = "() => [...document.querySelectorAll('.aw-family-tab')].map(t => t.innerText.trim().split(' ')[0])"
JS_OPEN_FOLD = "() => { const f = [...document.querySelectorAll('.aw-fold')].find(f => f.getClientRects().length); " \
               "if (f && !f.classList.contains('mod-active')) f.click(); return !!f; }"

def points(drawn: dict | None, run: int, kind: str) -> int:
    """The timeline's points of ``run``: "step" (warm-up included) or "util"."""
    return (drawn or {}).get(str(run), {}).get(kind, 0)


def use_in_my_code(page) -> dict[str, str]:
    """Click "Use #N in my code", read the plain-PyTorch code, then pick Hugging Face and read that; a screenshot of
    each is kept."""
    button = page.locator(".aw-use-in-my-code")
    label = button.inner_text()
    # Disabled: no run qualifies (something outside this test loaded the machine while the bursts ran); the hovers say.
    assert button.is_enabled(), (button.get_attribute("title"), page.evaluate(JS_ROW_HOVERS))
    button.click()
    code = page.locator(".aw-recipe-code textarea")
    page.wait_for_function("() => (document.querySelector('.aw-recipe-code textarea') || {}).value?.includes('def "
                           "train(')", timeout=10_000, polling=100)
    pytorch = code.input_value()
    page.locator(".aw-use-in-my-code").scroll_into_view_if_needed()
    page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / "panel-use-in-my-code.png"))
    page.locator(".aw-recipe-styles button", has_text="Hugging Face").click()
    page.wait_for_function("() => document.querySelector('.aw-recipe-code textarea').value.includes("
                           "'TrainingArguments')", timeout=10_000, polling=100)
    return {"button": label.strip(), "pytorch": pytorch, "hf": code.input_value()}


def test_run_burst_click_updates_plots_and_table_in_jupyterlab(tmp_path: Path, alone: Alone) -> None:
    from playwright.sync_api import sync_playwright

    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    write_notebook(root / "panel.ipynb", NOTEBOOK_CELLS)
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
            page.wait_for_function(f"() => ({JS_TIMELINE})() !== null", timeout=30_000, polling=200)
            before = page.evaluate(JS_TIMELINE)
            assert points(before, 0, "step") > 0 and points(before, 0, "util") > 0, before

            # What a user watches: the clicked burst drawn live and its comparison window, with nothing else on the
            # machine (the notebook's own burst, read only for its points, and the layout need not be).
            with alone():
                page.locator(".aw-run-burst").click()
                updates = watch_live_updates(page, run=1)
                page.wait_for_function(f"() => ({JS_STATUS})().includes('finished')",
                                       timeout=(2 * BURST_S + COMPARE_S + 30) * 1000, polling=100)
                traces = settled_timeline(page)
                speedup = page.evaluate(JS_SPEEDUP)
                rows = page.evaluate(JS_ROWS)
                status = page.evaluate(JS_STATUS)
            page.wait_for_function(f"() => ({JS_WIDTHS})().fits", timeout=10_000, polling=100)
            wide = page.evaluate(JS_WIDTHS)
            page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / "panel.png"))
            recipes = use_in_my_code(page)
            narrow = narrow_layout(page)
            layout = layout_beside_file_browser(page)
            reloaded = traces_after_reload(page)
            live = live_mode(page)  # what it asserts is the table's rows, which the machine's load does not change
        finally:
            browser.close()

    assert rows == 2, f"the runs table should have gained a row; status: {status!r}"
    # The clicked run is the baseline's config: compared with it, the row reads as this machine's noise floor.
    assert speedup[1].startswith("same config:"), speedup
    assert "finished" in status, status
    # "Use in my code" names the best run and writes it as a plain-PyTorch loop, then as TrainingArguments.
    assert recipes["button"].startswith("Use #") and recipes["button"].endswith("in my code"), recipes
    assert "def train(model, dataset, loss_fn, make_optimizer, steps" in recipes["pytorch"], recipes
    assert "import accel_widgets" not in recipes["pytorch"] and "from accel_widgets" not in recipes["pytorch"]
    assert "TrainingArguments(" in recipes["hf"], recipes
    assert points(traces, 1, "step") > 0, traces
    assert points(traces, 1, "util") > 0, traces
    rate = (len(updates) - 1) / (updates[-1][0] - updates[0][0]) if len(updates) > 1 else 0.0
    (ARTIFACTS / "browser_update_rate.json").write_text(json.dumps({"updates": updates, "rate_hz": rate}))
    # A CPU burst fills every core: the page shows its warm-up live, then holds still while the window measures
    # (saying so on the chart), and draws the window once it has ended.
    held = [count for _, count, holding in updates if holding]
    assert held and len(set(held)) == 1, f"the chart must hold still while the window measures, saw {updates}"
    assert updates[-1][1] > held[0] and not updates[-1][2], f"the window is drawn when it ends, saw {updates}"
    # The chart takes its box's width, in a wide window and a narrow one; the table never scrolls: it folds columns.
    for widths in (wide, narrow):
        assert widths["fits"], widths
        assert widths["runs"] <= widths["runs_room"] <= widths["panel"], widths
    assert narrow["panel"] < wide["panel"], (narrow, wide)
    # Beside the file browser every control is whole, in each family of knobs (the folded ones unfolded).
    for where, problems in layout.items():
        assert problems == [], f"{where}:\n" + "\n".join(problems)
    # Live: the toggle ran the settings; an edit in the browser replaced that run; after Pin, an edit added one.
    assert live["rows"] == [3, 3, 4], live
    assert "batch 32" in live["tables"][1] and "batch 16" in live["tables"][2], live
    assert "batch 32" in live["tables"][2], "the pinned live run must stay"
    # A view created later (page reload) must draw the same runs from the widget state, not an empty chart.
    for run in (0, 1):
        for kind in ("step", "util"):
            assert points(reloaded, run, kind) == points(traces, run, kind), (run, kind)


def test_the_panel_lays_out_whole_in_notebook_7(tmp_path: Path) -> None:
    """Notebook 7 (``jupyter notebook``) draws the panel in its own page: the same layout checks, 1400 px wide."""
    pytest.importorskip("notebook", minversion="7")
    from playwright.sync_api import sync_playwright

    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    write_notebook(root / "panel.ipynb", NOTEBOOK_CELLS[:1])
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyter_lab(root, home, app="notebook") as (base, token), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": LAYOUT_WIDTHS[0], "height": VIEWPORT["height"]})
            page.goto(f"{base}/notebooks/panel.ipynb?token={token}")
            page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=200)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_selector(".aw-panel .aw-run-burst", timeout=KERNEL_READY_MS)
            page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=200)
            problems = layout_problems(page)
            page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / f"notebook7-{LAYOUT_WIDTHS[0]}.png"))
        finally:
            browser.close()
    assert problems == [], "\n".join(problems)


def narrow_layout(page: Page) -> dict[str, float]:
    """Look at the panel in a 1000 px window, side bars closed: how wide its parts are next to the room they have."""
    page.set_viewport_size({"width": NARROW_WIDTH, "height": VIEWPORT["height"]})
    page.wait_for_function(f"() => ({JS_WIDTHS})().panel < {NARROW_WIDTH} && ({JS_WIDTHS})().fits",
                           timeout=10_000, polling=100)
    page.wait_for_timeout(300)  # the relayout's redraw
    return page.evaluate(JS_WIDTHS)


def layout_problems(page: Page) -> list[str]:
    """What is clipped or overlapping in the panel, once the kernel's relayout for this width has come back: with
    each family of knobs open in turn, its folded knobs unfolded, the first family open again at the end."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.wait_for_timeout(400)  # the probe reports a width 150 ms after the last resize
    page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=100)
    problems = []
    families = page.evaluate(JS_FAMILIES)
    for family in families:
        page.evaluate(JS_OPEN_FAMILY, family)
        page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=50)
        if page.evaluate(JS_OPEN_FOLD):
            page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=50)
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function(f"() => ({JS_LAYOUT})().length === 0", timeout=LAYOUT_SETTLE_MS, polling=100)
        problems += [f"{family}: {problem}" for problem in page.evaluate(JS_LAYOUT)]
    page.evaluate(JS_OPEN_FAMILY, families[0])
    page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=50)
    return problems


def runs_table_problems(page: Page) -> list[str]:
    """The runs table never scrolls sideways: it folds its least important columns instead."""
    widths = page.evaluate(JS_WIDTHS)
    if widths["runs"] <= widths["runs_room"]:
        return []
    return [f"the runs table needs {widths['runs']} px and has {widths['runs_room']} px: it scrolls"]


def layout_beside_file_browser(page: Page) -> dict[str, list[str]]:
    """Open JupyterLab's file browser and check the panel's layout at each of LAYOUT_WIDTHS, saving
    panel-<width>.png and one shot of the whole window."""
    page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
    page.wait_for_selector("#filebrowser", state="visible")
    problems = {}
    for width in LAYOUT_WIDTHS:
        page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
        problems[f"{width} px, file browser open"] = layout_problems(page) + runs_table_problems(page)
        page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / f"panel-{width}.png"))
        if width == LAYOUT_WIDTHS[0]:
            page.screenshot(path=str(ARTIFACTS / f"jupyterlab-{width}-file-browser.png"))
    page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
    page.set_viewport_size(VIEWPORT)
    return problems


def live_mode(page: Page) -> dict[str, list]:
    """Turn Live on with its button, type a batch size into its box, pin, type another: the rows and the
    table's text after each live run has finished."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    assert page.evaluate(JS_EXECUTE, "panel.length_unit.value = 'steps'; panel.length_value.value = 10") == "ok"
    batch_size = page.locator(".aw-knob", has=page.locator(".aw-knob-name", has_text="batch_size")).locator("input")
    seen: dict[str, list] = {"rows": [], "tables": []}

    def after_live_run(action: Callable[[], None], running: str) -> None:
        """Do ``action`` and wait for the live run it starts to finish and join the table as ``running``."""
        action()
        try:
            page.wait_for_function(f"() => ({JS_STATUS})().includes('Live finished') && "
                                   f"document.querySelector('.aw-runs').innerText.includes('{running}')",
                                   timeout=60_000, polling=100)
        except PlaywrightTimeout:
            page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / "panel-live-failed.png"))
            raise AssertionError(f"no live run of {running!r}; the status reads {page.evaluate(JS_STATUS)!r}") from None
        seen["rows"].append(page.evaluate(JS_ROWS))
        seen["tables"].append(page.evaluate("() => document.querySelector('.aw-runs').innerText"))

    after_live_run(lambda: page.locator(".aw-live").click(), "live (baseline)")
    def type_batch_size(value: str) -> None:
        batch_size.fill(value)
        batch_size.press("Enter")  # a text box sends its value on Enter or when it loses focus

    after_live_run(lambda: type_batch_size("32"), "live: batch 32")
    page.locator(".aw-pin").click()
    after_live_run(lambda: type_batch_size("16"), "live: batch 16")
    page.locator(".aw-live").click()
    page.locator(".aw-panel").screenshot(path=str(ARTIFACTS / "panel-live.png"))
    return seen


def traces_after_reload(page: Page) -> list[dict]:
    """Save, reload the page and read the figure again: the restored view is built from widget state alone."""
    save_and_reload(page)
    page.wait_for_function(JS_KERNEL_IDLE, timeout=KERNEL_READY_MS, polling=200)
    page.wait_for_function(f"() => ({JS_TIMELINE})() !== null && ({JS_ROWS})() === 2", timeout=60_000, polling=200)
    page.wait_for_function(f"() => Object.keys(({JS_TIMELINE})()).length === 2", timeout=10_000, polling=200)
    return page.evaluate(JS_TIMELINE)


def settled_timeline(page: Page, timeout_s: float = 10.0) -> dict:
    """What the timeline draws once the finished run has replaced its streamed points (the page draws at most
    once a second): two reads 1.5 s apart that agree."""
    deadline = time.monotonic() + timeout_s
    drawn = page.evaluate(JS_TIMELINE)
    while time.monotonic() < deadline:
        page.wait_for_timeout(1_500)
        again = page.evaluate(JS_TIMELINE)
        if again == drawn:
            return drawn
        drawn = again
    raise AssertionError(f"the timeline kept changing: {drawn}")


JS_TIMELINE_LABEL = """() => {
  const canvas = document.querySelector('.aw-plots canvas');
  return canvas ? canvas.getAttribute('aria-label') || '' : '';
}"""


def watch_live_updates(page: Page, run: int, timeout_s: float = 120.0) -> list[tuple[float, int, bool]]:
    """Poll what the live chart says it draws while the burst runs: (time, points of ``run``, whether it says the
    measured window is drawn when it ends) at each change, until the run has its row and the chart has drawn it (the
    chart draws at most once a second, so its last drawing may follow the row by up to ``CHART_DRAW_S``)."""
    seen: list[tuple[float, int, bool]] = []
    started, finished = time.monotonic(), None
    while time.monotonic() - started < timeout_s:
        count = points(page.evaluate(JS_TIMELINE), run, "step") + points(page.evaluate(JS_TIMELINE), run, "util")
        held = "drawn when they end" in page.evaluate(JS_TIMELINE_LABEL)
        if count and (not seen or (count, held) != seen[-1][1:]):
            seen.append((round(time.monotonic() - started, 3), count, held))
        if finished is None and page.evaluate(JS_ROWS) > run:
            finished = time.monotonic()
        if finished is not None and ((seen and not seen[-1][2]) or time.monotonic() - finished > CHART_DRAW_S):
            return seen
        page.wait_for_timeout(50)
    raise AssertionError(f"the burst did not finish within {timeout_s:.0f} s; updates seen: {seen}")
