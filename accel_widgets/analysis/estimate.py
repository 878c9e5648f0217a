"""Will it fit, and how fast could it be, before a byte is allocated: one training step traced on fake tensors.

``estimate(workload, config, device="H100 80GB")`` builds the model under torch's ``FakeTensorMode`` (every tensor
has its shape and dtype, none has memory), applies what the knob owners do to it (channels_last, activation
checkpointing, the optimizer's implementation), and runs one step as a burst does: the micro-batch's forward under
the config's autocast, backward, the optimizer step, zero_grad. Every storage the step allocates is followed from
the op that made it to the moment it is freed, so the peak and what was alive at it (parameters, gradients,
optimizer state, activations) are those of the real step; FLOPs are counted in the same pass
(:func:`~accel_widgets.metrics.flops.counting_flops`). The step is traced with the CPU's kernels, so where a GPU's
kernels keep other tensors for backward the estimate differs by that much (``Estimate.notes`` lists what it leaves
out).

From the one trace:

- per rank under DDP (plus its gradient buckets) and FSDP (the state divided by the ranks, plus the blocks it gathers),
  with the allocator's rounding on a GPU, against the device's memory: fits, or by how much it does not;
- the largest batch that fits leaving the batch-size finder's margin free: activations grow with the batch, the
  state does not;
- a roofline *lower bound* on the step's time, ``max(FLOPs / peak, bytes / bandwidth)`` per rank, where the bytes are
  the least the step must move (each weight read in forward and backward, the gradients written, the optimizer's
  reads and writes, each saved activation written and read once): a bound, never a prediction.

``device`` is this machine (a GPU through NVML, else its RAM), or a named GPU from
:data:`~accel_widgets.metrics.gpus.GPU_SPECS`, so a laptop can ask about an H100.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import psutil
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.data import IterableDataset, default_collate
from torch.utils.weak import WeakIdKeyDictionary

from ..engine.forkserver import server_pid
from ..engine.training import micro_batch_loss
from ..inputs.blocks import block_modules
from ..inputs.device import DeviceInfo, GpuInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import ModelStage, batch, data, memory, overhead, parallel, precision, prepare_model, system
from ..knobs.config import Config
from ..knobs.plan import resolve
from ..metrics.flops import OpClass, counting_flops
from ..metrics.gpus import GpuSpec, gpu_spec, spec_of_device
from ..metrics.thresholds import THRESHOLDS

Phase = Literal["forward", "backward", "optimizer"]
#: The CUDA caching allocator hands out blocks in multiples of 512 bytes; requests up to 1 MiB share 2 MiB segments,
#: up to 10 MiB 20 MiB segments, larger ones are rounded to 2 MiB (c10/cuda/CUDACachingAllocator.cpp).
CUDA_BLOCK_BYTES = 512
CUDA_SMALL_SEGMENT = 2 << 20
CUDA_LARGE_SEGMENT = 20 << 20
CUDA_LARGE_REQUEST = 10 << 20
CUDA_LARGE_ROUNDING = 2 << 20


# -- where the step runs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """The device an estimate is for: its name, ``kind`` ("cuda" or "cpu"), the memory a rank may use, the GPU's spec
    (None on a CPU, or a GPU not in the table) and the :class:`DeviceInfo` the knobs' rules judge the config by."""

    name: str
    kind: Literal["cuda", "cpu"]
    memory_bytes: int
    spec: GpuSpec | None
    device: DeviceInfo


def target(device: str | GpuSpec | DeviceInfo | None, ranks: int = 1) -> Target:
    """``device`` as an estimate reads it: None (or a :class:`DeviceInfo`) is a machine, its first GPU or else its
    RAM (what is available now); a name or a :class:`GpuSpec` is that GPU, ``ranks`` of them, with this machine's
    CPU."""
    if isinstance(device, str):
        device = gpu_spec(device)
    here = probe_device() if not isinstance(device, DeviceInfo) else device
    if isinstance(device, GpuSpec):
        gpus = tuple(GpuInfo(i, i, device.name, device.memory_bytes, compute_capability=device.compute_capability)
                     for i in range(max(1, ranks)))
        return Target(device.name, "cuda", device.memory_bytes, device,
                      DeviceInfo(here.cpu_count, here.cpu_name, here.cpu_flags, gpus, "named"))
    if here.has_cuda:
        gpu = here.gpus[0]
        return Target(gpu.name, "cuda", gpu.memory_bytes, spec_of_device(gpu.name), here)
    return Target(f"this machine's RAM ({here.cpu_name})", "cpu", int(psutil.virtual_memory().available), None, here)


# -- what a traced step found ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Breakdown:
    """Bytes alive at one rank's peak, by what holds them. ``parallel``: DDP's gradient buckets, or the parameters
    FSDP gathers; ``slack``: the CUDA caching allocator's rounding of the blocks alive then (its fragmentation can add
    more); ``process``: on a CPU, the rank's process before it trains (interpreter, torch and libraries)."""

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    parallel: int = 0
    slack: int = 0
    process: int = 0

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.activations + self.parallel + self.slack
                + self.process)

    @property
    def tensors(self) -> int:
        """What the step's own tensors hold (no allocator, no process): what a tensor-level tracker measures."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.parallel


@dataclass(frozen=True)
class Estimate:
    """One rank's step of ``config`` for ``workload`` on ``device``, estimated from a trace on fake tensors.

    ``peak``: the bytes alive at the rank's peak, by what holds them; ``memory_bytes`` what the device has for it;
    ``phase`` where the peak fell. ``flops_by_math``: the step's FLOPs per rank by "<op class>:<math>" (every
    micro-batch); ``bytes_moved``: the least memory traffic the step needs per rank (the roofline's bytes);
    ``bytes_unfused``: what its ops read and write one by one, without fusion. ``step_time_bound_s``: the roofline's
    lower bound on the step's time (None where the device has no peak: a CPU, a GPU not in the table),
    ``bound_by`` which side sets it ("compute", "memory") or why there is none. ``largest_batch``: the largest
    micro-batch per rank whose peak leaves ``margin`` of the memory free (None: not even a batch of 1).
    ``fixed_bytes`` and ``bytes_per_sample`` are the line the largest batch is read from (activations grow with the
    batch, the state does not), ``optimizer_peak_bytes`` the peak of the optimizer's step (no activations).
    ``notes`` say what the trace leaves out for this config; ``trace_s`` what it took. ``state_blocks`` and
    ``activation_blocks``: the sizes of the storages alive at the peak that stay and that grow with the batch; on a
    GPU the allocator's rounding of another batch is read from them (its segments make it a step, not a line).
    """

    workload: str
    config: Config
    device: str
    device_kind: Literal["cuda", "cpu"]
    memory_bytes: int
    batch_size: int
    ranks: int
    peak: Breakdown
    phase: Phase
    flops_by_math: dict[str, float]
    bytes_moved: int
    bytes_unfused: int
    step_time_bound_s: float | None
    bound_by: str
    largest_batch: int | None
    margin: float
    fixed_bytes: int
    bytes_per_sample: float
    optimizer_peak_bytes: int
    notes: tuple[str, ...] = ()
    trace_s: float = 0.0
    state_blocks: tuple[int, ...] = ()
    activation_blocks: tuple[int, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.peak.total

    @property
    def spare_bytes(self) -> int:
        """The device's memory left at the peak (negative: how much it is short by)."""
        return self.memory_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.spare_bytes >= 0

    @property
    def within_margin(self) -> bool:
        """Whether the peak leaves the margin free, as the batch-size finder requires of a size that fits."""
        return self.peak_bytes <= self.memory_bytes * (1 - self.margin)

    @property
    def flops(self) -> float:
        return sum(self.flops_by_math.values())

    def peak_at(self, batch_size: int) -> int:
        """The rank's peak at another micro-batch size, read off the line (no trace): the state and what the optimizer
        step needs stay, activations scale with the batch, on a GPU the allocator rounds that batch's blocks."""
        line = self.fixed_bytes + self.bytes_per_sample * batch_size + self.slack_at(batch_size)
        return int(max(line, self.optimizer_peak_bytes))

    def slack_at(self, batch_size: int) -> int:
        """The CUDA allocator's rounding at another batch: each activation block scaled with the batch (0 on a CPU)."""
        if self.device_kind != "cuda":
            return 0
        scale = batch_size / self.batch_size
        return _cuda_slack((*self.state_blocks, *(int(size * scale) for size in self.activation_blocks)))

    def largest_within(self, memory_bytes: int, margin: float | None = None) -> int | None:
        """The largest micro-batch whose peak leaves ``margin`` (default: this estimate's) of ``memory_bytes`` free: a
        memory cap other than the device's (the batch-size finder's on a CPU)."""
        return _largest(self, memory_bytes, self.margin if margin is None else margin)

    def error_of(self, measured_bytes: int, kind: str) -> float | None:
        """How far a burst's measured peak lies from this estimate, as a share of the estimate (+0.09: measured 9%
        above), comparing like with like: a GPU's allocated peak with the tensors (the allocator's rounding aside), a
        CPU's RSS with the tensors and the process; None for another device's kind."""
        if kind == "cuda_allocator" and self.device_kind == "cuda":
            expected = self.peak_bytes - self.peak.slack
        elif kind == "rss" and self.device_kind == "cpu":
            expected = self.peak_bytes
        else:
            return None
        return measured_bytes / expected - 1 if expected > 0 else None


# -- the trace -------------------------------------------------------------------------------------------------
@dataclass
class _Storage:
    bytes: int
    born: int
    died: int | None = None


class _Storages(TorchDispatchMode):
    """Every storage the traced step allocates, on the clock of its ops: when it was made, when it was freed and its
    bytes (a storage is freed when its last tensor is: a weak reference says when). The peak is read after each op,
    when its outputs and whatever is still referenced are alive."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0
        self.storages: list[_Storage] = []
        self._known: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: list[weakref.ref] = []
        self.live = 0
        self.peak = 0
        self.peak_at = 0
        self.phase: Phase = "forward"
        self.peak_phase: Phase = "forward"
        self.phase_peaks: dict[Phase, tuple[int, int]] = {}  # phase -> (peak bytes, clock)
        self.unfused_bytes = 0
        self.recomputed_bytes = 0

    def add(self, tensor: torch.Tensor) -> int | None:
        """Follow ``tensor``'s storage from now on (made before the trace: the parameters, the batch); its index."""
        storage = tensor.untyped_storage()
        index = self._known.get(storage)
        if index is not None:
            return index
        index = len(self.storages)
        record = _Storage(storage.nbytes(), self.clock)
        self.storages.append(record)
        self._known[storage] = index
        self._refs.append(weakref.ref(storage, lambda _, record=record: self._freed(record)))
        self.live += record.bytes
        return index

    def index_of(self, tensor: torch.Tensor) -> int | None:
        return self._known.get(tensor.untyped_storage())

    def _freed(self, record: _Storage) -> None:
        """A free is a tick of its own: one freed after the op that set the peak (its output dropped by Python before
        the next op) was alive at the peak, and ``alive_at`` must say so."""
        if record.died is None:
            self.clock += 1
            record.died = self.clock
            self.live -= record.bytes

    def enter_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.clock += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.clock += 1
        touched = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        self.unfused_bytes += sum(t.numel() * t.element_size() for t in touched)
        made = len(self.storages)
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self.add(tensor)
        if self.phase == "backward" and torch.is_grad_enabled():  # a checkpointed block's forward, run again
            self.recomputed_bytes += sum(s.bytes for s in self.storages[made:])
        if self.live > self.peak:
            self.peak, self.peak_at, self.peak_phase = self.live, self.clock, self.phase
        best = self.phase_peaks.get(self.phase, (-1, 0))
        if self.live > best[0]:
            self.phase_peaks[self.phase] = (self.live, self.clock)
        return out

    def alive_at(self, clock: int) -> list[int]:
        return [i for i, s in enumerate(self.storages) if s.born <= clock and (s.died is None or s.died > clock)]


@dataclass(frozen=True)
class _Traced:
    """What one traced step found, in bytes (one rank, the whole model unsharded, no allocator)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    gradients_at_peak: int
    phase: Phase
    optimizer_peak: int
    saved_for_backward: int
    recomputed: int  # what checkpointed blocks' forward made again in backward
    unfused_bytes: int
    flops: dict[tuple[OpClass, str], int]
    blocks: tuple[int, ...]  # each repeated block's parameter bytes (FSDP's units)
    state_sizes: tuple[int, ...]  # the blocks alive at the peak that stay with any batch (the allocator's rounding)
    activation_sizes: tuple[int, ...]  # those that grow with it

    @property
    def state(self) -> int:
        return self.parameters + self.gradients_at_peak + self.optimizer

    @property
    def total(self) -> int:
        return self.state + self.activations


def _fake_model(workload: Workload, fake: FakeTensorMode) -> nn.Module:
    """The workload's model with fake parameters: a factory is called under the fake mode (no weight is made); an
    instance is copied with a fake of each of its parameters and buffers in place of its own (tied ones stay tied),
    so no weight is copied and no op of the copy touches a real tensor (a copy under torch's FakeCopyMode cloned each
    Parameter's real data under the fake mode, which refuses it)."""
    model = workload.model
    if isinstance(model, nn.Module):
        fakes: dict[int, Any] = {}
        for _, tensor in (*model.named_parameters(remove_duplicate=False),
                          *model.named_buffers(remove_duplicate=False)):
            if id(tensor) not in fakes:
                fakes[id(tensor)] = fake.from_tensor(tensor)
        return copy.deepcopy(model, fakes)  # the memo: each tensor's copy is its fake
    with fake:
        return workload.build_model()


def sample_batch(workload: Workload) -> Any:
    """A real micro-batch of two items (or one), collated as the loader collates them: the structure and every shape
    but the batch's own length, which the fake batch takes from the config."""
    dataset = workload.build_dataset()
    if workload.loader is not None and workload.loader.batch_sampler is not None and workload.loader.batch_size is None:
        dataset = workload.loader.dataset
    if isinstance(dataset, IterableDataset):
        iterator = iter(dataset)
        items = [next(iterator)]
        items += [next(iterator, items[0])]
    else:
        items = [dataset[i] for i in range(min(2, len(dataset)))]  # type: ignore[arg-type]
    collate = workload.collate_fn or default_collate
    return collate(items)


def _fake_batch(sample: Any, size: int, fake: FakeTensorMode) -> Any:
    """``sample`` with every tensor whose leading dimension is the sample's length made ``size`` long, fake."""
    length = _leading(sample)

    def resized(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        shape = (size, *value.shape[1:]) if value.dim() and value.shape[0] == length else tuple(value.shape)
        with fake:
            return torch.zeros(shape, dtype=value.dtype)

    return tree_map(resized, sample)


def _leading(sample: Any) -> int:
    tensors = [t for t in tree_flatten(sample)[0] if isinstance(t, torch.Tensor) and t.dim()]
    return int(tensors[0].shape[0]) if tensors else 1


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


#: The owners' model stages a trace applies to the fake model (channels_last, activation checkpointing). DDP's and
#: FSDP's memory is counted per rank from the one trace instead (:func:`_per_rank`); the float8 and compile stages are
#: not traced.
TRACED_STAGES: tuple[ModelStage, ...] = ("layout", "recompute")
_CPU = torch.device("cpu")


def _trace(workload: Workload, config: Config, batch_size: int, sample: Any, grads_persist: bool) -> _Traced:
    """One step of ``config`` on fake tensors at ``batch_size``: the storages alive at its peak, by what holds them,
    and its FLOPs."""
    fake = FakeTensorMode()
    with torch.random.fork_rng(devices=[]):
        model = _fake_model(workload, fake)
        with fake:
            model, _, _ = prepare_model(model, config, _CPU, workload.blocks, stages=TRACED_STAGES)
            model.train()
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = overhead.build_optimizer(workload, params, config)
            for param in params:  # the steady state: the optimizer's state exists before the step begins
                param.grad = torch.zeros_like(param)
            optimizer.step()
            optimizer.zero_grad(set_to_none=not grads_persist)
            fake_batch = _fake_batch(sample, batch_size, fake)
        blocks = tuple(sum(p.numel() * p.element_size() for p in block.parameters())
                       for block in block_modules(model, workload.blocks))
        storages = _Storages()
        parameters = {storages.add(t) for t in (*model.parameters(), *model.buffers())}
        optimizer_state = {storages.add(t) for t in _state_tensors(optimizer)} - parameters
        persisting = {storages.add(p.grad) for p in params if p.grad is not None}
        for tensor in tree_flatten(fake_batch)[0]:
            if isinstance(tensor, torch.Tensor):
                storages.add(tensor)
        mixed = precision.MixedPrecision(config, torch.device("cpu"))
        with fake, storages, counting_flops() as flops:
            with mixed.autocast():
                loss = micro_batch_loss(model, fake_batch, workload.loss_fn, workload.step)
            storages.enter_phase("backward")
            saved = storages.live
            loss.backward()
            gradients = {storages.index_of(p.grad) for p in params if p.grad is not None} | persisting
            del loss
            storages.enter_phase("optimizer")
            optimizer.step()
            overhead.zero_grad(optimizer, config)
    state = parameters | optimizer_state
    before = sum(storages.storages[i].bytes for i in state | persisting)
    peak_clock = max((storages.phase_peaks.get(p, (0, 0)) for p in ("forward", "backward")), default=(0, 0))[1]
    alive = storages.alive_at(peak_clock)

    def held(indices: set[int | None]) -> int:
        return sum(storages.storages[i].bytes for i in alive if i in indices)

    grads_at_peak = held(gradients)
    sizes = [storages.storages[i].bytes for i in alive]
    stays = state | gradients | persisting
    optimizer_peak = storages.phase_peaks.get("optimizer", (0, 0))[0]
    return _Traced(
        parameters=held(parameters),
        gradients=sum(storages.storages[i].bytes for i in gradients if i is not None),
        optimizer=held(optimizer_state),
        activations=sum(sizes) - held(parameters) - held(optimizer_state) - grads_at_peak,
        gradients_at_peak=grads_at_peak,
        phase=storages.peak_phase,
        optimizer_peak=optimizer_peak,
        saved_for_backward=max(0, saved - before),
        recomputed=storages.recomputed_bytes,
        unfused_bytes=storages.unfused_bytes,
        flops=dict(flops),
        blocks=blocks,
        state_sizes=tuple(storages.storages[i].bytes for i in alive if i in stays),
        activation_sizes=tuple(storages.storages[i].bytes for i in alive if i not in stays),
    )


# -- per rank, on the device -----------------------------------------------------------------------------------
def _cuda_slack(sizes: tuple[int, ...]) -> int:
    """What the CUDA caching allocator reserves beyond the blocks alive: each rounded to 512 bytes, large ones to
    2 MiB, and one partly used segment of each pool (a floor: fragmentation can add more)."""
    rounded = 0
    for size in sizes:
        if size >= CUDA_LARGE_REQUEST:
            rounded += -size % CUDA_LARGE_ROUNDING
        else:
            rounded += -size % CUDA_BLOCK_BYTES
    pools = CUDA_SMALL_SEGMENT * any(s <= 1 << 20 for s in sizes) + CUDA_LARGE_SEGMENT * any(
        1 << 20 < s < CUDA_LARGE_REQUEST for s in sizes)
    return rounded + pools


def _per_rank(traced: _Traced, config: Config, batch_scale: float = 1.0) -> tuple[Breakdown, str]:
    """One rank's peak from the unsharded trace: DDP adds its gradient buckets (one copy of the gradients); FSDP
    divides the state by the ranks and adds the parameters it gathers (the largest block twice, the one computing and
    the next prefetched, or every block when it keeps them gathered from forward to backward), in the dtype it
    gathers them in. ``batch_scale`` scales the activations (another batch size, read off the line)."""
    activations = int(traced.activations * batch_scale)
    if parallel.sharded(config):
        ranks = parallel.ranks(config)
        scale = 0.5 if precision.sharded_param_dtype(config) == torch.bfloat16 else 1.0
        held = sum(traced.blocks) if parallel.keeps_gathered(config) else 2 * max(traced.blocks, default=0)
        root = traced.parameters - sum(traced.blocks)  # the root unit: embeddings, head, norms
        gathered = int((held + root) * scale)
        return (Breakdown(traced.parameters // ranks, traced.gradients_at_peak // ranks, traced.optimizer // ranks,
                          activations, gathered),
                f"FSDP over {ranks} ranks: the state divided by them, plus the parameters gathered")
    if parallel.distributed(config):
        return (Breakdown(traced.parameters, traced.gradients_at_peak, traced.optimizer, activations,
                          traced.gradients), "DDP: plus its gradient buckets (a copy of the gradients)")
    return Breakdown(traced.parameters, traced.gradients_at_peak, traced.optimizer, activations), ""


def _process_bytes() -> int:
    """On a CPU, what a rank's process holds before it trains: a rank is forked from the forkserver, which holds the
    interpreter, torch and the libraries it preloaded (the forkserver's RSS; this process's where none runs yet)."""
    pid = server_pid()
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, ValueError):  # no server (pid None), or it has just gone
        return int(psutil.Process().memory_info().rss)


# -- the estimate ----------------------------------------------------------------------------------------------
def estimate(workload: Workload, config: Config | None = None, *, device: str | GpuSpec | DeviceInfo | None = None,
             margin: float = THRESHOLDS.fit_margin) -> Estimate:
    """Peak memory, FLOPs and bytes of one training step of ``config`` (default ``Config()``) for ``workload``, per
    rank, on ``device`` (None: this machine; a name such as ``"H100 80GB"``, ``"A100 40GB"``, ``"L4"``,
    ``"RTX 4090"``; a :class:`~accel_widgets.metrics.gpus.GpuSpec`), from one step traced on fake tensors: nothing
    is allocated, and no process starts.

    Returns an :class:`Estimate`: the peak with its breakdown, whether it fits and by how much, the largest
    micro-batch that leaves ``margin`` of the memory free (the batch-size finder's margin), and a roofline lower bound
    on the step's time. A config the knobs' rules refuse on that device raises their
    :class:`~accel_widgets.knobs.rules.ConfigError`, and an unknown GPU name a ValueError naming the known ones.
    """
    started = time.perf_counter()
    config = config or Config()
    where = target(device, parallel.ranks(config))
    plan = resolve(config, where.device, workload)  # refused as a burst there would refuse it
    size = data.resolve_batch_size(config, workload)
    grads_persist = batch.micro_batches(config) > 1 or not overhead.frees_gradients(config)
    traced = _trace(workload, config, size, sample_batch(workload), grads_persist)
    rank, how = _per_rank(traced, config)
    slack = _cuda_slack((*traced.state_sizes, *traced.activation_sizes)) if where.kind == "cuda" else 0
    process = _process_bytes() if where.kind == "cpu" else 0
    peak = Breakdown(rank.parameters, rank.gradients, rank.optimizer, rank.activations, rank.parallel, slack, process)
    per_sample = traced.activations / size
    fixed = peak.total - traced.activations - slack  # the line; the allocator's rounding is read per batch
    optimizer_peak = traced.optimizer_peak - traced.parameters + rank.parameters + rank.parallel + slack + process
    flops = _flops_by_math(traced.flops, config, where.kind, batch.micro_batches(config))
    moved = _least_bytes(traced, rank, config)
    bound, bound_by = _roofline(flops, moved, where)
    notes = _notes(config, where, how)
    found = Estimate(workload.name, plan.config, where.name, where.kind, where.memory_bytes, size, plan.ranks, peak,
                     traced.phase, flops, moved, traced.unfused_bytes * batch.micro_batches(config), bound, bound_by,
                     None, margin, fixed, per_sample, optimizer_peak, notes, 0.0, traced.state_sizes,
                     traced.activation_sizes)
    return dataclasses.replace(found, largest_batch=_largest(found, where.memory_bytes, margin),
                               trace_s=time.perf_counter() - started)


def _largest(found: Estimate, memory_bytes: int, margin: float) -> int | None:
    """The largest batch whose peak leaves ``margin`` of ``memory_bytes`` free (None: not even 1): the line without
    the allocator's rounding bounds it from above, and a bisection under that bound finds it with the rounding."""
    room = memory_bytes * (1 - margin)
    if found.bytes_per_sample <= 0 or found.peak_at(1) > room:
        return None
    low, high = 1, max(1, math.floor((room - found.fixed_bytes) / found.bytes_per_sample))
    while low < high:
        middle = (low + high + 1) // 2
        if found.peak_at(middle) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def _flops_by_math(flops: Mapping[tuple[OpClass, str], int], config: Config, kind: str,
                   micro_batches: int) -> dict[str, float]:
    """The step's FLOPs (every micro-batch) by "<op class>:<math>", each op's math as the precision owner names it for
    the device (an fp32 convolution on a GPU runs in TF32)."""
    by_math: Counter[str] = Counter()
    for (op_class, dtype), count in flops.items():
        by_math[f"{op_class}:{precision.op_math(config, kind, op_class, dtype)}"] += count * micro_batches
    return dict(by_math)


def _least_bytes(traced: _Traced, rank: Breakdown, config: Config) -> int:
    """The least memory traffic of one step per rank: each weight read in forward and in backward (the forward again
    in checkpointed blocks), the gradients written, the optimizer reading weights, gradients and its state and writing
    weights and state, and each activation saved for backward written once and read once, those a checkpointed block
    makes again in backward included (the backward's ops run with grad mode off; a recomputed forward's run with it
    on, which is how the trace tells them apart)."""
    micro = batch.micro_batches(config)
    reads = (3 if memory.checkpointing(config) else 2) * rank.parameters * micro
    gradients = rank.gradients or traced.gradients
    optimizer = 2 * rank.parameters + gradients + 2 * rank.optimizer
    return int(reads + gradients + optimizer + 2 * (traced.saved_for_backward + traced.recomputed) * micro)


def _roofline(flops: Mapping[str, float], moved: int, where: Target) -> tuple[float | None, str]:
    """``max(sum(FLOPs_i / peak_i), bytes / bandwidth)``: the least time the step can take on the device, or why
    there is no bound."""
    if where.spec is None:
        return None, ("no peak FLOP/s or bandwidth known for a CPU" if where.kind == "cpu"
                      else f"{where.name} is not in the GPU table")
    compute = 0.0
    for key, count in flops.items():
        peak = where.spec.peak(key.partition(":")[2])
        if peak is None:
            return None, f"{where.name} has no {key.partition(':')[2]} peak"
        compute += count / peak
    memory_s = moved / where.spec.bandwidth_bytes_per_s
    return max(compute, memory_s), "compute" if compute >= memory_s else "memory"


def _notes(config: Config, where: Target, how: str) -> tuple[str, ...]:
    """What the estimate leaves out for this config, in words."""
    notes = ["traced with the CPU's kernels and autocast rules: a GPU kernel that keeps other tensors for backward "
             "moves the activations by that much"]
    if how:
        notes.append(how)
    if where.kind == "cuda":
        notes.append("the CUDA context and cuBLAS/cuDNN workspaces are outside the allocator's peak and not counted")
    else:
        notes.append("on a CPU the peak includes the rank's process; loader workers are processes of their own")
    if system.inputs_channels_last(config):
        notes.append("channels_last is applied to the weights; the batch's layout is traced as it comes")
    return tuple(notes)
