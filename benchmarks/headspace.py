"""Headspace on this CPU (issue 31): the ceiling each part of the step sets, measured, and the knobs read against it.

Why: a ceiling is only worth measuring if it bounds what the knobs of its part reach, and reads "same" where the part
costs nothing. Every comparison here is the comparison engine's (interleaved blocks, an anytime-valid interval):

* **data-bound** steps, each config at ``num_workers=0``: the image demo (per-item augmentation of 3x-supersampled
  images) and a per-item decode (a 3 ms sleep per item, batch 8; the test's workload, independent of how busy the
  cores are). The config with the data free (a few batches on the device, cycled) against the config as it is, and
  in the same measurement the data knobs a person would try (1 and 2 loader workers): each knob's speed-up should lie
  at or below the ceiling, within the intervals (``knob.low <= ceiling.high``);
* **compute-bound** steps: eight 768-wide layers on a batch of 32 from a TensorDataset, and the LM demo: the data
  ceiling should read "same" (``aw.headspace`` with ``min_effect`` 0.15 for the matmuls, as its test);
* **DDP x 2 (gloo)**: the communication ceiling of the LM demo (gradient synchronisation skipped on every step).

On a 2-core machine shared with other work, blocks beside another process's load are left out (the engine's rule),
and the JSON keeps how many were counted and why others were not.

Run:  PYTHONPATH=. .venv/bin/python benchmarks/headspace.py [--budget 90]   (~8 minutes)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from _common import table, write_json
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import accel_widgets as aw  # noqa: E402  (the repository's package, after its root is on the path)
from accel_widgets.results.comparison import Comparison  # noqa: E402
from accel_widgets.search.compare import measure_pairs  # noqa: E402
from tests.search.test_headspace import data_bound_workload  # noqa: E402  (the per-item decode of the tests)


def comparison_row(case: str, what: str, comparison: Comparison) -> dict[str, Any]:
    """A comparison as plain numbers: its ratio and interval, verdict, blocks counted and left out, and why."""
    interval = comparison.interval if comparison.counted else None
    return {"case": case, "what": what, "ratio": comparison.ratio, "low": interval.low if interval else None,
            "high": interval.high if interval else None, "verdict": comparison.verdict if interval else None,
            "blocks_counted": len(comparison.counted),
            "blocks_left_out": len(comparison.blocks) - len(comparison.counted),
            "left_out_because": sorted({b.left_out for b in comparison.blocks if b.left_out}),
            "stopped": comparison.stopped, "error": comparison.error, "wall_s": comparison.wall_s}


def data_bound(case: str, workload: aw.Workload, budget_s: float) -> list[dict[str, Any]]:
    """The data ceiling and two loader-worker configs, in one interleaved measurement; each knob read against it. The
    budget is the repeats' (four first bursts of a data-bound step would take half of it)."""
    configs = [aw.Config(), aw.Config(), aw.Config(num_workers=1), aw.Config(num_workers=2)]
    found = measure_pairs(workload, configs, [(0, 1), (0, 2), (0, 3)], freed=[None, "data", None, None],
                          budget_s=budget_s, steps=5, window_s=0.3, budget_covers_firsts=False)
    ceiling, *knobs = found.comparisons
    rows = [comparison_row(case, "data free (the ceiling)", ceiling)]
    for name, knob in zip(("num_workers=1", "num_workers=2"), knobs, strict=True):
        row = comparison_row(case, name, knob)
        row["at_or_below_ceiling"] = (knob.counted and ceiling.counted and knob.interval.low <= ceiling.interval.high)
        rows.append(row)
    return rows


def matmuls() -> aw.Workload:
    model = nn.Sequential(*(nn.Linear(768, 768) for _ in range(8)))
    return aw.Workload(model=model, dataset=(torch.randn(256, 768), torch.randn(256, 768)), loss_fn=F.mse_loss,
                       batch_size=32, name="matmuls")


def ceiling_rows(case: str, found: aw.Headspace) -> list[dict[str, Any]]:
    rows = []
    for part, ceiling in found.ceilings.items():
        if ceiling.comparison is None:
            rows.append({"case": case, "what": f"{part} free", "not_measured": ceiling.why_not})
        else:
            rows.append({**comparison_row(case, f"{part} free (the ceiling)", ceiling.comparison),
                         "room": ceiling.room, "closed": ceiling.closed_text})
    return rows


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=90.0, help="seconds per measurement (default 90)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    rows += data_bound("image-small, 0 workers", aw.demo_workload("image"), args.budget)
    print("image done", flush=True)
    rows += data_bound("per-item decode (3 ms/item), 0 workers", data_bound_workload(), args.budget)
    print("decode done", flush=True)
    rows += ceiling_rows("matmuls (8 x 768, batch 32)", aw.headspace(matmuls(), aw.Config(), parts=["data"],
                                                                    budget_s=args.budget, min_effect=0.15, steps=5,
                                                                    window_s=0.3))
    rows += ceiling_rows("lm-small", aw.headspace(aw.demo_workload("lm"), aw.Config(), parts=["data"],
                                                  budget_s=args.budget, steps=5, window_s=0.3))
    print("compute-bound done", flush=True)
    rows += ceiling_rows("lm-small, DDP x 2 (gloo)", aw.headspace(aw.demo_workload("lm"),
                                                                  aw.Config(parallel="ddp", world_size=2),
                                                                  parts=["communication"], budget_s=args.budget,
                                                                  steps=5, window_s=0.3))
    print(table(["case", "what", "speed-up", "95% interval", "verdict", "blocks", "note"],
                [[r["case"], r["what"], fmt(r.get("ratio")), f"{fmt(r.get('low'))}-{fmt(r.get('high'))}",
                  r.get("verdict") or "-", f"{r.get('blocks_counted', 0)}+{r.get('blocks_left_out', 0)} left out",
                  r.get("not_measured") or r.get("closed") or ("at/below ceiling" if r.get("at_or_below_ceiling")
                                                               else "")]
                 for r in rows]))
    path = write_json("headspace", {"budget_s": args.budget, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
