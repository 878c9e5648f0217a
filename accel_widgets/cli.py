"""``accel-widgets``: the command-line face. A thin view: arguments become Configs, results become tables.

    accel-widgets demo                      # the classic ladder on the built-in workloads + HTML report
    accel-widgets run --workload pkg.mod:make_workload --set precision=bf16 --num-workers 4
    accel-widgets export --workload pkg.mod:make_workload --parallel ddp --world-size 8 -o train.py
    accel-widgets export --workload pkg.mod:make_workload --precision bf16 --as hf   # TrainingArguments(...)
    accel-widgets knobs [--markdown]        # what every knob does (generated from the registry)
    accel-widgets estimate --demo lm --device "H100 80GB" --precision bf16   # will it fit, before running
    accel-widgets headspace --demo image    # the most each part of the step (data, ...) could win here

Per-knob flags (``--num-workers``, ``--precision`` ...) are generated from the knob registry; ``--set
name=value`` is the same thing spelled generically.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis.compare import RunRow, best_run, run_rows
from .analysis.diagnosis import Finding
from .analysis.estimate import Estimate, estimate
from .demos import DEMO_NAMES, demo_workload
from .engine.launcher import run_burst
from .engine.outcome import BurstError
from .engine.request import BurstOptions, check_burst_request
from .inputs.device import probe_device
from .inputs.workload import Workload, load_workload
from .knobs import GROUP_TITLES, GROUPS, KNOBS, KnobValueError, parallel
from .knobs.base import STYLES
from .knobs.config import Config
from .knobs.rules import ConfigError
from .results.burst import BurstResult
from .results.comparison import Comparison
from .search.compare import DEFAULT_BUDGET_S, Progress, measure_pairs
from .search.headspace import headspace
from .search.ladder import Ladder, Rung, classic_ladder, run_ladder
from .views.comparison import comparison_sentence, interval_text, verdict_text
from .views.estimate import estimate_line, estimate_lines
from .views.headspace import headspace_lines
from .views.progress import ProgressSeries, result_line
from .views.text import finding_line, run_findings, summary

DEFAULT_REPORT = "accel_widgets_report.html"
#: Seconds each demo workload's rungs are measured again: a 5-rung ladder needs ~40 windows of ~0.8 s here before
#: most of its verdicts settle.
DEMO_BUDGET_S = 40.0
DEFAULT_SCRIPT = "train_ddp.py"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_knob_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("knobs (generated from the registry; see `accel-widgets knobs`)")
    for knob in KNOBS.values():
        group.add_argument(_flag(knob.name), dest=f"knob_{knob.name}", metavar="VALUE", default=None,
                           help=f"{knob.what} Valid: {knob.valid_values_text()}. Default: {knob.default!r}.")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="set any knob by name, e.g. --set precision=bf16 (repeatable)")


def config_from_args(args: argparse.Namespace) -> Config:
    """Collect per-knob flags and --set pairs into a validated Config."""
    values: dict[str, Any] = {}
    for name, knob in KNOBS.items():
        text = getattr(args, f"knob_{name}", None)
        if text is not None:
            values[name] = knob.parse(text)
    for pair in args.set:
        name, separator, text = pair.partition("=")
        if not separator:
            raise KnobValueError(f"--set {pair!r}: use NAME=VALUE, e.g. --set precision=bf16")
        values[name.strip()] = KNOBS[name.strip()].parse(text)
    return Config(**values)


def _print_result_line(result: BurstResult, baseline: BurstResult | None) -> None:
    print(result_line(result, baseline), flush=True)


def _run_ladder_with_progress(workload: Workload, rungs: list[Rung], *, steps: int, timeout_s: float,
                              budget_s: float) -> Ladder:
    """The ladder with a live progress line per rung, each replaced by the rung's first-burst line when it ends;
    then one line as each comparison settles, and the ladder read rung by rung."""
    progress = ProgressSeries("rung", len(rungs), steps=steps)
    upcoming = iter(rungs[1:])
    baseline: list[BurstResult] = []
    said: set[int] = set()

    def show(rung: Rung, result: BurstResult) -> None:
        progress.end()
        _print_result_line(result, baseline[0] if baseline else None)
        if not baseline:
            baseline.append(result)
        following = next(upcoming, None)
        if following is not None:
            progress.begin(following.name, following.config)
        elif len(rungs) > 1:
            print(f"  comparing the {len(rungs)} rungs, interleaved, for up to {budget_s:g} s ...", flush=True)

    def settled(now: Progress) -> None:
        for index, comparison in enumerate(now.comparisons):
            if comparison.settled and index not in said:
                said.add(index)
                subject, reference = comparison.subject_label, comparison.reference_label
                print(f"    {subject} vs {reference}: {verdict_text(comparison)} {interval_text(comparison)} "
                      f"({now.elapsed_s:.0f} s)", flush=True)

    progress.begin(rungs[0].name, rungs[0].config)
    try:
        ladder = run_ladder(workload, rungs, on_result=show, on_event=progress.on_event, on_progress=settled,
                            steps=steps, timeout_s=timeout_s, budget_s=budget_s)
    finally:
        progress.end()
    print(ladder_text(ladder), flush=True)
    return ladder


def ladder_text(ladder: Ladder) -> str:
    """The ladder read rung by rung: what each added over the one before, and where it stands against the
    baseline, each as its comparison's verdict and interval."""
    lines = []
    for index, result in enumerate(ladder.results[1:], start=1):
        name = ladder.rungs[index].name
        step, overall = ladder.step(index), ladder.overall(index)
        parts = [f"{label} {verdict_text(c)} {interval_text(c)}" if c.counted else f"{label} not measured again"
                 for label, c in (("vs previous:", step), ("vs baseline:", overall if index > 1 else None))
                 if c is not None]
        if step is not None and not step.counted and step.stopped:
            parts.append(step.stopped)
        lines.append(f"  {name:<10} " + "; ".join(parts) if result.ok else f"  {name:<10} {result.status}")
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from .views.report import format_table, write_json, write_report

    names = _demo_names(args.workloads)
    check_burst_request(args.steps, None, None, args.timeout, 0)  # before the first line of output
    if not args.budget > 0:
        raise ValueError(f"--budget {args.budget:g}: use a number of seconds > 0")
    device = probe_device()
    print(f"accel-widgets demo on {device.name} ({device.cpu_count} CPU cores, {len(device.gpus)} GPUs)", flush=True)
    results: list[BurstResult] = []
    estimates: list[Estimate] = []
    compared: dict[int, Comparison] = {}
    stepwise: list[tuple[str, str, Comparison]] = []
    for name in names:
        workload = demo_workload(name, size=args.size)
        rungs = classic_ladder(workload, device, leave_out={"+compile"} if args.no_compile else ())
        print(f"\n{workload.name}: {' -> '.join(r.name for r in rungs)}", flush=True)
        estimates.append(estimate(workload, rungs[0].config, device=device))
        print(f"estimate: {estimate_line(estimates[-1])}", flush=True)
        ladder = _run_ladder_with_progress(workload, rungs, steps=args.steps, timeout_s=args.timeout,
                                           budget_s=args.budget)
        offset = len(results)
        results += ladder.results
        for index in range(1, len(ladder.results)):
            overall, step = ladder.overall(index), ladder.step(index)
            if overall is not None:
                compared[offset + index] = overall
            if step is not None and index > 1:
                stepwise.append((f"#{offset + index} {ladder.rungs[index].name}",
                                 f"#{offset + index - 1} {ladder.rungs[index - 1].name}", step))
    rows = run_rows(results, compared=compared)
    print("\n" + format_table([row.values for row in rows]))
    readings = _best_rung_findings(rows)
    if readings:
        print("\nfindings of each workload's best rung (the report has every run's):\n" + "\n".join(readings))
    notes = [f"Each rung keeps the knobs of the rungs before it; {args.steps} measured steps in each rung's first "
             f"burst, then the rungs measured again, interleaved, for up to {args.budget:g} s per workload. A speed-up "
             "in brackets is its 95% anytime-valid interval against the workload's baseline."]
    report = write_report(results, args.report, title="accel_widgets demo: the classic ladder", notes=notes,
                          compared=compared, comparisons=stepwise, estimates=estimates)
    print(f"\nreport: {report}")
    if args.json:
        print(f"json:   {write_json(results, args.json)}")
    return 0 if all(r.ok for r in results) else 1


def _best_rung_findings(rows: Sequence[RunRow]) -> list[str]:
    """Each workload's best rung (:func:`~accel_widgets.analysis.compare.best_run`) read as the report reads it, kept to
    what to act on: its warnings and the findings that name a knob. How busy it kept the machine and the like are the
    table's columns, and a workload with no rung to take says why in the table's lines already."""
    lines = []
    for workload in dict.fromkeys(row.values["workload"] for row in rows):
        best = best_run([row for row in rows if row.values["workload"] == workload])
        if best is None:
            continue
        acted = [f for f in run_findings(best.result, best.baseline, best.verdict) if f.severity == "warn" or f.knob]
        if acted:
            lines += [f"  #{best.run} {best.values['label']} [{workload}]", *_finding_lines(acted, "    ")]
    return lines


def _finding_lines(findings: Sequence[Finding], indent: str = "  ") -> list[str]:
    return [indent + finding_line(finding) for finding in findings]


def _demo_names(text: str | None) -> list[str]:
    """The demo workloads ``--workloads`` names, every one checked before the first burst: a typo at the end
    must not cost the ladders before it."""
    names = [name.strip() for name in text.split(",")] if text else list(DEMO_NAMES)
    unknown = [name for name in names if name not in DEMO_NAMES]
    if unknown:
        raise ValueError(f"--workloads {text!r}: unknown demo {', '.join(map(repr, unknown))}; valid names: "
                         f"{', '.join(DEMO_NAMES)}")
    return names


def cmd_run(args: argparse.Namespace) -> int:
    from .views.report import write_json

    check_burst_request(args.steps, args.seconds, None, args.timeout, args.profile_steps)  # before any progress line
    workload = load_workload(args.workload) if args.workload else demo_workload(args.demo)
    config = config_from_args(args)
    if args.compare and config != Config():
        return _run_compared(args, workload, config)
    # Progress goes to stderr: stdout keeps the results, for whoever reads them from a pipe.
    progress = ProgressSeries("run", 1, steps=args.steps, seconds=args.seconds, stream=sys.stderr)
    progress.begin(config.label(), config)
    options = BurstOptions(timeout_s=args.timeout, profile_steps=args.profile_steps)
    try:
        result = run_burst(workload, config, steps=args.steps, seconds=args.seconds, on_event=progress.on_event,
                           options=options)
    except BurstError as exc:
        result = exc.result
        progress.end()
        print(str(exc), file=sys.stderr)
    finally:
        progress.end()
    print(summary(result))
    if result.profile is not None:
        print(f"  profile     {result.profile.trace_path} (open in https://ui.perfetto.dev)")
        for op in result.profile.top_operators[:5]:
            times = f"self cpu {op.self_cpu_ms:8.2f} ms  device {op.self_device_ms:8.2f} ms"
            print(f"              {op.name:<40} {times}")
    for line in _finding_lines(run_findings(result)):
        print(line)
    if args.json:
        print(f"json: {write_json([result], args.json)}")
    return 0 if result.ok else 1


def _run_compared(args: argparse.Namespace, workload: Workload, config: Config) -> int:
    """``run --compare``: the config against the plain loop, by the comparison engine (an interval, a verdict)."""
    from .views.report import format_table, write_json

    if args.seconds is not None or args.profile_steps:
        raise ValueError("--compare measures both configs in windows of steps: give --steps, not --seconds, and "
                         "profile a config on its own run (without --compare)")
    print(f"comparing {config.label()} with the plain loop, interleaved, for up to {args.budget:g} s ...",
          file=sys.stderr, flush=True)
    measured = measure_pairs(workload, [Config(), config], [(0, 1)], budget_s=args.budget, steps=args.steps,
                             timeout_s=args.timeout, labels=["baseline", config.label()])
    results = [first for first in measured.firsts if first is not None]
    comparison = measured.comparisons[0]
    rows = run_rows(results, compared={1: comparison})
    for row in rows:  # each run read against the plain loop: the guard and the compile's payback too
        print("\n".join([summary(row.result), *_finding_lines(run_findings(row.result, row.baseline, row.verdict))]))
    print("\n" + format_table([row.values for row in rows]))
    print("\n" + comparison_sentence(comparison, f"#1 {config.label()}", "#0 baseline"))
    if args.json:
        print(f"json: {write_json(results, args.json)}")
    return 0 if all(r.ok for r in results) else 1


def cmd_estimate(args: argparse.Namespace) -> int:
    """Will the config fit, and how fast could its step be: one step traced on fake tensors, no burst, no memory."""
    workload = load_workload(args.workload) if args.workload else demo_workload(args.demo)
    found = estimate(workload, config_from_args(args), device=args.device)
    print("\n".join(estimate_lines(found)) if args.details else estimate_line(found))
    return 0 if found.fits else 1


def cmd_headspace(args: argparse.Namespace) -> int:
    """The ceilings of the config: each part of its step made free, measured against it as it is; one line each."""
    workload = load_workload(args.workload) if args.workload else demo_workload(args.demo)
    config = config_from_args(args)
    print(f"measuring the ceilings of {config.label()} for up to {args.budget:g} s ...", file=sys.stderr, flush=True)
    found = headspace(workload, config, budget_s=args.budget, steps=args.steps, timeout_s=args.timeout)
    print("\n".join(headspace_lines(found)))
    if args.report:
        from .views.report import write_report

        measured = [c.comparison for c in found.ceilings.values() if c.comparison is not None]
        results = measured[0].reference_windows[:1] if measured else []  # the config as it is, its environment
        print(f"report: {write_report(results, args.report, title='accel_widgets headspace', headspaces=[found])}")
    return 0


def _add_workload_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", help="MODULE:FUNCTION returning an accel_widgets.Workload")
    source.add_argument("--demo", choices=DEMO_NAMES, default="mlp", help="a built-in workload instead")


def cmd_export(args: argparse.Namespace) -> int:
    from .job.export import export_script, torchrun_command
    from .job.recipe import recipe

    config = config_from_args(args)
    if args.style is not None:
        made = recipe(config, load_workload(args.workload), args.style)
        if args.output is None:
            print(made.code, end="")
            return 0
        target = Path(args.output)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(made.code)
        print(f"wrote {target}: the settings as {args.style} code")
        return 0
    path = export_script(args.workload, config, args.output or DEFAULT_SCRIPT, nnodes=args.nnodes,
                         endpoint=args.endpoint)
    ranks = parallel.ranks(config)
    print(f"wrote {path}\n  one machine:  torchrun --standalone --nproc-per-node {ranks} {path.name}")
    print("  several:      " + torchrun_command(path, nproc_per_node=ranks, nnodes=args.nnodes, endpoint=args.endpoint))
    return 0


def knobs_markdown() -> str:
    """The knob reference, generated from the registry (docs/knobs.md is this text)."""
    lines = ["# Knob reference", "", "Generated from `accel_widgets.knobs.KNOBS` by `accel-widgets knobs --markdown`.",
             ""]
    for group in GROUPS:
        lines += [f"## {GROUP_TITLES[group]}", ""]
        for knob in KNOBS.in_group(group):
            lines += [
                f"### `{knob.name}`",
                "",
                f"- **Values:** {knob.valid_values_text()}; default `{knob.default!r}`; "
                f"acts on: {', '.join(knob.applies_to).upper()}",
                f"- **What:** {knob.what}",
                f"- **Why:** {knob.why}",
                f"- **When:** {knob.when}",
                "",
            ]
    return "\n".join(lines)


def cmd_knobs(args: argparse.Namespace) -> int:
    if args.markdown:
        print(knobs_markdown())
        return 0
    for group in GROUPS:
        print(GROUP_TITLES[group])
        for knob in KNOBS.in_group(group):
            print(f"  {knob.name:<19} {knob.valid_values_text():<48} default {knob.default!r}")
            print(f"  {'':<19} {knob.what}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accel-widgets", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the classic ladder on the built-in workloads")
    demo.add_argument("--workloads", default=None, help=f"comma-separated subset of {', '.join(DEMO_NAMES)}")
    demo.add_argument("--size", choices=("small", "gpu"), default="small")
    demo.add_argument("--steps", type=int, default=30, help="measured steps per burst (default 30)")
    demo.add_argument("--no-compile", action="store_true", help="skip the torch.compile rung")
    demo.add_argument("--report", default=DEFAULT_REPORT, help=f"HTML report path (default {DEFAULT_REPORT})")
    demo.add_argument("--json", default=None, help="also write every result as JSON here")
    demo.add_argument("--timeout", type=float, default=600.0, help="per-burst timeout in seconds")
    demo.add_argument("--budget", type=float, default=DEMO_BUDGET_S,
                      help="seconds each workload's rungs are measured again, interleaved, to give every speed-up "
                           f"its interval and verdict (default {DEMO_BUDGET_S:g})")
    demo.set_defaults(handler=cmd_demo)

    run = commands.add_parser("run", help="run one burst of your workload (MODULE:FUNCTION) with chosen knobs")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--workload", help="MODULE:FUNCTION returning an accel_widgets.Workload")
    source.add_argument("--demo", choices=DEMO_NAMES, default="mlp", help="a built-in workload instead")
    run.add_argument("--steps", type=int, default=None, help="measured steps (default 40)")
    run.add_argument("--seconds", type=float, default=None, help="measure for this long instead of --steps (not both)")
    run.add_argument("--compare", action="store_true",
                     help="compare with the plain loop Config(): both measured again, interleaved, for an interval "
                          "and a verdict")
    run.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                     help=f"with --compare: seconds the comparison may take (default {DEFAULT_BUDGET_S:g})")
    run.add_argument("--json", default=None, help="write the result(s) as JSON here")
    run.add_argument("--profile-steps", type=int, default=0,
                     help="after measuring, record this many steps with torch.profiler and write a trace")
    run.add_argument("--timeout", type=float, default=600.0, help="burst timeout in seconds")
    _add_knob_flags(run)
    run.set_defaults(handler=cmd_run)

    export = commands.add_parser("export", help="write a torchrun job (checkpoints, --resume, logs) with the chosen "
                                 "knobs, or --as the settings in your own code")
    export.add_argument("--workload", required=True, help="MODULE:FUNCTION returning an accel_widgets.Workload")
    export.add_argument("-o", "--output", default=None, help=f"script path (default {DEFAULT_SCRIPT}; with --as, "
                        "the code is printed unless -o is given)")
    export.add_argument("--as", dest="style", choices=STYLES, default=None,
                        help="the settings as code for your own training instead of a job: pytorch (a plain loop, no "
                             "accel_widgets import), hf (TrainingArguments), lightning (Trainer), accelerate "
                             "(Accelerator); knobs with no equivalent are listed with what to do instead")
    export.add_argument("--nnodes", type=int, default=2, help="machines in the multi-node command (default 2)")
    export.add_argument("--endpoint", default="HOST:29400", help="rendezvous HOST:PORT reachable from all nodes")
    _add_knob_flags(export)
    export.set_defaults(handler=cmd_export)

    sized = commands.add_parser("estimate", help="will it fit, and how fast could a step be: one step traced on fake "
                                "tensors, on this machine or a named GPU (no burst runs, nothing is allocated)")
    _add_workload_source(sized)
    sized.add_argument("--device", default=None, help="a named GPU (\"H100 80GB\", \"A100 40GB\", \"L4\", \"RTX 4090\" "
                       "...); default this machine")
    sized.add_argument("--details", action="store_true", help="the peak's breakdown and what the estimate leaves out")
    _add_knob_flags(sized)
    sized.set_defaults(handler=cmd_estimate)

    room = commands.add_parser("headspace", help="the most each part of the step (data, communication, host) could "
                               "win: the config with that part made free, measured against it as it is")
    _add_workload_source(room)
    room.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                      help=f"seconds the comparisons may take (default {DEFAULT_BUDGET_S:g})")
    room.add_argument("--steps", type=int, default=None, help="measured steps of the first bursts")
    room.add_argument("--timeout", type=float, default=600.0, help="burst timeout in seconds")
    room.add_argument("--report", default=None, help="also write an HTML report with the ceilings' bars here")
    _add_knob_flags(room)
    room.set_defaults(handler=cmd_headspace)

    knobs = commands.add_parser("knobs", help="list every knob with what it does")
    knobs.add_argument("--markdown", action="store_true", help="print the Markdown reference")
    knobs.set_defaults(handler=cmd_knobs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (KnobValueError, ConfigError, ValueError, TypeError, ImportError, OSError) as exc:
        print(f"accel-widgets: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("accel-widgets: interrupted; workers stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
