"""Mixed precision: the autocast dtype (bf16, fp16 with GradScaler) and TF32 for fp32 matmuls.

:class:`MixedPrecision` owns the three places a precision touches the step (autocast around the
forward, the backward, the optimizer step), as Lightning Fabric's precision plugins do; the loop
never asks which precision it runs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .base import Knob, Rule

if TYPE_CHECKING:
    from ..config import Config
    from ..device import DeviceInfo

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

GROUP = "precision"
TITLE = "Mixed precision"

KNOBS = [
    Knob(
        "precision", "precision", str, "fp32", choices=("fp32", "bf16", "fp16"),
        what="Autocast dtype via torch.amp; fp16 also uses torch.amp.GradScaler.",
        why="Half-precision matmuls run on tensor cores / bf16 units and halve activation memory.",
        when="The step is compute-bound on hardware with bf16/fp16 units (tensor-core GPUs, AVX512-BF16/AMX "
        "CPUs). fp16's GradScaler reads its inf/NaN check back to the host on every step (a sync) unless "
        "optimizer_impl='fused', which checks on the GPU.",
    ),
    Knob(
        "tf32", "precision", bool, False, applies_to=("cuda",),
        what="Allow TF32 tensor cores for float32 matmuls (off: PyTorch's default, IEEE fp32 matmuls). cuDNN "
        "convolutions and RNNs use TF32 either way, as in stock PyTorch.",
        why="Ampere+ GPUs run fp32 matmuls several times faster with a 10-bit mantissa.",
        when="Training stays in fp32 on an Ampere or newer GPU and matmuls (linear layers, attention) "
        "matter. No effect on CPU.",
    ),
]


def _gpu_without_bf16(device: DeviceInfo) -> str:
    """The first GPU here without bf16 units, named with its compute capability."""
    gpu = next(g for g in device.gpus if not g.has_bf16_units)
    major, minor = gpu.compute_capability or (0, 0)
    return f"{gpu.name} (compute capability {major}.{minor})"


RULES = [
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "fp16" and not d.has_cuda and not d.cpu_has_fp16_units,
        lambda c, d: f"precision='fp16' on this CPU ({d.cpu_name}) has no fp16 units: autocast emulates "
        "it, measured 11-130x slower than fp32 here. Use bf16.",
    ),
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "bf16" and d.has_cuda and not d.gpu_has_bf16_units,
        lambda c, d: f"precision='bf16' on {_gpu_without_bf16(d)}: GPUs before Ampere (compute capability 8.0) "
        "have no bf16 tensor cores, so bf16 is slow, emulated. Use precision='fp16' (with GradScaler).",
    ),
    Rule(
        ("precision",), "warning",
        lambda c, d: c.precision == "bf16" and not d.has_cuda and not d.cpu_has_bf16_units,
        lambda c, d: "precision='bf16' on a CPU without AVX512-BF16/AMX units is emulated and may be "
        "slower than fp32.",
    ),
]


def math_precision(config: Config, device_kind: str) -> str:
    """The arithmetic matmuls really ran in: fp32 with TF32 on a GPU multiplies with 10-bit mantissas.

    What the correctness guard's tolerance is chosen by (MFU charges each op its own math: :func:`op_math`).
    """
    if config.precision == "fp32" and config.tf32 and device_kind == "cuda":
        return "tf32"
    return config.precision


_DTYPE_MATH = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def op_math(config: Config, device_kind: str, op_class: str, dtype: str) -> str:
    """The arithmetic one counted op ran in, from its class ("conv" or "matmul") and its inputs' dtype.

    Autocast casts before an op runs, so bf16/fp16 inputs mean bf16/fp16 math. A float32 convolution on a
    GPU runs on cuDNN with TF32 allowed in every burst (:func:`global_flags` keeps stock PyTorch's
    setting), so it counts as TF32, the peak it may reach; a float32 matmul (attention included) is TF32
    only with ``tf32=True``. On a CPU float32 is fp32. Other dtypes keep their own name (no peak for them).
    """
    if dtype == "float32" and device_kind == "cuda" and (op_class == "conv" or config.tf32):
        return "tf32"
    return _DTYPE_MATH.get(dtype, dtype)


class MixedPrecision:
    """Autocast, backward and optimizer step for the configured precision."""

    def __init__(self, config: Config, device: torch.device) -> None:
        self._dtype = _AUTOCAST_DTYPES.get(config.precision)
        self._device_type = device.type
        # Why: fp16 has a narrow exponent range; scaling the loss keeps small gradients from flushing to 0.
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self._initial_scale = self.scaler.get_scale()  # before first use: no tensor yet, so no sync

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Why: matmuls and convs run in half precision on tensor cores / bf16 units; reductions stay fp32."""
        if self._dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self._device_type, dtype=self._dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> None:
        """Clip, step (skipped by GradScaler when fp16 gradients overflowed), then adapt the loss scale.

        Why unscale before clipping: under fp16 the gradients are still multiplied by the loss scale, and
        a norm measured on them would clip the real gradients to a tiny fraction of ``max_grad_norm``.
        """
        if max_grad_norm is not None:
            self.scaler.unscale_(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        self.scaler.step(optimizer)
        self.scaler.update()

    def skipped_steps(self, steps_taken: int) -> int | None:
        """Optimizer steps GradScaler skipped for inf/NaN gradients (fp16 only), read once after measuring.

        Within a burst shorter than the scaler's growth interval the scale only changes by halving on a
        skipped step, so log2(initial / final) counts the skips exactly without a per-step host sync.
        """
        if not self.scaler.is_enabled():
            return None
        scale = self.scaler.get_scale()
        if scale == 0.0:  # float32 underflow after ~166 consecutive skips: every step was skipped
            return steps_taken
        growths = steps_taken // self.scaler.get_growth_interval()
        halvings = math.log2(self._initial_scale / scale)
        return max(0, round(halvings) + growths)


@contextlib.contextmanager
def global_flags(config: Config) -> Iterator[None]:
    """TF32 for fp32 matmuls when the knob is on; otherwise PyTorch's own defaults. Restores everything.

    Stock PyTorch runs fp32 matmuls in IEEE fp32 but lets cuDNN convolutions and RNNs use TF32, so
    ``Config()`` keeps exactly that: forcing convolutions to IEEE would slow the baseline of every
    conv net and inflate each ratio measured against it. ``tf32=True`` adds TF32 matmuls.

    Written through the ``allow_tf32`` switches because, up to torch 2.13 at least, they keep both views
    of the setting in step (they also set the per-op ``fp32_precision``; ``cudnn.allow_tf32`` sets conv
    and rnn together), and ``cuda.matmul`` leaves CPU (oneDNN) matmuls alone as a CUDA-only knob must.
    Writing ``fp32_precision`` directly leaves ``torch.get_float32_matmul_precision()`` and
    ``cudnn.allow_tf32`` raising a "mix of the legacy and new APIs" error, and inductor still reads
    them while compiling (pytorch/pytorch#189955). On exit the legacy values go back first, then the
    per-op ones (torch >= 2.9), so the caller gets back exactly the strings it had ("none", not the
    "ieee" the legacy setters write).
    """
    ops = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul, torch.backends.cudnn.conv,
           torch.backends.cudnn.rnn)
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    per_op = [op.fp32_precision for op in ops]
    torch.backends.cuda.matmul.allow_tf32 = config.tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn
        for op, value in zip(ops, per_op, strict=True):
            op.fp32_precision = value
