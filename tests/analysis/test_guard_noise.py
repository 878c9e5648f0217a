"""The guard's noise band (what reseeding the baseline's data moves its loss by), the data seed it needs, and
caches that freeze random augmentation."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from accel_widgets import BurstEngine, BurstOptions, BurstResult, Config, Workload
from accel_widgets.analysis import guard
from accel_widgets.analysis.diagnosis import diagnose
from accel_widgets.analysis.guard import (
    NOISE_MARGIN,
    SMOOTHING_WINDOW,
    cached_noise,
    check_training,
    deviation_at,
    find_baseline,
    noise_band,
    tolerance,
)
from accel_widgets.data.cache import cache_dataset, first_random_item
from accel_widgets.engine.training import build_loop
from accel_widgets.knobs.plan import resolve
from accel_widgets.results.history import RunHistory, workload_fingerprint
from accel_widgets.results.noise import NoiseBand
from accel_widgets.search.tuner import measure_noise
from accel_widgets.views.text import summary
from tests.analysis.test_guard import HugeActivations, falling, result
from tests.devices import cpu_device
from tests.workloads import CLASSES, FEATURES, TinyNet, tensors

INPROCESS = BurstEngine(BurstOptions(isolation="inprocess"))
STEPS = 30  # measured; with 2 warm-up steps every trajectory has 32


class Augmented(Dataset):
    """The tiny learnable task (label = argmax of the first CLASSES features) with random augmentation on every
    read, drawn from torch's generator: Gaussian noise, and half the time the features that do not decide the label
    reversed (a "flip"). Its draws are keyed to the item (:mod:`accel_widgets.data.keyed`).

    ``cost_s`` of CPU time per item stands for decoding; ``shuffle_labels`` breaks the task on purpose.
    """

    def __init__(self, n: int = 512, noise: float = 0.5, cost_s: float = 0.0, shuffle_labels: bool = False) -> None:
        self.x, self.y = tensors(n)
        if shuffle_labels:
            self.y = self.y[torch.randperm(n, generator=torch.Generator().manual_seed(1))]
        self.noise, self.cost_s = noise, cost_s

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.thread_time()
        while time.thread_time() - started < self.cost_s:
            pass
        return self.augment(self.x[index], None), self.y[index]

    def augment(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        x = x + self.noise * torch.randn(FEATURES, generator=generator)
        if torch.rand((), generator=generator) < 0.5:
            x = torch.cat([x[:CLASSES], x[CLASSES:].flip(0)])
        return x


class OwnGenerator(Augmented):
    """The same augmentation drawn from a generator the dataset holds itself: no key reaches it, so an item's draws
    depend on the process that reads it and on what that process read before."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.generator = torch.Generator().manual_seed(0)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.augment(self.x[index], self.generator), self.y[index]


def augmented(name: str = "augmented", *, lr: float = 3e-3, model: Any = TinyNet, own_generator: bool = False,
              **dataset: Any) -> Workload:
    items = OwnGenerator(**dataset) if own_generator else Augmented(**dataset)
    return Workload(model=model, dataset=items, loss_fn=F.cross_entropy, batch_size=64, name=name,
                    optimizer=functools.partial(torch.optim.AdamW, lr=lr))


@pytest.fixture(autouse=True)
def fresh_noise_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no band measured yet."""
    monkeypatch.setattr(guard, "_NOISE_BANDS", {})


# -- the data seed ----------------------------------------------------------------------------------
def built(workload: Workload, tmp_path: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A rank's starting weights, its first batch's inputs and the next draw augmentation would make."""
    with torch.random.fork_rng():
        loop, raw = build_loop(workload, resolve(Config(), cpu_device(), workload), torch.device("cpu"), 0,
                               cache_dir=str(tmp_path),
                               emit=lambda event: None, clock_origin=0.0)
        draw = torch.rand(4)
        inputs, _ = next(loop.batches)
    return raw.state_dict(), inputs, draw


def test_the_data_seed_moves_data_order_and_augmentation_but_not_the_weights(tmp_path: Path):
    workload = Workload(model=TinyNet, dataset=tensors(), loss_fn=F.cross_entropy, batch_size=32, seed=3)
    weights, inputs, draw = built(workload, tmp_path)
    for same in (workload, dataclasses.replace(workload, data_seed=3)):
        again = built(same, tmp_path)
        assert all(torch.equal(weights[k], again[0][k]) for k in weights)
        assert torch.equal(inputs, again[1]) and torch.equal(draw, again[2])
    other_weights, other_inputs, other_draw = built(dataclasses.replace(workload, data_seed=4), tmp_path)
    assert all(torch.equal(weights[k], other_weights[k]) for k in weights)
    assert not torch.equal(inputs, other_inputs)
    assert not torch.equal(draw, other_draw)


def test_a_workload_with_another_data_seed_is_another_workload_in_the_history():
    workload = Workload(model=TinyNet, dataset=tensors(64), loss_fn=F.cross_entropy, seed=3)
    fingerprint = workload_fingerprint(workload)
    assert workload_fingerprint(dataclasses.replace(workload, data_seed=3)) == fingerprint
    assert workload_fingerprint(dataclasses.replace(workload, data_seed=4)) != fingerprint


# -- real bursts: keyed augmentation needs no band; what the band lets through and what it still catches -----
#: What changes only how batches are loaded (pin_memory is a no-op on a CPU, where these tests run).
LOADING = {
    "1 worker": Config(num_workers=1),
    "2 workers": Config(num_workers=2),
    "4 workers": Config(num_workers=4),
    "2 persistent workers, prefetch 4, pinned": Config(num_workers=2, persistent_workers=True, prefetch_factor=4,
                                                       pin_memory=True),
}


@pytest.fixture(scope="module")
def keyed_runs() -> Iterator[dict[str, Any]]:
    """The augmented workload's fp32 baseline (8 batches an epoch: 32 steps cross 3 epoch ends), the loading configs,
    and runs that must (not) be flagged."""
    workload = augmented()
    runs = {"base": INPROCESS(workload, Config(), steps=STEPS)}
    runs |= {name: INPROCESS(workload, config, steps=STEPS) for name, config in LOADING.items()}
    runs |= {"bf16": INPROCESS(workload, Config(precision="bf16"), steps=STEPS),
             "lr x10": INPROCESS(augmented(lr=3e-2), Config(), steps=STEPS),
             "shuffled labels": INPROCESS(augmented(shuffle_labels=True), Config(), steps=STEPS)}
    yield runs


def test_on_keyed_augmented_data_loading_knobs_train_exactly_as_the_baseline_and_pass_without_a_band(keyed_runs):
    base = keyed_runs["base"]
    rank = base.ranks[0]
    assert rank.random_data and rank.keyed_data  # two draws of an item differ; two under one key agree
    for name in LOADING:
        run = keyed_runs[name]
        assert run.losses() == base.losses(), name  # fp32, step for step: equal, not close
        verdict = check_training(run, base)
        assert verdict.status == "ok" and verdict.max_relative_deviation == 0.0, (name, verdict)
        assert not [f for f in diagnose(run, base) if "training" in f.title]


def test_bf16_on_augmented_data_is_not_flagged(keyed_runs):
    verdict = check_training(keyed_runs["bf16"], keyed_runs["base"])
    assert verdict.status == "ok", verdict.reasons
    assert verdict.max_relative_deviation < tolerance("bf16", 0) / 10  # same draws: rounding only


@pytest.mark.parametrize("broken", ["lr x10", "shuffled labels"])
def test_a_real_change_on_keyed_augmented_data_is_flagged_without_a_band(keyed_runs, broken):
    verdict = check_training(keyed_runs[broken], keyed_runs["base"])
    assert verdict.status == "changes_training" and verdict.beyond_tolerance
    (reason,) = verdict.reasons
    assert reason.startswith("loss deviates") and "there for fp32" in reason


@pytest.fixture(scope="module")
def own_generator_runs() -> Iterator[dict[str, Any]]:
    """The same workload augmenting from a generator of its own: its fp32 baseline, its noise band, and runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(guard, "_NOISE_BANDS", {})
        workload = augmented("own generator", own_generator=True)
        base = INPROCESS(workload, Config(), steps=STEPS)
        yield {"base": base, "noise": measure_noise(workload, base, engine=INPROCESS),
               "workers": INPROCESS(workload, Config(num_workers=2), steps=STEPS),
               "lr x10": INPROCESS(augmented("own generator", own_generator=True, lr=3e-2), Config(), steps=STEPS)}


def test_an_augmentation_no_key_reaches_moves_with_loader_workers_and_needs_the_band(own_generator_runs):
    base, noise, workers = own_generator_runs["base"], own_generator_runs["noise"], own_generator_runs["workers"]
    assert noise.data_seeds == (1, 2) and noise.steps == STEPS + 2
    assert 0.02 < noise.spread < 0.2  # about 5%: a batch of 64 augmented items moves the loss that much

    assert workers.losses() != base.losses()  # each worker's copy of the generator draws its own
    assert workers.ranks[0].random_data and not workers.ranks[0].keyed_data  # two reads under one key differ
    alone = check_training(workers, base)  # the precision's tolerance alone would be a false alarm: no verdict
    assert alone.status == "cannot_tell" and alone.beyond_tolerance
    (reason,) = alone.reasons
    assert "there for fp32" in reason and "a generator the items' keys do not set" in reason
    assert reason.endswith("band = aw.measure_noise(workload, baseline), then aw.check_training(run, baseline, band)")
    (finding,) = [f for f in diagnose(workers, base) if f.title == "Cannot tell whether training changed"]
    assert finding.severity == "info" and not [f for f in diagnose(workers, base) if "changes training" in f.title]

    verdict = check_training(workers, base, noise)
    assert verdict.status == "ok", verdict.reasons
    assert verdict.max_relative_deviation == alone.max_relative_deviation

    broken = check_training(own_generator_runs["lr x10"], base, noise)
    assert broken.status == "changes_training" and broken.beyond_tolerance
    assert broken.max_relative_deviation > 2 * NOISE_MARGIN * deviation_at(noise, SMOOTHING_WINDOW)
    assert f"{NOISE_MARGIN:g}x the" in broken.reasons[0] and "a baseline with reseeded data moves" in broken.reasons[0]


def test_fp16_that_overflows_is_flagged_whatever_the_noise():
    workload = augmented("huge", model=HugeActivations)
    base = INPROCESS(workload, Config(), steps=8)
    noise = measure_noise(workload, base, engine=INPROCESS)
    assert noise is not None
    verdict = check_training(INPROCESS(workload, Config(precision="fp16"), steps=8), base, noise)
    assert verdict.status == "changes_training"
    assert verdict.reasons[0].startswith("loss is NaN from step 0")
    assert "GradScaler skipped" in verdict.reasons[1]


# -- the band, by hand ----------------------------------------------------------------------------
def scaled(losses: list[float], factor: float) -> list[float]:
    return [loss * factor for loss in losses]


def test_the_band_is_the_widest_reseed_rescaled_to_one_batch_and_averages_down():
    base = result(falling())
    band = noise_band(base, {1: result(scaled(falling(), 1.03)), 2: result(scaled(falling(), 0.98))})
    assert band == NoiseBand(pytest.approx(0.03 * math.sqrt(SMOOTHING_WINDOW)), 40, (1, 2))
    assert [deviation_at(band, i) for i in (0, 3, 4, 100)] == pytest.approx(
        [0.03 * math.sqrt(5), 0.03 * math.sqrt(5 / 4), 0.03, 0.03])
    assert NoiseBand.from_dict(band.to_dict()) == band


def test_reseeds_that_failed_or_read_other_batches_do_not_count():
    base = result(falling())
    failed = result(scaled(falling(), 1.5), status="failed")
    other_batch = result(scaled(falling(), 1.5), samples=128, batch_size=128)
    assert noise_band(base, {1: failed, 2: other_batch}) is None
    assert noise_band(base, {1: failed, 2: result(scaled(falling(), 1.01))}).data_seeds == (2,)


def test_the_band_widens_the_tolerance_and_the_precision_floor_stays():
    base, reseeded = result(falling()), {1: result(scaled(falling(), 1.03))}
    band = noise_band(base, reseeded)
    inside = result(scaled(falling(), 1.05))
    outside = result([loss * (1 + 0.0025 * step) for step, loss in enumerate(falling())])  # drifting away
    assert check_training(inside, base).status == "changes_training"  # 5% is beyond fp32's 1-2.6%
    assert check_training(inside, base, band).status == "ok"
    flagged = check_training(outside, base, band)
    assert flagged.status == "changes_training" and flagged.beyond_tolerance
    assert flagged.reasons == ("loss deviates 9.2% (above) from the fp32 baseline at step 39 (tolerance 6.0% there: "
                               "2x the 3.0% a baseline with reseeded data moves); first beyond tolerance at step 27",)
    assert check_training(outside, base).reasons[0].endswith("(tolerance 2.6% there for fp32); first beyond "
                                                             "tolerance at step 10")

    quiet = noise_band(base, {1: result(falling())})  # a deterministic workload: reseeding moves nothing
    assert quiet.spread == 0.0
    assert check_training(result(scaled(falling(), 1.03)), base, quiet).reasons == (
        "loss deviates 3.0% (above) from the fp32 baseline at step 0 (tolerance 1.0% there for fp32)",)


# -- measured once, kept ----------------------------------------------------------------------------
@dataclasses.dataclass
class ReseedEngine:
    """``run_burst``'s signature: each data seed moves the falling trajectory by ``shift[seed]``."""

    shift: dict[int, float]
    calls: list[tuple[int | None, Config, int, str]] = dataclasses.field(default_factory=list)

    def __call__(self, workload: Workload, config: Config, *, steps: int, seconds: float | None = None,
                 label: str = "", stop: Any = None, on_event: Any = None) -> BurstResult:
        self.calls.append((workload.data_seed, config, steps, label))
        return result(scaled(falling(steps + 2), 1 + self.shift[workload.data_seed]), workload=workload.name)


def tiny(name: str = "w") -> Workload:
    return Workload(model=TinyNet, dataset=tensors(64), loss_fn=F.cross_entropy, name=name, seed=5)


def test_the_band_is_measured_once_per_workload_and_kept_in_the_history(tmp_path: Path):
    workload, base = tiny(), result(falling(32))
    engine = ReseedEngine({6: 0.02, 7: -0.04})
    with RunHistory(tmp_path / "h.sqlite") as history:
        band = measure_noise(workload, base, engine=engine, history=history)
        assert band.data_seeds == (6, 7) and band.spread == pytest.approx(0.04 * math.sqrt(5))
        assert [(seed, steps, label) for seed, _, steps, label in engine.calls] == [
            (6, 32, "guard: baseline, data seed 6"), (7, 32, "guard: baseline, data seed 7")]
        assert all(config == base.config for _, config, _, _ in engine.calls)
        assert measure_noise(workload, base, engine=engine, history=history) == band
        assert len(engine.calls) == 2  # kept in this process

        fingerprint = workload_fingerprint(workload)
        guard._NOISE_BANDS.clear()  # a new process: the history still has it
        assert cached_noise(fingerprint, base) is None
        assert cached_noise(fingerprint, base, history) == band
        assert measure_noise(workload, base, engine=engine, history=history) == band
        assert len(engine.calls) == 2

        longer = result(falling(40))  # the band covers 32 steps: a longer baseline is measured again
        assert cached_noise(fingerprint, longer, history) is None
        assert measure_noise(workload, longer, engine=engine, history=history).steps == 40
        other_batch = result(falling(32), samples=32, batch_size=32)
        assert cached_noise(fingerprint, other_batch, history) is None
        assert cached_noise(workload_fingerprint(tiny("other")), base, history) is None


def test_without_a_finished_reseed_there_is_no_band_and_the_floor_stands():
    def failing(workload: Workload, config: Config, **kwargs: Any) -> BurstResult:
        return result(falling(), status="failed")

    base = result(falling())
    assert measure_noise(tiny(), base, engine=failing) is None
    assert cached_noise(workload_fingerprint(tiny()), base) is None


def test_history_measurements_round_trip_and_a_file_without_them_reads_none(tmp_path: Path):
    with RunHistory(tmp_path / "h.sqlite") as history:
        assert history.measurement("f", "k") is None  # the table does not exist yet
        history.save_measurement("f", "k", {"spread": 0.1})
        history.save_measurement("f", "k", {"spread": 0.2})
        assert history.measurement("f", "k") == {"spread": 0.2}
        assert history.measurement("f", "other") is None
        assert history.runs() == []


# -- caches that freeze augmentation ----------------------------------------------------------------
class RandomInTheMiddle(Dataset):
    """Deterministic items, NaN included, except the middle one, which draws on every read."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = torch.tensor([float(index), math.nan])
        return (x + torch.rand(2) if index == 5 else x), index


def test_two_reads_that_differ_name_the_item():
    assert first_random_item(Augmented(n=8)) == 0
    assert first_random_item(RandomInTheMiddle()) == 5
    assert first_random_item(TensorDataset(*tensors(8))) is None


@pytest.mark.parametrize("mode", ["memory", "memmap"])
def test_caching_random_items_says_which_item_froze_built_or_reused(mode: str, tmp_path: Path):
    built = cache_dataset(Augmented(n=8), mode, tmp_path)[1]
    reused = cache_dataset(Augmented(n=8), mode, tmp_path)[1]
    for info in (built, reused):
        assert info.frozen_item == 0
        assert info.frozen_text().startswith(f"data_cache='{mode}' froze random augmentation: item 0 differs "
                                             "between two reads")
    assert (built.reused, reused.reused) == (False, mode == "memmap")  # RAM is not kept between calls
    assert cache_dataset(TensorDataset(*tensors(8)), mode, tmp_path)[1].frozen_item is None


def test_a_run_on_frozen_augmentation_is_marked_and_never_a_baseline():
    workload = augmented("frozen")
    base = INPROCESS(workload, Config(), steps=4)
    frozen = INPROCESS(workload, Config(data_cache="memory"), steps=4)
    assert frozen.cache is not None and frozen.cache.frozen_item == 0 and frozen.warnings == []
    reason = frozen.cache.frozen_text()
    assert "froze random augmentation" in summary(frozen)
    for baseline in (base, None):
        verdict = check_training(frozen, baseline)
        assert verdict.status == "changes_training"
        assert verdict.reasons[0] == reason and not verdict.beyond_tolerance
    assert find_baseline(INPROCESS(workload, Config(precision="bf16"), steps=4), [frozen]) is None

    findings = [(f.title, f.knob) for f in diagnose(frozen, base) if "augmentation" in f.detail]
    assert ("Cache froze augmentation", "data_cache") in findings
    assert ("Engine warning", None) not in findings


@pytest.mark.parametrize("mode", ["memory", "memmap"])
def test_a_cache_that_freezes_nothing_trains_exactly_as_the_baseline(mode: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ACCEL_WIDGETS_CACHE", str(tmp_path))
    workload = Workload(model=TinyNet, dataset=tensors(), loss_fn=F.cross_entropy, batch_size=32, name="plain")
    base = INPROCESS(workload, Config(), steps=8)
    cached = INPROCESS(workload, Config(data_cache=mode, num_workers=2), steps=8)
    assert cached.warnings == [] and cached.cache.frozen_item is None
    assert cached.losses() == base.losses()
    verdict = check_training(cached, base)
    assert verdict.status == "ok" and verdict.max_relative_deviation == 0.0
