"""accel_widgets.views.figures on hand-built results: the numbers each figure plots, found by trace ``meta``."""

from __future__ import annotations

import itertools
import math
import random
from typing import TYPE_CHECKING, Any

import pytest

from accel_widgets.analysis.compare import comparison_rows
from accel_widgets.knobs.config import Config
from accel_widgets.results.burst import BurstResult, RankSummary, StepRecord, TelemetrySample
from accel_widgets.views.figures import (
    NOISY_MARK,
    NOISY_PATTERN,
    Lesson,
    breakdown_figure,
    by_workload,
    folklore_figure,
    ladder,
    speedup_figure,
    speedup_whiskers,
    step_distributions,
    utilisation_figure,
    waterfall_figure,
)
from accel_widgets.views.style import run_colour
from tests.measured import as_measured

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

MIB = 2**20
BATCH = 64


def burst(workload: str, config: Config, label: str, *, step_ms: float, data_share: float, jitter: float = 0.02,
          warmup_ms: tuple[float, ...] = (3.0,), util: float = 60.0, steps: int = 30, seed: int = 0) -> BurstResult:
    """A finished burst as the engine returns it: ``steps`` measured steps of about ``step_ms`` (± ``jitter``,
    uniform, deterministic), a ``data_share`` of each waiting for data and 5% copying, warm-up steps of
    ``warmup_ms`` (a compile step is a long one), and telemetry around ``util`` % every 0.1 s."""
    rng = random.Random(seed)
    records, t = [], 1.0
    for step, ms in enumerate(warmup_ms):
        t += ms / 1e3
        records.append(StepRecord(0, step, t, 0.0, 0.0, ms / 1e3, ms / 1e3, BATCH, loss=2 / (step + 2), warmup=True))
    for i in range(steps):
        total = step_ms * (1 + jitter * rng.uniform(-1, 1)) / 1e3
        t += total
        step = len(warmup_ms) + i  # the same loss at the same step in every run: the guard sees one training
        records.append(StepRecord(0, step, t, total * data_share, total * 0.05, total * (0.95 - data_share), total,
                                  BATCH, loss=2 / (step + 2)))
    measured_s = sum(s.total_s for s in records if not s.warmup)
    telemetry = [TelemetrySample(t=1.0 + 0.1 * i, source="psutil", device="cpu", mem_used_bytes=512 * MIB,
                                 util_pct=max(0.0, min(100.0, util + rng.gauss(0, 8))))
                 for i in range(int((t - 1.0) / 0.1) + 2)]
    summary = RankSummary(0, BATCH * steps, measured_s, 600 * MIB, "rss", 0.4, warmup_ms[0] / 1e3, "cpu")
    return as_measured(BurstResult(workload=workload, config=config, status="ok", warmup_steps=len(warmup_ms),
                                   steps=records, telemetry=telemetry, ranks=[summary], label=label,
                                   environment={"torch": "2.13.0", "device_kind": "cpu", "cpu_count": 2}))


def realistic_runs() -> list[BurstResult]:
    """Two workloads ~300x apart in step time, a ladder each: a data-bound CNN whose bf16 rung is noisy and whose
    compile rung spends 30 s compiling, and a tiny MLP whose loader rung makes it slower."""
    loader = {"num_workers": 2, "persistent_workers": True}
    cnn = [
        burst("image-cnn", Config(), "baseline", step_ms=42.0, data_share=0.6, util=35, seed=1),
        burst("image-cnn", Config(**loader), "+loader", step_ms=18.0, data_share=0.1, util=80, seed=2),
        burst("image-cnn", Config(**loader, precision="bf16"), "+bf16", step_ms=16.0, data_share=0.1, jitter=0.45,
              util=75, seed=3),
        burst("image-cnn", Config(**loader, precision="bf16", compile_mode="default"), "+compile", step_ms=12.0,
              data_share=0.12, warmup_ms=(30_000.0, 850.0), util=85, seed=4),
        burst("image-cnn", Config(**loader, precision="bf16", compile_mode="default", optimizer_impl="fused"),
              "+rest", step_ms=11.0, data_share=0.13, warmup_ms=(28_000.0, 700.0), util=88, seed=5),
    ]
    mlp = [
        burst("tabular-mlp", Config(), "baseline", step_ms=0.14, data_share=0.3, util=50, seed=6),
        burst("tabular-mlp", Config(**loader), "+loader", step_ms=0.2, data_share=0.5, util=45, seed=7),
        burst("tabular-mlp", Config(**loader, compile_mode="default"), "+compile", step_ms=0.09, data_share=0.4,
              warmup_ms=(12_000.0, 40.0), util=60, seed=8),
    ]
    return cnn + mlp


@pytest.fixture()
def runs() -> list[BurstResult]:
    return realistic_runs()


def _traces(figure: Figure, kind: str) -> list[Any]:
    return [t for t in figure.data if isinstance(t.meta, dict) and t.meta.get("kind") == kind]


def test_groups_keep_run_order_with_the_baseline_first() -> None:
    rows = comparison_rows([burst("a", Config(num_workers=2), "fast", step_ms=5, data_share=0.1),
                            burst("b", Config(), "base", step_ms=5, data_share=0.1),
                            burst("a", Config(), "base", step_ms=10, data_share=0.1)])
    groups = by_workload(rows)
    assert list(groups) == ["a", "b"] and [r["run"] for r in groups["a"]] == [0, 2]
    assert [r["run"] for r in ladder(groups["a"])] == [2, 0]  # the baseline leads the ladder


def test_speedup_whiskers_are_the_comparisons_interval_and_a_lone_ratio_has_none() -> None:
    compared = {"run": 1, "speedup": 1.2, "speedup_interval": (1.1, 1.35)}
    assert speedup_whiskers(compared) == pytest.approx((0.1, 0.15))
    assert speedup_whiskers({"run": 1, "speedup": 1.2, "speedup_interval": None}) == (0.0, 0.0)  # one burst
    assert speedup_whiskers({"run": 1, "speedup": None, "speedup_interval": None}) == (0.0, 0.0)


def test_speedup_bars_one_facet_per_workload_with_noise_marked(runs: list[BurstResult]) -> None:
    rows = comparison_rows(runs)
    figure = speedup_figure(rows)
    cnn, mlp = _traces(figure, "speedup")
    assert (cnn.meta["workload"], mlp.meta["workload"]) == ("image-cnn", "tabular-mlp")
    assert cnn.meta["runs"] == [0, 1, 2, 3, 4] and mlp.meta["runs"] == [5, 6, 7]
    assert (cnn.yaxis, mlp.yaxis) == ("y", "y2")  # facets, one x axis shared
    assert list(cnn.x) == pytest.approx([rows[i]["speedup"] for i in range(5)])
    assert cnn.x[0] == pytest.approx(1.0) and cnn.x[1] == pytest.approx(42 / 18, rel=0.03)
    assert list(cnn.error_x.array) == [0.0] * 5  # one burst each: no interval to draw
    assert all(text.startswith(f"{rows[i]['speedup']:.2f}×") for i, text in enumerate(cnn.text))
    assert cnn.meta["noisy"] == [False, False, True, False, False]
    assert list(cnn.marker.pattern.shape) == ["", "", NOISY_PATTERN, "", ""]
    assert cnn.text[2].endswith(NOISY_MARK) and NOISY_MARK not in cnn.text[1]
    assert list(cnn.marker.color) == [run_colour(i) for i in range(5)]
    assert [a.text for a in figure.layout.annotations] == ["image-cnn", "tabular-mlp"]
    assert [s.x0 for s in figure.layout.shapes] == [1.0, 1.0]  # the 1× line in each facet


def test_speedup_bars_of_one_workload_without_runs() -> None:
    assert len(_traces(speedup_figure(comparison_rows(realistic_runs()[5:])), "speedup")) == 1
    assert _traces(speedup_figure([]), "speedup") == []


def test_waterfall_steps_sum_to_the_last_runs_speedup(runs: list[BurstResult]) -> None:
    rows = comparison_rows(runs)
    cnn, mlp = _traces(waterfall_figure(rows), "waterfall")
    speedups = [rows[i]["speedup"] for i in range(5)]
    assert list(cnn.measure) == ["absolute", "relative", "relative", "relative", "relative", "total"]
    assert list(cnn.x[:5]) == pytest.approx([1.0, *(b - a for a, b in itertools.pairwise(speedups))])
    assert sum(cnn.x[:5]) == pytest.approx(speedups[-1])
    assert cnn.text[-1] == f"{speedups[-1]:.2f}×" and cnn.y[-1] == "= final"
    assert cnn.customdata[2] == pytest.approx(speedups[2] / speedups[1])  # the rung's own samples/s ratio
    assert mlp.meta["runs"] == [5, 6, 7] and mlp.x[1] < 0  # the loader rung slowed the MLP


def test_breakdown_is_shares_of_the_median_step_with_ms_on_hover(runs: list[BurstResult]) -> None:
    figure = breakdown_figure(runs, comparison_rows(runs))
    data, h2d, compute = (_traces(figure, kind)[0] for kind in ("data_s", "h2d_s", "compute_s"))
    assert data.meta["runs"] == list(range(8)) and data.orientation == "h"
    for i in range(8):
        assert data.x[i] + h2d.x[i] + compute.x[i] == pytest.approx(100.0)
    assert data.x[0] == pytest.approx(60.0) and h2d.x[0] == pytest.approx(5.0)
    median_ms = sorted(s.total_s for s in runs[0].measured_steps())[15] * 1e3
    assert data.customdata[0] == pytest.approx(0.6 * median_ms, rel=0.03)  # ms on hover
    assert data.y[0] == "#0 image-cnn: baseline" and data.y[5] == "#5 tabular-mlp: baseline"
    assert figure.layout.barmode == "stack" and list(figure.layout.xaxis.range) == [0, 100]


def test_utilisation_small_multiples_one_panel_per_run(runs: list[BurstResult]) -> None:
    figure = utilisation_figure(runs, comparison_rows(runs))
    util = _traces(figure, "util")
    assert [t.meta["run"] for t in util] == list(range(8))
    assert len({(t.xaxis, t.yaxis) for t in util}) == 8  # a panel each
    assert all(figure.layout[key].range == (0, 105) for key in figure.layout if key.startswith("yaxis"))
    assert list(util[0].y) == pytest.approx([s.util_pct for s in runs[0].telemetry])
    titles = [a.text for a in figure.layout.annotations]
    assert titles[0].startswith("#0 image-cnn: baseline · mean ") and len(titles) == 8


def test_folklore_band_point_and_skipped_lesson() -> None:
    base = burst("w", Config(), "baseline", step_ms=10.0, data_share=0.5, jitter=0.1)
    loader = burst("w", Config(num_workers=2), "+num_workers", step_ms=8.0, data_share=0.1, jitter=0.1, seed=1)
    lessons = [Lesson("Data loading", (3.0, 5.0), "3-5×", base, loader),
               Lesson("Batch", (1.0, 1.0), "1×", base, None)]
    figure = folklore_figure(lessons)
    (band,), (point,), (skipped,) = (_traces(figure, k) for k in ("folklore", "measured", "skipped"))
    assert list(band.base) == [3.0, 1.0] and band.x[0] == pytest.approx(2.0) and band.x[1] > 0  # 1× still shows
    speedup, error = lessons[0].speedup() or (0.0, 0.0)
    assert speedup == pytest.approx(loader.samples_per_s / base.samples_per_s)
    spreads = [r.step_time.relative_iqr / 2 for r in (loader, base) if r.step_time]
    assert error == pytest.approx(speedup * math.hypot(*spreads)) and error > 0
    assert list(point.x) == pytest.approx([speedup]) and list(point.error_x.array) == pytest.approx([error])
    assert list(skipped.y) == ["Batch"] and lessons[1].speedup() is None
    assert figure.layout.xaxis.type == "log"


def test_step_distributions_two_boxes_per_measured_lesson() -> None:
    base = burst("w", Config(), "baseline", step_ms=10.0, data_share=0.5, steps=12)
    fast = burst("w", Config(num_workers=2), "+num_workers", step_ms=6.0, data_share=0.1, steps=10)
    figure = step_distributions([Lesson("Data loading", (3, 5), "3-5×", base, fast),
                                 Lesson("Batch", (1, 1), "1×", base, None)])
    (before,), (after,) = _traces(figure, "baseline_steps"), _traces(figure, "lesson_steps")
    assert list(before.x) == ["Data loading"] * 12 and list(after.x) == ["Data loading"] * 10
    assert list(after.y) == pytest.approx([t * 1e3 for t in fast.step_times()])
    assert figure.layout.boxmode == "group" and figure.layout.yaxis.type == "log"
