"""The knob registry: every optimisation the tool can switch, declared exactly once.

The panel's controls, the CLI's ``--set`` flags, ``Config`` validation and the docs are all generated
from :data:`KNOBS`, so adding a knob here is the whole job of exposing it. Each entry says what the
knob does, why it can help, when it helps, on which devices it does anything, and its valid values.
Cross-knob and device rules (conflicts, "no effect here") live in :mod:`accel_widgets.validation`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Group = Literal["data", "precision", "batch", "compile", "python", "system", "parallel"]
DeviceKind = Literal["cpu", "cuda"]

#: Groups in the classic order a tuning session walks them (the ladder follows the same order).
GROUPS: tuple[Group, ...] = ("data", "precision", "batch", "compile", "python", "system", "parallel")
GROUP_TITLES: dict[Group, str] = {
    "data": "Data loading",
    "precision": "Mixed precision",
    "batch": "Batch",
    "compile": "torch.compile",
    "python": "Python overhead",
    "system": "System",
    "parallel": "Parallel",
}


class KnobValueError(ValueError):
    """A knob was given a value outside its declared choices or range; the message names the valid ones."""


@dataclass(frozen=True)
class Knob:
    """One optimisation: its valid values and the text a user reads before flipping it."""

    name: str
    group: Group
    kind: type
    default: Any
    what: str
    why: str
    when: str
    applies_to: tuple[DeviceKind, ...] = ("cpu", "cuda")
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    allow_none: bool = False

    def valid_values_text(self) -> str:
        """Human-readable description of the valid values, used in every error message."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind is bool:
            return "True or False"

        def bound(value: float | None, unbounded: str) -> str:
            if value is None:
                return unbounded
            return str(int(value)) if self.kind is int else f"{value:g}"

        noun = "an integer" if self.kind is int else "a number"
        text = f"{noun} in [{bound(self.minimum, '-inf')}, {bound(self.maximum, 'inf')}]"
        return text + " or None" if self.allow_none else text

    def check(self, value: Any) -> Any:
        """Return ``value`` normalised to the knob's type, or raise :class:`KnobValueError`."""
        if value is None and self.allow_none:
            return None
        if self.choices is not None:
            if value in self.choices and type(value) is type(self.default):
                return value
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        if not math.isfinite(value):  # NaN passes every range comparison, and int(inf) raises OverflowError
            raise KnobValueError(f"{self.name}={value!r} is not a finite number: use {self.valid_values_text()}")
        if self.kind is int and int(value) != value:
            raise KnobValueError(f"{self.name}={value!r} is invalid: use {self.valid_values_text()}")
        value = self.kind(value)
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise KnobValueError(f"{self.name}={value!r} is out of range: use {self.valid_values_text()}")
        return value

    def parse(self, text: str) -> Any:
        """Parse a command-line string (``--set name=text``) into a checked value."""
        stripped = text.strip()
        if self.allow_none and stripped.lower() in ("none", "null", ""):
            return None
        if self.kind is bool:
            lowered = stripped.lower()
            if lowered in ("1", "true", "yes", "on"):
                return self.check(True)
            if lowered in ("0", "false", "no", "off"):
                return self.check(False)
            raise KnobValueError(f"{self.name}={text!r} is invalid: use true or false")
        if self.kind is str:
            return self.check(stripped)
        try:
            number = float(stripped)
        except ValueError:
            raise KnobValueError(f"{self.name}={text!r} is invalid: use {self.valid_values_text()}") from None
        return self.check(int(number) if self.kind is int and number.is_integer() else number)


class KnobRegistry(Mapping[str, Knob]):
    """Ordered, read-only mapping of knob name to :class:`Knob`."""

    def __init__(self, knobs: list[Knob]) -> None:
        self._knobs = {k.name: k for k in knobs}
        if len(self._knobs) != len(knobs):
            raise ValueError("duplicate knob names in the registry")

    def __getitem__(self, name: str) -> Knob:
        try:
            return self._knobs[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), self._knobs, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KnobValueError(f"unknown knob {name!r}{hint}: known knobs are {', '.join(self._knobs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def in_group(self, group: Group) -> list[Knob]:
        return [k for k in self._knobs.values() if k.group == group]

    def defaults(self) -> dict[str, Any]:
        return {name: k.default for name, k in self._knobs.items()}


KNOBS = KnobRegistry(
    [
        # -- data loading -------------------------------------------------------------------------
        Knob(
            "batch_size", "data", int, None, minimum=1, maximum=1 << 20, allow_none=True,
            what="Samples per micro-batch handed to the model (None: the workload's own batch size).",
            why="Larger batches amortise per-step Python and kernel-launch overhead over more samples.",
            when="The step is short and memory has headroom; watch accuracy when changing it for real.",
        ),
        Knob(
            "num_workers", "data", int, 0, minimum=0, maximum=64,
            what="DataLoader worker processes that load and augment batches in parallel.",
            why="With 0 workers the training loop waits while every item is decoded/augmented on its thread.",
            when="Data wait is a visible share of the step (per-item CPU work: decoding, augmentation).",
        ),
        Knob(
            "pin_memory", "data", bool, False, applies_to=("cuda",),
            what="Collate batches into page-locked host memory.",
            why="The GPU's DMA engine copies from pinned memory directly, faster and asynchronously.",
            when="Host-to-device copies are a visible share of the step. No effect without CUDA.",
        ),
        Knob(
            "prefetch_factor", "data", int, 2, minimum=1, maximum=64,
            what="Batches each DataLoader worker prepares ahead of the training loop.",
            why="A deeper queue absorbs jitter in per-batch loading time.",
            when="Loading time varies a lot between batches. Needs num_workers > 0.",
        ),
        Knob(
            "persistent_workers", "data", bool, False,
            what="Keep DataLoader workers alive between epochs.",
            why="Restarting workers every epoch re-forks processes and re-creates dataset state.",
            when="Epochs are short or dataset setup is expensive. Needs num_workers > 0.",
        ),
        Knob(
            "non_blocking", "data", bool, False, applies_to=("cuda",),
            what="Issue host-to-device copies with non_blocking=True.",
            why="From pinned memory the copy overlaps with compute instead of stalling the host.",
            when="Together with pin_memory on a GPU. No effect without CUDA.",
        ),
        Knob(
            "data_cache", "data", str, "none", choices=("none", "memory", "memmap"),
            what="Materialise the dataset once: in RAM, or in a numpy.memmap file reused by later runs.",
            why="Per-item preprocessing is paid once instead of every epoch; memmap is shared by loader workers.",
            when="Items are expensive to produce and deterministic enough to cache (random augmentation is "
            "frozen to one draw per item).",
        ),
        # -- precision ----------------------------------------------------------------------------
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
        # -- batch --------------------------------------------------------------------------------
        Knob(
            "grad_accum_steps", "batch", int, 1, minimum=1, maximum=1024,
            what="Micro-batches accumulated per optimizer step (loss scaled by 1/k).",
            why="Reaches a large effective batch without its activation memory.",
            when="Memory, not speed, is the limit: accumulation saves memory, it does not save time.",
        ),
        # -- compile ------------------------------------------------------------------------------
        Knob(
            "compile_mode", "compile", str, "off",
            choices=("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
            what="torch.compile the model with this mode (inductor backend).",
            why="Fuses elementwise kernels and removes Python overhead; reduce-overhead adds CUDA graphs.",
            when="Many small ops or launch-bound steps, and enough steps to repay the compile time.",
        ),
        # -- python overhead ----------------------------------------------------------------------
        Knob(
            "sync_every", "python", int, 1, minimum=0, maximum=1 << 20,
            what="Read the loss on the host every N steps (1 = every step, 0 = only at the end).",
            why="loss.item() blocks the host until the GPU finishes, so the GPU idles while Python catches up.",
            when="Launch-bound GPU steps; logging every step is the classic hidden sync. fp16 with a non-fused "
            "optimizer still syncs every step inside GradScaler; run_burst(sync_debug=True) names any sync left.",
        ),
        Knob(
            "script_loss", "python", bool, False,
            what="Compile the loss function with TorchScript (legacy; torch.compile replaces it).",
            why="Historically fused small loss ops; kept to show how the legacy path compares.",
            when="Rarely now: TorchScript is deprecated in favour of torch.compile.",
        ),
        Knob(
            "optimizer_impl", "python", str, "default", choices=("default", "for-loop", "foreach", "fused"),
            what="Optimizer implementation: per-parameter loop, multi-tensor foreach, or one fused kernel.",
            why="The for-loop launches kernels per parameter; foreach batches them; fused does it in one kernel.",
            when="Models with many parameter tensors and short steps.",
        ),
        Knob(
            "set_to_none", "python", bool, True,
            what="zero_grad(set_to_none=True): drop gradients instead of writing zeros.",
            why="Skips a memset per parameter and lets the next backward allocate fresh gradients.",
            when="Always, unless code reads .grad before backward.",
        ),
        # -- system -------------------------------------------------------------------------------
        Knob(
            "cudnn_benchmark", "system", bool, False, applies_to=("cuda",),
            what="torch.backends.cudnn.benchmark: time cuDNN's algorithms and keep the fastest.",
            why="The default heuristic pick is not always the fastest convolution algorithm.",
            when="Convolutional models with fixed input shapes. No effect on CPU.",
        ),
        Knob(
            "deterministic", "system", bool, False,
            what="torch.use_deterministic_algorithms(True): bitwise-reproducible kernels.",
            why="Reproducibility for debugging; usually costs speed.",
            when="Debugging or auditing; turn off for speed.",
        ),
        Knob(
            "channels_last", "system", bool, False,
            what="Store 4-D activations and weights as NHWC (channels_last memory format).",
            why="Tensor-core convolutions want NHWC; NCHW inputs pay transposes around every conv.",
            when="Convolutional models, especially with bf16/fp16 on GPUs.",
        ),
        Knob(
            "memory_fraction", "system", float, None, minimum=0.05, maximum=1.0, allow_none=True,
            applies_to=("cuda",),
            what="Cap this process's share of GPU memory (torch.cuda.set_per_process_memory_fraction).",
            why="Simulates a smaller GPU or leaves room for other processes; OOMs show the real limit.",
            when="Testing whether a config fits a smaller device. No effect on CPU.",
        ),
        Knob(
            "empty_cache", "system", bool, False, applies_to=("cuda",),
            what="Call torch.cuda.empty_cache() after warmup, before measuring.",
            why="Returns the allocator's cached, unused blocks to the driver: other processes on the GPU can "
            "use that memory (nvidia-smi shows less), and the next allocations pay cudaMalloc again. It "
            "does not lower the measured peak of allocated memory (that peak is reset after warm-up anyway).",
            when="Sharing the GPU with other processes. It never speeds training up; it can slow the first "
            "measured steps. No effect on CPU.",
        ),
        # -- parallel -----------------------------------------------------------------------------
        Knob(
            "parallel", "parallel", str, "none", choices=("none", "dataparallel", "ddp"),
            what="Data parallelism: one process over several GPUs (DataParallel) or one process per rank (DDP).",
            why="More devices process more samples per second; DDP avoids DataParallel's single-process GIL "
            "and scatter/gather bottleneck.",
            when="Several local GPUs (or CPU ranks with gloo for learning DDP); prefer DDP.",
        ),
        Knob(
            "world_size", "parallel", int, 1, minimum=1, maximum=1024,
            what="Number of DDP ranks (processes).",
            why="Each rank trains on its own shard of every global batch.",
            when="With parallel='ddp': one rank per GPU, or a few CPU ranks.",
        ),
    ]
)
