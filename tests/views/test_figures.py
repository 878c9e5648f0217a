"""accel_widgets.views.figures on hand-built results: the numbers each figure plots, found by trace ``meta``."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from accel_widgets.analysis.compare import comparison_rows
from accel_widgets.knobs.config import Config
from accel_widgets.results.burst import BurstResult, RankSummary, StepRecord, TelemetrySample
from accel_widgets.results.comparison import Block, Comparison
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
from tests.panel.fakes import synthetic_result

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


def compared(subject: Config, blocks: Sequence[tuple[float, float, float, float]], *, left_out: str = "",
             **fields: Any) -> Comparison:
    """``subject`` against the baseline as :func:`accel_widgets.compare` leaves it: per entry of ``blocks`` one block
    of four windows (the baseline's two samples/s, then the subject's two), each a synthetic 10-step burst at that
    rate."""
    reference = Config()
    windows = [synthetic_result(config, steps=10, step_s=32 / rate)
               for a1, a2, b1, b2 in blocks for config, rate in ((reference, a1), (reference, a2), (subject, b1),
                                                                 (subject, b2))]
    return Comparison(reference, subject, 0.05, windows=windows,
                      blocks=[Block((4 * k, 4 * k + 1), (4 * k + 2, 4 * k + 3), left_out) for k in range(len(blocks))],
                      **fields)


LOADER = Config(num_workers=2, persistent_workers=True)
FASTER = [(1000, 1000, 1500, 1500), (1000, 1000, 1520, 1520), (1000, 1000, 1480, 1480), (1000, 1000, 1510, 1510)]
SAME = [(1000, 1000, 1000, 1000), (1000, 1000, 1005, 1005), (1000, 1000, 995, 995), (1000, 1000, 1002, 1002)]
# The same config drifting: window ratios 0.91 ... 1.24, the spread a lone ratio is read against.
FLOOR = [(1000, 1000, 910, 1100), (1000, 1000, 1240, 1000), (1000, 1000, 960, 1050), (1000, 1000, 1000, 980)]


def test_a_lesson_reads_its_comparison_as_an_interval_and_a_verdict() -> None:
    faster = Lesson("Data loading", (3.0, 5.0), "3-5×", compared(LOADER, FASTER))
    found = faster.speedup()
    assert found is not None and found.bounded and faster.comparison is not None
    assert faster.comparison.verdict == "faster" and found.low > 1.4 and found.ratio == pytest.approx(1.5025, rel=1e-3)
    assert faster.headline() == f"{found.ratio:.2f}× [{found.low:.2f}–{found.high:.2f}], faster"
    same = Lesson("Batch", (1.0, 1.0), "1×", compared(Config(grad_accum_steps=2), SAME))
    interval = same.speedup()
    assert interval is not None
    low, high = interval.low, interval.high
    bound = math.ceil(round(max(high - 1, 1 - low) * 100, 6))
    assert same.headline() == f"no measurable effect here (within ±{bound}%)" and bound <= 5
    few = Lesson("System", (1.1, 1.3), "1.1-1.3×", compared(Config(channels_last=True), FASTER[:2]))
    unbounded = few.speedup()
    assert unbounded is not None and not unbounded.bounded and unbounded.ratio == pytest.approx(1.51, rel=1e-2)
    assert few.headline().endswith("(too few blocks for an interval), undecided")
    assert faster.noise_floor() is None and same.noise_floor() is None


def test_the_noise_floor_lesson_reads_the_burst_to_burst_range() -> None:
    floor = Lesson("The noise floor", (1.0, 1.0), "1×", compared(Config(), FLOOR))
    assert floor.noise_floor() == pytest.approx((0.91, 1.24))
    assert floor.headline().startswith("this machine moves the same config 0.91–1.24× from burst to burst (")
    assert floor.speedup() is not None


def test_a_lesson_without_a_counted_block_says_why_and_has_no_speedup() -> None:
    skipped = Lesson("Parallel", (1.8, 2.0), "2×")
    assert skipped.speedup() is None and skipped.headline() == "not measured here" and skipped.bursts() == ([], [])
    firsts = [synthetic_result(Config(), step_s=0.032), synthetic_result(LOADER, step_s=0.02)]
    budget = "budget: 4.2 s of 2 s used, and another block would not fit"
    short = Lesson("Data loading", (3.0, 5.0), "3-5×", Comparison(Config(), LOADER, 0.05, firsts=firsts,
                                                                  stopped=budget))
    assert short.speedup() is None and short.headline() == f"undecided: no block counted ({budget})"
    assert short.bursts() == ([firsts[0]], [firsts[1]])  # the first bursts, the baseline's first
    loaded = Lesson("Data loading", (3.0, 5.0), "3-5×", compared(LOADER, FASTER[:1], left_out="other load took 60%"))
    assert loaded.speedup() is None
    assert loaded.headline() == "undecided: no block counted (1 left out: other load took 60%)"
    failed = Lesson("Parallel", (1.8, 2.0), "2×", compared(Config(parallel="ddp", world_size=2), FASTER,
                                                           error="RuntimeError: boom"))
    assert failed.speedup() is None and failed.headline() == "not compared (RuntimeError: boom)"


def test_folklore_figure_draws_each_interval_its_verdict_and_the_noise_floor() -> None:
    lessons = [Lesson("The noise floor", (1.0, 1.0), "1×", compared(Config(), FLOOR)),
               Lesson("Data loading", (3.0, 5.0), "3-5×", compared(LOADER, FASTER)),
               Lesson("Batch", (1.0, 1.0), "1×", compared(Config(grad_accum_steps=2), SAME)),
               Lesson("Parallel", (1.8, 2.0), "2×")]
    figure = folklore_figure(lessons)
    (band,), (point,), (unmeasured,) = (_traces(figure, k) for k in ("folklore", "measured", "unmeasured"))
    assert list(band.base) == [1.0, 3.0, 1.0, 1.8] and band.x[1] == pytest.approx(2.0) and band.x[0] > 0
    intervals = [found for lesson in lessons[:3] if (found := lesson.speedup()) is not None]
    assert list(point.y) == ["The noise floor", "Data loading", "Batch"]
    assert len(intervals) == 3 and list(point.x) == pytest.approx([i.ratio for i in intervals])
    assert list(point.error_x.array) == pytest.approx([i.high - i.ratio for i in intervals])
    assert list(point.error_x.arrayminus) == pytest.approx([i.ratio - i.low for i in intervals])
    assert point.error_x.symmetric is False and all(e > 0 for e in point.error_x.array)
    verdicts = [lesson.comparison.verdict for lesson in lessons[:3] if lesson.comparison is not None]
    assert point.meta["verdicts"] == verdicts and verdicts[1:] == ["faster", "same"]
    assert point.text[1] == f"{intervals[1].ratio:.2f}× faster" and point.text[2].startswith("same ±")
    assert list(point.customdata) == [lesson.headline() for lesson in lessons[:3]]  # the hover says it all
    assert list(unmeasured.y) == ["Parallel"] and list(unmeasured.text) == ["skipped here"]
    (floor,) = [shape for shape in figure.layout.shapes if shape.type == "rect"]
    assert (floor.x0, floor.x1) == pytest.approx((0.91, 1.24)) and floor.showlegend
    assert floor.name == "noise floor: the same config 0.91–1.24× burst to burst"
    assert figure.layout.xaxis.type == "log"
    low, high = (10 ** x for x in figure.layout.xaxis.range)
    assert low < 0.91 and high > 5.0


def test_folklore_figure_without_a_noise_floor_or_a_bounded_interval() -> None:
    few = Lesson("System", (1.1, 1.3), "1.1-1.3×", compared(Config(channels_last=True), FASTER[:2]))
    failed = Lesson("Parallel", (1.8, 2.0), "2×", compared(Config(parallel="ddp", world_size=2), FASTER,
                                                           error="RuntimeError: boom"))
    figure = folklore_figure([few, failed])
    (point,), (unmeasured,) = _traces(figure, "measured"), _traces(figure, "unmeasured")
    assert list(point.error_x.array) == [0.0] and list(point.error_x.arrayminus) == [0.0]  # no interval to draw
    assert point.meta["verdicts"] == ["undecided"] and point.text[0].endswith("× undecided")
    assert list(unmeasured.text) == ["not compared"]
    assert [shape.type for shape in figure.layout.shapes] == ["line"]  # the 1× line, no noise band


def test_step_distributions_pool_every_burst_of_each_side() -> None:
    loader = compared(LOADER, FASTER)
    firsts = [synthetic_result(Config(), steps=12, step_s=0.032), synthetic_result(LOADER, steps=8, step_s=0.02)]
    short = Comparison(Config(), LOADER, 0.05, firsts=firsts, stopped="budget")
    figure = step_distributions([Lesson("Data loading", (3, 5), "3-5×", loader),
                                 Lesson("System", (1.1, 1.3), "1.1-1.3×", short),
                                 Lesson("Batch", (1, 1), "1×")])
    (before,), (after,) = _traces(figure, "baseline_steps"), _traces(figure, "lesson_steps")
    assert list(before.x) == ["Data loading"] * 80 + ["System"] * 12  # 4 blocks of two 10-step bursts, one first
    assert list(after.x) == ["Data loading"] * 80 + ["System"] * 8
    assert list(after.y) == pytest.approx([t * 1e3 for w in loader.subject_windows for t in w.step_times()]
                                          + [t * 1e3 for t in firsts[1].step_times()])
    assert figure.layout.boxmode == "group" and figure.layout.yaxis.type == "log"
