"""Knob controls generated from the registry: one input, help toggle and note line per knob, by group.

Nothing here knows a knob by name: kinds, ranges, choices, help text and availability all come from
:data:`~accel_widgets.knobs.KNOBS` and the state's :class:`~.state.Draft` (which asks
:func:`~accel_widgets.knobs.rules.check_config`), so a new registry entry shows up in the panel with no code
here. The inputs hold the draft's values: an edit goes to the draft, and :meth:`KnobControls.render` copies
the draft (values and notes) back, so a config set from code shows up in the controls too.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w

from ..inputs.device import DeviceInfo
from ..knobs import GROUP_TITLES, GROUPS, KNOBS, Group, Knob
from ..views.style import COLOURS
from .state import Draft, Note, control_kind, value_note

INPUT_WIDTH = "125px"  # "None (default)" with room to spare; a drop-down grows to its longest choice
INFO_WIDTH = "28px"
COLUMN_PX = 300  # one column of controls with the gap after it: the panel picks how many fit by this
COLUMN_GAP = "10px"
NOTE_STYLE = "font-size: 0.8em; line-height: 1.2; white-space: normal;"
_NOTE_MARKS = {"unavailable": ("", COLOURS["muted"]), "warning": ("⚠ ", COLOURS["warning"]),
               "error": ("✗ ", COLOURS["error"])}


def choice_notes(knob: Knob, device: DeviceInfo) -> dict[Any, Note]:
    """Notes for each choice of a choice knob, to mark impossible or harmful values in its drop-down."""
    notes = {}
    for value in knob.choices or ():
        note = value_note(knob.name, value, device)
        if note is not None:
            notes[value] = note
    return notes


def choice_label(value: Any, note: Note | None) -> str:
    """Drop-down text: the value, marked ✗ when it cannot run here and ⚠ when it runs but hurts."""
    if note is None:
        return str(value)
    return f"{value} {'✗' if note.severity == 'error' else '⚠'}"


def help_text(knob: Knob) -> dict[str, str]:
    """The registry's own explanation, in the order a user reads it."""
    return {"what": knob.what, "why": knob.why, "when": knob.when, "values": knob.valid_values_text()}


def balanced_columns(heights: Sequence[float], columns: int) -> list[list[int]]:
    """Split items, in order, into at most ``columns`` contiguous runs with the smallest tallest run.

    The registry's group order is the tuning order, so groups stay in order; only the breaks move.
    """
    count = len(heights)
    columns = max(1, min(columns, count))
    best: tuple[float, list[list[int]]] | None = None

    def split(start: int, left: int, done: list[list[int]]) -> None:
        nonlocal best
        if left == 1:
            parts = [*done, list(range(start, count))]
            tallest = max(sum(heights[i] for i in part) for part in parts)
            if best is None or tallest < best[0]:
                best = (tallest, parts)
            return
        for end in range(start + 1, count - left + 2):
            split(end, left - 1, [*done, list(range(start, end))])

    split(0, columns, [])
    assert best is not None
    return best[1]


class KnobControl:
    """One knob: the input, an info toggle showing what/why/when, and a line for its note.

    The note shows why the knob is disabled here, or what this machine says about the chosen value
    (⚠ runs but hurts, ✗ cannot run), so a warning sits next to the control that caused it.
    """

    def __init__(self, knob: Knob, draft: Draft, on_edit: Callable[[str, Any], None]) -> None:
        self.knob = knob
        self.input = self._make_input(knob, draft)
        self.input.tooltip = knob.what
        self.input.disabled = not draft.available(knob.name)
        label = w.HTML(f'<span style="white-space: nowrap;">{html.escape(knob.name)}</span>', tooltip=knob.what,
                       layout=w.Layout(flex="0 0 auto"))
        self.info = w.ToggleButton(icon="info", tooltip=f"What {knob.name} does, why and when it helps",
                                   layout=w.Layout(width=INFO_WIDTH, padding="0", flex="0 0 auto"))
        self.help = w.HTML(self._help_html(), layout=w.Layout(display="none", margin="0 0 6px 0"))
        self.note = w.HTML(layout=w.Layout(margin="0 0 4px 0"))
        self.info.observe(self._toggle_help, names="value")
        self.input.observe(lambda change: on_edit(knob.name, change["new"]), names="value")
        # The name left, the input and its ⓘ right (inputs line up down a column); where the name and the input
        # do not fit on one line (a long drop-down, a big font), the input and its ⓘ wrap under the name
        # instead of being squeezed, clipped or pushed under the next column.
        entry = w.HBox([self.input, self.info], layout=w.Layout(flex="0 0 auto", margin="0 0 0 auto",
                                                                 overflow="visible"))
        row = w.HBox([label, entry], layout=w.Layout(flex_flow="row wrap", align_items="center",
                                                     overflow="visible"))
        self.box = w.VBox([row, self.note, self.help], layout=w.Layout(overflow="visible"))
        # CSS hooks for browser tests and user styling, as the panel's own (``aw-panel``, ``aw-run-burst``...).
        for widget, hook in ((self.box, "knob"), (label, "knob-name"), (self.input, "knob-input"),
                             (self.info, "knob-info"), (self.note, "knob-note")):
            widget.add_class(f"aw-{hook}")

    def render(self, draft: Draft) -> None:
        """Show the draft's value and note for this knob."""
        self.input.value = draft.raw[self.knob.name]
        note = draft.notes[self.knob.name]
        if note is None:
            self.note.value, self.note.layout.display = "", "none"
            return
        mark, colour = _NOTE_MARKS[note.severity]
        self.note.value = f'<div style="{NOTE_STYLE} color: {colour};">{html.escape(mark + note.message)}</div>'
        self.note.layout.display = None

    @staticmethod
    def _make_input(knob: Knob, draft: Draft) -> w.ValueWidget:
        kind, layout, value = control_kind(knob), w.Layout(width=INPUT_WIDTH, flex="0 0 auto"), draft.raw[knob.name]
        if kind == "bool":
            return w.Checkbox(value=value, indent=False, layout=layout)
        if kind == "choice":
            notes = choice_notes(knob, draft.device)
            options = [(choice_label(c, notes.get(c)), c) for c in knob.choices or ()]
            return w.Dropdown(options=options, value=value,
                              layout=w.Layout(width="auto", min_width=INPUT_WIDTH, flex="0 0 auto"))
        if kind == "int":
            return w.BoundedIntText(value=value, min=int(knob.minimum or 0),
                                    max=int(knob.maximum if knob.maximum is not None else 2**31 - 1), layout=layout)
        placeholder = "None (default)" if knob.default is None else str(knob.default)
        return w.Text(value=value, placeholder=placeholder, continuous_update=False, layout=layout)

    def _help_html(self) -> str:
        rows = "".join(f"<div><b>{key}</b> {html.escape(text)}</div>" for key, text in help_text(self.knob).items())
        return f'<div style="{NOTE_STYLE} background: #f4f6f8; padding: 4px 6px; border-radius: 3px;">{rows}</div>'

    def _toggle_help(self, change: dict[str, Any]) -> None:
        self.help.layout.display = None if change["new"] else "none"


class KnobControls:
    """All knob controls, grouped as the registry groups them, in balanced columns (three until
    :meth:`arrange` says how many fit).

    The columns never shrink: the browser wraps one that does not fit under the others, so a column count
    picked from a stale width (the kernel busy, a side bar just opened) still leaves every control whole.

    ``on_edit(name, raw value)`` is called when the user changes a control.
    """

    def __init__(self, draft: Draft, on_edit: Callable[[str, Any], None]) -> None:
        self.controls = {name: KnobControl(knob, draft, on_edit) for name, knob in KNOBS.items()}
        groups = [group for group in GROUPS if KNOBS.in_group(group)]
        self._heights = [1.2 + sum(1.0 + 0.5 * (not draft.available(k.name)) for k in KNOBS.in_group(group))
                         for group in groups]
        self._cards = [self._group_card(group) for group in groups]
        self.widget = w.HBox(layout=w.Layout(flex_flow="row wrap", align_items="flex-start",
                                             justify_content="space-between", overflow="visible"))
        self.widget.add_class("aw-controls")
        self.columns = 0
        self.arrange(3)
        self.render(draft)

    def arrange(self, columns: int) -> None:
        """Lay the groups out in ``columns`` balanced columns, in the registry's order."""
        if columns != self.columns:
            self.columns = columns
            self.widget.children = [w.VBox([self._cards[i] for i in column], layout=self._column_layout(),
                                           _dom_classes=("aw-column",))
                                    for column in balanced_columns(self._heights, columns)]

    def render(self, draft: Draft) -> None:
        for control in self.controls.values():
            control.render(draft)

    @staticmethod
    def _column_layout() -> w.Layout:
        return w.Layout(width=f"{COLUMN_PX}px", flex="0 0 auto", padding=f"0 {COLUMN_GAP} 0 0", overflow="visible")

    def _group_card(self, group: Group) -> w.VBox:
        title = w.HTML(f"<b>{html.escape(GROUP_TITLES[group])}</b>", layout=w.Layout(margin="6px 0 2px 0"))
        return w.VBox([title, *(self.controls[k.name].box for k in KNOBS.in_group(group))],
                      layout=w.Layout(overflow="visible"))
