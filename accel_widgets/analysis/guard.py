"""Correctness guard: does a speed-up change what the model learns, or only how fast it learns it?

Every burst of a workload starts from the same weights and reads the same seeded batches in the same
order, so a config that only changes *speed* (loader workers, pinned memory, a fused optimizer) traces
the fp32 baseline's loss curve step for step, and one that changes *numerics* (bf16, fp16, TF32,
compile) traces it up to rounding. :func:`check_training` compares a run's loss trajectory with that
baseline's and says ``"changes_training"`` when:

- a loss is NaN or inf on any rank (no baseline needed: training is broken);
- an fp16 GradScaler keeps skipping optimizer steps (the engine's per-rank count);
- a data cache froze random augmentation to one draw per item (the engine's warning on the result);
- the smoothed trajectory leaves the baseline's by more than noise explains: more than reseeding the
  baseline's data moves it (a :class:`~accel_widgets.results.noise.NoiseBand`, when measured) and more than the
  precision in use does.

Randomly augmented data needs no band where its draws are keyed to the item (``RankSummary.keyed_data``: two
reads under one key agree, :mod:`~accel_widgets.data.keyed`): every item then draws the same whichever process
reads it, so loader workers, pinning, prefetching, persistence and a cache that froze nothing leave the batches
as they were, and an fp32 run traces its fp32 baseline exactly. Only an augmentation that draws from a generator
of its own (two reads under one key differ) still moves with them; there, without a band, a trajectory beyond
the precision's tolerance is no evidence either way: the verdict is ``"cannot_tell"``, saying how to measure the
band, never a false "changes_training".

Why a measured band there: a config that changes only speed still changes which random draw each item gets
(loader workers draw from their own seeded generators), so its loss moves by as much as the data's randomness
moves it -- 2.5-3.1% where the precision table allows fp32 1.2%. What that randomness moves is a property of
the workload, not of the precision: the baseline runs again with another data seed (same weights, other data
order and augmentation draws), once per workload
(:func:`~accel_widgets.search.tuner.measure_noise`, which runs the bursts: the guard itself only reads results), and
the band is kept in this process and in the run history (:func:`keep_noise`, :func:`cached_noise`). The
precision table stays as the floor, so a near-deterministic workload is not judged on a hair trigger.

Where no such baseline exists, or the two runs read different batches (DDP shards, another batch size),
the verdict says so instead of guessing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..knobs.data import reseeding_factors
from ..knobs.precision import LOSS_TOLERANCE_AT_START
from ..results.burst import BurstResult
from ..results.noise import NoiseBand

if TYPE_CHECKING:
    from ..results.history import RunHistory

GuardStatus = Literal["ok", "changes_training", "cannot_tell", "not_comparable", "no_baseline"]

#: Tolerance growth: ``start * (1 + sqrt(step) / GROWTH_SQRT_STEPS)``, so it doubles by step 16, triples by
#: step 64 and keeps widening slowly. Rounding differences change the weights a little at every step and
#: training amplifies them, so two correct trajectories drift apart the longer they run; a sqrt keeps a
#: long burst from hiding a real break behind an ever-wider band.
GROWTH_SQRT_STEPS = 4.0

#: Trailing running mean over this many steps before comparing: bf16 rounding moves single loss values by
#: up to 3.5% (image, above) without changing where training goes, while a real change persists.
SMOOTHING_WINDOW = 5

#: Deviations are relative to the baseline's loss, but never to less than this share of the largest
#: baseline loss of the burst: once a loss has fallen close to zero, a relative difference on it is noise
#: (0.01 vs 0.02 is "100%"), not a change in what the model learnt.
LOSS_FLOOR_SHARE = 0.2

#: GradScaler starts at a scale of 2**16 and halves it on every overflow, skipping that step: a few skips
#: at the start are it calibrating (the PyTorch AMP docs call that normal). More than this many, and more
#: than ``SCALER_SKIP_SHARE`` of the rank's steps, is a scaler that keeps skipping: those steps did not train.
SCALER_CALIBRATION_SKIPS = 4
SCALER_SKIP_SHARE = 0.1

#: An fp16 run whose loss falls by less than this share of the baseline's fall, while the baseline's falls
#: by at least ``STALL_MIN_BASELINE_FALL``, looks like a scaler skipping most steps (the weights do not move).
STALL_SHARE = 0.25
STALL_MIN_BASELINE_FALL = 0.1

#: A change counts only when it moves the loss this many times more than reseeding the baseline's data does.
#: Calibration (tests/analysis/test_guard_noise.py's augmented workload, 4 weight seeds x 30 steps, two reseeds each,
#: in units of the band at margin 1): loader workers reached 0.33-0.73, bf16 0.01, shuffled labels 5.2-8.3 and
#: a 10x learning rate 16-26. Twice the band keeps every correct run under ~0.4 of the tolerance while a
#: broken one still clears it several times over.
NOISE_MARGIN = 2.0
#: Reseeded baseline bursts per measurement: the band is the widest of them, so one quiet seed cannot set it.
NOISE_RESEEDS = 2


@dataclass(frozen=True)
class GuardVerdict:
    """Whether a run trains like its fp32 baseline, with the reasons in plain language and numbers.

    ``max_relative_deviation`` is the largest smoothed deviation from the baseline over the
    ``compared_steps`` steps both runs reported (``None`` when nothing was compared).
    ``beyond_tolerance`` says the trajectory left the tolerance: the one finding that a wider, measured
    noise band (:func:`~accel_widgets.search.tuner.measure_noise`) can overturn, so callers know when measuring it is
    worth bursts.
    """

    status: GuardStatus
    reasons: tuple[str, ...] = ()
    max_relative_deviation: float | None = None
    compared_steps: int = 0
    beyond_tolerance: bool = False


def deviation_at(band: NoiseBand, position: int) -> float:
    """What reseeding the data moves the smoothed loss by at the ``position``-th compared step (0-based): the band's
    one-batch spread averaged down over the losses the running mean holds there (one at step 0, ``SMOOTHING_WINDOW``
    from then on), wide at the first steps and narrower once the mean covers a full window."""
    return band.spread / math.sqrt(min(position + 1, SMOOTHING_WINDOW))


# -- which runs can be compared -------------------------------------------------------------------
def comparable(run: BurstResult, baseline: BurstResult) -> tuple[bool, str]:
    """Whether ``run`` and ``baseline`` read the same batches at every step and both have losses; if not, why.

    Same batches: same workload, same world size (DDP ranks read their own shards) and same samples per
    optimizer step; the reasons are spelled out in ``_batch_mismatch``. Losses: each side needs finite
    ones on rank 0, and a baseline that itself went NaN/inf is no reference.
    """
    mismatch = _batch_mismatch(run, baseline)
    if mismatch:
        return False, mismatch
    if not _finite_losses(run):
        return False, "the run has no finite loss to compare with the baseline"
    if not _finite_losses(baseline):
        return False, "the baseline has no finite loss to compare with"
    broken = _nonfinite_reasons(baseline)
    if broken:
        return False, f"the baseline itself is broken ({broken[0]}): it cannot serve as a reference"
    return True, ""


def find_baseline(run: BurstResult, candidates: Sequence[BurstResult]) -> BurstResult | None:
    """The fp32 reference for ``run`` among ``candidates``, or ``None``.

    Eligible: a finished (status ok) fp32 run, not TF32 on a GPU (that is reduced precision), with finite
    losses and live augmentation (no cache froze it), reading the same batches as ``run`` (same workload,
    world size and samples per step). The run's own losses play no part: a run that went NaN still gets its
    baseline. Preferred, in order: the same micro-batching (batch-norm statistics see the micro-batch, so
    2 x 32 is close to 1 x 64 but not equal), the plainest config (fewest knobs changed: the plain loop is
    the ground truth, while an fp32 run with compile could share a broken graph with the run), the longest
    trajectory.
    """
    eligible = [c for c in candidates if c is not run and c.ok and _precision(c) == "fp32"
                and not _batch_mismatch(run, c) and _finite_losses(c) and not _nonfinite_reasons(c)
                and not frozen_augmentation(c)]
    if not eligible:
        return None
    micro = _micro_batch(run)
    return min(eligible, key=lambda c: (_micro_batch(c) != micro, len(c.config.diff()), -len(_finite_losses(c))))


def _batch_mismatch(run: BurstResult, baseline: BurstResult) -> str:
    """Why rank 0 of ``run`` reads other batches than rank 0 of ``baseline``; empty when it reads the same.

    Same workload name (its seed and dataset are assumed to come with it: callers holding runs of
    several workloads under one name should group them by ``history.workload_fingerprint`` first), same
    world size (a DDP rank reads its own shard through DistributedSampler, so rank 0 of N ranks sees
    other batches than a single process), same samples per optimizer step (batch size x accumulation:
    2 x 32 reads the same items as 1 x 64).
    """
    if run.workload != baseline.workload:
        return f"different workloads ({run.workload} vs baseline {baseline.workload})"
    if run.world_size != baseline.world_size:
        return (f"the run has {run.world_size} rank(s) and the baseline {baseline.world_size}: under DDP each rank "
                "reads its own shard (DistributedSampler), so rank 0's batches differ from the baseline's at every "
                "step; compare with an fp32 run of the same world size")
    mine, theirs = _samples_per_step(run), _samples_per_step(baseline)
    if mine != theirs:
        return (f"the run trains on {_describe_batch(run, mine)} per step and the baseline on "
                f"{_describe_batch(baseline, theirs)}: the batches differ from step 0")
    return _stream_split_mismatch(run, baseline)


def _stream_split_mismatch(run: BurstResult, baseline: BurstResult) -> str:
    """Why a stream that splits itself between its loader workers gives the two runs other batches ("" when it does
    not): its own split decides which items each worker reads, so each worker count batches other items."""
    mine, theirs = run.stream, baseline.stream
    if mine is None or theirs is None or "stream" not in (mine.workers, theirs.workers):
        return ""
    if (mine.workers, mine.readers) == (theirs.workers, theirs.readers):
        return ""
    return (f"the stream splits itself between its loader workers, and the run reads it with {mine.readers} "
            f"reader(s) per rank where the baseline reads it with {theirs.readers}: its own split decides which "
            "items each reader batches, so the batches differ; compare runs with the same loader workers")


# -- the verdict ----------------------------------------------------------------------------------
def check_training(run: BurstResult, baseline: BurstResult | None, noise: NoiseBand | None = None) -> GuardVerdict:
    """Compare ``run`` with its fp32 ``baseline`` (see :func:`find_baseline`) and say whether it changes training.

    NaN/inf losses, a GradScaler that keeps skipping and a cache that froze random augmentation are judged
    on the run alone, so they are flagged even without a baseline. The trajectory check compares running
    means (``SMOOTHING_WINDOW``) of rank 0's losses step by step over the steps both runs reported, warmup
    included (the data order is the same from step 0), as ``|run - base| / max(|base|, floor)`` against a
    tolerance: ``NOISE_MARGIN`` times what reseeding the baseline's data moves it (``noise``, see
    :func:`~accel_widgets.search.tuner.measure_noise`), and never less than the precision's own (the precision
    owner's ``LOSS_TOLERANCE_AT_START``, widening with the step by ``GROWTH_SQRT_STEPS``), which is all there is
    without ``noise``.
    """
    reasons = _nonfinite_reasons(run) + _scaler_reasons(run) + frozen_augmentation(run)
    if baseline is None:
        return GuardVerdict("changes_training" if reasons else "no_baseline", tuple(reasons) or (
            "no finished fp32 run of this workload with the same batch size and world size to compare with",))
    ok, why = comparable(run, baseline)
    if not ok:
        return GuardVerdict("changes_training" if reasons else "not_comparable", (*reasons, why))
    comparison = _Comparison.of(run, baseline, noise)
    if not comparison.steps:
        return GuardVerdict("changes_training" if reasons else "not_comparable",
                            (*reasons, "no step has a finite loss in both runs"))
    beyond = comparison.reasons(fp16=_precision(run) == "fp16")
    if beyond and not reasons and noise is None and (_unkeyed_draws(run) or _unkeyed_draws(baseline)):
        return GuardVerdict("cannot_tell", (beyond[0] + _RANDOM_DATA,), max(comparison.deviations),
                            len(comparison.steps), True)
    reasons += beyond
    return GuardVerdict("changes_training" if reasons else "ok", tuple(reasons), max(comparison.deviations),
                        len(comparison.steps), bool(beyond))


#: Why a trajectory beyond the precision's tolerance on randomly augmented data whose draws are not keyed to the
#: item is no verdict without a band.
_RANDOM_DATA = (
    "; but the data is randomly augmented from a generator the items' keys do not set (two reads of the same item "
    "under one key differ: the dataset draws from a generator of its own), so a config that changes only speed "
    "still gives items other random draws (loader workers draw from their own generators) and moves the loss by as "
    "much as that randomness does, which the precision's tolerance does not cover. Cannot tell without measuring "
    "it: band = aw.measure_noise(workload, baseline), then aw.check_training(run, baseline, band)"
)


def _unkeyed_draws(result: BurstResult) -> bool:
    """Whether ``result``'s data draws randomly from something its items' keys do not set (or its keys are not
    known: a result from before them), so that its batches may depend on the loader's workers."""
    first = result.ranks[0] if result.ranks else None  # rank 0 checks its data for every rank
    return first is not None and bool(first.random_data) and first.keyed_data is not True


def tolerance(precision: str, step: int) -> float:
    """Relative deviation ``precision`` (a key of ``LOSS_TOLERANCE_AT_START``) explains at ``step``: the floor."""
    return LOSS_TOLERANCE_AT_START[precision] * (1 + math.sqrt(step) / GROWTH_SQRT_STEPS)


# -- the noise band -------------------------------------------------------------------------------
#: Bands measured in this process, by workload fingerprint and :func:`noise_key`.
_NOISE_BANDS: dict[tuple[str, str], NoiseBand] = {}
#: The history stores the band under this key, followed by :func:`noise_key`.
_HISTORY_KEY = "guard noise band "


def noise_band(baseline: BurstResult, reseeded: Mapping[int, BurstResult]) -> NoiseBand | None:
    """The band that ``reseeded`` bursts (data seed -> a burst of the baseline's config with that data seed) show.

    Bursts that did not finish or cannot be compared with ``baseline`` are left out; ``None`` when none is left.
    """
    comparisons = {seed: _Comparison.of(burst, baseline) for seed, burst in reseeded.items()
                   if burst.ok and comparable(burst, baseline)[0]}
    comparisons = {seed: c for seed, c in comparisons.items() if c.steps}
    if not comparisons:
        return None
    spread = max(deviation * math.sqrt(min(i + 1, SMOOTHING_WINDOW))
                 for c in comparisons.values() for i, deviation in enumerate(c.deviations))
    return NoiseBand(spread, min(len(c.steps) for c in comparisons.values()), tuple(sorted(comparisons)))


def noise_key(baseline: BurstResult) -> str:
    """What besides the workload sets how far reseeding moves the loss: the batches (samples per step,
    micro-batches, ranks) and the data cache. JSON text, so the history can store it as it is."""
    pieces = {"samples_per_step": _samples_per_step(baseline), "micro_batches": _micro_batches(baseline),
              "world_size": baseline.world_size, **reseeding_factors(baseline.config)}
    return json.dumps(pieces, sort_keys=True)


def cached_noise(fingerprint: str, baseline: BurstResult, history: RunHistory | None = None) -> NoiseBand | None:
    """The band measured earlier for the workload ``fingerprint`` (see
    :func:`~accel_widgets.results.history.workload_fingerprint`) and ``baseline``'s batches, if it covers the baseline's
    steps: this process's, else the one ``history`` keeps (then kept in this process too). A stored band that no
    longer parses counts as none: measuring again replaces it.
    """
    key = noise_key(baseline)
    band = _NOISE_BANDS.get((fingerprint, key))
    if band is None and history is not None:
        stored = history.measurement(fingerprint, _HISTORY_KEY + key)
        try:
            band = NoiseBand.from_dict(stored) if stored is not None else None
        except (KeyError, TypeError, ValueError):
            band = None
        if band is not None:
            _NOISE_BANDS[(fingerprint, key)] = band
    return band if band is not None and band.steps >= len(_finite_losses(baseline)) else None


def keep_noise(fingerprint: str, baseline: BurstResult, band: NoiseBand, history: RunHistory | None = None) -> None:
    """Keep ``band``, measured for the workload ``fingerprint`` against ``baseline``, for :func:`cached_noise`:
    in this process, and in ``history`` when one is in use (a later session then need not measure it again)."""
    key = noise_key(baseline)
    _NOISE_BANDS[(fingerprint, key)] = band
    if history is not None:
        history.save_measurement(fingerprint, _HISTORY_KEY + key, band.to_dict())


# -- the pieces -----------------------------------------------------------------------------------
def _precision(result: BurstResult) -> str:
    """The arithmetic a run really used (the precision knob's account: TF32 on a GPU counts)."""
    return result.facts.math if result.facts is not None else "fp32"


def _less_precise(run: BurstResult, baseline: BurstResult) -> str:
    return max(_precision(run), _precision(baseline), key=LOSS_TOLERANCE_AT_START.__getitem__)


def _micro_batches(result: BurstResult) -> int:
    """Micro-batches per optimizer step, as the owners reported them (1 for a run that never got that far)."""
    return result.facts.micro_batches if result.facts is not None else 1


def _samples_per_step(result: BurstResult) -> int | None:
    """Samples one rank consumes per optimizer step (batch size x accumulation), from its first step."""
    return next((s.samples for s in result.steps if s.rank == 0), None)


def _micro_batch(result: BurstResult) -> int | None:
    samples = _samples_per_step(result)
    return None if samples is None else samples // _micro_batches(result)


def _describe_batch(result: BurstResult, samples: int | None) -> str:
    accum = _micro_batches(result)
    if samples is None:
        return "an unknown number of samples (no step reported)"
    return f"{samples} samples" + (f" ({samples // accum} x {accum} accumulated)" if accum > 1 else "")


def _finite_losses(result: BurstResult) -> dict[int, float]:
    """Rank 0's finite losses by step number."""
    return {s.step: s.loss for s in result.steps
            if s.rank == 0 and s.loss is not None and math.isfinite(s.loss)}


def _nonfinite_reasons(result: BurstResult) -> list[str]:
    """One reason per rank whose loss went NaN/inf, worded as the engine's "diverged" status words it."""
    return result.nonfinite_losses()


def frozen_augmentation(result: BurstResult) -> list[str]:
    """Why the run's data cache changes training: it froze random augmentation (:class:`CacheInfo`), or nothing.

    A frozen cache trains on one draw per item in every epoch: faster, perhaps, but another training, and
    one no loss comparison over a short burst can see (the first epoch reads the same kind of draws).
    """
    cache = result.cache
    return [cache.frozen_text()] if cache is not None and cache.frozen_item is not None else []


def _scaler_reasons(result: BurstResult) -> list[str]:
    """Ranks whose GradScaler skipped steps beyond its calibration (the engine counts them for fp16)."""
    reasons = []
    for summary in result.ranks:
        skipped = summary.scaler_skipped_steps
        steps = sum(1 for s in result.steps if s.rank == summary.rank)
        if skipped is not None and skipped > max(SCALER_CALIBRATION_SKIPS, SCALER_SKIP_SHARE * steps):
            where = f" on rank {summary.rank}" if result.world_size > 1 else ""
            reasons.append(f"the fp16 GradScaler skipped {skipped} of {steps} optimizer steps{where} "
                           "(gradients overflowed): those steps did not train")
    return reasons


def _smooth(values: list[float]) -> list[float]:
    """Trailing running mean over ``SMOOTHING_WINDOW`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - SMOOTHING_WINDOW] if i >= SMOOTHING_WINDOW else 0.0)
        out.append(total / min(i + 1, SMOOTHING_WINDOW))
    return out


@dataclass(frozen=True)
class _Comparison:
    """Smoothed rank-0 trajectories over the steps both runs reported, and where they part."""

    steps: list[int]
    run: list[float]
    base: list[float]
    precision: str  # the less precise of the two: it sets the floor of the tolerance
    baseline_precision: str
    noise: NoiseBand | None = None

    @classmethod
    def of(cls, run: BurstResult, baseline: BurstResult, noise: NoiseBand | None = None) -> _Comparison:
        mine, theirs = _finite_losses(run), _finite_losses(baseline)
        steps = sorted(mine.keys() & theirs.keys())
        return cls(steps, _smooth([mine[s] for s in steps]), _smooth([theirs[s] for s in steps]),
                   _less_precise(run, baseline), _precision(baseline), noise)

    @property
    def deviations(self) -> list[float]:
        """``|run - base| / max(|base|, floor)`` per step, the floor a share of the largest baseline loss."""
        floor = max(LOSS_FLOOR_SHARE * max(abs(b) for b in self.base), 1e-12)
        return [abs(r - b) / max(abs(b), floor) for r, b in zip(self.run, self.base, strict=True)]

    @property
    def tolerances(self) -> list[float]:
        """Per step: ``NOISE_MARGIN`` x the noise band, floored by the precision's tolerance."""
        return [max(tolerance(self.precision, s), self._noise_tolerance(i)) for i, s in enumerate(self.steps)]

    def _noise_tolerance(self, position: int) -> float:
        return 0.0 if self.noise is None else NOISE_MARGIN * deviation_at(self.noise, position)

    def _explain_tolerance(self, position: int) -> str:
        """Where the tolerance at ``position`` comes from: the noise band, or the precision floor."""
        noise = self._noise_tolerance(position)
        if noise > tolerance(self.precision, self.steps[position]):
            moved = _percent(noise / NOISE_MARGIN)
            return f": {NOISE_MARGIN:g}x the {moved} a baseline with reseeded data moves"
        return f" for {self.precision}"

    def reasons(self, fp16: bool) -> list[str]:
        """The worst step beyond tolerance (and the first), in words; empty when the run stays inside."""
        deviations, tolerances = self.deviations, self.tolerances
        beyond = [i for i, (d, t) in enumerate(zip(deviations, tolerances, strict=True)) if d > t]
        if not beyond:
            return []
        worst = max(beyond, key=lambda i: deviations[i] / tolerances[i])
        first = f"; first beyond tolerance at step {self.steps[beyond[0]]}" if beyond[0] != worst else ""
        direction = "above" if self.run[worst] > self.base[worst] else "below"
        reason = (f"loss deviates {_percent(deviations[worst])} ({direction}) from the {self.baseline_precision} "
                  f"baseline at step {self.steps[worst]} (tolerance {_percent(tolerances[worst])} there"
                  f"{self._explain_tolerance(worst)}){first}")
        return [reason + (self.stall_hint() if fp16 else "")]

    def stall_hint(self) -> str:
        """Why an fp16 run may be off: a loss that stays put while the baseline's falls is a scaler skipping steps.

        A skipped step leaves the weights as they were, so a scaler that skips most steps shows as a flat
        loss. The engine's skip count says so directly; this reads it off the trajectory, for results
        saved before the engine counted skips and for scalers that skip without a NaN loss.
        """
        if len(self.steps) < 2 * SMOOTHING_WINDOW:
            return ""
        start = SMOOTHING_WINDOW - 1  # the first full window: single early losses are too noisy to anchor on
        our_fall, base_fall = _fall(self.run, start), _fall(self.base, start)
        if base_fall < STALL_MIN_BASELINE_FALL or our_fall > STALL_SHARE * base_fall:
            return ""
        return (f"; its loss fell {_percent(our_fall)} where the baseline's fell {_percent(base_fall)}, as when a "
                "GradScaler skips most optimizer steps")


def _fall(values: list[float], start: int) -> float:
    """Relative fall of a trajectory from ``values[start]`` to its end (negative when it rose)."""
    return (values[start] - values[-1]) / max(abs(values[start]), 1e-12)


def _percent(share: float) -> str:
    """``3.4%`` below ten percent (where 3% vs 4% matters), ``23%`` above."""
    return f"{share:.1%}" if abs(share) < 0.1 else f"{share:.0%}"
