"""The panel without widgets: its state driven directly, the controller's helpers, and the controls' rules."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from accel_widgets import KNOBS, Config
from accel_widgets.panel.controller import (
    FLUSH_INTERVAL_S,
    Batch,
    EventBatcher,
    ladder_plan,
    length_kwargs,
)
from accel_widgets.panel.controls import choice_label, choice_notes
from accel_widgets.panel.state import Draft, PanelState, control_kind, value_note
from accel_widgets.search.ladder import classic_ladder
from tests.panel.fakes import CPU, GPU1, sample, step_record, synthetic_result
from tests.workloads import tiny_workload


# -- the config being edited -----------------------------------------------------------------------------
def test_each_knob_gets_the_input_its_values_need() -> None:
    kinds = {name: control_kind(knob) for name, knob in KNOBS.items()}
    assert kinds["pin_memory"] == "bool"
    assert kinds["precision"] == "choice"
    assert kinds["num_workers"] == "int"
    assert kinds["batch_size"] == "optional" and kinds["memory_fraction"] == "optional"


def test_value_notes_judge_one_value_against_the_baseline() -> None:
    assert value_note("num_workers", 2, CPU) is None
    fp16 = value_note("precision", "fp16", CPU)
    assert fp16 is not None and fp16.severity == "warning" and "no fp16 units" in fp16.message
    dataparallel = value_note("parallel", "dataparallel", CPU)
    assert dataparallel is not None and dataparallel.severity == "error"
    assert value_note("precision", "fp16", GPU1) is None
    assert choice_notes(KNOBS["parallel"], CPU).keys() == {"dataparallel"}
    assert choice_label("fp16", fp16) == "fp16 ⚠" and choice_label("fp32", None) == "fp32"


def test_the_draft_validates_what_is_typed_and_says_why_a_knob_is_off() -> None:
    draft = Draft(CPU)
    assert draft.config() == Config() and draft.validation.ok
    note = draft.notes["pin_memory"]
    assert note is not None and note.severity == "unavailable" and "only acts on CUDA" in note.message
    assert draft.set("precision", "fp16") and not draft.set("precision", "fp16")  # nothing new the second time
    assert draft.validation.ok and draft.validation.warnings and draft.notes["precision"].severity == "warning"
    draft.set("parallel", "dataparallel")
    assert not draft.validation.ok and "2 GPUs" in (draft.validation.error or "")
    draft.set("parallel", "none")
    draft.set("batch_size", "many")  # half-typed text is kept, and blocks the run
    assert draft.raw["batch_size"] == "many" and "batch_size" in (draft.validation.error or "")
    assert draft.notes["batch_size"].severity == "error"
    draft.set("batch_size", "64")
    assert draft.config() == Config(precision="fp16", batch_size=64) and draft.validation.ok
    assert draft.set_config(Config()) and draft.raw["batch_size"] == "" and draft.config() == Config()


def test_the_state_refuses_to_run_what_cannot_run_here() -> None:
    state = PanelState(CPU)
    parts: list[str] = []
    state.subscribe(parts.append)
    state.edit("parallel", "dataparallel")
    state.edit("parallel", "dataparallel")
    assert parts == ["draft"]  # one change, one redraw
    with pytest.raises(ValueError, match=r"cannot run here.*2 GPUs"):
        state.runnable_config()
    state.set_config(Config(num_workers=2))
    assert state.runnable_config() == Config(num_workers=2)


# -- runs ------------------------------------------------------------------------------------------------
def test_runs_stream_into_the_state_and_are_judged_against_one_baseline() -> None:
    state = PanelState(CPU)
    parts: list[str] = []
    state.subscribe(parts.append)
    first = state.begin_run("baseline", ranks=1)
    state.add_events(first, [step_record(0, 0, warmup=True)], [sample(0.1)])
    assert state.runs[0].name == "#0 baseline" and len(state.runs[0].steps) == 1 and state.results == []
    state.finish_run(first, synthetic_result())
    broken = synthetic_result(Config(precision="bf16"), step_s=0.025)
    broken = replace(broken, steps=[replace(s, loss=math.nan) if s.step > 5 else s for s in broken.steps])
    state.finish_run(state.begin_run("bf16", ranks=1), broken)
    assert parts == ["runs", "points", "runs", "reading", "runs", "runs", "reading"]
    base_row, bf16_row = state.rows
    assert bf16_row.baseline is state.results[0] and bf16_row.values["baseline"] == 0
    assert bf16_row.values["speedup"] == pytest.approx(2.0) and bf16_row.changes_training
    assert state.reading is not None and state.reading.run == 1
    assert "Faster but changes training" in [f.title for f in state.reading.findings]
    assert base_row.verdict.status == "ok"


def test_a_later_plain_run_becomes_the_baseline_of_every_row() -> None:
    """The speed-up and the verdict of a row always refer to the same run, even when that run changes."""
    state = PanelState(CPU)
    state.finish_run(state.begin_run("workers", 1), synthetic_result(Config(num_workers=1), step_s=0.025))
    assert state.rows[0].baseline is state.results[0]
    state.finish_run(state.begin_run("plain", 1), synthetic_result())
    for row in state.rows:
        assert row.baseline is state.results[1] and row.values["baseline"] == 1
    assert state.rows[0].values["speedup"] == pytest.approx(2.0)


def test_hidden_runs_and_loaded_runs() -> None:
    state = PanelState(CPU)
    parts: list[str] = []
    state.subscribe(parts.append)
    state.set_shown(0, False)
    state.set_shown(0, False)
    assert state.hidden == {0} and parts == ["shown"]
    state.add_loaded([("baseline", synthetic_result(), "recorded yesterday")])
    assert state.runs[0].name == "#0 ⟲ baseline" and state.loaded == {0: "recorded yesterday"}
    assert state.runs[0].steps == state.results[0].steps and state.rows[0].loaded == "recorded yesterday"


def test_one_action_at_a_time() -> None:
    state = PanelState(CPU)
    state.begin_action("Burst")
    with pytest.raises(RuntimeError, match="already running"):
        state.begin_action("Ladder")
    state.end_action()
    state.begin_action("Ladder")
    assert state.action == "Ladder" and state.progress == 0.0


# -- the controller's helpers ----------------------------------------------------------------------------
def test_the_ladder_plan_is_the_classic_cumulative_ladder() -> None:
    plan = ladder_plan(tiny_workload(), CPU)
    assert [(item.label, item.config) for item in plan] == [(r.name, r.config)
                                                            for r in classic_ladder(tiny_workload(), CPU)]
    assert [item.label for item in plan][:2] == ["baseline", "+loader"] and plan[0].config == Config()


def test_length_kwargs_pick_steps_or_seconds() -> None:
    assert length_kwargs("steps", 12.4) == {"steps": 12, "seconds": None}
    assert length_kwargs("seconds", 2.5) == {"steps": None, "seconds": 2.5}
    with pytest.raises(ValueError, match="unit"):
        length_kwargs("minutes", 1)


def test_the_batcher_flushes_on_its_interval_not_per_event() -> None:
    batcher = EventBatcher()
    assert not batcher.add(step_record(0, 0))
    assert not batcher.add(step_record(0, 1))
    time.sleep(FLUSH_INTERVAL_S + 0.02)
    assert batcher.add(step_record(0, 2))
    batch = batcher.take()
    assert [s.step for s in batch.steps] == [0, 1, 2] and not batch.samples
    assert not batcher.add(step_record(0, 3)) and not Batch()
