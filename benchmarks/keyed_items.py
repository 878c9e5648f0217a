"""What keying every item's random draws costs (issue 29): microseconds per item, and their share of a training step.

Every item a burst, a job or a recipe reads is read by key (:mod:`accel_widgets.data.keyed`): torch's CPU, Python's
and NumPy's generators are set from ``(data seed, epoch, index, position)`` before the item is read, and a rank that
reads without loader workers puts its generators back after each batch. Three measurements, on three pipelines:

* ``keying``: the keying alone (``seed_generators(item_seed(...))``), in a tight loop: it runs before the item is
  read, so it costs the same whatever the item does; and noting and putting back the generators, once a batch, which
  a rank without workers pays;
* ``read``: the same items read through ``KeyedItems`` and read plainly, alternating in each round: what an item
  costs, and the extra it took by key (a cross-check of the keying alone, resolved only where items are cheap);
* ``step``: a training loop with no loader workers (every item read on the training thread), keyed against plain, in
  interleaved pairs (order alternating). The share of that step is ``(keying x batch + kept) / plain step``; the
  pairs' ratio checks it, within the host's noise. With loader workers the keying runs in them, beside the step: it
  shows only when the loader is the bottleneck, and then as ``keying / item``, the loader-bound share printed too.

Pipelines: the image demo (``demo_workload("image")``: 32 px images with a heavy augmentation, batch 64, the small
CNN); a decode-heavy one, as an ImageNet folder feeds a model (256 px JPEG bytes decoded with Pillow per item, a
random-resized crop to 224 and a flip from Python's ``random``, colour jitter from NumPy; batch 32, the small CNN
after a 4x average pool, so the data dominates the step); and cheap items, the worst case for a share (the LM demo's
token windows: a slice per item, batch 32, its small GPT).

The host is shared with other sessions: every measurement interleaves its variants, repeats many rounds, and reports
medians with their quartiles.

Run:  .venv/bin/python benchmarks/keyed_items.py [--rounds 15] [--pairs 12]
"""

from __future__ import annotations

import argparse
import io
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from _common import load_average, positive_int, spread, table, usable_cpus, write_json
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler, default_collate

import accel_widgets as aw
from accel_widgets.data.keyed import (
    CollateKept,
    KeyedItems,
    KeyedOrder,
    generator_states,
    generators_kept,
    item_seed,
    restore_generators,
    seed_generators,
)
from accel_widgets.demos.image import SmallCNN, synthetic_images

SEED = 0


class DecodedJpegs(Dataset):
    """A decode-heavy pipeline, as an image folder feeds one: JPEG bytes decoded with Pillow per item, a random-resized
    crop and a flip (Python's ``random``), colour jitter (NumPy), a CHW float tensor."""

    def __init__(self, n: int = 256, size: int = 256, out: int = 224) -> None:
        from PIL import Image

        images, self.labels = synthetic_images(n, size, 10, SEED)
        self.files = []
        for image in images:
            encoded = io.BytesIO()
            Image.fromarray(image).save(encoded, format="JPEG", quality=90)
            self.files.append(encoded.getvalue())
        self.out = out

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        with Image.open(io.BytesIO(self.files[index])) as image:
            image = image.convert("RGB")
        side = image.width * random.uniform(0.6, 1.0)
        left, top = random.uniform(0, image.width - side), random.uniform(0, image.height - side)
        image = image.resize((self.out, self.out), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side))
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        jitter = (np.random.uniform(0.8, 1.2, 3) / 255.0).astype(np.float32)
        pixels = np.asarray(image, dtype=np.float32) * jitter
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))), int(self.labels[index])


def pooled_cnn() -> nn.Module:
    """The small CNN after a 4x average pool: a model whose step the decoding outweighs."""
    return nn.Sequential(nn.AvgPool2d(4), SmallCNN(num_classes=10))


def pipelines() -> dict[str, aw.Workload]:
    jpegs = aw.Workload(model=pooled_cnn, dataset=DecodedJpegs(), loss_fn=F.cross_entropy, batch_size=32,
                        name="decode-heavy")
    return {"image demo": aw.demo_workload("image"), "decode-heavy": jpegs,
            "cheap items (lm demo)": aw.demo_workload("lm")}


# -- per item ------------------------------------------------------------------------------------------------------
def keying_us(rounds: int, items: int = 1000) -> dict[str, Any]:
    """The keying alone per item, and the generators kept around one batch, in microseconds."""
    per_item, per_batch = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        for position in range(items):
            seed_generators(item_seed(SEED, 1, position, position))
        per_item.append((time.perf_counter() - started) / items * 1e6)
        started = time.perf_counter()
        for _ in range(items // 20):
            restore_generators(generator_states())
        per_batch.append((time.perf_counter() - started) / (items // 20) * 1e6)
    return {"seed_us_per_item": spread(per_item), "kept_us_per_batch": spread(per_batch)}


def read_us(dataset: Any, rounds: int, items: int) -> dict[str, Any]:
    """Microseconds per item read plainly and by key, the order alternating between rounds."""
    keyed = KeyedItems(dataset, SEED)
    indices = list(range(items))

    def plain() -> float:
        started = time.perf_counter()
        for index in indices:
            dataset[index]
        return (time.perf_counter() - started) / items * 1e6

    def by_key() -> float:
        started = time.perf_counter()
        for index in indices:
            keyed[(1, index, index)]
        return (time.perf_counter() - started) / items * 1e6

    plain_us, keyed_us, extra = [], [], []
    with generators_kept():
        for round_ in range(rounds):
            if round_ % 2:
                k, p = by_key(), plain()
            else:
                p, k = plain(), by_key()
            plain_us.append(p)
            keyed_us.append(k)
            extra.append(k - p)
    return {"plain_us_per_item": spread(plain_us), "keyed_us_per_item": spread(keyed_us),
            "extra_us_per_item": spread(extra)}


# -- a training step -----------------------------------------------------------------------------------------------
def loader(workload: aw.Workload, keyed: bool) -> DataLoader:
    """What a burst builds for no loader workers (the keyed one: keys, and the generators noted before a batch's reads
    and put back once it is collated), or the same without keys."""
    dataset, batch = workload.dataset, workload.batch_size
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    collate = workload.collate_fn or default_collate
    if keyed:
        items = KeyedItems(dataset, SEED)
        return DataLoader(items, sampler=KeyedOrder(sampler), batch_size=batch, drop_last=True,
                          collate_fn=CollateKept(collate, items))
    return DataLoader(dataset, sampler=sampler, batch_size=batch, drop_last=True, collate_fn=collate)


def endless(data: DataLoader) -> Iterator[Any]:
    """Batches across epochs."""
    while True:
        yield from data


def step_seconds(workload: aw.Workload, keyed: bool, steps: int) -> float:
    """Median seconds of ``steps`` training steps (after one warm-up step), every item read on this thread."""
    torch.manual_seed(SEED)
    model = workload.build_model()
    optimizer = workload.optimizer(model.parameters())
    batches = endless(loader(workload, keyed))
    times = []
    for step in range(steps + 1):
        started = time.perf_counter()
        inputs, targets = next(batches)
        loss = workload.loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        if step:
            times.append(time.perf_counter() - started)
    return float(np.median(times))


def step_pairs(workload: aw.Workload, pairs: int, steps: int) -> dict[str, Any]:
    plain_s, keyed_s, ratios = [], [], []
    for pair in range(pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        measured = {keyed: step_seconds(workload, keyed, steps) for keyed in order}
        plain_s.append(measured[False])
        keyed_s.append(measured[True])
        ratios.append(measured[True] / measured[False])
    return {"plain_step_s": spread(plain_s), "keyed_step_s": spread(keyed_s), "keyed_over_plain": spread(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=15, help="rounds of the per-item measurements")
    parser.add_argument("--pairs", type=positive_int, default=12, help="interleaved keyed/plain training-loop pairs")
    parser.add_argument("--steps", type=positive_int, default=6, help="measured steps per training loop")
    args = parser.parse_args()
    torch.set_num_threads(usable_cpus())

    results: dict[str, Any] = {}
    rows = []
    for name, workload in pipelines().items():
        keying = keying_us(args.rounds)  # again beside each pipeline: the host's load drifts
        reads = read_us(workload.dataset, args.rounds, items=2 * workload.batch_size)
        steps = step_pairs(workload, args.pairs, args.steps)
        seed_us, kept_us = keying["seed_us_per_item"]["median"], keying["kept_us_per_batch"]["median"]
        item_us, plain_step = reads["plain_us_per_item"]["median"], steps["plain_step_s"]["median"]
        share = (seed_us * workload.batch_size + kept_us) * 1e-6 / plain_step
        results[name] = {"batch_size": workload.batch_size, **keying, **reads, **steps, "share_of_step": share,
                         "share_loader_bound": seed_us / item_us}
        extra, ratio = reads["extra_us_per_item"], steps["keyed_over_plain"]
        rows.append([name, workload.batch_size, f"{item_us:,.0f}", f"{seed_us:.1f}",
                     f"{extra['median']:.1f} ({extra['q1']:.1f} to {extra['q3']:.1f})", f"{plain_step * 1e3:.1f}",
                     f"{share:.2%}", f"{seed_us / item_us:.2%}",
                     f"{ratio['median']:.3f} ({ratio['q1']:.3f}-{ratio['q3']:.3f})"])
        print(" | ".join(map(str, rows[-1])), flush=True)
    print(table(["pipeline", "batch", "item us", "keying us/item", "read extra us/item (IQR)", "step ms (0 workers)",
                 "share of step", "share, loader-bound", "keyed/plain step (IQR)"], rows))
    path = write_json("keyed_items", {
        "rounds": args.rounds, "pairs": args.pairs, "steps": args.steps, "pipelines": results,
        "load_average_during": load_average(),
        "note": "shared 2-core host: variants interleaved, order alternating, medians with quartiles. share_of_step: "
                "(keying us x batch + generators kept per batch) / the plain step with no loader workers (every item "
                "read on the training thread); share_loader_bound: keying / item, what it costs a step the loader "
                "bounds with workers",
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
