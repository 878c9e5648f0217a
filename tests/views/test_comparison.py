"""A comparison's outcome in a line of text: every verdict with what it rests on."""

from __future__ import annotations

import dataclasses

from accel_widgets import Config
from accel_widgets.results.comparison import Block, Comparison
from accel_widgets.views.comparison import interval_text, outcome_text
from tests.panel.fakes import synthetic_result

A, B = Config(), Config(num_workers=2)


def measured(ratios: list[float], *, min_effect: float = 0.05, error: str = "") -> Comparison:
    """A comparison whose blocks read ``ratios`` (B over A): each block two windows of A at 1000 samples/s, two of B."""
    windows, blocks = [], []
    for ratio in ratios:
        offset = len(windows)
        windows += [synthetic_result(A, step_s=0.032)] * 2 + [synthetic_result(B, step_s=0.032 / ratio)] * 2
        blocks.append(Block((offset, offset + 1), (offset + 2, offset + 3)))
    return Comparison(A, B, min_effect, windows, blocks, error=error)


def test_each_outcome_reads_with_what_it_rests_on() -> None:
    faster = measured([1.30, 1.32, 1.28, 1.31])
    assert faster.verdict == "faster" and outcome_text(faster) == f"faster: {interval_text(faster)}"
    assert outcome_text(faster).startswith("faster: 1.30× [")
    assert outcome_text(measured([0.70, 0.71, 0.69, 0.70])).startswith("slower: 0.70× [")
    same = measured([1.001, 0.999, 1.002, 0.998, 1.0, 1.001])
    low, high = same.interval.low, same.interval.high
    assert same.verdict == "same" and 0.99 < low < 1 < high < 1.01
    assert outcome_text(same) == "same within ±1%"  # the bound rounded up, never stated tighter than it is
    open_ = measured([1.1, 0.9, 1.2, 0.85, 1.05, 0.95])
    assert open_.verdict == "undecided"
    assert outcome_text(open_) == f"undecided after 6 blocks: {interval_text(open_)}"
    assert outcome_text(measured([1.3, 1.31])) == "undecided after 2 blocks: 1.30× (too few blocks for an interval)"
    assert outcome_text(measured([])) == "undecided: no block was measured"
    loaded = measured([1.3] * 4)
    loaded.blocks = [dataclasses.replace(block, left_out="other load took 70% of the machine") for block in
                     loaded.blocks]
    assert outcome_text(loaded) == "undecided: all 4 blocks left out (other load took 70% of the machine)"
    assert outcome_text(measured([1.3] * 4, error="RuntimeError: boom")) == "not compared: RuntimeError: boom"
