"""The runs table as every face shows it: its columns, what each cell reads and says on hover, the status cell.

The panel's table, the HTML report's and the terminal's (:func:`format_table`) are built from these, over the
comparison rows of :mod:`accel_widgets.analysis.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..analysis.compare import Row, RunRow
from ..metrics.units import MISSING, decimals, number, si, significant
from .style import COLOURS, COMPARING_MARK, LOADED_MARK, UNRELIABLE, UNRELIABLE_MARK, VERDICT_MARKS

#: A table cell: the text shown and the text on hover ("" for none).
Cell = tuple[str, str]


def row_title(row: Row) -> str:
    """A row's changes from the baseline, after its own label when that says more (a ladder rung)."""
    label, changes = str(row.get("label") or ""), str(row.get("changes") or "")
    if not label or label == changes:
        return changes
    return f"{label} (baseline)" if changes == "baseline" else f"{label}: {changes}"


# -- cells ---------------------------------------------------------------------------------------------
def step_text(row: Row) -> str:
    """Median step time ± IQR in ms, both to the median's precision; `` ~`` marks a noisy measurement."""
    median = row.get("step_ms_median")
    if median is None:
        return MISSING
    places = decimals(median)
    noise = " ~" if row.get("noisy") else ""
    return f"{median:.{places}f} ± {row['step_ms_iqr']:.{places}f}{noise}"


@dataclass(frozen=True)
class Speedup:
    """How a row's speed-up reads, in parts a face can style: ``value`` ("1.23× [1.11–1.35]", "same ±4%", "same
    config: 0.91–1.24×"), the verdict's ``mark`` and the palette key of its ``tone``, a quiet ``hint`` ("1 burst":
    a single ratio, no interval), ``comparing`` while repeats still arrive, the ``flags`` every face has shown
    (⚠ unreliable) and the whole sentence on ``hover``."""

    value: str
    mark: str = ""
    tone: str = ""
    hint: str = ""
    comparing: bool = False
    flags: str = ""
    hover: str = ""

    @property
    def text(self) -> str:
        """The cell as plain text (the terminal's and the report's table): everything but the quiet hint."""
        parts = [self.value, self.mark, COMPARING_MARK if self.comparing else "", self.flags]
        return " ".join(part for part in parts if part)


def _count(blocks: int) -> str:
    """What a ratio without an interval rests on: its interleaved blocks, else one burst against one."""
    return f"{blocks} block{'s' if blocks != 1 else ''}" if blocks else "1 burst"


def _interval(low: float, high: float) -> str:
    return f"{low:.2f}–{high:.2f}"


def same_within_pct(low: float, high: float) -> int:
    """The larger distance of an interval's ends from 1, in whole percent rounded up: "same ±4%" bounds the effect
    (the rounding of a float such as 1 - 0.96 never adds a percent)."""
    return math.ceil(round(max(high - 1.0, 1.0 - low) * 100, 6))


def speedup_reading(row: Row) -> Speedup:
    """The speed-up cell from the row's comparison (issue #28's keys, each optional): ``speedup`` (the point
    estimate), ``speedup_interval`` (low, high: 95%, anytime-valid), ``verdict`` ("faster", "slower", "same",
    "undecided"; None before a comparison), ``min_effect`` (the margin "same" was judged against), ``comparing``
    (repeats still arriving) and ``same_config`` (the run is its baseline's config: the interval is this machine's
    noise floor, never a speed-up). Without an interval it is one burst against one burst, as the table always
    showed it, with a quiet "1 burst" hint; the baseline's own row reads 1.00× alone."""
    ratio = row.get("speedup")
    if ratio is None:
        return Speedup(MISSING)
    flags = UNRELIABLE_MARK if row.get("unreliable") else ""
    comparing = bool(row.get("comparing"))
    live = "Still comparing: repeats are arriving and the interval tightens with each.\n" if comparing else ""
    interval, verdict = row.get("speedup_interval"), row.get("verdict")
    blocks = row.get("blocks") or 0
    if row.get("same_config"):
        floor = f"{_interval(*interval)}×" if interval is not None else f"{ratio:.2f}×"
        return Speedup(f"same config: {floor}", tone="muted", hint="" if interval is not None else _count(blocks),
                       comparing=comparing, flags=flags,
                       hover=f"{live}The same config as its baseline: this machine moves it {floor} from burst to "
                             "burst. That is the noise floor here, not a speed-up.")
    if interval is None and verdict is not None:  # compared, but too few blocks yet to bound an interval
        return Speedup(f"{ratio:.2f}×", mark=VERDICT_MARKS["undecided"][0], tone=VERDICT_MARKS["undecided"][1],
                       hint=_count(blocks), comparing=comparing, flags=flags,
                       hover=f"{live}{ratio:.2f}× the baseline's samples/s over {blocks} interleaved block"
                             f"{'s' if blocks != 1 else ''}: too few yet for an interval; a longer budget bounds it")
    if interval is None:
        if row.get("baseline") == row.get("run"):
            return Speedup(f"{ratio:.2f}×", flags=flags, hover="the baseline: every speed-up is over its samples/s")
        hover = (f"{ratio:.2f}× the baseline's samples/s, one burst against one burst: no "
                                     "interval, so the drift between bursts is not in this number")
        return Speedup(f"{ratio:.2f}×", hint="1 burst", comparing=comparing,
                       flags=flags, hover=live + hover)
    low, high = interval
    margin = row.get("min_effect")
    within = f"±{margin:.0%}" if margin is not None else "the smallest effect judged"
    said = f"{ratio:.2f}× the baseline's samples/s, 95% anytime-valid interval {_interval(low, high)}×"
    if verdict == "same":
        bound = same_within_pct(low, high)
        return Speedup(f"same ±{bound}%", tone=VERDICT_MARKS["same"][1], comparing=comparing, flags=flags,
                       hover=f"{live}No measurable effect here: within ±{bound}% of the baseline ({said}, inside "
                             f"{within}).")
    mark, tone = VERDICT_MARKS.get(verdict, ("", "")) if verdict is not None else ("", "")
    outcome = {"faster": "faster", "slower": "slower",
               "undecided": f"undecided, neither clearly faster or slower nor within {within}; more repeats would "
                            "settle it"}.get(str(verdict), "not judged yet")
    return Speedup(f"{ratio:.2f}× [{_interval(low, high)}]", mark=mark, tone=tone, comparing=comparing, flags=flags,
                   hover=f"{live}{said}: {outcome}.")


def speedup_text(row: Row) -> str:
    """The speed-up as plain text (the terminal's and the report's table): the interval and the verdict's mark where
    the row was compared, ⚠ when the run is unreliable, and the hint in brackets where there is one, since plain text
    has no quiet style: "1.23× (1 burst)" is never read as a measured speed-up."""
    reading = speedup_reading(row)
    return f"{reading.text} ({reading.hint})" if reading.hint else reading.text


def flops_text(row: Row) -> str:
    """Model FLOP/s with the prefix its size needs, and the MFU in brackets where the GPU's peak is known."""
    tflops = row.get("tflops")
    if tflops is None:
        return MISSING
    mfu = f" ({row['mfu_pct']:.0f}%)" if row.get("mfu_pct") is not None else ""
    return si(tflops * 1e12, "FLOP/s") + mfu


# -- table columns ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One numeric column: its header, what it means (the header's hover) and how a row's cell reads."""

    header: str
    meaning: str
    text: Callable[[Row], str]
    hover: Callable[[Row], str] | None = None

    def cell(self, row: Row) -> Cell:
        return self.text(row), self.hover(row) if self.hover is not None else ""


def util_text(row: Row) -> str:
    """The mean utilisation, or "too short" where the window was shorter than NVML's readings can tell."""
    if row["util_pct"] is None and str(row.get("util_note") or "").startswith("too short"):
        return "too short"
    return number(row["util_pct"], ".0f")


def _noise_note(row: Row) -> str:
    return "noisy: IQR/median ≥ 10% or fewer than 4 steps" if row.get("noisy") else ""


def _energy_note(row: Row) -> str:
    """How the energy was read (or why it was not), then samples per joule and the mean power."""
    note = str(row.get("energy_note") or "")
    if row.get("joules_per_sample") is None:
        return note
    power = f", {significant(row['mean_power_w'])} W mean" if row.get("mean_power_w") is not None else ""
    return f"{note}\n{significant(row['samples_per_joule'])} samples/J{power}"


TITLE = ("changes from baseline", "what differs from the baseline run (a ladder rung's name first)")
STATUS = ("status", "ok, stopped, or failed with the error's first line; 'diverged' when a loss went NaN/inf (numbers "
                    "measured, but it did not train); 'changes training' when the losses leave the baseline run's; "
                    "'unreliable' when other load or a stalling machine spread the steps too much to rank it "
                    "(hover for why)")
COLUMNS: dict[str, Column] = {
    "samples": Column("samples/s", "steady-state throughput, summed over ranks",
                      lambda r: number(r["samples_per_s"], ",.1f")),
    "tokens": Column("tokens/s", "steady-state tokens per second, for workloads that count tokens",
                     lambda r: number(r["tokens_per_s"], ",.0f")),
    "speedup": Column("speedup", "throughput over the baseline run's, with its 95% interval where the run was "
                      "compared in repeats: ▲ faster, ▼ slower, 'same ±4%' no measurable effect, ? undecided, ⟳ "
                      "still comparing, '1 burst' a single ratio; ⚠ marks an unreliable run (hover its status), "
                      "'p' one re-measured in pairs with its baseline (hover: the pairs' quartiles)",
                      speedup_text, lambda r: speedup_reading(r).hover),
    "step": Column("step ms", "median step time ± IQR; ~ marks a noisy measurement (IQR/median ≥ 10%)", step_text,
                   _noise_note),
    "util": Column("util %", "mean device utilisation (GPU: NVML, from 1 s into the measured window: its readings "
                   "average the last second; CPU: the workers' share of the machine)", util_text,
                   lambda r: str(r.get("util_note") or "")),
    "data_wait": Column("data wait", "share of the step spent waiting for the data loader",
                        lambda r: number(r["data_wait_pct"], ".0f", "%")),
    "peak": Column("peak MiB", "peak memory (GPU allocator, or the workers' RSS on CPU)",
                   lambda r: number(r["peak_mem_mib"], ",.0f")),
    "compile": Column("compile s", "extra time of the first step over a steady one (compiled runs)",
                      lambda r: number(r["compile_s"], ".1f")),
    "flops": Column("FLOP/s (MFU)", "model math sustained (forward + backward), summed over ranks; MFU, the share "
                    "of the GPUs' dense peak, in brackets where the peak is known; each FLOP at the peak of the math "
                    "it ran in (hover)", flops_text, lambda r: str(r.get("mfu_basis") or "")),
    "energy": Column("J/sample", "energy per trained sample over the measured window: NVML on a GPU (summed over "
                     "the GPUs in use), RAPL on the CPU (the whole package, every process on it, not only the "
                     "burst); hover for how it was read or why it was not",
                     lambda r: MISSING if r["joules_per_sample"] is None else significant(r["joules_per_sample"]),
                     _energy_note),
}
#: The numeric columns each face shows, in order, between the title and the status.
PANEL_COLUMNS = ("samples", "speedup", "step", "util", "data_wait", "peak", "compile", "flops", "energy")
REPORT_COLUMNS = ("samples", "tokens", "speedup", "step", "util", "data_wait", "peak", "compile", "flops", "energy")
TEXT_COLUMNS = ("samples", "speedup", "step", "util", "data_wait", "peak", "compile")


# -- a run's row ---------------------------------------------------------------------------------------
def title_cell(row: RunRow) -> Cell:
    """The run's changes from its baseline; a run loaded from the run history is marked, its origin on hover."""
    title = row_title(row.values)
    if row.loaded is None:
        return title, title
    return LOADED_MARK + title, f"{LOADED_MARK}{title}\n{row.loaded}"


def compact_title_cell(row: RunRow) -> Cell:
    """The run's changes from its baseline in a cell that must fit (``+loader: workers 2, persistent``), each knob as
    its owner shortens it; the long form and the run's whole config (every knob off its default) on hover."""
    _, hover = title_cell(row)
    label = str(row.values.get("label") or "")
    baseline = row.baseline.config if row.baseline is not None else None
    changes = row.result.config.compact_label(baseline)
    if row.values.get("changes") == "baseline":
        short = f"{label} (baseline)" if label and label != "baseline" else "baseline"
    else:
        short = changes if not label or label == row.values.get("changes") else f"{label}: {changes}"
    mark = LOADED_MARK if row.loaded is not None else ""
    whole = row.result.config.label()
    return mark + short, f"{hover}\nwhole config: {'every knob at its default' if whole == 'baseline' else whole}"


def row_cells(row: RunRow, columns: Iterable[str]) -> list[Cell]:
    """The title, the named :data:`COLUMNS` and the status, as (text, hover) pairs."""
    return [title_cell(row), *(COLUMNS[key].cell(row.values) for key in columns), status_cell(row)]


def status_cell(row: RunRow) -> Cell:
    """The outcome, and the guard's reasons on hover when the run changes training.

    A diverged run keeps its own status ("diverged: loss is NaN from step ...") because it says more
    than the guard's "changes training"; any other run the guard flags is marked, faster or not.
    """
    values = row.values
    if row.changes_training and values["status"] != "diverged":
        faster = values["speedup"] is not None and values["speedup"] > 1.0
        return "faster but changes training" if faster else "changes training", "\n".join(row.verdict.reasons)
    text = f"{values['status']}: {values['error']}" if values["error"] else str(values["status"])
    if values["unreliable"]:
        return UNRELIABLE, (f"finished, but unreliable: {values['unreliable_why']}.\nRe-measure it against "
                            "its baseline (Re-measure in the panel, aw.remeasure) before ranking it.")
    unchecked = values["status"] == "ok" and row.verdict.status in ("not_comparable", "no_baseline", "cannot_tell")
    return text, f"{text}\ntraining not checked: {row.verdict.reasons[-1]}" if unchecked else text


def status_tone(row: RunRow) -> str:
    """The palette key of the status: ok, stopped, warning (unreliable), or error for anything that did not train
    as it should."""
    status = str(row.values["status"])
    if row.changes_training or status not in ("ok", "stopped"):
        return "error"
    return "warning" if row.values["unreliable"] else status


def status_colour(row: RunRow) -> str:
    """Green for ok, amber for stopped or unreliable, red for anything that did not train as it should."""
    return COLOURS[status_tone(row)]
