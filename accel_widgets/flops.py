"""Model FLOPs utilisation: how far a configuration is from the hardware's limit.

FLOPs per training step are counted with ``torch.utils.flop_counter`` (matmuls and convolutions,
forward and backward) and divided by the measured step rate; MFU divides that by the GPU's dense
peak for the precision in use. Peaks are the vendors' dense (not 2:4 sparse) tensor-core figures per
GPU, in TFLOP/s. On a CPU, or a GPU not in the table, only the achieved FLOP/s is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# name fragment -> {precision: dense TFLOP/s}. Order matters: the first fragment found in the
# device name wins, so more specific names ("H100 PCIe", "A100", "L40S") come before their prefixes.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    ("V100", {"fp32": 15.7, "fp16": 125.0}),
    ("T4", {"fp32": 8.1, "fp16": 65.0}),
)


def peak_flops(device_name: str, math_mode: str) -> float | None:
    """Dense peak FLOP/s of one GPU for the arithmetic matmuls ran in ("fp32", "tf32", "bf16", "fp16")."""
    for fragment, peaks in PEAK_TFLOPS:
        if fragment in device_name:
            value = peaks.get(math_mode) or (peaks.get("fp32") if math_mode == "tf32" else None)
            return value * 1e12 if value else None
    return None


def count_training_flops(
    model: nn.Module,
    loss_of: Callable[[nn.Module], torch.Tensor],
    autocast: Callable[[], Any],
) -> int:
    """FLOPs of one forward + backward of ``model`` (``loss_of(model)``: one micro-batch's loss), after
    which the gradients are cleared.

    Run on the unwrapped model after the measured window: the counter's dispatch overhead and the
    extra step never touch the burst's timings, and DDP/compile wrappers would only hide the ops.
    """
    counter = FlopCounterMode(display=False)
    with counter:
        with autocast():
            loss = loss_of(model)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())
