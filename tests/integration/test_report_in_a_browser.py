"""The HTML report in a real browser: every figure renders offline, and screenshots are kept to be looked at.

The report is written from hand-built but realistic results (two workloads ~300x apart in step time, a ladder
each, a noisy rung, compile rungs with a 30 s first step), opened from a file:// URL in Debian's chromium with
networking off, and read back from plotly's own state in the page. The screenshots land in test-artifacts/:
``report.png`` (the whole page) and ``report-<figure>.png`` (one per figure). Skipped without chromium.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_widgets.views.report import build_figures, write_report
from tests.browsers import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, NEEDS_CHROMIUM
from tests.views.test_figures import realistic_runs

pytestmark = NEEDS_CHROMIUM

VIEWPORT = {"width": 1300, "height": 1000}
RENDER_MS = 30_000

JS_PLOTS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(div => ({
  id: div.id,
  traces: div.data.length,
  drawn: div.querySelectorAll('.main-svg').length,
  stepRange: div.layout.yaxis2 && div.layout.yaxis2.range,
  stepTitle: div.layout.xaxis2 && div.layout.xaxis2.title && div.layout.xaxis2.title.text,
}))"""


def test_report_renders_every_figure_offline_and_saves_screenshots(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    runs = realistic_runs()
    figures = build_figures(runs)
    path = write_report(runs, tmp_path / "report.html", title="accel_widgets report: screenshot test")
    ARTIFACTS.mkdir(exist_ok=True)
    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("request", lambda request: requests.append(request.url))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.as_uri())
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                                   f"{2 * len(figures)}", timeout=RENDER_MS)
            plots = page.evaluate(JS_PLOTS)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
            for key in figures:
                page.locator(f"#figure-{key}").screenshot(path=str(ARTIFACTS / f"report-{key}.png"))
        finally:
            browser.close()
    assert errors == []
    assert [url for url in requests if not url.startswith("file://")] == []  # nothing fetched from anywhere
    assert [p["id"] for p in plots] == [f"figure-{key}" for key in figures]
    assert [p["traces"] for p in plots] == [len(figure.data) for figure in figures.values()]
    timeline = next(p for p in plots if p["id"] == "figure-timeline")
    assert timeline["stepRange"] == pytest.approx(list(figures["timeline"].layout.yaxis2.range))
    assert timeline["stepTitle"].startswith("step (▲ 5 warm-up/compile steps above the plot")
    assert all((ARTIFACTS / f"report-{key}.png").stat().st_size > 10_000 for key in figures)
