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
from tests.views.comparisons import comparison_of
from tests.views.test_figures import realistic_runs

pytestmark = NEEDS_CHROMIUM

VIEWPORT = {"width": 1300, "height": 1000}
RENDER_MS = 30_000

JS_PLOTS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(div => ({
  id: div.id,
  traces: div.data.length,
  whiskers: div.data.filter(t => t.error_x && t.error_x.array).map(t => [...t.error_x.array]),
  drawn: div.querySelectorAll('.main-svg').length,
  stepRange: div.layout.yaxis2 && div.layout.yaxis2.range,
  stepTitle: div.layout.xaxis2 && div.layout.xaxis2.title && div.layout.xaxis2.title.text,
}))"""


def test_report_renders_every_figure_offline_and_saves_screenshots(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    runs = realistic_runs()
    # The CNN's rungs as the comparison engine left them: +loader faster, +bf16 within noise, +compile faster; the
    # MLP's rungs were never compared (one burst each).
    compared = {1: comparison_of(runs[0].config, runs[1].config, 2.3, seed=1),
                2: comparison_of(runs[0].config, runs[2].config, 1.02, noise=0.01, seed=2),
                3: comparison_of(runs[0].config, runs[3].config, 3.4, noise=0.06, seed=3)}
    figures = build_figures(runs, compared)
    path = write_report(runs, tmp_path / "report.html", title="accel_widgets report: screenshot test",
                        compared=compared)
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
            sentences = page.locator("h2:has-text('Comparisons') + ul li").all_inner_texts()
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
    # The speed-up figure's whiskers are the compared rungs' intervals, drawn in the page; the others have none.
    cnn = next(p for p in plots if p["id"] == "figure-speedup")["whiskers"][0]
    assert cnn[0] == 0 and all(w > 0 for w in cnn[1:4]) and cnn[4] == 0, cnn
    assert len(sentences) == 3 and "faster" in sentences[0] and "no measurable effect" in sentences[1], sentences
