"""(e) Lifetime: how fast a burst's processes go when they must, and whether compiled kernels are kept.

Three measurements of issue #9's promises, each as a user meets them:

* **Stop with DataLoader workers**: seconds from setting ``stop`` (at the 4th step record) to
  ``run_burst`` returning, with ``num_workers=2``. Goal: median <= 0.2 s.
* **The owner is killed**: a fresh ``python -c`` owner runs a 120 s burst (one rank with a loader
  worker, and two DDP ranks), prints at its first step and is SIGKILLed, as the OOM killer or a kernel
  restart past its grace period does. Seconds until every rank and loader worker has exited, and until
  the forkserver and the resource tracker have too. Goal: ranks and workers <= 2 s.
* **Warm re-compile**: the first-step time of two identical ``compile_mode="default"`` bursts in a
  fresh private cache: the second compiles from the kernels the first left in the ranks' 0700 cache.

Run:  .venv/bin/python benchmarks/lifetime.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _common import positive_int, spread, table, write_json

import accel_widgets as aw
from accel_widgets.engine.process import running

ROOT = Path(__file__).resolve().parent.parent
GOAL_STOP_S = 0.2
GOAL_OWNER_S = 2.0
OWNER = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import accel_widgets as aw
from lifetime import tiny_workload

printed = []

def on_event(event):
    if isinstance(event, aw.StepRecord) and not printed:
        printed.append(1)
        print("STEP", flush=True)

aw.run_burst(tiny_workload(), aw.Config(**json.loads(sys.argv[1])), seconds=120, on_event=on_event)
"""


def tiny_workload() -> aw.Workload:
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=generator)
    return aw.Workload(model=lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                         torch.nn.Linear(32, 4)),
                       dataset=(x, x[:, :4].argmax(dim=1)), loss_fn=F.cross_entropy, batch_size=32, name="tiny")


def stop_latency() -> float:
    stop, pressed = threading.Event(), []

    def on_event(event: Any) -> None:
        if isinstance(event, aw.StepRecord) and event.step == 3 and not stop.is_set():
            stop.set()
            pressed.append(time.perf_counter())

    result = aw.run_burst(tiny_workload(), aw.Config(num_workers=2), steps=100_000, on_event=on_event, stop=stop)
    assert result.status == "stopped", result.status
    return time.perf_counter() - pressed[0]


def owner_killed(knobs: dict[str, Any]) -> dict[str, float]:
    """SIGKILL an owner mid-burst; seconds until its ranks and workers, then everything, are gone."""
    tmp = tempfile.mkdtemp(prefix="awl-", dir="/tmp")  # short: the owner's forkserver socket lives there
    env = {**os.environ, "TMPDIR": tmp}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, json.dumps(knobs)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        while "STEP" not in owner.stdout.readline():
            if owner.poll() is not None:
                raise RuntimeError("the owner exited before its first step")
        family = psutil.Process(owner.pid).children(recursive=True)
        infrastructure = psutil.Process(owner.pid).children()
        ranks = [p for p in family if p not in infrastructure]
        killed = time.perf_counter()
        owner.kill()
        while running(ranks):
            time.sleep(0.002)
        ranks_s = time.perf_counter() - killed
        while running(family):
            time.sleep(0.002)
        return {"processes": len(ranks), "ranks_and_workers_s": ranks_s, "everything_s": time.perf_counter() - killed}
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)


def warm_recompile() -> list[float]:
    """First-step seconds of two identical compiled bursts in a fresh cache root."""
    cache = tempfile.mkdtemp(prefix="aw-compile-")
    try:
        return [aw.run_burst(tiny_workload(), aw.Config(compile_mode="default"), steps=5,
                             options=aw.BurstOptions(cache_dir=cache)).first_step_s for _ in range(2)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _owner_goal(runs: list[dict[str, float]]) -> str:
    met = max(run["ranks_and_workers_s"] for run in runs) <= GOAL_OWNER_S
    return f"<= {GOAL_OWNER_S} s every time: {'met' if met else 'NOT met'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args()
    stops = [stop_latency() for _ in range(2 * args.repeats + 1)]
    kills = {label: [owner_killed(knobs) for _ in range(args.repeats)]
             for label, knobs in (("1 rank + 1 loader worker", {"num_workers": 1}),
                                  ("2 DDP ranks", {"parallel": "ddp", "world_size": 2}))}
    compiles = warm_recompile()
    print(table(["measurement", "median (min-max)", "goal"], [
        ["Stop with 2 loader workers", f"{statistics.median(stops):.3f} s ({min(stops):.3f}-{max(stops):.3f})",
         f"<= {GOAL_STOP_S} s: {'met' if statistics.median(stops) <= GOAL_STOP_S else 'NOT met'}"],
        *[[f"owner SIGKILLed, {label}: ranks and workers gone",
           f"{statistics.median(k['ranks_and_workers_s'] for k in runs):.3f} s", _owner_goal(runs)]
          for label, runs in kills.items()],
        *[[f"owner SIGKILLed, {label}: forkserver and tracker gone too",
           f"{statistics.median(k['everything_s'] for k in runs):.3f} s", "-"] for label, runs in kills.items()],
        ["compiled first step: cold cache, then warm", f"{compiles[0]:.1f} s, then {compiles[1]:.1f} s",
         "warm < cold: " + ("met" if compiles[1] < compiles[0] else "NOT met")],
    ]))
    path = write_json("lifetime", {"stop_latency_s": spread(stops), "owner_killed": kills,
                                   "compile_first_step_s": {"cold": compiles[0], "warm": compiles[1]}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
