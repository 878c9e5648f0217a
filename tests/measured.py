"""Hand-built results the way the engine hands them back: with the knob owners' facts about how they ran."""

from __future__ import annotations

import dataclasses

from accel_widgets.knobs import facts
from accel_widgets.knobs.config import Config
from accel_widgets.results.burst import BurstResult


def as_measured(result: BurstResult) -> BurstResult:
    """``result`` with the facts ``run_burst`` records at launch, from its config and environment."""
    environment = result.environment
    return dataclasses.replace(result, facts=facts(result.config, str(environment.get("device_kind", "cpu")),
                                                   len(environment.get("gpus", ()))))


#: NVML's GPM metrics of an fp32 GPT step on one H200, as the sampler reads them: a kernel runs 98% of the time
#: (utilisation), but the SMs are 61% busy on average, 25% of their warp slots filled, the tensor cores busy 12% of
#: the time, DRAM at 35% of its bandwidth. Under bf16 autocast the same step keeps the tensor cores busy 55%.
H200_FP32_ACTIVITY = {"sm_active_pct": 61.0, "sm_occupancy_pct": 25.0, "tensor_active_pct": 12.0, "dram_bw_pct": 35.0}
H200_BF16_ACTIVITY = {"sm_active_pct": 78.0, "sm_occupancy_pct": 31.0, "tensor_active_pct": 55.0, "dram_bw_pct": 48.0}


def h200_result(config: Config | None = None, *, activity: dict[str, float] | None = None, util: float = 98.0,
                steps: int = 60, step_s: float = 0.05) -> BurstResult:
    """A one-rank burst on an H200 (a 124M GPT at batch 16: 50 ms steps, 3 s measured after 2 warm-up steps) with
    NVML samples every 0.2 s from launch to past the window (650 W, the energy counter rising with it), each with
    ``activity``'s GPM readings (none: a GPU or a pynvml without GPM)."""
    from accel_widgets.results.burst import RankSummary, StepRecord, TelemetrySample

    config = config or Config()
    warmup, start = 2, 1.0
    records = [StepRecord(0, i, start + (i + 1) * step_s, 0.0005, 0.0005, step_s - 0.001, step_s, 16, 3.0,
                          warmup=i < warmup) for i in range(warmup + steps)]
    end = records[-1].t + 0.5
    telemetry = [TelemetrySample(round(0.2 * k, 3), "nvml", util, 60 << 30, "cuda:0", mem_total_bytes=143_771 << 20,
                                 power_w=650.0, sm_clock_mhz=1980.0, energy_j=7_000.0 + 650.0 * 0.2 * k,
                                 energy_scope="gpu", **(activity or {}))
                 for k in range(int(end / 0.2) + 1)]
    rank = RankSummary(0, 16 * steps, steps * step_s, 60 << 30, "cuda_allocator", 0.5, 1.2, "NVIDIA H200")
    return as_measured(BurstResult(workload="gpt-124m", config=config, status="ok", warmup_steps=warmup,
                                   steps=records, telemetry=telemetry, ranks=[rank],
                                   environment={"device_kind": "cuda", "device_name": "NVIDIA H200",
                                                "capability": "9.0", "gpus": ["NVIDIA H200"]}))
