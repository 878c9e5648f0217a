"""A headspace's ceilings read from their comparisons: room or none, the most a family can win, what they close."""

from __future__ import annotations

import pytest

from accel_widgets import Config
from accel_widgets.knobs.parts import bounded_knobs
from accel_widgets.results.comparison import Block, Comparison
from accel_widgets.results.headspace import Ceiling, Headspace
from tests.panel.fakes import synthetic_result

STEP_S = 0.05


def ceiling_of(part: str, ratios: list[float], config: Config | None = None) -> Ceiling:
    """A ceiling whose comparison measured one block per ratio: the reference's two windows at ``STEP_S`` a step, the
    freed variant's two at ``STEP_S / ratio``."""
    config = config or Config()
    comparison = Comparison(config, config, 0.05, freed=part)
    for ratio in ratios:
        offset = len(comparison.windows)
        comparison.windows += [synthetic_result(config, step_s=STEP_S)] * 2
        comparison.windows += [synthetic_result(config, step_s=STEP_S / ratio)] * 2
        comparison.blocks.append(Block((offset, offset + 1), (offset + 2, offset + 3)))
    return Ceiling(part, comparison)  # type: ignore[arg-type]


def headspace_of(parts: dict[str, list[float]], config: Config | None = None, **why_not: str) -> Headspace:
    """A headspace measured with these blocks' ratios per part, and the parts named in ``why_not`` not measured."""
    config = config or Config()
    ceilings = {part: ceiling_of(part, ratios, config) for part, ratios in parts.items()}
    ceilings.update({part: Ceiling(part, why_not=why) for part, why in why_not.items()})  # type: ignore[misc]
    return Headspace("fake", config, ceilings)  # type: ignore[arg-type]


def test_a_ceiling_near_one_closes_its_family_and_one_far_above_leaves_room() -> None:
    same = ceiling_of("data", [1.01, 0.99, 1.02, 1.0, 1.01, 0.995])
    assert same.verdict == "same" and same.room is False
    assert same.cost_share is not None and 0 < same.cost_share < 0.05  # "costs at most 3%"
    room = ceiling_of("data", [2.0, 2.2, 2.1, 1.9, 2.05])
    assert room.verdict == "faster" and room.room is True and room.most == pytest.approx(room.comparison.interval.high)
    assert room.comparison.same_config is False  # the config with a part freed is no noise floor
    unmeasured = Ceiling("communication", why_not="one process")
    assert unmeasured.room is None and unmeasured.most is None and unmeasured.verdict is None


def test_a_headspace_closes_the_knobs_its_same_ceilings_bound_and_no_other() -> None:
    headspace = headspace_of({"data": [1.0, 1.01, 0.99, 1.0, 1.005, 0.998]}, communication="one process")
    assert headspace.closed("data") is not None
    assert all(headspace.closes(knob) is not None for knob in bounded_knobs("data"))
    assert headspace.closes("precision") is None and headspace.closes("sync_every") is None
    loader = {"num_workers": 2, "persistent_workers": True}
    assert headspace.closes_changes(loader) is not None
    assert headspace.closes_changes({**loader, "precision": "bf16"}) is None  # reaches past the data part
    assert headspace.share_freed("data") == pytest.approx(0.0, abs=0.01)
    assert headspace.share_freed("communication") is None


def test_the_bounding_ceiling_of_a_rung_is_its_parts_when_every_knob_shares_it() -> None:
    headspace = headspace_of({"data": [2.0, 2.1, 1.95, 2.05]})
    assert headspace.bounding({"num_workers": 2}) is headspace.ceilings["data"]
    assert headspace.bounding({"num_workers": 2, "sync_every": 0}) is None
    assert headspace.share_freed("data") == pytest.approx(0.5, abs=0.02)
