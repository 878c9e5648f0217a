"""A real training step's peak, as torch's MemTracker counts it in real mode: what an estimate on fake tensors is
held to (tests/analysis/test_estimate.py, benchmarks/estimate_accuracy.py).

The step is the burst's: the knob owners' model changes, the optimizer's state made by one step first (the steady
state), then one micro-batch's forward under the config's autocast, backward, the optimizer step and zero_grad.
"""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._pytree import tree_flatten, tree_map

from accel_widgets import Config, Workload
from accel_widgets.analysis.estimate import TRACED_STAGES, sample_batch
from accel_widgets.engine.training import micro_batch_loss
from accel_widgets.knobs import overhead, precision, prepare_model


def tracked_peak(workload: Workload, config: Config, batch_size: int) -> int:
    """The bytes MemTracker saw alive at the peak of one steady-state step on this CPU (the batch included: the
    estimate counts it, as the step holds it)."""
    torch.manual_seed(workload.seed)
    model, _, _ = prepare_model(workload.build_model(), config, torch.device("cpu"), workload.blocks,
                                stages=TRACED_STAGES)
    model.train()
    optimizer = overhead.build_optimizer(workload, [p for p in model.parameters() if p.requires_grad], config)
    sample = sample_batch(workload)
    length = next(t for t in tree_flatten(sample)[0] if isinstance(t, torch.Tensor) and t.dim()).shape[0]
    repeats = -(-batch_size // length)
    batch = tree_map(lambda t: torch.cat([t] * repeats)[:batch_size]
                     if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == length else t, sample)
    mixed = precision.MixedPrecision(config, torch.device("cpu"))

    def step() -> None:
        with mixed.autocast():
            loss = micro_batch_loss(model, batch, workload.loss_fn, workload.step)
        loss.backward()
        del loss
        optimizer.step()
        overhead.zero_grad(optimizer, config)

    step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *(t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)))
    with tracker:
        step()
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
