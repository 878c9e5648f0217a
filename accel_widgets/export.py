"""Beyond one machine: write the chosen configuration out as a standalone ``torchrun`` training script.

A burst tells you which knobs help; a real job then runs for hours across machines. The exported
script is plain, editable PyTorch in modern APIs (``torch.amp``, ``torch.compile``, DDP under
``torchrun``), with every knob's value baked in and commented. It imports only the workload, named
``module:function`` (the function returns an ``accel_widgets.Workload``; the module must be importable
on every machine, e.g. installed or on ``PYTHONPATH``).
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import Config

_TEMPLATE = '''"""Training script exported by accel_widgets for workload {workload_ref!r}.

Configuration: {label}

One machine, {nproc} processes:
    torchrun --standalone --nproc-per-node {nproc} {name}
Several machines (run on each; HOST:PORT is reachable from all of them):
    {multinode}
"""

import argparse
import contextlib
import importlib
import inspect
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

WORKLOAD = {workload_ref!r}
BATCH_SIZE = {batch_size!r}  # None: the workload's own batch size
NUM_WORKERS = {num_workers!r}
PIN_MEMORY = {pin_memory!r}  # pinned host memory: the copy engine DMAs batches asynchronously
PREFETCH_FACTOR = {prefetch_factor!r}
PERSISTENT_WORKERS = {persistent_workers!r}
NON_BLOCKING = {non_blocking!r}  # overlap host-to-device copies with compute (needs pinned memory)
PRECISION = {precision!r}  # autocast dtype; fp16 also scales the loss with GradScaler
TF32 = {tf32!r}
GRAD_ACCUM_STEPS = {grad_accum_steps!r}  # micro-batches per optimizer step; DDP syncs only on the last
COMPILE_MODE = {compile_mode!r}
SYNC_EVERY = {sync_every!r}  # read the loss on the host every N steps (0: only at the end)
OPTIMIZER_IMPL = {optimizer_impl!r}
SET_TO_NONE = {set_to_none!r}
CUDNN_BENCHMARK = {cudnn_benchmark!r}
DETERMINISTIC = {deterministic!r}
CHANNELS_LAST = {channels_last!r}
MEMORY_FRACTION = {memory_fraction!r}


def load_workload():
    module, _, function = WORKLOAD.partition(":")
    return getattr(importlib.import_module(module), function)()


def to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        if CHANNELS_LAST and obj.dim() == 4 and obj.is_floating_point():
            return obj.to(device, non_blocking=NON_BLOCKING, memory_format=torch.channels_last)
        return obj.to(device, non_blocking=NON_BLOCKING)
    if isinstance(obj, dict):
        return {{k: to_device(v, device) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def build_optimizer(workload, params):
    optimizer = workload.optimizer(params)
    if OPTIMIZER_IMPL == "default":
        return optimizer
    flags = {{"for-loop": dict(foreach=False, fused=False), "foreach": dict(foreach=True, fused=False),
             "fused": dict(foreach=False, fused=True)}}[OPTIMIZER_IMPL]
    accepted = inspect.signature(type(optimizer).__init__).parameters
    groups = [{{k: v for k, v in g.items() if k == "params" or (k in accepted and k not in flags)}}
              for g in optimizer.param_groups]
    defaults = {{k: v for k, v in optimizer.defaults.items() if k in accepted and k not in flags}}
    return type(optimizer)(groups, **defaults, **flags)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps to train")
    args = parser.parse_args()
    if DETERMINISTIC:
        # cuBLAS is deterministic only with a fixed workspace, which it reads when CUDA starts: set it first.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    # torchrun sets RANK, LOCAL_RANK and WORLD_SIZE and runs the rendezvous for us.
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))

    # TF32 tensor cores for fp32 matmuls (False is PyTorch's default; cuDNN convolutions use TF32 either way).
    torch.backends.cuda.matmul.allow_tf32 = TF32
    torch.backends.cudnn.benchmark = CUDNN_BENCHMARK
    torch.use_deterministic_algorithms(DETERMINISTIC)
    if device.type == "cuda" and MEMORY_FRACTION is not None:
        torch.cuda.set_per_process_memory_fraction(MEMORY_FRACTION, device)

    workload = load_workload()
    torch.manual_seed(workload.seed)
    model = workload.build_model().to(device)
    if CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(workload, list(model.parameters()))
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    if COMPILE_MODE != "off":
        model = torch.compile(model, mode=None if COMPILE_MODE == "default" else COMPILE_MODE)

    batch_size = BATCH_SIZE or workload.batch_size or 64
    sampler = DistributedSampler(workload.dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=workload.seed)
    loader = DataLoader(workload.dataset, batch_size=batch_size, sampler=sampler, num_workers=NUM_WORKERS,
                        collate_fn=workload.collate_fn, pin_memory=PIN_MEMORY and device.type == "cuda",
                        drop_last=True, prefetch_factor=PREFETCH_FACTOR if NUM_WORKERS else None,
                        persistent_workers=PERSISTENT_WORKERS if NUM_WORKERS else False)
    dtype = {{"bf16": torch.bfloat16, "fp16": torch.float16}}.get(PRECISION)
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    stream, pending, samples = batches(), [], 0
    started = time.perf_counter()
    for step in range(args.steps):
        for micro in range(GRAD_ACCUM_STEPS):
            inputs, targets = to_device(next(stream), device)
            samples += len(targets)
            last = micro == GRAD_ACCUM_STEPS - 1
            with contextlib.nullcontext() if last else model.no_sync():
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    output = model(**inputs) if isinstance(inputs, dict) else model(inputs)
                    loss = workload.loss_fn(output, targets)
                scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=SET_TO_NONE)
        pending.append(loss.detach())
        if SYNC_EVERY and len(pending) >= SYNC_EVERY:
            if rank == 0:
                print(f"step {{step}} loss {{torch.stack(pending).float().mean().item():.4f}}", flush=True)
            pending.clear()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    if rank == 0:
        final = torch.stack(pending).float().mean().item() if pending else loss.item()
        print(f"done: {{args.steps}} steps, {{samples * world_size / elapsed:.1f}} samples/s over {{world_size}} "
              f"ranks, final loss {{final:.4f}}", flush=True)
    dist.barrier()  # leave together: a rank destroying its group while a peer still uses it can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def torchrun_command(script: str | os.PathLike[str], *, nproc_per_node: int, nnodes: int = 1,
                     endpoint: str = "HOST:29400", job_id: str = "accel-widgets") -> str:
    """The multi-machine launch line (c10d rendezvous: no extra service to run)."""
    return (f"torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint {endpoint} --rdzv-id {job_id} {Path(script).name}")


def export_script(workload_ref: str, config: Config, path: str | os.PathLike[str], *, nnodes: int = 2,
                  endpoint: str = "HOST:29400") -> Path:
    """Write a standalone DDP training script for ``config``; returns its path.

    ``workload_ref`` is ``module:function``. The script always runs under ``torchrun`` with DDP (a
    single process is ``--nproc-per-node 1``); ``config.world_size`` sets the suggested processes per node.
    """
    module, _, function = workload_ref.partition(":")
    if not module or not function:
        raise ValueError(f"workload_ref {workload_ref!r}: use MODULE:FUNCTION, e.g. mypkg.train:make_workload")
    if config.parallel == "dataparallel":
        raise ValueError("export_script writes a DDP script; DataParallel is single-process legacy: use parallel='ddp'")
    target = Path(path)
    nproc = config.world_size
    text = _TEMPLATE.format(
        workload_ref=workload_ref, label=config.label(), nproc=nproc, name=target.name,
        multinode=torchrun_command(target, nproc_per_node=nproc, nnodes=nnodes, endpoint=endpoint),
        **config.to_dict(),
    )
    target.write_text(text)
    return target
