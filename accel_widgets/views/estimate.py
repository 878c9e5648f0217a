"""How an estimate reads: whether it fits and with how much to spare, where its peak goes, the largest batch, the
roofline's bound (said as a bound), and a measured peak against it; one line each, the same in the terminal, the
panel's fit line and the report."""

from __future__ import annotations

from ..analysis.estimate import Breakdown, Estimate
from ..metrics.units import si


def gib(value: float) -> str:
    """Bytes to the precision a person reads memory in: "52.3 GiB", "0.41 GiB", and in MiB under a tenth of a GiB
    (a small model's weights are not "0.00 GiB")."""
    amount = value / 2**30
    if abs(amount) < 0.1:
        return f"{value / 2**20:.1f} MiB"
    return f"{amount:.1f} GiB" if abs(amount) >= 10 else f"{amount:.2f} GiB"


def device_text(estimate: Estimate) -> str:
    return estimate.device if estimate.device_kind == "cuda" else estimate.device.replace("this machine's RAM",
                                                                                            "this machine")


def fit_text(estimate: Estimate) -> str:
    """"fits on NVIDIA H100 80GB HBM3 with 52.3 GiB to spare (peak 27.3 GiB, estimated)", or by how much it does
    not."""
    where = device_text(estimate)
    per = f" per rank ({estimate.ranks} ranks)" if estimate.ranks > 1 else ""
    if estimate.fits:
        return (f"fits on {where} with {gib(estimate.spare_bytes)} to spare (peak {gib(estimate.peak_bytes)}{per}, "
                "estimated)")
    return (f"does not fit on {where}: the estimated peak {gib(estimate.peak_bytes)}{per} is "
            f"{gib(-estimate.spare_bytes)} over its {gib(estimate.memory_bytes)}")


def breakdown_text(peak: Breakdown) -> str:
    """Where the peak goes, the largest first: "activations 21.3 GiB, optimizer 0.93 GiB, ..."."""
    parts = {"activations": peak.activations, "parameters": peak.parameters, "gradients": peak.gradients,
             "optimizer state": peak.optimizer, "DDP buckets / FSDP gathers": peak.parallel,
             "allocator rounding": peak.slack, "the rank's process": peak.process}
    return ", ".join(f"{name} {gib(size)}" for name, size in sorted(parts.items(), key=lambda kv: -kv[1]) if size)


def bound_text(estimate: Estimate) -> str:
    """The roofline's lower bound on the step, said as one ("no step of this config can take less than 41 ms on an
    H100: its compute at the dense peak"), or why there is none."""
    if estimate.step_time_bound_s is None:
        return f"no lower bound on the step's time: {estimate.bound_by}"
    side = ("its FLOPs at the dense peaks" if estimate.bound_by == "compute"
            else "the least memory traffic at the peak bandwidth")
    return (f"lower bound on the step: {estimate.step_time_bound_s * 1e3:.3g} ms ({side}; "
            f"{si(estimate.flops, 'FLOP')}, {si(estimate.bytes_moved, 'B')} moved at least); a bound, not a prediction")


def largest_text(estimate: Estimate) -> str:
    if estimate.largest_batch is None:
        return f"not even a batch of 1 leaves {estimate.margin:.0%} of the memory free"
    scope = " per rank" if estimate.ranks > 1 else ""
    return (f"largest batch leaving {estimate.margin:.0%} free: {estimate.largest_batch:,}{scope} "
            f"(now {estimate.batch_size:,})")


def estimate_line(estimate: Estimate) -> str:
    """The estimate in one line, for the terminal and the report: the fit, the largest batch, the bound ("lm-small
    (precision=bf16): fits on NVIDIA H100 80GB HBM3 with 79.1 GiB to spare (peak 0.03 GiB, estimated); largest batch
    leaving 10% free: 71,388 (now 32); lower bound on the step: 0.02 ms ...")."""
    return (f"{estimate.workload} ({estimate.config.label()}): {fit_text(estimate)}; {largest_text(estimate)}; "
            f"{bound_text(estimate)}")


def estimate_lines(estimate: Estimate) -> list[str]:
    """The estimate in a few lines: the fit, the breakdown, the largest batch, the bound, what it leaves out."""
    return [f"{estimate.workload} ({estimate.config.label()}): {fit_text(estimate)}",
            f"  at the peak ({estimate.phase}): {breakdown_text(estimate.peak)}",
            f"  {largest_text(estimate)}",
            f"  {bound_text(estimate)}",
            *(f"  note: {note}" for note in estimate.notes)]


def measured_text(estimate: Estimate, measured_bytes: int | None, kind: str) -> str:
    """A finished burst's peak next to the estimate: "measured 1.21 GiB, estimated 1.10 GiB (+10%)"."""
    if measured_bytes is None:
        return ""
    error = estimate.error_of(measured_bytes, kind)
    if error is None:
        return f"measured {gib(measured_bytes)} ({kind}), not comparable with an estimate for {estimate.device}"
    return f"measured {gib(measured_bytes)}, estimated {gib(measured_bytes / (1 + error))} ({error:+.0%})"
