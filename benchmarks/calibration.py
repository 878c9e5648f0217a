"""Calibration of the comparison engine on this machine: are its verdicts right as often as they claim?

Runs real comparisons (``aw.compare``, held ranks, the default engine) of three kinds, interleaved so the machine's
mood lands on all of them alike:

* ``compute``: the same config against itself, on a compute-bound workload (2 conv layers on a 2048x3x24x24
  TensorDataset, batch 32, no loader workers): every "faster" or "slower" verdict is a false alarm;
* ``data``: the same config against itself, on a data-bound workload (per-item random crop and three blurs) with 2
  loader workers: false alarms again;
* ``effect``: loader workers (2) against none on that data-bound workload, a large real effect: the engine should
  decide it, the same way every time (on 2 cores the two workers can lose to none: the direction is the machine's).

The goals (issue 28): false "faster"/"slower" verdicts <= 5% of the same-vs-same comparisons, the real effect found
>= 90% of the time, and the cost per comparison stated (bursts and seconds). Each rate is printed with a 95% Wilson
interval, since 40 comparisons cannot pin a rate to a percent.

Run:  .venv/bin/python benchmarks/calibration.py [--rounds 20] [--budget 30] [--effect-budget 45]
      (writes results/calibration.json)
      .venv/bin/python benchmarks/calibration.py --combine calibration calibration-2 --name calibration-all
      (one summary over the runs of several sessions, each run kept with the file it came from)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from _common import RESULTS_DIR, QuietGate, load_average, positive_int, table, write_json
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import accel_widgets as aw
from accel_widgets.metrics.sequential import VERDICTS


class ConvNet(nn.Module):
    """The compute-bound workload of issue 28's finding: two conv layers, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(32 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Augmented(Dataset):
    """uint8 images augmented per item on the CPU: a random crop and three box blurs (the data-bound workload)."""

    def __init__(self, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 40, 40), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i].float() / 255
        top, left = torch.randint(0, 9, (2,)).tolist()
        x = x[:, top:top + 32, left:left + 32]
        for _ in range(3):
            x = F.avg_pool2d(x.unsqueeze(0), 3, stride=1, padding=1).squeeze(0)
        return x, self.labels[i]


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)


def compute_workload() -> aw.Workload:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2048, 3, 24, 24, generator=g)
    dataset = TensorDataset(images, torch.randint(0, 10, (2048,), generator=g))
    return aw.Workload(model=ConvNet, dataset=dataset, loss_fn=F.cross_entropy, batch_size=32,
                       name="calibration-compute", optimizer=sgd)


def data_workload() -> aw.Workload:
    return aw.Workload(model=SmallNet, dataset=Augmented(), loss_fn=F.cross_entropy, batch_size=32,
                       name="calibration-data", optimizer=sgd)


KINDS: dict[str, tuple[Any, aw.Config, aw.Config, bool]] = {
    # kind: (workload factory, reference, subject, is there a real effect)
    "compute": (compute_workload, aw.Config(), aw.Config(), False),
    "data": (data_workload, aw.Config(num_workers=2), aw.Config(num_workers=2), False),
    "effect": (data_workload, aw.Config(), aw.Config(num_workers=2), True),
}


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a rate ``hits / n``."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def one(kind: str, budget_s: float, steps: int) -> dict[str, Any]:
    factory, reference, subject, _ = KINDS[kind]
    started = time.perf_counter()
    found = aw.compare(factory(), reference, subject, budget_s=budget_s, steps=steps)
    wall = time.perf_counter() - started
    interval = found.interval
    noise = found.noise
    return {"kind": kind, "budget_s": budget_s, "verdict": found.verdict, "ratio": found.ratio,
            "low": interval.low if interval.bounded else None, "high": interval.high if interval.bounded else None,
            "blocks": len(found.counted), "left_out": len(found.blocks) - len(found.counted),
            "bursts": len(found.windows), "wall_s": wall, "stopped": found.stopped, "error": found.error,
            "window_ratios": found.window_ratios,
            "noise": None if noise is None else {"between": noise.between, "within": noise.within,
                                                 "drift": noise.drift, "other_load_pct": noise.other_load_pct}}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    same = [r for r in runs if not KINDS[r["kind"]][3]]
    effect = [r for r in runs if KINDS[r["kind"]][3]]
    false = sum(r["verdict"] in ("faster", "slower") for r in same)
    # The real effect's direction is the machine's to say (two loader workers on two cores can lose to none): found
    # is a decided verdict in the direction most decided ones took; a decided verdict the other way is a false one.
    decided = [r["verdict"] for r in effect if r["verdict"] in ("faster", "slower")]
    direction = max(("faster", "slower"), key=decided.count) if decided else "faster"
    found = decided.count(direction)
    walls = [r["wall_s"] for r in runs]
    return {
        "same_vs_same": len(same), "false_verdicts": false, "false_rate": false / len(same) if same else None,
        "false_rate_wilson95": wilson(false, len(same)),
        "same_verdicts": {v: sum(r["verdict"] == v for r in same) for v in VERDICTS},
        "effect_comparisons": len(effect), "effect_direction": direction, "effect_found": found,
        "effect_wrong_way": len(decided) - found,
        "effect_verdicts": {v: sum(r["verdict"] == v for r in effect) for v in VERDICTS},
        "effect_rate": found / len(effect) if effect else None, "effect_rate_wilson95": wilson(found, len(effect)),
        "median_bursts": statistics.median(r["bursts"] for r in runs),
        "median_wall_s": statistics.median(walls), "max_wall_s": max(walls),
        "budgets_s": {kind: sorted({r["budget_s"] for r in runs if r["kind"] == kind}) for kind in KINDS},
        "over_budget": sum(r["wall_s"] > 1.1 * r["budget_s"] for r in runs),
        "burst_to_burst": {kind: [min(x for r in runs if r["kind"] == kind for x in r["window_ratios"]),
                                  max(x for r in runs if r["kind"] == kind for x in r["window_ratios"])]
                           for kind in KINDS if any(r["kind"] == kind and r["window_ratios"] for r in runs)},
    }


def combine(names: list[str], name: str) -> None:
    """One summary over runs measured apart: calibration is a rate, and its interval narrows with every run kept."""
    runs = [{**run, "source": source}
            for source in names
            for run in json.loads((RESULTS_DIR / f"{source}.json").read_text())["runs"]]
    summary = summarise(runs)
    print(table(["", "value"], [(key, value) for key, value in summary.items()]))
    write_json(name, {"summary": summary, "sources": names, "runs": runs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=20, help="comparisons of each kind (default 20)")
    parser.add_argument("--budget", type=float, default=30.0, help="each same-vs-same comparison's budget in seconds")
    parser.add_argument("--effect-budget", type=float, default=45.0,
                        help="each effect comparison's budget: its 0-worker windows are the slowest, and an interval "
                             "needs 4 blocks")
    parser.add_argument("--steps", type=positive_int, default=30, help="measured steps of the first bursts")
    parser.add_argument("--kinds", default=",".join(KINDS), help="which kinds to run (default all)")
    parser.add_argument("--name", default="calibration", help="results/<name>.json (a run of some kinds apart)")
    parser.add_argument("--combine", nargs="+", metavar="NAME",
                        help="measure nothing: summarise the runs stored in results/<NAME>.json files together")
    args = parser.parse_args()
    if args.combine:
        combine(args.combine, args.name)
        return
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    gate = QuietGate()
    runs: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        for kind in kinds if round_index % 2 == 0 else reversed(kinds):
            gate.wait()
            run = one(kind, args.effect_budget if KINDS[kind][3] else args.budget, args.steps)
            runs.append(run)
            print(f"round {round_index + 1:2d} {kind:8s} {run['verdict']:9s} "
                  f"{run['ratio'] or float('nan'):.3f} [{run['low'] or 0:.3f}-{run['high'] or math.inf:.3f}] "
                  f"{run['blocks']} blocks, {run['bursts']} bursts, {run['wall_s']:.1f} s; {run['stopped']}",
                  flush=True)
    summary = summarise(runs)
    print(table(["", "value"], [(key, value) for key, value in summary.items()]))
    write_json(args.name, {"summary": summary, "runs": runs, "load_average": load_average(),
                               "quiet_wait_s": gate.waited_s})


if __name__ == "__main__":
    main()
