"""How a comparison reads: its interval, its verdict and where its noise came from, one sentence each, the same in
the terminal, the panel and the report (the table's cell is :func:`~accel_widgets.views.table.speedup_reading`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.compare import RunRow
from ..results.comparison import Comparison, NoiseSources
from .table import same_within_pct


def interval_text(comparison: Comparison) -> str:
    """"1.23× [1.11–1.35]"; the ratio alone while too few blocks bound it; "–" before any block."""
    ratio = comparison.ratio
    if ratio is None:
        return "–"
    found = comparison.interval
    if not found.bounded:
        return f"{ratio:.2f}× (too few blocks for an interval)"
    return f"{ratio:.2f}× [{found.low:.2f}–{found.high:.2f}]"


def verdict_text(comparison: Comparison) -> str:
    """The verdict in a word or two: "faster", "slower", "same ±4%", "undecided", "not compared"."""
    if comparison.error:
        return "not compared"
    if comparison.verdict == "same":
        found = comparison.interval
        return f"same ±{same_within_pct(found.low, found.high)}%"
    return comparison.verdict


def outcome_text(comparison: Comparison) -> str:
    """The verdict with what it rests on, for a line of text (a tuner's decision, a sweep's point): "faster: 1.12×
    [1.05–1.20]", "same within ±3%", "undecided after 6 blocks: 1.02× [0.95–1.10]", "undecided: all 4 blocks left
    out (other load took 72% of the machine ...)", "not compared: <why>"."""
    if comparison.error:
        return f"not compared: {comparison.error}"
    blocks = len(comparison.counted)
    if comparison.verdict == "same":
        found = comparison.interval
        return f"same within ±{same_within_pct(found.low, found.high)}%"
    if comparison.verdict != "undecided":
        return f"{comparison.verdict}: {interval_text(comparison)}"
    left_out = [block.left_out for block in comparison.blocks if block.left_out]
    if not blocks and left_out:
        return (f"undecided: {'its' if len(left_out) == 1 else f'all {len(left_out)}'} block"
                f"{'s' if len(left_out) != 1 else ''} left out ({left_out[0]})")
    if not blocks:
        return "undecided: no block was measured"
    return f"undecided after {blocks} block{'s' if blocks != 1 else ''}: {interval_text(comparison)}"


def comparison_sentence(comparison: Comparison, subject: str, reference: str) -> str:
    """One sentence for the comparison of ``subject`` with ``reference`` (their names as the face shows them)."""
    if comparison.error:
        return f"{subject} against {reference}: not compared ({comparison.error})."
    found, blocks = comparison.interval, len(comparison.counted)
    bursts = len(comparison.firsts) + len(comparison.windows)
    measured = f"{blocks} block{'s' if blocks != 1 else ''}, {bursts} bursts, {comparison.wall_s:.0f} s"
    if comparison.same_config and comparison.window_ratios:
        ratios = comparison.window_ratios
        return (f"{subject} is the same config as {reference}: this machine moves it {min(ratios):.2f}–"
                f"{max(ratios):.2f}× from burst to burst ({interval_text(comparison)}, {measured}): the noise floor "
                "here, not a speed-up.")
    verdict = comparison.verdict
    if verdict == "faster":
        return f"{subject}: {interval_text(comparison)} over {reference}, faster (95% anytime-valid; {measured})."
    if verdict == "slower":
        return f"{subject}: {interval_text(comparison)} of {reference}, slower (95% anytime-valid; {measured})."
    if verdict == "same":
        return (f"{subject}: no measurable effect here, within ±{same_within_pct(found.low, found.high)}% of "
                f"{reference} ({interval_text(comparison)}; {measured}).")
    reach = f"; it could only tell effects over ±{found.detectable:.0%}" if found.bounded else ""
    noise = comparison.noise
    why = f" {noise_sentence(noise)}" if noise is not None else ""
    return (f"{subject} against {reference}: undecided, {interval_text(comparison)} after {measured}{reach} "
            f"({comparison.stopped}).{why}")


def noise_sentence(noise: NoiseSources) -> str:
    """Where a comparison's noise came from, the largest source first."""
    parts = {
        "drift": f"the machine drifted ±{noise.drift:.1%} between bursts",
        "steps": f"each burst's own steps moved it ±{noise.within:.1%}",
        "other load": (f"other processes took {noise.other_load_pct:.0f}% of the machine"
                       if noise.other_load_pct is not None else ""),
        "clocks": ("NVML held the GPU's clocks down in " + ", ".join(f"{windows} burst{'s' if windows != 1 else ''} "
                                                                   f"({reason})"
                                                                   for reason, windows in noise.clock_limits.items())
                   if noise.clock_limits else ""),
    }
    first = parts.pop(noise.dominant)
    rest = [text for text in parts.values() if text]
    return f"Noise: {first}" + (f" ({'; '.join(rest)})." if rest else ".")


def no_best_run_text(rows: Sequence[RunRow]) -> str:
    """Why no run can be taken into the user's code yet (:func:`~accel_widgets.analysis.compare.best_run` found none),
    in a sentence: the first of its conditions that every run fails."""
    finished = [row for row in rows if row.result.ok and row.values["samples_per_s"] is not None]
    if not finished:
        return "no run has finished yet"
    trusted = [row for row in finished if not row.values["unreliable"]]
    if not trusted:
        return ("every finished run was measured unreliably (its step times spread, or other load shared the "
                "machine): run it again, or compare it, on a quiet machine")
    if all(row.changes_training for row in trusted):
        return "the runs measured reliably train differently from their baseline (the training check says how)"
    return "every run measured reliably was slower than its baseline"
