"""The machine as the CPU-only tests must see it, whatever GPUs it has.

``run_burst`` trains on the device ``probe_device()`` reports, so on a machine with a GPU the ordinary
suite would run on CUDA, and 2-rank DDP would need NCCL and a GPU per rank. Tests that assume the CPU
(gloo, RSS memory, psutil telemetry) pass ``device=cpu_device()``; tests/engine/test_gpu.py stays on CUDA.
"""

from __future__ import annotations

import dataclasses

from accel_widgets.inputs.device import DeviceInfo, probe_device


def cpu_device() -> DeviceInfo:
    """This machine with its GPUs hidden: same cores and CPU features, no CUDA."""
    return dataclasses.replace(probe_device(), gpus=(), driver=None)
