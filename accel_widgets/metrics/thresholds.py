"""Every number a reading of a run compares against, in one table.

Pure data at the bottom of the package: the statistics (a noisy step spread), the result (an unreliable
run), the launcher's warnings and the diagnosis's rules of thumb all read their limits from here, so a
recalibration is one edit and every face agrees on what "noisy" or "unreliable" means.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """The limits, the classic rules of thumb for a healthy step first, then what makes a measurement suspect.

    Reliability calibration (benchmarks/results/repeatability.json, 2-core host, 30 bursts of the three
    demos): bursts on a quiet machine had a within-burst step IQR of 0.014-0.23 of the median and other
    processes took <= 10% of the machine; every burst that shared the machine with another job took
    26-51% and, when its steps overlapped the job, had an IQR of 0.29-28x the median. The panel's own view
    took 44-56% before it was made cheap. So "noisy" stays torch.utils.benchmark's 10% (a hint), and a run
    is *unreliable* -- not ranked, not drawn as a plain speed-up -- past 50% or 25% of the machine.
    """

    util_ok_pct: float = 80.0  # device busy at least this share of the time
    memory_full_share: float = 0.90  # peak memory above this share of the device leaves no room
    # The share of the CUDA allocator's reserved peak never allocated at once, worth a note (expandable segments):
    # a rule of thumb, not yet calibrated on a GPU (a quarter of what the device gave idle in cached blocks).
    allocator_slack_notice_share: float = 0.25
    h2d_max_share: float = 0.10  # host-to-device copies should stay below this share of the step
    compute_ok_share: float = 0.70  # a healthy step spends at least this share computing
    data_wait_notice_share: float = 0.05  # data wait worth mentioning
    data_wait_bound_share: float = 0.10  # data wait that makes the step data-bound
    short_step_s: float = 0.010  # steps this short are dominated by per-step overhead
    low_util_pct: float = 50.0
    host_saturated_pct: float = 90.0  # the whole machine's CPU this busy: the loader has no cores left
    iowait_notice_pct: float = 10.0  # CPU time waiting on the disk: the data source is the limit
    tensor_core_capability: float = 7.0  # Volta and newer run fp16/bf16 matmuls on tensor cores
    # Tensor cores busy less than this share of a busy GPU's time (NVML GPM, Hopper and newer): the step's math runs
    # elsewhere. A rule of thumb, not yet calibrated on a GPU (a bf16 transformer step keeps them busy several times
    # this; an fp32 one, whose matmuls never reach them, well under it).
    tensor_active_low_pct: float = 20.0
    # The slowest rank's own work per step over the other ranks' median from which it is named as the straggler that
    # sets a group's pace: a rule of thumb (ranks of one config on like machines differ by a few %; a rank sharing its
    # core with another program took ~2x here)
    straggler_ratio: float = 1.25
    read_amplification_notice: float = 1.5  # a stream read this many times per item kept is worth a note
    read_amplification_bound: float = 2.0  # ... and a warning from here: half or more of every read is dropped
    # The share of the memory a batch must leave free to count as fitting (the batch-size finder's and the estimate's):
    # a real run's longer sequences, evaluation passes and allocator fragmentation need room a short burst never shows.
    fit_margin: float = 0.10
    # -- can the numbers be trusted ------------------------------------------------------------------
    noisy_relative_iqr: float = 0.10  # step IQR/median from which a median is flagged noisy (a hint)
    min_steps_for_spread: int = 4  # fewer measured steps cannot show a spread: flagged noisy
    other_load_notice_pct: float = 10.0  # other processes' share of the machine worth mentioning
    unreliable_relative_iqr: float = 0.50  # step IQR/median from which a run cannot rank a knob
    unreliable_other_load_pct: float = 25.0  # other processes' share of the machine that makes a run unreliable
    process_notice_core_pct: float = 5.0  # a process named in a run's load attribution (% of one core)
    # A measured window needs this many of NVML's averaging periods (utilisation, power) for the readings settled
    # inside it to say anything; a shorter one is "too short to read".
    min_periods_per_window: float = 2.0


THRESHOLDS = Thresholds()
