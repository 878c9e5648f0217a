"""Records in words: the lines a person reads in a terminal, a notebook cell or under the panel's figures.

The records themselves (:mod:`accel_widgets.results`) hold outcomes and no text; every face that prints one calls
:func:`summary` (``aw.summary``), which reads any record it knows, so the CLI, the panel and a notebook say the same.
A diagnosis's finding is worded here too, as one sentence (:func:`finding_sentence`) that the panel and the report
show in HTML and the CLI prints.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from functools import singledispatch

from ..analysis.compare import straggler
from ..analysis.diagnosis import ENGINE_WARNING, Finding, diagnose
from ..analysis.guard import GuardVerdict
from ..analysis.usage import (
    activity_text,
    allocator_expandable,
    allocator_slack_share,
    energy,
    mean_utilisation_pct,
    mfu,
    mfu_basis,
    model_state_bytes,
    peak_reserved_bytes,
    utilisation_note,
)
from ..metrics.units import MISSING, bytes_text, significant
from ..results.batchsize import BatchSizeSearch, BatchTry, TargetBatch, TargetTry
from ..results.burst import BurstResult
from ..results.reliability import Reliability, reliability
from ..results.sweep import BASE, SweepPoint, SweepResult
from ..results.tune import TuneResult
from .comparison import outcome_text
from .style import COLOURS, FINDING_MARKS


@singledispatch
def summary(record: object) -> str:
    """A few lines a person reads about ``record``: each kind of record registers its own reading below."""
    raise TypeError(f"no summary for a {type(record).__name__}: give a BurstResult, a BatchSizeSearch, a SweepResult "
                    "or a TuneResult")


@summary.register
def burst_summary(result: BurstResult) -> str:
    """A burst's lines: throughput, step time with spread, where the time went, then what it compiled, computed,
    held in memory, cached, kept busy and used in energy; whether it can be trusted and its warnings last. A failed
    burst says why and stops; a diverged one says why, then shows the numbers it measured."""
    head = f"{result.label or result.config.label()} [{result.workload}] {result.status}"
    why = f": {result.error.message}" if not result.ok and result.error is not None else ""
    if why and result.status != "diverged":
        return head + why
    trusted = reliability(result)
    lines = [head + why, *_speed_lines(result, trusted), *_rank_lines(result), *_compile_lines(result),
             *_resource_lines(result)]
    if not trusted.reliable:
        lines.append(f"  unreliable  {trusted.text()}: re-measure it against the baseline "
                     "(aw.remeasure: an interval and a verdict) or on a quiet machine")
    lines.extend(f"  warning     {w}" for w in result.warnings)
    return "\n".join(lines)


def _speed_lines(result: BurstResult, trusted: Reliability) -> list[str]:
    """Throughput, the median step with its spread, and the step's breakdown."""
    lines = []
    if result.samples_per_s is not None:
        tokens = f", {result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else ""
        lines.append(f"  throughput  {result.samples_per_s:,.1f} samples/s{tokens}")
    step = result.step_time
    if step is not None:
        noise = "  (noisy: IQR/median >= 10%)" if step.noisy else ""
        noise = "  (unreliable, see below)" if not trusted.reliable else noise
        lines.append(f"  step        {step.median * 1e3:.2f} ms median, IQR {step.iqr * 1e3:.2f} ms, n={step.n}{noise}")
    shares = [(n, v) for n, v in (("data wait", result.data_wait_share), ("h2d copy", result.h2d_share),
                                  ("compute", result.compute_share)) if v is not None]
    if shares:
        lines.append("  breakdown   " + ", ".join(f"{n} {v:.0%}" for n, v in shares))
    return lines


def _rank_lines(result: BurstResult) -> list[str]:
    """Where the ranks ran, for a burst on a cluster, and which of several ranks set the pace, where they measured
    their own work."""
    lines = []
    if any(rank.node for rank in result.ranks):
        lines.append("  nodes       " + ", ".join(f"rank {rank.rank} on {rank.node[:12]}" for rank in result.ranks))
    if (slowest := straggler(result)) is not None:
        lines.append(f"  pace        rank {slowest.rank}'s: its own work {slowest.busy_step_s * 1e3:.3g} ms a step, "
                     f"{slowest.ratio:.2f}x the other ranks' median")
    return lines


def _compile_lines(result: BurstResult) -> list[str]:
    """The word on compiling: its cost, what was compiled, then every graph break and recompile listed."""
    report, lines = result.compile_report, []
    if result.compile_s is not None:
        lines.append(f"  compile     {result.compile_s:.1f} s (first step {result.first_step_s:.1f} s)"
                     + (f"; {report.text()}" if report is not None else ""))
    elif report is not None:
        lines.append(f"  compile     {report.text()}")
    if report is None:
        return lines
    lines.append(f"  compiled    {report.scope}")
    lines.extend(f"  graph break {found.text()}" for found in report.graph_breaks)
    lines.extend(f"  recompiled  {found.text()}" for found in report.recompile_reasons)
    return lines


def _resource_lines(result: BurstResult) -> list[str]:
    """The model math, memory, data cache, utilisation and energy lines, each where it was measured."""
    lines = []
    if result.achieved_flops_per_s is not None:
        share = mfu(result)
        peaks = f", MFU {share:.1%} ({mfu_basis(result)}, each at its peak)" if share is not None else ""
        lines.append(f"  model math  {result.achieved_flops_per_s / 1e12:,.3f} TFLOP/s{peaks}")
    if result.peak_memory_bytes is not None:
        lines.append(f"  peak mem    {_memory_text(result)}")
    if result.cache is not None:
        frozen = f"; {result.cache.frozen_text()}" if result.cache.frozen_item is not None else ""
        lines.append(f"  data cache  {result.cache.summary()}{frozen}")
    if result.telemetry:
        util, activity = mean_utilisation_pct(result), activity_text(result)
        if util is None:
            lines.append(f"  util        {utilisation_note(result)}")
        else:
            lines.append(f"  util        {util:.0f}%" + (f"; {activity}" if activity else ""))
    used = energy(result)
    if used.joules_per_sample is not None:
        lines.append(f"  energy      {used.joules_per_sample:.3g} J/sample, {used.samples_per_joule:.3g} samples/J")
    return lines


def _memory_text(result: BurstResult) -> str:
    """"812 MiB (rss), per rank: the busiest of 2", with the CUDA allocator's reserved peak where it is known."""
    text = f"{(result.peak_memory_bytes or 0) / 2**20:,.0f} MiB ({result.memory_kind})"
    if len(result.ranks) > 1:
        sharded = ", parameters sharded" if result.facts is not None and result.facts.sharded else ""
        text += f" per rank: the busiest of {len(result.ranks)}{sharded}"
    reserved, slack = peak_reserved_bytes(result), allocator_slack_share(result)
    if reserved is not None and slack is not None:
        text += f"; reserved {reserved / 2**20:,.0f} MiB ({slack:.0%} of it never allocated at once)"
    if (expandable := allocator_expandable(result)) is not None:
        text += f"; {'expandable' if expandable else 'fixed'} allocator segments"
    if (state := model_state_bytes(result)) is not None:
        text += f"; model state {state / 2**20:,.0f} MiB (weights, gradients, optimizer)"
    return text


@summary.register
def batch_size_summary(search: BatchSizeSearch) -> str:
    """A batch-size search's lines: the answer, the cap and the margin, making room, a target batch, where the search
    started, then one line per try in batch-size order."""
    best = search.fastest_try()
    fastest = MISSING if best is None else f"{best.batch_size:,} ({significant(best.samples_per_s or 0)} samples/s)"
    largest = MISSING if search.largest_fitting is None else f"{search.largest_fitting:,}"
    answer = f"largest that fits {largest}"
    if search.margin:
        within = MISSING if search.largest_within_margin is None else f"{search.largest_within_margin:,}"
        answer = f"largest that fits with {search.margin:.0%} of the memory left {within} (at all: {largest})"
    cap = ("no memory cap" if search.cap_bytes is None
           else f"memory cap {bytes_text(search.cap_bytes)} ({search.cap_note})")
    lines = [f"batch size {search.batch_scope}: {answer}, fastest {fastest}",
             f"{search.device}, {cap}; {len(search.tries)} tries in {search.wall_s:.1f} s; {search.stopped_reason}"]
    if search.margin and search.limit_bytes is not None:
        lines.append(f"margin: a size fits when its peak leaves {search.margin:.0%} of "
                     f"{bytes_text(search.limit_bytes)} free (peak <= {bytes_text(search.peak_allowed_bytes or 0)})")
    if search.room_setting:
        room = MISSING if search.largest_with_room is None else f"{search.largest_with_room:,}"
        lines.append(f"with {search.room_setting}: largest that fits {room}")
    if search.target is not None:
        lines.append(_target_line(search.target))
    lines.append(_estimate_line(search))
    lines.append(f"{'batch':>9}  {'fits':<4}  {'samples/s':>10}  {'step ms ± IQR':>15}  {'peak mem':>9}")
    lines += [_try_line(t, search) for t in sorted(search.tries, key=lambda t: (t.setting, t.batch_size))]
    return "\n".join(lines)


def _target_line(target: TargetBatch) -> str:
    """How a target global batch is reached fastest, with every way measured."""
    ranks = f" x {target.ranks} ranks" if target.ranks > 1 else ""
    head = f"target global batch {target.target:,} = micro-batch x grad_accum_steps{ranks}: "
    best = target.best
    if best is None:
        return head + (target.note or "no way of reaching it fit")
    tried = "; ".join(_target_try_text(t) for t in target.tries)
    return head + f"fastest {best.micro_batch:,} x {best.accumulation} ({tried})"


def _target_try_text(way: TargetTry) -> str:
    """"256 x 4 with activation_checkpointing=blocks: 1,230 samples/s", or why it was not measured."""
    under = f" with {way.setting}" if way.setting else ""
    rate = (f"{significant(way.samples_per_s)} samples/s" if way.samples_per_s is not None
            else f"not measured: {way.why_not}")
    return f"{way.micro_batch:,} x {way.accumulation}{under}: {rate}"


def _estimate_line(search: BatchSizeSearch) -> str:
    """Where the search started and how far the estimate was from what it found."""
    if search.estimated is None:
        start = f"started at {search.tries[0].batch_size:,} " if search.tries else ""
        return f"{start}(no estimate: {search.estimate_note})"
    error = search.estimate_error
    off = (f"; it found {search.largest_within_margin:,}: the estimate was {abs(error):.0%} "
           f"{'high' if error > 0 else 'low'}" if error is not None else "")
    return f"started at the estimate, {search.estimated:,} (a step traced on fake tensors){off}"


def _try_line(t: BatchTry, search: BatchSizeSearch) -> str:
    """One try as a row of the table under the answer: fits or why not, samples/s, step time, peak memory."""
    under = f"  (with {t.setting})" if t.setting else ""
    if not t.fits:
        return f"{t.batch_size:>9,}  {'no':<4}  {t.why_not}{under}"
    rate = MISSING if t.samples_per_s is None else significant(t.samples_per_s)
    if not t.within_margin:
        peak = t.reserved_bytes or t.peak_memory_bytes or 0
        return (f"{t.batch_size:>9,}  {'no':<4}  ran ({rate} samples/s), but its peak {bytes_text(peak)} leaves less "
                f"than {search.margin:.0%} of {bytes_text(search.limit_bytes or 0)} free{under}")
    step = (MISSING if t.step_median_s is None
            else f"{t.step_median_s * 1e3:.3g} ± {(t.step_iqr_s or 0) * 1e3:.2g}")
    memory = MISSING if t.peak_memory_bytes is None else bytes_text(t.peak_memory_bytes)
    return f"{t.batch_size:>9,}  {'yes':<4}  {rate:>10}  {step:>15}  {memory:>9}{under}"


@summary.register
def sweep_summary(swept: SweepResult) -> str:
    """A sweep's lines: what was swept against what, then each point's samples/s and verdict."""
    head = (f"sweep of {' × '.join(swept.knobs)} on {swept.workload} against {swept.base.label()}, "
            f"{len(swept.points)} points{', stopped' if swept.stopped else ''}")
    lines = [head]
    for point in swept.points:
        rate = f"{point.samples_per_s:,.1f} samples/s, " if point.samples_per_s is not None else ""
        lines.append(f"  {point.label}: {rate}{point_text(swept, point)}")
    return "\n".join(lines)


def point_text(swept: SweepResult, point: SweepPoint) -> str:
    """What a sweep's point measured against the base, in words: ``faster: 1.45× [1.30–1.62]``, ``same within
    ±3%``, ``base``, ``failed: <why>`` (its own burst), ``not compared: <why>`` (the base's), ``not run``: the
    summary's and the figure's hover."""
    if point.status != "ok" and point.error:
        return f"{point.status}: {point.error}"
    if point.config == swept.base:
        return BASE if point.results else "not run"
    if point.comparison is None:
        return "not run" if not point.results else "not compared"
    return outcome_text(point.comparison)


@summary.register
def tune_summary(tuned: TuneResult) -> str:
    """A tuning's lines: the pick and what it gains over the start, then each decision (+ marks the kept ones)."""
    rates = ", ".join(f"{name} {rate:,.1f} samples/s" for name, rate in
                      (("baseline", tuned.baseline_samples_per_s), ("best", tuned.best_samples_per_s))
                      if rate is not None)
    if tuned.confirmation is not None:
        measured = f"{outcome_text(tuned.confirmation)} against the start"
    elif tuned.speedup is not None:
        measured = "no knob beat the starting config"
    else:
        measured = "its speed-up over the start not measured"
    measured += f"; {rates}" if rates else ""
    head = (f"best: {tuned.best.label()} ({measured}), {len(tuned.bursts)} bursts in {tuned.wall_s:.1f} s; "
            f"{tuned.stopped_reason}")
    return "\n".join([head, *(f"  {'+' if s.accepted else ' '} {s.knob}={s.value!r}: {s.reason}"
                              for s in tuned.decisions)])


# -- a diagnosis's findings ------------------------------------------------------------------------------------------
def finding_sentence(finding: Finding) -> str:
    """A finding as its one sentence: the title, the numbers it read and the knob to try where it names one. Every face
    says a finding in these words, so a reading quoted from the CLI is the one the panel and the report show."""
    return finding.title + _after_title(finding)


def _after_title(finding: Finding) -> str:
    """The sentence after its title, which the HTML sets apart in bold."""
    knob = f" → try {finding.knob}" if finding.knob else ""
    return f": {finding.detail}{knob}"


def finding_line(finding: Finding) -> str:
    """A finding for a terminal: its severity's mark, then its sentence."""
    return f"{FINDING_MARKS[finding.severity][0]} {finding_sentence(finding)}"


def findings_html(findings: Sequence[Finding], colour: Callable[[str], str] = COLOURS.__getitem__) -> str:
    """A run's findings as an HTML list: each mark in its colour, then the sentence with its title in bold; ``colour``
    gives a palette key's CSS colour (the panel's follow the JupyterLab theme:
    :func:`~accel_widgets.views.style.themed`)."""
    items = []
    for finding in findings:
        mark, key = FINDING_MARKS[finding.severity]
        items.append(f'<li style="margin-bottom: 4px;"><span style="color: {colour(key)};">{mark}</span> '
                     f"<b>{html.escape(finding.title)}</b>{html.escape(_after_title(finding))}</li>")
    body = "".join(items) or "<li>Nothing stands out.</li>"
    return f'<ul style="padding-left: 18px; margin: 4px 0;">{body}</ul>'


def run_findings(result: BurstResult, baseline: BurstResult | None = None,
                 verdict: GuardVerdict | None = None) -> list[Finding]:
    """A run's findings as the report and the CLI list them: :func:`~accel_widgets.analysis.diagnosis.diagnose`'s,
    less the engine's warnings, which both say on their own (the report's Warnings, a burst's summary lines)."""
    return [f for f in diagnose(result, baseline, verdict=verdict) if f.title != ENGINE_WARNING]
