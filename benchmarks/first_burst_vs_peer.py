"""The first DDP burst of a fresh process, started as scripts and notebooks really start, against a peer.

A script or a notebook imports torch (and its other libraries) first and accel_widgets after, then trains at
once. What a user would compare with is Accelerate's ``notebook_launcher`` in the same position: a fresh
process that imports torch and accelerate, then launches 2 ranks of a training function. Both sides train the
same small MLP with AdamW on 2 gloo CPU ranks; the time is from the call (``run_burst`` /
``notebook_launcher``) to the end of the slowest rank's first optimizer step, read on the machine-wide
monotonic clock, in a fresh process each time, the two interleaved (``--repeats`` pairs, order alternating).

Goal (issue #18): the first burst no slower than the peer in this order of imports (median ratio <= 1.0).

    .venv/bin/python benchmarks/first_burst_vs_peer.py [--repeats 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import positive_int, spread, table, write_json

MODEL = """
import torch
from torch import nn

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

def make_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2048, 64, generator=g), torch.randint(0, 10, (2048,), generator=g)
"""

OURS = MODEL + """
import json, sys, time
import torch.nn.functional as F
import accel_widgets as aw  # after torch, as scripts do

x, y = make_data()
workload = aw.Workload(model=make_model, dataset=(x, y), loss_fn=F.cross_entropy, batch_size=64)
called = time.perf_counter()
firsts = {}

def on_event(event):
    if isinstance(event, aw.StepRecord) and event.rank not in firsts:
        firsts[event.rank] = called + event.t  # the step's end on the shared monotonic clock

aw.run_burst(workload, aw.Config(parallel="ddp", world_size=2), steps=5, on_event=on_event)
print(json.dumps({"first_step_s": max(firsts.values()) - called}))
"""

PEER = MODEL + """
import json, os, sys, time
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator, notebook_launcher

def train(called, path):
    accelerator = Accelerator(cpu=True)
    x, y = make_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for inputs, targets in loader:
        loss = F.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        with open(f"{path}.{accelerator.process_index}", "w") as fh:
            fh.write(str(time.perf_counter() - called))
        break

path = sys.argv[1]
called = time.perf_counter()
notebook_launcher(train, args=(called, path), num_processes=2)
print(json.dumps({"first_step_s": max(float(open(f"{path}.{r}").read()) for r in (0, 1))}))
"""


def fresh(code: str, scratch: str) -> float:
    """Run ``code`` in a fresh interpreter; its first-step time."""
    env = {**os.environ, "TMPDIR": scratch, "ACCEL_WIDGETS_CACHE": os.path.join(scratch, "cache")}
    done = subprocess.run([sys.executable, "-c", code, os.path.join(scratch, "peer")], capture_output=True,
                          text=True, timeout=300, env=env, cwd=scratch)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return float(json.loads(done.stdout.strip().splitlines()[-1])["first_step_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=6)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="aw-first-burst-") as scratch:
        fresh(PEER, scratch)  # unmeasured: the page cache holds torch and accelerate for both sides alike
        fresh(OURS, scratch)
        for repeat in range(args.repeats):
            order = ("ours", "peer") if repeat % 2 == 0 else ("peer", "ours")
            times = {side: fresh(OURS if side == "ours" else PEER, scratch) for side in order}
            rows.append({**times, "ratio": times["ours"] / times["peer"], "order": order})
            print(f"  pair {repeat + 1}: ours {times['ours']:.2f} s, notebook_launcher {times['peer']:.2f} s, "
                  f"ratio {rows[-1]['ratio']:.2f}", flush=True)
    summary = {side: spread([r[side] for r in rows]) for side in ("ours", "peer", "ratio")}
    print(table(["", "median", "min", "max"], [[side, f"{s['median']:.2f}", f"{s['min']:.2f}", f"{s['max']:.2f}"]
                                               for side, s in summary.items()]))
    print(f"goal: median ratio <= 1.0: {'met' if summary['ratio']['median'] <= 1.0 else 'NOT met'}")
    path = write_json("first_burst_vs_peer", {"repeats": args.repeats, "pairs": rows, "summary": summary})
    print(f"wrote {path}")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"took {time.monotonic() - started:.0f} s")
