"""How a headspace reads: one line per ceiling (the terminal and the report), a rung read against its ceiling, and
the row of bars the panel draws under its runs table and the report repeats.

A ceiling is a comparison of the config with one part of its step made free against the config as it is
(:mod:`accel_widgets.results.headspace`): its interval's top is the most any knob of that part can win.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

from ..results.comparison import Comparison
from ..results.headspace import Ceiling, Headspace
from .comparison import interval_text
from .style import COLOURS, VERDICT_MARKS
from .table import same_within_pct


def ceiling_line(ceiling: Ceiling) -> str:
    """One line: the part, its interval and verdict, and what that leaves its knobs ("Data free: same ±3%: data
    loading costs at most 3% here: the loader knobs cannot help.")."""
    about = ceiling.about
    title = about.title[0].upper() + about.title[1:]
    comparison = ceiling.comparison
    if not ceiling.measured or comparison is None:
        why = ceiling.why_not or "not measured"
        return f"{title}: not measured: {why}."
    found = comparison.interval
    if ceiling.room is False:
        said = (f"same ±{same_within_pct(found.low, found.high)}%" if comparison.verdict == "same"
                else f"{interval_text(comparison)}, slower")
        return f"{title}: {said}: {ceiling.closed_text}."
    if ceiling.room:
        share = 1 - 1 / comparison.ratio if comparison.ratio else 0.0
        return (f"{title}: {interval_text(comparison)}, faster: {about.costs} takes ~{share:.0%} of the step; "
                f"{about.knobs} can win at most {found.high:.2f}× here.")
    top = f"; {about.knobs} can win at most {found.high:.2f}× here" if found.bounded else ""
    return f"{title}: {interval_text(comparison)}, undecided ({comparison.stopped}){top}."


def headspace_lines(headspace: Headspace) -> list[str]:
    """Every ceiling, one line each, in the parts' order."""
    return [ceiling_line(ceiling) for ceiling in headspace.ceilings.values()]


def reached_text(rung: str, comparison: Comparison | None, ceiling: Ceiling | None) -> str:
    """A rung read against its ceiling: "+loader reached 1.90× of a possible 2.10×" ("" without both numbers)."""
    if comparison is None or comparison.ratio is None or ceiling is None or not ceiling.measured:
        return ""
    possible = ceiling.comparison.ratio if ceiling.comparison is not None else None
    if possible is None:
        return ""
    return f"{rung} reached {comparison.ratio:.2f}× of a possible {possible:.2f}× ({ceiling.about.title})"


#: The bars' scale: a speed-up of 1× draws nothing, this one the whole bar (larger ones are drawn at the end).
BAR_SCALE_MAX = 4.0
BAR_PX = 180


def _position(ratio: float) -> float:
    """Where a ratio lies along a bar, 0-1, on a log scale from 1× to ``BAR_SCALE_MAX``."""
    if ratio <= 1:
        return 0.0
    return min(1.0, math.log(ratio) / math.log(BAR_SCALE_MAX))


def ceiling_bar_html(ceiling: Ceiling, colour: Callable[[str], str] = COLOURS.__getitem__) -> str:
    """One ceiling as a bar: its title, the ratio drawn from 1× (log scale, to ``BAR_SCALE_MAX``) with the interval as
    a whisker, and its line on hover."""
    about, comparison = ceiling.about, ceiling.comparison
    line = html.escape(ceiling_line(ceiling))
    if not ceiling.measured or comparison is None or comparison.ratio is None:
        value, fill, whisker, tone = "–", 0.0, "", "muted"
    else:
        found, verdict = comparison.interval, comparison.verdict
        tone = VERDICT_MARKS["same" if ceiling.room is False else verdict][1]
        value = (f"same ±{same_within_pct(found.low, found.high)}%" if verdict == "same"
                 else f"≤ {found.high:.2f}×" if found.bounded and ceiling.room else f"{comparison.ratio:.2f}×")
        fill = _position(comparison.ratio)
        whisker = ""
        if found.bounded:
            low, high = _position(found.low) * BAR_PX, _position(found.high) * BAR_PX
            whisker = (f'<div style="position: absolute; left: {low:.0f}px; width: {max(1.0, high - low):.0f}px; '
                       f'top: 5px; height: 2px; background: {colour("text")};"></div>')
    bar = (f'<div style="position: relative; width: {BAR_PX}px; height: 12px; background: {colour("rule")}; '
           f'border-radius: 2px;"><div style="width: {fill * BAR_PX:.0f}px; height: 12px; background: {colour(tone)}; '
           f'border-radius: 2px;"></div>{whisker}</div>')
    return (f'<div class="aw-ceiling" title="{line}" style="display: inline-flex; align-items: center; gap: 6px; '
            f'margin: 0 14px 2px 0;"><span style="white-space: nowrap;">{html.escape(about.title)}</span>{bar}'
            f'<span style="white-space: nowrap; color: {colour(tone)};">{html.escape(value)}</span></div>')


def ceilings_html(headspace: Headspace, colour: Callable[[str], str] = COLOURS.__getitem__) -> str:
    """The ceilings as one row of bars, after a short caption (the panel under its runs table; the report)."""
    bars = "".join(ceiling_bar_html(ceiling, colour) for ceiling in headspace.ceilings.values())
    return (f'<div style="font-size: 0.85em; line-height: 1.3;"><span style="color: {colour("muted")};" '
            'title="each part of the step made free, measured against the config as it is: the most its knobs can '
            f'win">Ceilings (1× to {BAR_SCALE_MAX:g}×, log):</span> <span style="display: inline-flex; '
            f'flex-wrap: wrap;">{bars}</span></div>')
