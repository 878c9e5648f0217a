"""DDP from a notebook: how fast a 2-rank burst gets going, and what 2 CPU ranks buy over 1.

(1) Time from calling ``run_burst`` to the first training step of *every* rank (2 gloo ranks, warm
    forkserver), against a bare ``torchrun --standalone --nproc-per-node 2`` of an empty script
    (time until both ranks are running: the floor of what a torchrun launch costs). Goal: ratio <= 0.5.
(2) Steady-state samples/s of 2 ranks against 1 rank, same config, interleaved; scaling efficiency.

    python benchmarks/ddp_startup.py [--repeats 5] [--workloads mlp,image]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import fmt_ratio, positive_int, spread, table, workloads_arg, write_json

EMPTY_RANK = "import time\nprint('ranks-running-at', time.perf_counter(), flush=True)\n"


def bare_torchrun_seconds() -> float:
    """Launch to the moment both ranks of an empty script are running (perf_counter is system-wide)."""
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "empty.py"
        script.write_text(EMPTY_RANK)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": scratch},
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        times = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("ranks-running-at")]
        return max(times) - started


def engine_first_step_seconds(workload: object, config: object) -> float:
    """Launch to the first step event of the last rank to get there."""
    import accel_widgets as aw

    started = time.perf_counter()
    first: dict[int, float] = {}

    def on_event(event: object) -> None:
        if isinstance(event, aw.StepRecord) and event.rank not in first:
            first[event.rank] = time.perf_counter()

    aw.run_burst(workload, config, steps=2, on_event=on_event)
    return max(first.values()) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--workloads", type=workloads_arg, default=["mlp", "image"])
    args = parser.parse_args()
    import accel_widgets as aw

    ddp = aw.Config(parallel="ddp", world_size=2)
    startup_workload = aw.demo_workload("mlp")
    aw.run_burst(startup_workload, ddp, steps=1)  # the forkserver is warm in a working session
    engine, bare = [], []
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        engine.append(engine_first_step_seconds(startup_workload, ddp))
        bare.append(bare_torchrun_seconds())
    ratios = [e / b for e, b in zip(engine, bare, strict=True)]
    print(table(["", "median s", "min", "max"],
                [["engine: launch -> first step of both ranks", *(f"{spread(engine)[k]:.3f}" for k in
                                                                  ("median", "min", "max"))],
                 ["bare torchrun: launch -> both ranks running", *(f"{spread(bare)[k]:.3f}" for k in
                                                                   ("median", "min", "max"))]]))
    print(f"ratio engine/torchrun: {fmt_ratio(spread(ratios))} (goal <= 0.5)\n")

    scaling_rows, scaling = [], {}
    for name in args.workloads:
        workload = aw.demo_workload(name)
        one, two = [], []
        for _ in range(3):
            one.append(aw.run_burst(workload, aw.Config(), steps=args.steps).samples_per_s)
            two.append(aw.run_burst(workload, ddp, steps=args.steps).samples_per_s)
        efficiency = [b / (2 * a) for a, b in zip(one, two, strict=True)]
        scaling[name] = {"one_rank": spread(one), "two_ranks": spread(two), "efficiency": spread(efficiency)}
        scaling_rows.append([workload.name, f"{spread(one)['median']:,.0f}", f"{spread(two)['median']:,.0f}",
                             f"{spread(two)['median'] / spread(one)['median']:.2f}x", fmt_ratio(spread(efficiency))])
    print(table(["workload", "1 rank samples/s", "2 ranks samples/s", "2 vs 1", "efficiency"], scaling_rows))
    path = write_json("ddp_startup", {
        "startup": {"engine_s": spread(engine), "bare_torchrun_s": spread(bare), "ratio": spread(ratios)},
        "scaling": scaling,
    })
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
