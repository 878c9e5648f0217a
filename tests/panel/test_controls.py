"""The notes under the knob controls follow the current values of every knob, not only of the one edited."""

from __future__ import annotations

import html

import ipywidgets as w

from accel_widgets import KNOBS, Config
from accel_widgets.panel.controls import KnobControls, changed_knobs, only_on_text
from accel_widgets.panel.state import PanelState, rule_notes
from tests.panel.fakes import CPU, GPU1

PREFETCH_NOTE = "only apply with num_workers > 0"
SHOWN_PREFETCH_NOTE = html.escape(PREFETCH_NOTE)


def test_the_prefetch_note_comes_and_goes_with_num_workers() -> None:
    state = PanelState(CPU)
    controls = KnobControls(state.draft, state.edit, w.Button())
    state.subscribe(lambda part: controls.render(state.draft))
    prefetch, workers = controls.controls["prefetch_factor"], controls.controls["num_workers"]

    prefetch.input.value = 4  # with num_workers=0 (the default) prefetching does nothing
    assert SHOWN_PREFETCH_NOTE in prefetch.note.value and prefetch.note.layout.display is None
    assert "⚠" in prefetch.note.value
    assert workers.note.layout.display == "none"  # num_workers is at its default: the edit was prefetch's

    workers.input.value = 2
    assert state.draft.notes["prefetch_factor"] is None
    assert prefetch.note.value == "" and prefetch.note.layout.display == "none"

    workers.input.value = 0  # back to no workers: the note is back, under the knob that does nothing now
    assert SHOWN_PREFETCH_NOTE in prefetch.note.value and prefetch.note.layout.display is None


def test_a_rule_over_two_knobs_updates_both_notes_when_either_changes() -> None:
    state = PanelState(GPU1)
    state.edit("compile_mode", "default")
    state.edit("script_loss", True)
    draft = state.draft
    for name in ("compile_mode", "script_loss"):
        note = draft.notes[name]
        assert note is not None and note.severity == "warning" and "TorchScript adds nothing" in note.message
    state.edit("compile_mode", "off")  # the other knob of the rule: script_loss's note goes too
    assert draft.notes["script_loss"] is None and draft.notes["compile_mode"] is None

    state.edit("deterministic", True)
    state.edit("compile_mode", "max-autotune")
    note = draft.notes["deterministic"]
    assert note is not None and note.severity == "error" and "forbids" in note.message
    assert not draft.validation.ok
    state.edit("compile_mode", "default")
    assert draft.notes["deterministic"] is None and draft.validation.ok


def test_errors_come_first_and_a_typed_error_keeps_the_rules_judging_the_rest() -> None:
    notes = rule_notes(Config(compile_mode="reduce-overhead", grad_accum_steps=2, script_loss=True), GPU1)
    compile_note = notes["compile_mode"]
    assert compile_note.severity == "error"
    assert compile_note.message.index("CUDA graphs") < compile_note.message.index("TorchScript")
    assert set(notes) == {"compile_mode", "grad_accum_steps", "script_loss"}

    state = PanelState(CPU)
    state.edit("prefetch_factor", 4)
    state.edit("batch_size", "many")
    assert state.draft.notes["batch_size"].severity == "error"
    assert PREFETCH_NOTE in state.draft.notes["prefetch_factor"].message
    assert state.draft.notes["pin_memory"].severity == "unavailable"  # off on this CPU, whatever the rules say


def test_a_config_set_from_code_refreshes_every_note() -> None:
    state = PanelState(CPU)
    state.set_config(Config(num_workers=0, persistent_workers=True))
    assert PREFETCH_NOTE in state.draft.notes["persistent_workers"].message
    state.set_config(Config(num_workers=2, persistent_workers=True))
    assert all(note is None or note.severity == "unavailable" for note in state.draft.notes.values())


def test_the_changes_read_short_and_a_half_typed_value_as_typed() -> None:
    state = PanelState(CPU)
    assert changed_knobs(state.draft) == {}
    state.set_config(Config(num_workers=2, pin_memory=True, batch_size=64, set_to_none=False, parallel="fsdp",
                            world_size=2))
    assert changed_knobs(state.draft) == {"batch_size": "batch 64", "num_workers": "workers 2", "pin_memory": "pin",
                                          "set_to_none": "no set_to_none", "parallel": "fsdp", "world_size": "ranks 2"}
    state.edit("batch_size", "6x")
    assert changed_knobs(state.draft)["batch_size"] == "batch '6x'"


def test_the_folded_line_counts_the_knobs_and_names_where_they_act() -> None:
    assert only_on_text([KNOBS["pin_memory"], KNOBS["non_blocking"]]) == "2 knobs act only on CUDA"
    assert only_on_text([KNOBS["float8"]]) == "1 knob acts only on CUDA"
