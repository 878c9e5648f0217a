"""(b) Time to first step: from calling ``run_burst`` to the first step event reaching the caller.

Why: a panel that flips one knob at a time lives or dies by how fast a burst starts. Three numbers,
per small demo workload, measured in one run:

* first burst of a fresh Python process (``result.time_to_first_step_s``): importing the package
  started the torch-preloaded forkserver in the background, and this burst waits for whatever of its
  imports is left. Measured in fresh ``python -c`` subprocesses that import the package, build the
  demo and call ``run_burst`` at once (a user typing would give the server more time); the clock starts
  at the call, and the time from the start of the import is recorded too. Median of ``--fresh`` runs.
* every later burst in the same process: ``--later`` bursts after the first, median and max. Each
  pays a fork from the warm server, unpickling the workload, building model/optimizer/loader and one
  training step.
* a cold ``spawn`` baseline, interleaved with the later bursts: ``torch.multiprocessing.start_processes``
  with ``start_method="spawn"`` of a minimal function that imports torch, builds the same model, and
  does one optimizer step on one batch (what a launcher without a preloaded server pays every time).
  Its time is when the parent receives the child's "first step" message, as the engine's is.

Each measurement starts once the machine is quiet (other jobs share this 2-core machine).

Each is measured for one rank and for two DDP ranks (gloo) of the same workload: a DDP burst's
first step needs both ranks forked, the process group formed and the model broadcast.

The clock stops when the first step's event arrives, so each time includes the workload's own first
step (0.2 s for the image demo, whatever the harness does). The "harness part" subtracts it (the
fastest rank's ``first_step_s``): what the burst costs before the user's code trains.

Goals: first burst <= 1.2 s (whole time), later bursts <= 0.1 s (harness part: no launcher can start a
0.2 s step in less than 0.2 s); the later/cold-spawn ratio shows what the forkserver buys, and the cold
spawn itself how fast the machine is that day.

Run:  .venv/bin/python benchmarks/time_to_first_step.py [--fresh 3] [--later 5] [--workloads mlp,lm,image]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from _common import QuietGate, fmt_ratio, load_average, positive_int, spread, table, workloads_arg, write_json

import accel_widgets as aw

GOAL_FIRST_S = 1.2
GOAL_LATER_S = 0.1
CONFIGS = {"1 rank": {}, "2 DDP ranks": {"parallel": "ddp", "world_size": 2}}
FRESH_TIMEOUT_S = 300

# The fresh process imports the package, builds the demo and calls run_burst at once.
FRESH_CODE = """
import time
started = time.perf_counter()
import json, accel_widgets as aw
workload = aw.demo_workload({name!r})
called = time.perf_counter()
result = aw.run_burst(workload, aw.Config(**{knobs!r}), steps=1)
print(json.dumps({{"time_to_first_step_s": result.time_to_first_step_s, "wall_s": result.wall_s,
                  "from_import_s": called - started + result.time_to_first_step_s,
                  "setup_s": result.ranks[0].setup_s,
                  "first_step_s": min(rank.first_step_s for rank in result.ranks)}}))
"""


def first_burst_in_fresh_process(name: str, knobs: dict[str, Any]) -> dict[str, float]:
    """One ``python -c`` process: import the package, build the demo, time its first ``run_burst``."""
    completed = subprocess.run([sys.executable, "-c", FRESH_CODE.format(name=name, knobs=knobs)],
                               capture_output=True, text=True, timeout=FRESH_TIMEOUT_S, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"fresh-process burst of {name} failed:\n{completed.stderr[-2000:]}")
    measured: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return measured


def later_burst(workload: aw.Workload, knobs: dict[str, Any]) -> dict[str, float]:
    result = aw.run_burst(workload, aw.Config(**knobs), steps=1)
    assert result.time_to_first_step_s is not None
    return {"time_to_first_step_s": result.time_to_first_step_s, "setup_s": result.ranks[0].setup_s,
            "first_step_s": min(rank.first_step_s for rank in result.ranks)}


def harness_part(measured: dict[str, float]) -> float:
    """Time to first step less the workload's own first step: what the launch costs before training."""
    return measured["time_to_first_step_s"] - measured["first_step_s"]


def cold_spawn_target(rank: int, workload: aw.Workload, threads: int, events: Any) -> None:
    """The cold baseline's whole job: import torch, build the model, take one optimizer step, report.

    ``rank`` is the index ``start_processes`` passes. The workload arrives pickled by spawn (the demo
    classes travel by reference, so unpickling imports torch and the demo module, as the engine does).
    """
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    torch.set_num_threads(threads)
    model = workload.build_model()
    optimizer = workload.optimizer(model.parameters())
    generator = torch.Generator().manual_seed(workload.seed)
    loader = DataLoader(workload.dataset, batch_size=workload.batch_size, drop_last=True,
                        sampler=RandomSampler(workload.dataset, generator=generator))
    inputs, targets = next(iter(loader))
    loss = workload.loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    events.put(("step", rank, loss.item()))


def cold_spawn(workload: aw.Workload, threads: int) -> float:
    """Seconds from ``start_processes(..., start_method="spawn")`` to the child's first-step message."""
    import torch.multiprocessing as torch_mp

    events = torch_mp.get_context("spawn").Queue()
    started = time.perf_counter()
    context = torch_mp.start_processes(cold_spawn_target, args=(workload, threads, events), nprocs=1, join=False,
                                       start_method="spawn")
    events.get(timeout=FRESH_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    while not context.join(timeout=30):
        pass
    events.close()
    events.join_thread()
    return elapsed


def _s(stats: dict[str, float], key: str) -> str:
    return f"{stats[key]:.3f} s"


def _verdict(median_ok: bool, every_ok: bool) -> str:
    if every_ok:
        return "met"
    return "median met, not every burst" if median_ok else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", type=positive_int, default=3, help="fresh processes per workload (default 3)")
    parser.add_argument("--later", type=positive_int, default=5,
                        help="later bursts (and cold spawns) per workload (default 5)")
    parser.add_argument("--workloads", type=workloads_arg, default=["mlp", "lm", "image"],
                        help="comma-separated small demos (default mlp,lm,image)")
    args = parser.parse_args()
    load_at_start = load_average()
    threads = max(1, aw.probe_device().cpu_count)
    gate = QuietGate()

    # Fresh processes first, while this process's forkserver is idle.
    cases = [(name, label) for name in args.workloads for label in CONFIGS]
    fresh: dict[tuple[str, str], list[dict[str, float]]] = {case: [] for case in cases}
    for i in range(args.fresh):
        for name, label in cases:
            gate.wait()
            fresh[name, label].append(first_burst_in_fresh_process(name, CONFIGS[label]))
            print(f"  fresh {i + 1}/{args.fresh} {name} {label}: "
                  f"{fresh[name, label][-1]['time_to_first_step_s']:.3f} s", flush=True)

    workloads = {name: aw.demo_workload(name) for name in args.workloads}
    this_process_first = later_burst(workloads[args.workloads[0]], {})  # this process's server was prestarted
    later: dict[tuple[str, str], list[dict[str, float]]] = {case: [] for case in cases}
    spawned: dict[str, list[float]] = {name: [] for name in args.workloads}
    for name, workload in workloads.items():
        for i in range(args.later):
            # Alternate the order so neither variant always runs right after the other.
            gate.wait()
            if i % 2:
                spawned[name].append(cold_spawn(workload, threads))
            for label, knobs in CONFIGS.items():
                later[name, label].append(later_burst(workload, knobs))
            if not i % 2:
                spawned[name].append(cold_spawn(workload, threads))
            print(f"  later {i + 1}/{args.later} {name}: " + ", ".join(
                f"{label} {later[name, label][-1]['time_to_first_step_s']:.3f} s" for label in CONFIGS)
                + f", cold spawn {spawned[name][-1]:.3f} s", flush=True)

    results = []
    for name, label in cases:
        first = spread([r["time_to_first_step_s"] for r in fresh[name, label]])
        after = spread([r["time_to_first_step_s"] for r in later[name, label]])
        after_harness = spread([harness_part(r) for r in later[name, label]])
        spawn = spread(spawned[name])
        ratios = spread([e["time_to_first_step_s"] / s
                         for e, s in zip(later[name, label], spawned[name], strict=True)])
        results.append({
            "workload": name,
            "ranks": label,
            "first_burst_fresh_process_s": first,
            "first_burst_from_import_s": spread([r["from_import_s"] for r in fresh[name, label]]),
            "first_burst_harness_part_s": spread([harness_part(r) for r in fresh[name, label]]),
            "later_burst_s": after,
            "later_burst_harness_part_s": after_harness,
            "later_burst_worker_setup_s": spread([r["setup_s"] for r in later[name, label]]),
            "later_burst_worker_first_step_s": spread([r["first_step_s"] for r in later[name, label]]),
            "cold_spawn_s": spawn,
            "later_over_cold_spawn": ratios,
            "meets_first_goal": first["median"] <= GOAL_FIRST_S,
            "meets_later_goal_median": after_harness["median"] <= GOAL_LATER_S,
            "meets_later_goal_every_burst": after_harness["max"] <= GOAL_LATER_S,
            "raw": {"fresh": fresh[name, label], "later": later[name, label], "cold_spawn_s": spawned[name]},
        })

    print()
    print(table(
        ["workload", "ranks", f"first burst median (min), goal <= {GOAL_FIRST_S} s", "from import (median)",
         "later median / max (min)", f"harness part of later, median / max, goal <= {GOAL_LATER_S} s",
         "cold spawn median (min)",
         "later / cold spawn median (min-max)"],
        [[r["workload"], r["ranks"],
          f"{_s(r['first_burst_fresh_process_s'], 'median')} ({_s(r['first_burst_fresh_process_s'], 'min')}) "
          f"{'met' if r['meets_first_goal'] else 'NOT met'}",
          _s(r["first_burst_from_import_s"], "median"),
          f"{_s(r['later_burst_s'], 'median')} / {_s(r['later_burst_s'], 'max')} ({_s(r['later_burst_s'], 'min')})",
          f"{_s(r['later_burst_harness_part_s'], 'median')} / {_s(r['later_burst_harness_part_s'], 'max')} "
          f"{_verdict(r['meets_later_goal_median'], r['meets_later_goal_every_burst'])}",
          f"{_s(r['cold_spawn_s'], 'median')} ({_s(r['cold_spawn_s'], 'min')})",
          fmt_ratio(r["later_over_cold_spawn"])] for r in results],
    ))
    print("(min: noise from other jobs only ever adds time, so the minimum shows what a quiet machine does)")
    own_first = this_process_first["time_to_first_step_s"]
    print(f"\n(this process's own first burst, {args.workloads[0]}: {own_first:.3f} s)")
    path = write_json("time_to_first_step", {
        "goal_first_s": GOAL_FIRST_S, "goal_later_s": GOAL_LATER_S, "fresh_runs": args.fresh,
        "later_bursts": args.later, "threads": threads, "load_average_at_start": load_at_start,
        "waited_for_quiet_s": gate.waited_s,
        "this_process_first_burst": {"workload": args.workloads[0], **this_process_first},
        "workloads": results,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
