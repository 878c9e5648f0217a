"""Knob controls generated from the registry: one input, help toggle and note line per knob, one family (the
registry's group) open at a time, the knobs that cannot act on this machine folded into one line per family.

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
from ..views.style import themed
from .state import Draft, Note, control_kind, value_note

INPUT_WIDTH = "125px"  # "None (default)" with room to spare; a drop-down grows to its longest choice
INFO_WIDTH = "28px"
KNOBS_PX = 300  # the knobs' column beside the live chart, with its gap
NOTE_STYLE = "font-size: 0.8em; line-height: 1.2; white-space: normal;"
_NOTE_MARKS = {"unavailable": ("", themed("muted")), "warning": ("⚠ ", themed("warning")),
               "error": ("✗ ", themed("error"))}


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
        self.aside = w.HTML(layout=w.Layout(margin="0 0 4px 0", display="none"))  # what the panel adds (the fit)
        self.info.observe(self._toggle_help, names="value")
        self.input.observe(lambda change: on_edit(knob.name, change["new"]), names="value")
        # The name left, the input and its ⓘ right (inputs line up down a column); where the name and the input
        # do not fit on one line (a long drop-down, a big font), the input and its ⓘ wrap under the name
        # instead of being squeezed, clipped or pushed under the next column.
        entry = w.HBox([self.input, self.info], layout=w.Layout(flex="0 0 auto", margin="0 0 0 auto",
                                                                 overflow="visible"))
        row = w.HBox([label, entry], layout=w.Layout(flex_flow="row wrap", align_items="center",
                                                     overflow="visible"))
        self.box = w.VBox([row, self.note, self.aside, self.help], layout=w.Layout(overflow="visible"))
        # CSS hooks for browser tests and user styling, as the panel's own (``aw-panel``, ``aw-run-burst``...).
        for widget, hook in ((self.box, "knob"), (label, "knob-name"), (self.input, "knob-input"),
                             (self.info, "knob-info"), (self.note, "knob-note"), (self.aside, "knob-aside")):
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

    def show_aside(self, text: str, colour: str) -> None:
        """A line the panel keeps under the control, in ``colour`` ("" hides it): whether the settings fit, under
        the knob the activations grow with."""
        self.aside.value = f'<div style="{NOTE_STYLE} color: {colour};">{html.escape(text)}</div>' if text else ""
        self.aside.layout.display = None if text else "none"

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
        return (f'<div style="{NOTE_STYLE} background: {themed("code")}; padding: 4px 6px; border-radius: 3px;">'
                f"{rows}</div>")

    def _toggle_help(self, change: dict[str, Any]) -> None:
        self.help.layout.display = None if change["new"] else "none"


def changed_knobs(draft: Draft) -> dict[str, str]:
    """Each knob the draft holds off its default, as its owner shortens it (``workers 2``); a typed value that does
    not parse reads as typed."""
    defaults = Draft(draft.device).raw
    changed = {}
    for name, knob in KNOBS.items():
        raw = draft.raw[name]
        if raw == defaults[name]:
            continue
        try:
            changed[name] = knob.compact(knob.parse(raw) if control_kind(knob) == "optional" else raw)
        except ValueError:  # KnobValueError: a half-typed value, shown as it stands (its note says what is wrong)
            changed[name] = f"{knob.short or knob.name} {raw!r}"
    return changed


def only_on_text(knobs: Sequence[Knob]) -> str:
    """The folded line of the knobs that cannot act on this machine: "4 knobs act only on CUDA"."""
    kinds = " or ".join(sorted({kind.upper() for knob in knobs for kind in knob.applies_to}))
    return f"{len(knobs)} knob{'s act' if len(knobs) != 1 else ' acts'} only on {kinds}"


class KnobFamily:
    """One family of knobs (a registry group): its title, the knobs that can act here, and the ones that cannot
    folded into one line that opens on demand (a row per knob would say "only acts on CUDA" again and again)."""

    def __init__(self, group: Group, controls: dict[str, KnobControl], draft: Draft) -> None:
        knobs = KNOBS.in_group(group)
        here = [controls[k.name].box for k in knobs if draft.available(k.name)]
        elsewhere = [k for k in knobs if not draft.available(k.name)]
        self.fold: w.ToggleButton | None = None
        self.folded = w.VBox([controls[k.name].box for k in elsewhere], layout=w.Layout(display="none",
                                                                                          overflow="visible"))
        children: list[w.Widget] = list(here)
        if elsewhere:
            self.fold = w.ToggleButton(description=only_on_text(elsewhere), icon="caret-right",
                                       tooltip=", ".join(k.name for k in elsewhere) + ": show them (disabled here)",
                                       layout=w.Layout(width="auto", margin="2px 0"))
            self.fold.add_class("aw-fold")
            self.fold.observe(self._unfold, names="value")
            children += [self.fold, self.folded]
        self.box = w.VBox(children, layout=w.Layout(overflow="visible", display="none"))
        self.box.add_class("aw-family")

    def _unfold(self, change: dict[str, Any]) -> None:
        assert self.fold is not None
        self.folded.layout.display = None if change["new"] else "none"
        self.fold.icon = "caret-down" if change["new"] else "caret-right"


class KnobControls:
    """Every knob control, one family open at a time: a row of the families (each saying how many of its knobs are
    off the baseline, and on hover which), the changes from the baseline in one line with ``reset`` beside it, then
    the open family's knobs. The form is compact on purpose: the actions, the live chart and the runs table above
    and beside it are what a user watches while a burst runs.

    ``on_edit(name, raw value)`` is called when the user changes a control.
    """

    def __init__(self, draft: Draft, on_edit: Callable[[str, Any], None], reset: w.Button) -> None:
        self.controls = {name: KnobControl(knob, draft, on_edit) for name, knob in KNOBS.items()}
        self.groups = [group for group in GROUPS if KNOBS.in_group(group)]
        self.families = {group: KnobFamily(group, self.controls, draft) for group in self.groups}
        self.tabs = {group: w.ToggleButton(description=group, tooltip=GROUP_TITLES[group],
                                           layout=w.Layout(width="auto", height="26px", padding="0 8px",
                                                           margin="0 4px 4px 0"))
                     for group in self.groups}
        for group, tab in self.tabs.items():
            tab.add_class("aw-family-tab")
            tab.observe(lambda change, group=group: self._tab(group, change["new"]), names="value")
        self.changed = w.HTML(layout=w.Layout(flex="1 1 auto", margin="0 6px 0 0"))
        self.changed.add_class("aw-changed")
        tabs = w.HBox(list(self.tabs.values()), layout=w.Layout(flex_flow="row wrap", overflow="visible"))
        summary = w.HBox([self.changed, reset], layout=w.Layout(align_items="center", margin="0 0 4px 0",
                                                                 overflow="visible"))
        self.widget = w.VBox([tabs, summary, *(family.box for family in self.families.values())],
                             layout=w.Layout(overflow="visible"))
        self.widget.add_class("aw-controls")
        self.open: Group | None = None
        self.show(self.groups[0])
        self.render(draft)

    def show(self, group: Group | None) -> None:
        """Open ``group``'s knobs (None: every family closed)."""
        self.open = group
        for name, family in self.families.items():
            family.box.layout.display = None if name == group else "none"
            self.tabs[name].value = name == group

    def render(self, draft: Draft) -> None:
        """Show the draft: every control's value and note, each family's count of changed knobs, the changes."""
        for control in self.controls.values():
            control.render(draft)
        changed = changed_knobs(draft)
        for group, tab in self.tabs.items():
            mine = [text for name, text in changed.items() if KNOBS[name].group == group]
            tab.description = f"{group} ·{len(mine)}" if mine else group
            tab.tooltip = f"{GROUP_TITLES[group]}: {', '.join(mine)}" if mine else GROUP_TITLES[group]
        said = html.escape(", ".join(changed.values())) if changed else "none (the baseline)"
        self.changed.value = (f'<div style="font-size: 0.9em; line-height: 1.2; color: {themed("muted")};">Changed: '
                              f'<span style="color: {themed("text")};">{said}</span></div>')

    def _tab(self, group: Group, pressed: bool) -> None:
        if pressed and self.open != group:
            self.show(group)
        elif not pressed and self.open == group:
            self.show(None)
