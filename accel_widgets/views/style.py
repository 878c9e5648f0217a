"""How a run looks in every face: its name and colour, the colours of statuses and findings, and their marks.

Decided once here (the palette too), so the panel's plots and table, the report's figures and the terminal
table cannot disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..analysis.diagnosis import Severity


#: A finished run whose numbers cannot rank a knob (:func:`~accel_widgets.results.reliability.reliability`): its
#: status and its speed-up carry this mark in every face.
UNRELIABLE = "⚠ unreliable"


UNRELIABLE_MARK = "⚠"


#: Title prefix of runs loaded from the run history rather than run in this session.
LOADED_MARK = "⟲ "


NAME_LIMIT = 40


#: plotly's default qualitative palette ("Plotly"), spelled out so a run's colour needs no plotly import.
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
           "#FECB52")


#: Statuses, findings and the lines around them; ``rule`` draws separators, ``failed row`` the background of a row
#: that did not train as it should, ``neutral`` a reference (a baseline's steps), ``totals`` a waterfall's sums.
COLOURS = {"ok": "#2e7d32", "stopped": "#8a6d00", "warning": "#b35900", "error": "#c62828", "info": "#1565c0",
           "muted": "#777", "neutral": "#9e9e9e", "totals": "#607d8b", "rule": "#e0e0e0", "text": "#222",
           "failed row": "#fdecea", "code": "#f6f6f6", "promise": "rgba(255,161,90,0.45)"}
#: The JupyterLab theme's variable for each colour the panel draws with, so its text, rules and marks read on a light
#: and a dark theme alike; the palette's own colour is the fallback where no theme defines it (VS Code, a static page).
THEME_VARIABLES = {"ok": "--jp-success-color1", "stopped": "--jp-warn-color0", "warning": "--jp-warn-color1",
                   "error": "--jp-error-color1", "info": "--jp-brand-color1", "muted": "--jp-ui-font-color2",
                   "neutral": "--jp-ui-font-color3", "rule": "--jp-border-color2", "text": "--jp-ui-font-color1",
                   "code": "--jp-layout-color2"}

#: A comparison's verdict (issue #28's engine) as a speed-up cell marks it: the glyph after the interval and the
#: palette colour it is drawn in. "same" has no glyph: its cell says "same" and reads in the quiet colour.
VERDICT_MARKS = {"faster": ("▲", "ok"), "slower": ("▼", "error"), "same": ("", "muted"), "undecided": ("?", "warning")}

#: After a speed-up whose comparison is still taking repeats: its interval tightens as they arrive.
COMPARING_MARK = "⟳"

#: Where a step's time goes, in the palette's colours: waiting for data, copying to the device, computing.
STEP_PART_COLOURS = {"data_s": PALETTE[1], "h2d_s": PALETTE[4], "compute_s": PALETTE[0]}


#: A finding's mark and the palette key of its colour.
FINDING_MARKS: dict[Severity, tuple[str, str]] = {"warn": ("⚠", "warning"), "info": ("ℹ", "info"), "good": ("✔", "ok")}


def themed(key: str) -> str:
    """A palette colour as the panel writes it in CSS: the JupyterLab theme's own where it has one, else ours."""
    variable = THEME_VARIABLES.get(key)
    return f"var({variable}, {COLOURS[key]})" if variable else COLOURS[key]


def run_colour(run: int) -> str:
    """The run's colour, the same in the panel's plots and table and in the report's figures."""
    return PALETTE[run % len(PALETTE)]


def run_name(run: int, label: str, workload: str | None = None) -> str:
    """Legend and axis name of a run: its index first (runs can share a label), then a shortened label,
    after the workload's name when one figure holds several workloads."""
    where = f"{workload}: " if workload else ""
    return f"#{run} {where}{shorten(label, NAME_LIMIT)}"


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
