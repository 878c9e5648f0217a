"""The panel's widget-free logic: control kinds, per-value notes, validation, layout, batching and progress."""

from __future__ import annotations

import pytest

from accel_widgets import KNOBS, Config
from accel_widgets.panel import state
from tests.panel.fakes import CPU, GPU1, step_record


def test_each_knob_gets_the_input_its_values_need() -> None:
    kinds = {name: state.control_kind(knob) for name, knob in KNOBS.items()}
    assert kinds["pin_memory"] == "bool"
    assert kinds["precision"] == "choice"
    assert kinds["num_workers"] == "int"
    assert kinds["batch_size"] == "optional" and kinds["memory_fraction"] == "optional"


def test_value_notes_judge_one_value_against_the_baseline() -> None:
    assert state.value_note("num_workers", 2, CPU) is None
    fp16 = state.value_note("precision", "fp16", CPU)
    assert fp16 is not None and fp16.severity == "warning" and "no fp16 units" in fp16.message
    dataparallel = state.value_note("parallel", "dataparallel", CPU)
    assert dataparallel is not None and dataparallel.severity == "error"
    assert state.value_note("precision", "fp16", GPU1) is None
    assert state.choice_notes(KNOBS["parallel"], CPU).keys() == {"dataparallel"}
    assert state.choice_label("fp16", fp16) == "fp16 ⚠" and state.choice_label("fp32", None) == "fp32"


def test_validate_turns_bad_values_and_rules_into_an_error() -> None:
    config, ok = state.validate(lambda: Config(precision="fp16"), CPU)
    assert config == Config(precision="fp16") and ok.ok and ok.warnings
    _, rule = state.validate(lambda: Config(parallel="dataparallel"), CPU)
    assert not rule.ok and "2 GPUs" in (rule.error or "")
    config, typed = state.validate(lambda: Config(num_workers=-1), CPU)
    assert config is None and "num_workers" in (typed.error or "")


def test_balanced_columns_keep_the_order_and_even_out_heights() -> None:
    assert state.balanced_columns([8, 3, 2, 2, 5, 6, 3], 3) == [[0, 1], [2, 3, 4], [5, 6]]
    assert state.balanced_columns([1, 1], 3) == [[0], [1]]
    parts = state.balanced_columns([1.0] * 7, 3)
    assert [i for part in parts for i in part] == list(range(7)) and len(parts) == 3


def test_length_kwargs_pick_steps_or_seconds() -> None:
    assert state.length_kwargs("steps", 12.4) == {"steps": 12, "seconds": None}
    assert state.length_kwargs("seconds", 2.5) == {"steps": None, "seconds": 2.5}
    with pytest.raises(ValueError, match="unit"):
        state.length_kwargs("minutes", 1)


def test_row_title_puts_a_rung_name_before_its_changes() -> None:
    assert state.row_title({"label": "", "changes": "num_workers=2"}) == "num_workers=2"
    assert state.row_title({"label": "+loader", "changes": "num_workers=2"}) == "+loader: num_workers=2"
    assert state.row_title({"label": "num_workers=2", "changes": "baseline"}) == "num_workers=2 (baseline)"


def test_the_batcher_flushes_on_its_interval_not_per_event() -> None:
    now = [0.0]
    batcher = state.EventBatcher(interval_s=0.25, clock=lambda: now[0])
    assert not batcher.add(step_record(0, 0))
    now[0] = 0.1
    assert not batcher.add(step_record(0, 1))
    now[0] = 0.3
    assert batcher.add(step_record(0, 2))
    batch = batcher.take()
    assert [s.step for s in batch.steps] == [0, 1, 2] and not batch.samples
    assert not batcher.add(step_record(0, 3)) and not state.Batch()


def test_progress_counts_measured_steps_of_rank_zero_only() -> None:
    tracker = state.ProgressTracker(steps=4, seconds=None)
    assert tracker.describe() == "starting the workers"
    tracker.observe([step_record(0, 0, warmup=True), step_record(1, 0, warmup=True)])
    assert tracker.fraction == 0 and tracker.describe() == "warm-up step 1 done"
    tracker.observe([step_record(0, 1), step_record(1, 1), step_record(0, 2)])
    assert tracker.fraction == 0.5 and tracker.describe() == "step 2/4"
    timed = state.ProgressTracker(steps=None, seconds=1.0)
    timed.observe([step_record(0, s, step_s=0.1) for s in range(1, 6)])
    assert timed.fraction == pytest.approx(0.5) and timed.describe().startswith("0.5 s of 1 s")
