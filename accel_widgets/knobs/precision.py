"""Mixed precision: the autocast dtype (bf16, fp16 with GradScaler) and TF32 for fp32 matmuls.

:class:`MixedPrecision` owns the three places a precision touches the step (autocast around the
forward, the backward, the optimizer step), as Lightning Fabric's precision plugins do; the loop
never asks which precision it runs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .base import (
    Climb,
    Code,
    Flag,
    Knob,
    RecipeContext,
    RecipeEntry,
    RecipePart,
    Remedy,
    Rule,
    Setting,
    Style,
    Symptom,
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from ..inputs.workload import Workload
    from .config import Config

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

GROUP = "precision"
TITLE = "Mixed precision"

KNOBS = [
    Knob(
        "precision", "precision", str, "fp32", choices=("fp32", "bf16", "fp16"),
        short="",
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


def half_precision(device: DeviceInfo) -> str | None:
    """The half precision this hardware runs natively: bf16 on Ampere+ GPUs and bf16-capable CPUs; fp16 (with
    GradScaler) on older GPUs (T4, V100), where bf16 is emulated; none on other CPUs."""
    if device.has_cuda:
        return "bf16" if device.gpu_has_bf16_units else "fp16"
    return "bf16" if device.cpu_has_bf16_units else None


def _half(device: DeviceInfo, workload: Workload) -> dict[str, Any]:
    half = half_precision(device)
    return {"precision": half} if half is not None else {}


LADDER = [
    Climb("+precision", "autocast matmuls/convs to half precision units", _half,
          title=lambda changes: f"+{changes['precision']}"),
    Climb("+rest", "TF32 fp32 matmuls", lambda device, workload: {"tf32": True} if device.has_cuda else {}),
]

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "compute_bound": lambda c: Remedy("precision", "try mixed precision (bf16)", "bf16")
    if c.precision == "fp32" else None,
    "fp32_on_tensor_cores": lambda c: Remedy("precision", "bf16/fp16 matmuls run on tensor cores several times "
                                             "faster than fp32", "bf16") if c.precision == "fp32" else None,
    "tensor_cores_idle": lambda c: Remedy("precision", "the math is not on the tensor cores: try bf16, whose matmuls "
                                          "run there (fp32 ones do not)", "bf16") if c.precision == "fp32" else None,
    "diverged": lambda c: Remedy("precision", f"precision={c.precision!r} may overflow (fp16 past 65504): compare "
                                 "with fp32 or bf16") if c.precision != "fp32" else None,
}

#: The correctness guard's floor (accel_widgets.analysis.guard; a measured noise band only widens it): how far a
#: run's loss may move from its fp32 baseline's at step 0, by the arithmetic the less precise of the two ran in
#: (:func:`math_precision`).
#: Why these sizes: bf16 keeps 8 significant bits (unit roundoff 2^-8 = 0.4% per rounding) and gets the
#: widest band; fp16 under autocast keeps 11 bits but stores activations in half precision and lives in a
#: narrow range; TF32 rounds only matmul inputs to 11 bits; fp32 only absorbs reordered reductions
#: (compile, foreach/fused optimizers, GPU atomics): 1e-7 per operation, compounding over steps.
#: Calibration (CPU with AVX512-BF16 autocast, torch 2.13, the small demos, in-process bursts with the same
#: seed and data order): the largest smoothed deviation from the fp32 run, as computed here (the largest
#: raw per-step one in brackets), and its share of the tolerance at that step:
#:   fp32 again, optimizer_impl=foreach or fused   0 on mlp, lm and image: bitwise equal losses
#:   fp32 compile_mode=default, 58 steps     mlp 0.000%, lm 0.000%, image 0.034% (0.13%)       <= 0.013
#:   bf16, 58 steps                          mlp 0.14% (0.30%), lm 0.007%, image 0.47% (1.8%)   <= 0.044
#:   bf16 + compile, 58 steps                mlp 0.14%, lm 0.005%, image 0.69% (3.5%)           <= 0.060
#:   bf16, lm at batch 8, 40 steps           0.003%
#:   fp16 with GradScaler, mlp, 58 steps     0.17% (0.40%)                                       0.025
#:   long: image bf16 150 steps 2.1% (tolerance there 15.5%), mlp bf16 300 steps 2.9% (21%), mlp fp16
#:   300 steps 3.9% (15.9%), mlp batch 32 bf16 200 steps 1.4% (14.5%)                            <= 0.24
#: so correct runs stay under a quarter of the band (a sixteenth within 60 steps), while the breakages
#: that matter (NaN, a stalled or blown-up loss) sit far outside it. The GPU's bf16 kernels round like the
#: CPU's (fp32 accumulation), but bigger models drift more: the margin is left for them.
LOSS_TOLERANCE_AT_START: dict[str, float] = {"fp32": 0.01, "tf32": 0.02, "fp16": 0.03, "bf16": 0.04}


def autocasts_to_half(config: Config) -> bool:
    """Whether the forward runs under autocast to bf16 or fp16: what half-precision-only kernels (flash and cuDNN
    attention) need of their inputs."""
    return config.precision in _AUTOCAST_DTYPES


def needs_loss_scaling(config: Config) -> bool:
    """fp16 scales the loss (GradScaler); bf16 has fp32's exponent range and needs none."""
    return config.precision == "fp16"


def sharded_param_dtype(config: Config) -> torch.dtype | None:
    """The dtype FSDP gathers and computes with (its ``MixedPrecisionPolicy.param_dtype``): bf16 under bf16, else
    the fp32 of the shards (None). fp16 never reaches FSDP (GradScaler does not agree across shards: the parallel
    owner refuses it).

    Autocast stays on around the forward as in every other burst, and nothing is cast twice: it decides each op's
    dtype exactly as under DDP (matmuls in bf16; softmax, norms and losses in fp32), and a bf16 weight autocast
    would cast to bf16 is one already. What FSDP's param_dtype adds is what is all-gathered and held unsharded:
    bf16 copies, half the bytes of fp32. Gradients are reduced in fp32 (the parallel owner's ``reduce_dtype``)."""
    return torch.bfloat16 if config.precision == "bf16" else None


_TF32 = "torch.backends.cuda.matmul.allow_tf32"
_AUTOCAST_CODE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
_SCALER_WHY = "fp16 has a narrow exponent range: scaling the loss keeps small gradients from flushing to 0"


def _autocast_recipe(config: Config, context: RecipeContext) -> list[RecipePart]:
    """Plain PyTorch: autocast around the forward; under fp16 the GradScaler's four places too."""
    if config.precision == "fp32":
        return []
    parts: list[RecipePart] = [Code("precision", "forward_context",
                                    f"torch.autocast(device.type, dtype={_AUTOCAST_CODE[config.precision]})")]
    if config.precision == "fp16":
        parts += [Code("precision", "scaler", "scaler = torch.amp.GradScaler(device.type)", _SCALER_WHY),
                  Code("precision", "backward", "scaler.scale({}).backward()", "the loss scaled, as GradScaler wants"),
                  Code("precision", "unscale", "scaler.unscale_(optimizer)", "clip real gradients, not scaled ones"),
                  Code("precision", "step", "scaler.step(optimizer)", "skipped when fp16 gradients overflowed"),
                  Code("precision", "step", "scaler.update()", "the scale adapts to what overflowed")]
    return parts


def _framework_precision(name: str, values: dict[str, Any]) -> RecipeEntry:
    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        value = values.get(config.precision)
        return [] if value is None else [Setting("precision", name if name else config.precision, value)]

    return entry


def _tf32_code(config: Config, context: RecipeContext) -> list[RecipePart]:
    return [Code("tf32", "code", f"{_TF32} = True")] if config.tf32 else []


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "precision": {
        "pytorch": _autocast_recipe,
        "hf": _framework_precision("", {"bf16": True, "fp16": True}),  # TrainingArguments(bf16=True) / fp16=True
        "lightning": _framework_precision("precision", {"bf16": "bf16-mixed", "fp16": "16-mixed"}),
        "accelerate": _framework_precision("mixed_precision", {"bf16": "bf16", "fp16": "fp16"}),
    },
    "tf32": {
        "pytorch": lambda config, context: [Flag("tf32", _TF32, _TF32 + " = {}", "True")] if config.tf32 else [],
        "hf": lambda config, context: [Setting("tf32", "tf32", True)] if config.tf32 else [],
        "lightning": _tf32_code,
        "accelerate": _tf32_code,
    },
}


def math_precision(config: Config, device_kind: str) -> str:
    """The arithmetic matmuls really ran in: fp32 with TF32 on a GPU multiplies with 10-bit mantissas.

    What the correctness guard's tolerance is chosen by (MFU charges each op its own math: :func:`op_math`).
    """
    if config.precision == "fp32" and config.tf32 and device_kind == "cuda":
        return "tf32"
    return config.precision


#: The peak table's name for the math of each dtype an op can run in; the float8 formats are one rate on the tensor
#: cores that have them (the float8 owner's torchao layers multiply e4m3 forward and e5m2 gradients).
_DTYPE_MATH = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "float8_e4m3fn": "fp8",
               "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}


def op_math(config: Config, device_kind: str, op_class: str, dtype: str) -> str:
    """The arithmetic one counted op ran in, from its class ("conv" or "matmul") and its inputs' dtype.

    Autocast casts before an op runs, so bf16/fp16 inputs mean bf16/fp16 math; float8 inputs (the FLOP counter
    reads the float8 data inside torchao's tensors) mean the float8 tensor cores' math, "fp8". A float32
    convolution on a GPU runs on cuDNN with TF32 allowed in every burst (:func:`global_flags` keeps stock PyTorch's
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


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    global_flags=global_flags,
    facts=lambda config, device_kind, visible_gpus: {"math": math_precision(config, device_kind)},
)
