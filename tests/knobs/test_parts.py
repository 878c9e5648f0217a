"""The parts of a step a headspace burst makes free: declared once, refused where there is nothing to free, and the
knobs each bounds named by their owners."""

from __future__ import annotations

import pytest

from accel_widgets import Config, ConfigError
from accel_widgets.engine.request import BurstOptions, BurstRequestError
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.knobs import KNOBS
from accel_widgets.knobs.parts import FREE_PARTS, PARTS, bounded_knobs, check_part, why_not_free
from accel_widgets.knobs.plan import resolve
from tests.workloads import tiny_workload

CPU = DeviceInfo(2, "cpu")
GPU = DeviceInfo(8, "cpu", gpus=(GpuInfo(0, 0, "NVIDIA H100 80GB HBM3", 80 << 30, compute_capability=(9, 0)),),
                 driver="test")


def test_every_part_is_declared_once_with_its_words_and_the_knobs_that_name_it() -> None:
    assert PARTS == ("data", "communication", "host") and set(FREE_PARTS) == set(PARTS)
    assert bounded_knobs("data") == ["num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                                     "non_blocking", "data_cache"]
    assert bounded_knobs("host") == ["sync_every"] and bounded_knobs("communication") == []
    assert {knob.part for knob in KNOBS.values()} <= {*PARTS, None}


def test_a_part_the_config_has_nothing_of_here_is_refused_before_any_process_with_why() -> None:
    assert why_not_free("data", Config(), CPU) == ""
    assert "trains one process" in why_not_free("communication", Config(), CPU)
    assert why_not_free("communication", Config(parallel="ddp", world_size=2), CPU) == ""
    assert "the host is the device" in why_not_free("host", Config(), CPU) and why_not_free("host", Config(), GPU) == ""
    with pytest.raises(ConfigError, match="communication free cannot be measured here: the config trains one process"):
        resolve(Config(), CPU, tiny_workload(), freed="communication")
    assert resolve(Config(), CPU, tiny_workload(), freed="data").freed == "data"
    with pytest.raises(ValueError, match="freed='disk' names no part of the step"):
        check_part("disk")
    with pytest.raises(BurstRequestError, match="freed='disk' names no part of the step"):
        BurstOptions(freed="disk")  # type: ignore[arg-type]
