"""The runs table as every face shows it: its columns, what each cell reads and says on hover, the status cell.

The panel's table, the HTML report's and the terminal's (:func:`format_table`) are built from these, over the
comparison rows of :mod:`accel_widgets.analysis.compare`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..analysis.compare import Row, RunRow
from ..metrics.units import MISSING, decimals, number, si, significant
from .style import COLOURS, LOADED_MARK, UNRELIABLE, UNRELIABLE_MARK

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


def speedup_text(row: Row) -> str:
    """The speed-up; "p" when it is a paired re-measure's median, ⚠ when the run is unreliable."""
    if row["speedup"] is None:
        return MISSING
    paired = " p" if row.get("paired") else ""
    mark = f" {UNRELIABLE_MARK}" if row.get("unreliable") else ""
    return f"{row['speedup']:.2f}×{paired}{mark}"


def paired_note(row: Row) -> str:
    if not row.get("paired"):
        return ""
    q1, q3, pairs = row["paired"]
    return f"median of {pairs} interleaved pairs with the baseline, IQR {q1:.2f}×-{q3:.2f}×"


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
    "speedup": Column("speedup", "throughput over the baseline run's; ⚠ marks an unreliable run (hover its status), "
                      "'p' one re-measured in pairs with its baseline (hover: the pairs' quartiles)",
                      lambda r: speedup_text(r), lambda r: paired_note(r)),
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
        return UNRELIABLE, (f"finished, but unreliable: {values['unreliable_why']}.\nRe-measure it paired with "
                            "its baseline (Re-measure in the panel, aw.remeasure) before ranking it.")
    unchecked = values["status"] == "ok" and row.verdict.status in ("not_comparable", "no_baseline", "cannot_tell")
    return text, f"{text}\ntraining not checked: {row.verdict.reasons[-1]}" if unchecked else text


def status_colour(row: RunRow) -> str:
    """Green for ok, amber for stopped or unreliable, red for anything that did not train as it should."""
    status = str(row.values["status"])
    if row.changes_training or status not in ("ok", "stopped"):
        return COLOURS["error"]
    return COLOURS["warning"] if row.values["unreliable"] else COLOURS[status]
