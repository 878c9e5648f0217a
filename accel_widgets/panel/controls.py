"""Knob controls generated from the registry: one input, help toggle and note line per knob, by group.

Nothing here knows a knob by name: kinds, ranges, choices, help text and availability all come from
:data:`~accel_widgets.knobs.KNOBS`, :func:`~accel_widgets.validation.knob_availability` and
:func:`~accel_widgets.validation.check_config` (through :mod:`.state`), so a new registry entry shows
up in the panel with no code here.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..config import Config
from ..device import DeviceInfo
from ..knobs import GROUP_TITLES, GROUPS, KNOBS, Group, Knob
from ..validation import knob_availability
from . import state

NAME_WIDTH = "138px"
INPUT_WIDTH = "125px"
COLUMN_WIDTH = "300px"
NOTE_STYLE = "font-size: 0.8em; line-height: 1.2; white-space: normal;"
_NOTE_COLOURS = {"unavailable": "#777", "warning": "#b35900", "error": "#c62828"}


class KnobControl:
    """One knob: the input, an info toggle showing what/why/when, and a line for its note.

    ``note`` shows why the knob is disabled here, or what this machine says about the chosen value
    (⚠ runs but hurts, ✗ cannot run), so a warning sits next to the control that caused it.
    """

    def __init__(self, knob: Knob, device: DeviceInfo, on_change: Callable[[str], None]) -> None:
        self.knob = knob
        self.device = device
        self.kind = state.control_kind(knob)
        self.available, self.reason = knob_availability(knob.name, device)
        self.input = self._make_input()
        self.input.tooltip = knob.what
        self.input.disabled = not self.available
        label = w.HTML(html.escape(knob.name), tooltip=knob.what,
                       layout=w.Layout(width=NAME_WIDTH, overflow="hidden"))
        self.info = w.ToggleButton(icon="info", tooltip=f"What {knob.name} does, why and when it helps",
                                   layout=w.Layout(width="32px", padding="0"))
        self.help = w.HTML(self._help_html(), layout=w.Layout(display="none", margin="0 0 6px 0"))
        self.note = w.HTML(layout=w.Layout(margin="-4px 0 2px 0"))
        self.info.observe(self._toggle_help, names="value")
        self.input.observe(lambda _: on_change(knob.name), names="value")
        self.box = w.VBox([w.HBox([label, self.input, self.info]), self.note, self.help],
                          layout=w.Layout(width=COLUMN_WIDTH))
        self.refresh_note()

    # -- value ------------------------------------------------------------------------------------
    @property
    def value(self) -> Any:
        """The knob's value; raises KnobValueError when typed text is not a valid value."""
        if self.kind == "optional":
            return self.knob.parse(self.input.value)
        return self.input.value

    @value.setter
    def value(self, value: Any) -> None:
        if self.kind == "optional":
            self.input.value = "" if value is None else str(value)
        else:
            self.input.value = value

    # -- notes ------------------------------------------------------------------------------------
    def refresh_note(self) -> None:
        """Re-judge the current value on this machine and show the result under the control."""
        if not self.available:
            self._show_note("unavailable", self.reason)
            return
        try:
            note = state.value_note(self.knob.name, self.value, self.device)
        except ValueError as exc:
            note = state.Note("error", str(exc))
        if note is None:
            self._show_note(None, "")
        else:
            self._show_note(note.severity, ("✗ " if note.severity == "error" else "⚠ ") + note.message)

    def _show_note(self, severity: str | None, text: str) -> None:
        self.note.value = "" if severity is None else (
            f'<div style="{NOTE_STYLE} color: {_NOTE_COLOURS[severity]};">{html.escape(text)}</div>')
        self.note.layout.display = "none" if severity is None else None

    # -- construction -----------------------------------------------------------------------------
    def _make_input(self) -> w.ValueWidget:
        knob, layout = self.knob, w.Layout(width=INPUT_WIDTH)
        if self.kind == "bool":
            return w.Checkbox(value=knob.default, indent=False, layout=w.Layout(width=INPUT_WIDTH))
        if self.kind == "choice":
            notes = state.choice_notes(knob, self.device)
            options = [(state.choice_label(c, notes.get(c)), c) for c in knob.choices or ()]
            return w.Dropdown(options=options, value=knob.default, layout=layout)
        if self.kind == "int":
            return w.BoundedIntText(value=knob.default, min=int(knob.minimum or 0),
                                    max=int(knob.maximum if knob.maximum is not None else 2**31 - 1), layout=layout)
        placeholder = "None (default)" if knob.default is None else str(knob.default)
        text = "" if knob.default is None else str(knob.default)
        return w.Text(value=text, placeholder=placeholder, continuous_update=False, layout=layout)

    def _help_html(self) -> str:
        texts = state.help_text(self.knob).items()
        rows = "".join(f"<div><b>{key}</b> {html.escape(text)}</div>" for key, text in texts)
        return f'<div style="{NOTE_STYLE} background: #f4f6f8; padding: 4px 6px; border-radius: 3px;">{rows}</div>'

    def _toggle_help(self, change: dict[str, Any]) -> None:
        self.help.layout.display = None if change["new"] else "none"


class KnobControls:
    """All knob controls, grouped as the registry groups them, in balanced columns.

    ``on_change(name)`` is called after any control changes, so the panel can re-validate the config.
    """

    def __init__(self, device: DeviceInfo, on_change: Callable[[str], None], columns: int = 3) -> None:
        self.device = device
        self._on_change = on_change
        self.controls = {name: KnobControl(knob, device, self._changed) for name, knob in KNOBS.items()}
        cards = [self._group_card(group) for group in GROUPS if KNOBS.in_group(group)]
        heights = [1.2 + sum(1.0 + 0.5 * (not self.controls[k.name].available) for k in KNOBS.in_group(group))
                   for group in GROUPS if KNOBS.in_group(group)]
        self.widget = w.HBox(
            [w.VBox([cards[i] for i in column]) for column in state.balanced_columns(heights, columns)],
            layout=w.Layout(align_items="flex-start", justify_content="space-between"),
        )

    def _group_card(self, group: Group) -> w.VBox:
        title = w.HTML(f"<b>{html.escape(GROUP_TITLES[group])}</b>", layout=w.Layout(margin="6px 0 2px 0"))
        return w.VBox([title, *(self.controls[k.name].box for k in KNOBS.in_group(group))])

    def _changed(self, name: str) -> None:
        self.controls[name].refresh_note()
        self._on_change(name)

    def config(self) -> Config:
        """The Config the controls describe; raises KnobValueError for an invalid typed value."""
        return Config(**{name: control.value for name, control in self.controls.items()})

    def set_config(self, config: Config) -> None:
        """Show ``config`` in the controls (Reset, or a notebook setting values programmatically)."""
        for name, control in self.controls.items():
            control.value = getattr(config, name)
