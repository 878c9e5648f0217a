"""Why a held rank rebuilds its training state before each window: a process's speed is fixed by where its tensors
landed, and only re-drawing that makes repeated windows independent.

Two processes train the same loop (issue 28's compute-bound workload: 2 conv layers, batch 32, 2 threads) and take
turns measuring ~1 s windows in A B B A / B A A B blocks, as the comparison engine does. Three ways to hold them:

* ``held``: each process builds model, optimizer and data once and measures window after window on them;
* ``rebuilt``: each window starts from state built afresh behind a random heap spacer (what
  :func:`accel_widgets.engine.worker._measure_held` does), in a process with the rank's heap settings;
* ``fresh``: each window is a new process (what a burst per repeat costs).

Both processes run the same config, so the true ratio is 1. Per session (one pair of processes, ``--blocks``
blocks) the script reports the mean log ratio (a bias when it stays away from 0) and its spread between blocks.
If ``held`` shows sessions whose mean sits many standard errors from 0 while ``rebuilt`` does not, holding a
process without rebuilding measures that process's luck, not the config.

Run:  .venv/bin/python benchmarks/held_windows.py [--sessions 6] [--blocks 8]   (writes results/held_windows.json)
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import random
import statistics
import time
from typing import Any

from _common import QuietGate, load_average, positive_int, table, write_json

BATCH, ITEMS, THREADS = 32, 2048, 2


def _build(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, 10))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    return net, optimizer, torch.randn(ITEMS, 3, 24, 24, generator=g), torch.randint(0, 10, (ITEMS,), generator=g)


def _window(state: tuple[Any, Any, Any, Any], steps: int, warmup: int = 2) -> float:
    """Samples/s over ``steps`` steps after ``warmup`` unmeasured ones."""
    import torch.nn.functional as F

    net, optimizer, images, labels = state

    def step(i: int) -> None:
        start = (i * BATCH) % ITEMS
        loss = F.cross_entropy(net(images[start:start + BATCH]), labels[start:start + BATCH])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()

    for i in range(warmup):
        step(i)
    started = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps * BATCH / (time.perf_counter() - started)


def _serve(connection: Any, rebuild: bool) -> None:
    """A held process: measures a window at each request, rebuilding first when asked to."""
    import gc

    import torch

    from accel_widgets.engine.process import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(THREADS)
    state = _build()
    shift = random.Random()
    while (steps := connection.recv()) is not None:
        spacer = None
        if rebuild:
            state = None
            gc.collect()
            spacer = torch.empty(shift.randrange(0, 1 << 20, 64) + 64, dtype=torch.uint8)
            state = _build()
        connection.send(_window(state, steps))
        del spacer


def _once(connection: Any, steps: int) -> None:
    import torch

    from accel_widgets.engine.process import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(THREADS)
    connection.send(_window(_build(), steps))


class _Held:
    def __init__(self, context: Any, rebuild: bool) -> None:
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, rebuild))
        self.process.start()

    def measure(self, steps: int) -> float:
        self.connection.send(steps)
        return float(self.connection.recv())

    def close(self) -> None:
        self.connection.send(None)
        self.process.join()


class _Fresh:
    def __init__(self, context: Any) -> None:
        self.context = context

    def measure(self, steps: int) -> float:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_once, args=(child, steps))
        process.start()
        rate = float(parent.recv())
        process.join()
        return rate

    def close(self) -> None:
        pass


def session(mode: str, blocks: int, steps: int) -> list[float]:
    """One pair of processes measured in ``blocks`` balanced blocks; the blocks' log ratios (B over A)."""
    context = mp.get_context("forkserver")
    pair = [_Fresh(context), _Fresh(context)] if mode == "fresh" else [_Held(context, mode == "rebuilt")
                                                                         for _ in range(2)]
    try:
        ratios = []
        for block in range(blocks):
            order = (0, 1, 1, 0) if block % 2 == 0 else (1, 0, 0, 1)
            rates: dict[int, list[float]] = {0: [], 1: []}
            for which in order:
                rates[which].append(pair[which].measure(steps))
            ratios.append(statistics.fmean(map(math.log, rates[1])) - statistics.fmean(map(math.log, rates[0])))
        return ratios
    finally:
        for member in pair:
            member.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=positive_int, default=6)
    parser.add_argument("--blocks", type=positive_int, default=8)
    parser.add_argument("--steps", type=positive_int, default=100, help="steps per window (~1 s here)")
    args = parser.parse_args()
    gate = QuietGate()
    sessions: dict[str, list[list[float]]] = {"held": [], "rebuilt": [], "fresh": []}
    for index in range(args.sessions):
        for mode in (sessions if index % 2 == 0 else reversed(list(sessions))):
            gate.wait()
            sessions[mode].append(session(mode, args.blocks, args.steps))
            ratios = sessions[mode][-1]
            print(f"session {index + 1} {mode:8s} mean {statistics.fmean(ratios):+.4f} "
                  f"sd {statistics.stdev(ratios):.4f}", flush=True)
    rows, summary = [], {}
    for mode, runs in sessions.items():
        means = [statistics.fmean(r) for r in runs]
        within = statistics.fmean(statistics.stdev(r) for r in runs)
        # A session whose mean is > 3 standard errors of its own blocks from 0: the pair differed, not the config.
        biased = sum(abs(m) > 3 * statistics.stdev(r) / math.sqrt(len(r)) for m, r in zip(means, runs, strict=True))
        summary[mode] = {"session_means": means, "mean_abs_bias": statistics.fmean(map(abs, means)),
                         "max_abs_bias": max(map(abs, means)), "within_sd": within, "biased_sessions": biased}
        rows.append((mode, f"{summary[mode]['mean_abs_bias']:.4f}", f"{summary[mode]['max_abs_bias']:.4f}",
                     f"{within:.4f}", f"{biased}/{len(runs)}"))
    print(table(["mode", "mean |bias|", "max |bias|", "block sd", "biased sessions"], rows))
    write_json("held_windows", {"summary": summary, "sessions": sessions, "blocks": args.blocks,
                                "steps": args.steps, "load_average": load_average(), "quiet_wait_s": gate.waited_s})


if __name__ == "__main__":
    main()
