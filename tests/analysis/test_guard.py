"""The correctness guard: real bursts that must (not) be flagged, and hand-built trajectories for each rule."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from accel_widgets import BurstOptions, BurstResult, Config, StepRecord, demo_workload, run_burst
from accel_widgets.analysis.guard import check_training, comparable, find_baseline, tolerance
from accel_widgets.data.streams import StreamReading
from accel_widgets.knobs.precision import LOSS_TOLERANCE_AT_START
from accel_widgets.results.burst import RankSummary
from tests.measured import as_measured
from tests.workloads import CLASSES, FEATURES, tiny_workload


def burst(workload, config, steps):
    return run_burst(workload, config, steps=steps, options=BurstOptions(isolation="inprocess"))


# -- real bursts ----------------------------------------------------------------------------------
class HugeActivations(nn.Module):
    """Activations around 1e5 then a LayerNorm: trains in fp32 and bf16 (8 exponent bits), overflows fp16.

    fp16's largest value is 65504, so under fp16 autocast the first layer's output is inf, the
    normalisation turns it into NaN, and the GradScaler skips every step on inf gradients.
    """

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(FEATURES, 32)
        with torch.no_grad():
            self.wide.weight.mul_(1e6)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.wide(x)))


def test_a_model_that_overflows_fp16_is_flagged_and_the_same_model_in_bf16_is_not():
    workload = tiny_workload(model=HugeActivations)
    base = burst(workload, Config(), steps=10)
    fp16 = burst(workload, Config(precision="fp16"), steps=10)
    bf16 = burst(workload, Config(precision="bf16"), steps=10)
    assert all(math.isfinite(loss) for loss in base.losses())

    assert find_baseline(fp16, [base, fp16, bf16]) is base
    flagged = check_training(fp16, base)
    assert flagged.status == "changes_training"
    assert flagged.reasons == (
        "loss is NaN from step 0 (12 of 12 steps not finite)",
        "the fp16 GradScaler skipped 12 of 12 optimizer steps (gradients overflowed): those steps did not train",
        "the run has no finite loss to compare with the baseline",
    )
    assert check_training(BurstResult.from_json(fp16.to_json()), base) == flagged  # as reloaded from history

    verdict = check_training(bf16, find_baseline(bf16, [base, fp16, bf16]))
    assert verdict.status == "ok", verdict.reasons
    assert verdict.compared_steps == 12


@pytest.mark.slow
@pytest.mark.parametrize(("demo", "batch_size", "steps"), [("mlp", None, 30), ("lm", 8, 20)])
def test_bf16_on_the_demo_workloads_is_not_flagged(demo, batch_size, steps):
    """Real bursts against fp32 (lm at batch 8 keeps the test short; image, at ~1.5 s a step here, is left to
    the calibration recorded in guard.py)."""
    workload = demo_workload(demo)
    base = burst(workload, Config(batch_size=batch_size), steps=steps)
    bf16 = burst(workload, Config(batch_size=batch_size, precision="bf16"), steps=steps)
    assert find_baseline(bf16, [bf16, base]) is base
    verdict = check_training(bf16, base)
    assert verdict.status == "ok", verdict.reasons
    assert verdict.compared_steps == steps + 2
    assert verdict.max_relative_deviation < tolerance("bf16", 0) / 4


# -- hand-built trajectories ----------------------------------------------------------------------
def falling(steps: int = 40) -> list[float]:
    return [0.5 + 2.0 * math.exp(-step / 15) for step in range(steps)]


def result(losses_by_rank, *, workload="w", samples=64, status="ok", skipped=None, env=None, **config) -> BurstResult:
    """A BurstResult with the given per-rank losses (a list for rank 0 alone)."""
    if not isinstance(losses_by_rank, dict):
        losses_by_rank = {0: losses_by_rank}
    steps = [StepRecord(rank, step, float(step), 0.0, 0.0, 0.01, 0.01, samples, loss)
             for rank, losses in losses_by_rank.items() for step, loss in enumerate(losses)]
    ranks = [RankSummary(rank, samples, 1.0, 0, "rss", 0.0, 0.1, "cpu", scaler_skipped_steps=skipped)
             for rank in losses_by_rank]
    return as_measured(BurstResult(workload=workload, config=Config(**config), status=status,
                                   world_size=len(losses_by_rank), steps=steps, ranks=ranks, environment=env or {}))


def test_a_diverging_trajectory_is_flagged_with_where_and_by_how_much():
    base = falling()
    run = [loss * (1 + max(0, step - 20) * 0.04) for step, loss in enumerate(base)]
    verdict = check_training(result(run, precision="bf16"), result(base))
    assert verdict.status == "changes_training"
    assert verdict.compared_steps == 40
    assert verdict.max_relative_deviation == pytest.approx(0.68, abs=0.01)
    (reason,) = verdict.reasons
    assert reason.startswith("loss deviates 68% (above) from the fp32 baseline at step 39 "
                             "(tolerance 10% there for bf16)")
    assert reason.endswith("first beyond tolerance at step 25")


def test_the_same_offset_is_rounding_for_bf16_and_a_change_for_fp32():
    base = falling()
    run = [loss * (1.03 - 0.02 * (-1) ** step) for step, loss in enumerate(base)]  # 3% off, +-2% per step
    assert check_training(result(run, precision="bf16"), result(base)).status == "ok"
    fp32 = check_training(result(run, optimizer_impl="foreach"), result(base))
    assert fp32.status == "changes_training"
    assert fp32.reasons == ("loss deviates 2.9% (above) from the fp32 baseline at step 1 "
                            "(tolerance 1.2% there for fp32)",)


def test_tf32_on_a_gpu_gets_the_tf32_tolerance_and_is_no_baseline():
    base, run = falling(), [loss * 1.015 for loss in falling()]
    gpu = {"device_kind": "cuda"}
    assert check_training(result(run, tf32=True, env=gpu), result(base)).status == "ok"
    assert check_training(result(run, tf32=True, env={"device_kind": "cpu"}), result(base)).status == "changes_training"
    assert find_baseline(result(run, precision="bf16"), [result(base, tf32=True, env=gpu)]) is None


def test_tolerance_widens_with_steps_and_orders_precisions():
    assert tolerance("bf16", 0) == LOSS_TOLERANCE_AT_START["bf16"]
    assert tolerance("bf16", 16) == pytest.approx(2 * tolerance("bf16", 0))
    assert tolerance("bf16", 64) == pytest.approx(3 * tolerance("bf16", 0))
    assert tolerance("fp32", 30) < tolerance("tf32", 30) < tolerance("fp16", 30) < tolerance("bf16", 30)


def test_a_near_zero_loss_is_judged_against_the_loss_scale():
    base = [2.0 * math.exp(-step / 3) for step in range(30)]  # falls to 1e-4
    run = [loss + 0.002 for loss in base]  # relative difference 2000% at the end, 0.1% of the start
    verdict = check_training(result(run, precision="bf16"), result(base))
    assert verdict.status == "ok"
    assert verdict.max_relative_deviation < 0.01


def test_nan_and_inf_are_flagged_without_a_baseline_and_name_the_rank():
    losses = {0: falling(10), 1: [*falling(10)[:3], math.nan, math.inf, *falling(10)[5:]]}
    verdict = check_training(result(losses, parallel="ddp", world_size=2), None)
    assert verdict.status == "changes_training"
    assert verdict.reasons == ("loss is NaN from step 3 on rank 1 (2 of 10 steps not finite)",)
    single = check_training(result([1.0, -math.inf]), None)
    assert single.reasons == ("loss is -inf from step 1 (1 of 2 steps not finite)",)


def test_without_a_baseline_a_finite_run_says_so():
    verdict = check_training(result(falling(), precision="bf16"), None)
    assert verdict.status == "no_baseline"
    assert verdict.max_relative_deviation is None
    assert "no finished fp32 run" in verdict.reasons[0]


@pytest.mark.parametrize(
    ("run", "baseline", "why"),
    [
        (result({0: falling(), 1: falling()}, parallel="ddp", world_size=2), result(falling()),
         "the run has 2 rank(s) and the baseline 1: under DDP each rank reads its own shard (DistributedSampler)"),
        (result(falling(), samples=128, batch_size=64, grad_accum_steps=2), result(falling()),
         "the run trains on 128 samples (64 x 2 accumulated) per step and the baseline on 64 samples"),
        (result(falling(), workload="lm"), result(falling(), workload="mlp"),
         "different workloads (lm vs baseline mlp)"),
        (result([None] * 5), result(falling()), "the run has no finite loss to compare with the baseline"),
        (result(falling()), result([*falling(5), math.nan]), "the baseline itself is broken (loss is NaN from step 5"),
    ],
    ids=["ddp-shards", "samples-per-step", "workload", "no-losses", "broken-baseline"],
)
def test_runs_that_read_different_batches_are_not_comparable(run, baseline, why):
    ok, reason = comparable(run, baseline)
    assert not ok
    assert reason.startswith(why)
    verdict = check_training(run, baseline)
    assert verdict.status == "not_comparable"
    assert verdict.reasons == (reason,)


def streamed(workers: str, readers: int, **config) -> BurstResult:
    """A run on a stream whose split across its rank's ``readers`` loader workers is ``workers``'s."""
    run = result(falling(), **config)
    reading = StreamReading("none", workers, "probe", readers=readers)
    return dataclasses.replace(run, ranks=[dataclasses.replace(run.ranks[0], stream=reading)])


def test_a_stream_that_splits_itself_between_workers_is_not_comparable_across_worker_counts():
    """Its own split decides which items each worker batches; a stream the tool deals out reads the same batches with
    any workers (its items keyed by position), and a self-split stream with the same workers does too."""
    two, one = streamed("stream", 2, num_workers=2), streamed("none", 1)
    ok, why = comparable(two, one)
    assert not ok and why.startswith("the stream splits itself between its loader workers, and the run reads it with "
                                     "2 reader(s) per rank where the baseline reads it with 1: ")
    assert check_training(two, one).status == "not_comparable"
    assert not comparable(streamed("stream", 4, num_workers=4), two)[0]
    assert comparable(streamed("stream", 2, num_workers=2, prefetch_factor=4), two) == (True, "")
    assert comparable(streamed("tool", 2, num_workers=2), one) == (True, "")


def test_accumulation_with_the_same_samples_per_step_is_comparable():
    run = result(falling(), batch_size=32, grad_accum_steps=2)
    assert comparable(run, result(falling())) == (True, "")


def test_a_broken_run_is_flagged_even_when_not_comparable():
    verdict = check_training(result([1.0, math.nan], workload="lm"), result(falling(), workload="mlp"))
    assert verdict.status == "changes_training"
    assert len(verdict.reasons) == 2


def test_a_scaler_that_keeps_skipping_is_flagged_from_the_engines_count():
    base = falling()
    flagged = check_training(result(base, precision="fp16", skipped=12), result(base))
    assert flagged.status == "changes_training"
    assert flagged.reasons == ("the fp16 GradScaler skipped 12 of 40 optimizer steps (gradients overflowed): "
                               "those steps did not train",)
    assert check_training(result(base, precision="fp16", skipped=3), result(base)).status == "ok"  # calibrating
    assert check_training(result(base, precision="fp16", skipped=None), result(base)).status == "ok"


def test_a_stalled_fp16_loss_is_explained_as_skipped_steps():
    base = falling()
    verdict = check_training(result([base[0]] * 40, precision="fp16"), result(base))
    assert verdict.status == "changes_training"
    assert verdict.reasons[0].endswith("its loss fell 0.0% where the baseline's fell 70%, as when a GradScaler "
                                       "skips most optimizer steps")


def test_find_baseline_picks_the_plainest_comparable_fp32_run():
    run = result(falling(), precision="bf16", num_workers=2)
    plain, loader = result(falling()), result(falling(), num_workers=2)
    same_micro_batches = result(falling(), num_workers=2, optimizer_impl="foreach")
    others = [
        run,
        result(falling(), status="failed"),
        result(falling(), precision="bf16"),
        result(falling(), samples=128, batch_size=128),
        result({0: falling(), 1: falling()}, parallel="ddp", world_size=2),
        result(falling(), workload="other"),
        result([*falling(5), math.nan]),
        result(falling(), compile_mode="default", num_workers=2, optimizer_impl="foreach"),
    ]
    assert find_baseline(run, [*others, loader, plain]) is plain
    assert find_baseline(run, [*others, loader]) is loader
    accumulated = result(falling(), batch_size=32, grad_accum_steps=2)
    assert find_baseline(run, [*others, accumulated, same_micro_batches]) is same_micro_batches
    assert find_baseline(run, others) is others[-1]
    assert find_baseline(run, others[:-1]) is None
