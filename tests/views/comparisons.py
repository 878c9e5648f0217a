"""Comparisons built by hand from synthetic windows, for the views' tests: what the comparison engine would have
measured of a run against its baseline."""

from __future__ import annotations

import random

from accel_widgets.knobs.config import Config
from accel_widgets.results.comparison import Block, Comparison
from tests.panel.fakes import synthetic_result


def comparison_of(reference: Config, subject: Config, ratio: float, *, noise: float = 0.02, blocks: int = 6,
                  seed: int = 0, min_effect: float = 0.05) -> Comparison:
    """``subject`` measured ``ratio`` times as fast as ``reference`` in ``blocks`` A B B A blocks, each window's rate
    off by a relative ``noise`` (normal)."""
    rng = random.Random(seed)
    windows, found = [], []
    for block in range(blocks):
        offset = len(windows)
        for config, speed in ((reference, 1.0), (reference, 1.0), (subject, ratio), (subject, ratio)):
            rate = 1000.0 * speed * (1 + rng.gauss(0, noise))
            windows.append(synthetic_result(config, step_s=32 / rate, label=f"block {block}"))
        found.append(Block((offset, offset + 1), (offset + 2, offset + 3)))
    return Comparison(reference, subject, min_effect, windows, found, stopped=f"settled after {blocks} blocks",
                      wall_s=4.0 * blocks)
