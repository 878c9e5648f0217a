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

Float8 training (torchao) multiplies tensor subclasses that hold float8 data and a scale but report the
high-precision dtype they stand in for (bf16): read by that dtype, their FLOPs would be charged the bf16 peak,
half the float8 one, and MFU could pass 1. An op is charged the float8 dtype any of its arguments holds.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
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
# The NVL cards (PCIe, 350-400 W) are slower than the SXM parts whose names they contain. "fp8": the float8
# tensor cores of Ada and Hopper (e4m3 and e5m2 alike), twice the bf16 rate; the datasheets' sparse figures halved.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.0}),
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.0}),
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1979.0}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0}),
    # GeForce: the tensor cores run half rate with the fp32 accumulation training uses (Ada whitepaper, dense).
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    ("V100", {"fp32": 15.7, "fp16": 125.0}),
    ("T4", {"fp32": 8.1, "fp16": 65.0}),
)


def peak_flops(device_name: str, math_mode: str) -> float | None:
    """Dense peak FLOP/s of one GPU for the arithmetic matmuls ran in ("fp32", "tf32", "bf16", "fp16", "fp8")."""
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


#: The float8 formats of the tensor cores that multiply them (e4m3 for weights and activations, e5m2 for gradients).
FLOAT8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})


def _dtype_name(args: Any) -> str:
    """The dtype an op's math ran in ("float32", "bfloat16", "float8_e4m3fn", ...): the float8 dtype any of its
    tensor arguments holds, else its first floating-point tensor argument's dtype."""
    dtypes = [_math_dtype(tensor) for tensor in _tensors(args)]
    chosen = next((d for d in dtypes if d in FLOAT8_DTYPES), None) or next(
        (d for d in dtypes if d.is_floating_point), None)
    return str(chosen).removeprefix("torch.") if chosen is not None else ""


def _tensors(args: Any) -> list[torch.Tensor]:
    if isinstance(args, torch.Tensor):
        return [args]
    return [t for arg in args for t in _tensors(arg)] if isinstance(args, (list, tuple)) else []


def _math_dtype(tensor: torch.Tensor) -> torch.dtype:
    """A tensor's dtype, or for a tensor subclass that wraps float8 data (torchao's float8 training tensors, whose
    ``dtype`` is the high-precision one they stand in for) the float8 dtype inside: what the tensor cores multiply.
    A traceable subclass names its inner tensors in ``__tensor_flatten__``."""
    if type(tensor) is torch.Tensor or not hasattr(tensor, "__tensor_flatten__"):
        return tensor.dtype
    names, _ = tensor.__tensor_flatten__()
    inner = (getattr(tensor, name) for name in names)
    return next((t.dtype for t in inner if isinstance(t, torch.Tensor) and t.dtype in FLOAT8_DTYPES), tensor.dtype)


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
    with counting_flops() as by_op:
        with autocast():
            loss = loss_of(model)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return FlopCount(dict(by_op))


class _NoModules:
    """A module tracker that tracks none: every FLOP is the step's ("Global"), which is all the counts here read."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _NoModules:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _StepFlops(FlopCounterMode):
    """torch's FLOP counter without its per-module tracker. The tracker hooks every module's outputs for backward, and
    in a checkpointed block recomputed in backward those hooks keep the recomputed activations alive past the step
    (a step traced for its peak memory then reads them as held: 30% too high on the LM demo). Nothing here reads
    FLOPs per module."""

    def __init__(self) -> None:
        super().__init__(display=False)
        self.mod_tracker = _NoModules()


@contextlib.contextmanager
def counting_flops() -> Iterator[Counter[tuple[OpClass, str]]]:
    """The FLOPs of everything run inside, by (op class, dtype), filled in as the ops run (a memory estimate traces its
    step once and counts it in the same pass, so counting must keep no tensor alive)."""
    counter = _StepFlops()
    with counter:
        attribution = _ByOpAndDtype(counter)
        with attribution:
            yield attribution.by_op
