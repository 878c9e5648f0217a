"""The first DDP burst of a fresh process, and the burst after the user's module was edited and reloaded, against a
peer.

A script or a notebook imports torch, its other libraries and its own modules first and accel_widgets after, then
trains at once; in a notebook it then edits its model's module, reloads it and trains again. What a user would
compare with is Accelerate's ``notebook_launcher`` in the same position: a fresh process that imports torch,
accelerate and the same module, launches 2 ranks, reloads the module and launches again (it forks the caller each
time, so it always runs the code the caller holds). Both sides train the same small MLP, defined in a module of
their own (``bench_model.py``, next to the script, as a user's ``models.py`` is) with AdamW on 2 gloo CPU ranks; the
time is from the call (``run_burst`` / ``notebook_launcher``) to the end of the slowest rank's first optimizer step,
read on the machine-wide monotonic clock (and, for the first burst, from the import of accel_widgets / accelerate:
importing accel_widgets forks its server, which the time from the call alone does not see), in a fresh process each
time, the sides interleaved (``--repeats`` rounds, order rotating). The reload changes a constant the model does not
use, so both bursts train the same amount of work, and each side checks that its ranks ran the reloaded module.

``--before PATH`` adds a third side: this package as another checkout has it (``PYTHONPATH=PATH``; e.g. the main
branch before user modules travelled by value): what the change costs, measured in the same run.

Goal (issues #18, #35): the first burst no slower than the peer in this order of imports (median ratio <= 1.0), and
the burst after a reload no slower than the peer's either.

    .venv/bin/python benchmarks/first_burst_vs_peer.py [--repeats 6] [--before ../main]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import positive_int, spread, table, write_json

ROOT = Path(__file__).resolve().parent.parent
MODEL = """
import torch
from torch import nn

VERSION = {version}


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


def make_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2048, 64, generator=g), torch.randint(0, 10, (2048,), generator=g)
"""

#: Reloads ``bench_model`` with VERSION 20002 written in its file (a longer file: no stale .pyc either).
RELOAD = """
import importlib, pathlib
pathlib.Path("bench_model.py").write_text(sys.argv[2])
importlib.reload(bench_model)
"""

#: The second burst, and whether its ranks ran the reloaded module (each rank leaves a file named by the version).
REPORT = """
called_again, after = burst()
current = os.path.exists(f"rank-ran-version-{bench_model.VERSION}")
print(json.dumps({"first_step_s": first - called, "import_to_first_step_s": first - imported_from,
                  "after_reload_s": after - called_again, "ran_reloaded_code": current}))
"""

OURS = """
import json, os, sys, time
import torch
import torch.nn.functional as F
import bench_model
imported_from = time.perf_counter()
import accel_widgets as aw  # after torch and the user's module, as scripts do


def burst():
    x, y = bench_model.make_data()

    def model():
        open(f"rank-ran-version-{bench_model.VERSION}", "w").close()  # what the caller reads back
        return bench_model.make_model()

    workload = aw.Workload(model=model, dataset=(x, y), loss_fn=F.cross_entropy, batch_size=64)
    called = time.perf_counter()
    firsts = {}

    def on_event(event):
        if isinstance(event, aw.StepRecord) and event.rank not in firsts:
            firsts[event.rank] = called + event.t  # the step's end on the shared monotonic clock

    aw.run_burst(workload, aw.Config(parallel="ddp", world_size=2), steps=5, on_event=on_event)
    return called, max(firsts.values())


called, first = burst()
""" + RELOAD + REPORT


PEER = """
import json, os, sys, time
import torch
import torch.nn.functional as F
import bench_model
imported_from = time.perf_counter()
from accelerate import Accelerator, notebook_launcher


def train(called, path):
    open(f"rank-ran-version-{bench_model.VERSION}", "w").close()
    accelerator = Accelerator(cpu=True)
    x, y = bench_model.make_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    model = bench_model.make_model()
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for inputs, targets in loader:
        loss = F.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        with open(f"{path}.{accelerator.process_index}", "w") as fh:
            fh.write(str(time.perf_counter()))
        break


def burst():
    path = sys.argv[1]
    called = time.perf_counter()
    notebook_launcher(train, args=(called, path), num_processes=2)
    return called, max(float(open(f"{path}.{r}").read()) for r in (0, 1))


called, first = burst()
""" + RELOAD + REPORT

SIDES = ("ours", "peer", "before")


def fresh(code: str, scratch: str, pythonpath: str) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter next to a fresh ``bench_model.py``; its two first-step times."""
    Path(scratch, "bench_model.py").write_text(MODEL.format(version=1))
    for stale in Path(scratch).glob("rank-ran-version-*"):
        stale.unlink()
    env = {**os.environ, "TMPDIR": scratch, "ACCEL_WIDGETS_CACHE": os.path.join(scratch, "cache"),
           "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-c", code, os.path.join(scratch, "peer"), MODEL.format(version=20002)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=scratch)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=6)
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout of this repository to measure beside this one (e.g. the main branch)")
    args = parser.parse_args()
    code = {"ours": (OURS, str(ROOT)), "peer": (PEER, str(ROOT))}
    if args.before is not None:
        code["before"] = (OURS, str(args.before.resolve()))
    sides = [side for side in SIDES if side in code]
    rows = []
    with tempfile.TemporaryDirectory(prefix="aw-first-burst-") as scratch:
        for side in sides:  # unmeasured: the page cache holds torch and accelerate for every side alike
            fresh(code[side][0], scratch, code[side][1])
        for repeat in range(args.repeats):
            order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
            times = {side: fresh(code[side][0], scratch, code[side][1]) for side in order}
            row = {"order": order, **{f"{side} {when}": times[side][key] for side in sides
                                      for when, key in (("first", "first_step_s"), ("reload", "after_reload_s"),
                                                        ("import to first", "import_to_first_step_s"))},
                   "ran the reloaded code": {side: times[side]["ran_reloaded_code"] for side in sides}}
            for when in ("first", "reload", "import to first"):
                row[f"ratio {when}"] = row[f"ours {when}"] / row[f"peer {when}"]
                if "before" in code:
                    row[f"vs before {when}"] = row[f"ours {when}"] / row[f"before {when}"]
            rows.append(row)
            print(f"  round {repeat + 1}: " + ", ".join(f"{key} {value:.2f}" for key, value in row.items()
                                                         if isinstance(value, float)) + "; ran the reloaded code: "
                  + str(row["ran the reloaded code"]), flush=True)
    keys = [key for key, value in rows[0].items() if isinstance(value, float)]
    summary = {key: spread([row[key] for row in rows]) for key in keys}
    print(table(["", "median", "min", "max"], [[key, f"{s['median']:.2f}", f"{s['min']:.2f}", f"{s['max']:.2f}"]
                                               for key, s in summary.items()]))
    for when in ("first", "reload"):
        met = summary[f"ratio {when}"]["median"] <= 1.0
        print(f"goal ({when} burst): median ratio to notebook_launcher <= 1.0: {'met' if met else 'NOT met'}")
    path = write_json("first_burst_vs_peer", {"repeats": args.repeats, "rounds": rows, "summary": summary})
    print(f"wrote {path}")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"took {time.monotonic() - started:.0f} s")
