"""Model FLOPs utilisation: how far a configuration is from the hardware's limit.

FLOPs per training step are counted with ``torch.utils.flop_counter`` (matmuls and convolutions,
forward and backward), each op's under its class (convolution or matmul, attention counting as matmul)
and the dtype it ran in, and divided by the measured step rate. One peak for the whole step would be
wrong: under stock PyTorch an fp32 step runs its matmuls in IEEE fp32 but lets cuDNN run convolutions in
TF32, 7.4x faster on an H200, so a conv net divided by the fp32 peak reads MFU > 1. So MFU charges each
FLOP the time it needs at the peak of its own math, ``sum(flops_i / peak_i) / step time``, which math an
op ran in being the precision knob's answer (:func:`~accel_widgets.knobs.precision.op_math`).
Peaks are the vendors' dense (not 2:4 sparse) tensor-core figures per GPU, in TFLOP/s. On a CPU, or a
GPU not in the table, only the achieved FLOP/s is reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # where torch documents it (no public alias)
from torch.utils.flop_counter import FlopCounterMode

OpClass = Literal["conv", "matmul"]
_aten = torch.ops.aten
#: The counter's convolution ops (forward and backward); every other op it counts multiplies matrices
#: (mm, addmm, bmm, baddbmm, _scaled_mm and the attention kernels).
CONV_OPS = frozenset({_aten.convolution, _aten._convolution, _aten.cudnn_convolution,
                      _aten.convolution_overrideable, _aten._slow_conv2d_forward, _aten.convolution_backward})

# name fragment -> {precision: dense TFLOP/s}. Order matters: the first fragment found in the
# device name wins, so more specific names ("H200 NVL", "H100 PCIe", "L40S") come before their prefixes.
# The NVL cards (PCIe, 350-400 W) are slower than the SXM parts whose names they contain.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
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


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one forward + backward, by (op class, dtype name) of the ops that did them."""

    by_op: dict[tuple[OpClass, str], int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


class _ByOpAndDtype(TorchDispatchMode):
    """Charges what the flop counter adds for each op to the op's class and the dtype it ran in.

    Entered inside the counter's mode, so it sees each op first and the counter counts it while it runs;
    autocast has cast the inputs before an op reaches a dispatch mode, so their dtype is the op's math.
    """

    supports_higher_order_operators = True

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.counter = counter
        self.by_op: Counter[tuple[OpClass, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        before = self.counter.get_total_flops()
        out = func(*args, **(kwargs or {}))
        added = self.counter.get_total_flops() - before
        if added:
            packet = getattr(func, "_overloadpacket", func)
            self.by_op[("conv" if packet in CONV_OPS else "matmul", _dtype_name(args) or "unknown")] += added
        return out


def _dtype_name(args: Any) -> str:
    """The dtype of an op's first floating-point tensor argument ("float32", "bfloat16", ...)."""
    if isinstance(args, torch.Tensor):
        return str(args.dtype).removeprefix("torch.") if args.is_floating_point() else ""
    for arg in args if isinstance(args, (list, tuple)) else ():
        if name := _dtype_name(arg):
            return name
    return ""


def count_training_flops(
    model: nn.Module,
    loss_of: Callable[[nn.Module], torch.Tensor],
    autocast: Callable[[], Any],
) -> FlopCount:
    """FLOPs of one forward + backward of ``model`` (``loss_of(model)``: one micro-batch's loss), by op class
    and dtype, after which the gradients are cleared.

    Run on the unwrapped model after the measured window: the counter's dispatch overhead and the
    extra step never touch the burst's timings, and DDP/compile wrappers would only hide the ops.
    """
    counter = FlopCounterMode(display=False)
    with counter:
        attribution = _ByOpAndDtype(counter)
        with attribution:
            with autocast():
                loss = loss_of(model)
            loss.backward()
    model.zero_grad(set_to_none=True)
    return FlopCount(dict(attribution.by_op))
