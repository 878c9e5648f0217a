"""Activation checkpointing and FSDP on the CPU: memory and speed, side by side in one run (issue 22).

Why: each trades something for memory, and only a measurement says how much of each. Every round runs each variant
once, in turn (interleaved, so the machine's drift falls on all of them alike), and each variant is read against the
reference of its own round:

* activation checkpointing ``off`` / ``blocks`` / ``selective`` on two transformers: a thin one whose activations
  outweigh its weights (the LM demo's TinyGPT, 8 blocks of width 16, 256 x 64 tokens a step: the case checkpointing
  is for) and the LM demo itself (2 blocks of width 128, 32 x 64 tokens). Peak RSS and step time against ``off``,
  and whether the fp32 losses are equal step for step (recompute is exact on a CPU);
* ``parallel="fsdp"`` against ``"ddp"``, 2 ranks (gloo), wide MLP blocks (12.6M parameters, AdamW, accumulation 2):
  the training state per rank (weights, gradients, optimizer state: what sharding divides), the ranks' peak RSS,
  samples/s, and the largest difference between the two runs' losses.

On a CPU the peak is the process's RSS, which includes everything torch holds (~300 MiB here) and what glibc's heap
keeps of freed blocks: the ratios understate what a GPU's allocator would show, and FSDP's saving shows in the
training state, not in RSS. The GPU side is ``benchmarks/gpu_modern.py``.

Run:  .venv/bin/python benchmarks/memory_knobs.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import torch
from _common import QuietGate, fmt_ratio, load_average, positive_int, spread, table, write_json
from torch import nn
from torch.nn import functional as F

import accel_widgets as aw
from accel_widgets.analysis.usage import model_state_bytes
from accel_widgets.demos.lm import TinyGPT, TokenWindows, lm_loss, markov_tokens
from accel_widgets.results.reliability import foreign_cpu_pct

CHECKPOINTING = ("off", "blocks", "selective")


def thin_gpt() -> aw.Workload:
    model = functools.partial(TinyGPT, vocab_size=256, seq_len=64, n_layer=8, d_model=16, n_head=2)
    return aw.Workload(model=model, dataset=TokenWindows(markov_tokens(4 * 256 * 64 + 1, 256, seed=0), 64),
                       loss_fn=lm_loss, batch_size=256, name="thin-gpt")


class WideBlocks(nn.Module):
    """Blocks of wide MLPs (512 -> 2048 -> 512) in an nn.ModuleList: weights and AdamW state outweigh activations."""

    def __init__(self, width: int = 512, blocks: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def wide() -> aw.Workload:
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    return aw.Workload(model=WideBlocks, dataset=(x, x[:, :4].argmax(dim=1)), loss_fn=F.cross_entropy,
                       optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4), batch_size=8, name="wide")


#: (study, workload factory, measured steps, the variants as configs; the first is each round's reference)
STUDIES: list[tuple[str, Any, int, dict[str, aw.Config]]] = [
    ("thin-gpt", thin_gpt, 3, {mode: aw.Config(activation_checkpointing=mode) for mode in CHECKPOINTING}),
    ("lm-small", functools.partial(aw.demo_workload, "lm", size="small"), 20,
     {mode: aw.Config(activation_checkpointing=mode) for mode in CHECKPOINTING}),
    ("wide 2 ranks", wide, 6, {mode: aw.Config(parallel=mode, world_size=2, grad_accum_steps=2)
                               for mode in ("ddp", "fsdp")}),
]


def burst(workload: aw.Workload, config: aw.Config, steps: int) -> dict[str, Any]:
    result = aw.run_burst(workload, config, steps=steps, options=aw.BurstOptions(warmup_steps=1))
    assert result.ok and result.samples_per_s is not None and result.step_time is not None, aw.summary(result)
    return {"peak_rss_mib": (result.peak_memory_bytes or 0) / 2**20,
            "model_state_mib": (model_state_bytes(result) or 0) / 2**20,
            "samples_per_s": result.samples_per_s, "step_median_s": result.step_time.median,
            "losses": [loss for rank in range(result.world_size) for loss in result.losses(rank)],
            "foreign_cpu_pct": foreign_cpu_pct(result)}


def study(name: str, make: Any, steps: int, variants: dict[str, aw.Config], rounds: int, gate: QuietGate
          ) -> dict[str, Any]:
    workload = make()
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant, config in variants.items():
            gate.wait()
            runs[variant].append(burst(workload, config, steps))
    reference = next(iter(variants))
    base = runs[reference]
    rows = {}
    for variant, measured in runs.items():
        rows[variant] = {
            "peak_rss_ratio": _ratios(measured, base, "peak_rss_mib"),
            "step_time_ratio": _ratios(measured, base, "step_median_s"),
            "model_state_ratio": _ratios(measured, base, "model_state_mib"),
            "peak_rss_mib": spread([m["peak_rss_mib"] for m in measured]),
            "model_state_mib": measured[0]["model_state_mib"],
            "max_loss_difference": max(abs(a - b) for m, r in zip(measured, base, strict=True)
                                       for a, b in zip(m["losses"], r["losses"], strict=True)),
            "losses_equal": all(m["losses"] == r["losses"] for m, r in zip(measured, base, strict=True)),
            "runs": measured,
        }
    return {"workload": workload.name, "reference": reference, "steps": steps, "variants": rows}


def _ratios(measured: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Each round's variant over that round's reference."""
    return spread([m[key] / b[key] for m, b in zip(measured, base, strict=True)])


def report(results: dict[str, Any]) -> str:
    lines = []
    for name, found in results.items():
        rows = [[variant, f"{row['peak_rss_mib']['median']:,.0f}", fmt_ratio(row["peak_rss_ratio"]),
                 f"{row['model_state_mib']:,.1f}", fmt_ratio(row["step_time_ratio"]),
                 "equal" if row["losses_equal"] else f"max diff {row['max_loss_difference']:.2g}"]
                for variant, row in found["variants"].items()]
        lines += [f"\n{name} ({found['workload']}, against {found['reference']}, {found['steps']} steps a burst)",
                  table(["variant", "peak RSS MiB", "peak ratio", "train state MiB", "step-time ratio", "losses"],
                        rows)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds of every variant")
    args = parser.parse_args()
    gate = QuietGate()
    results = {name: study(name, make, steps, variants, args.rounds, gate)
               for name, make, steps, variants in STUDIES}
    print(report(results))
    path = write_json("memory_knobs", {"rounds": args.rounds, "load_average": load_average(),
                                       "quiet_wait_s": round(gate.waited_s, 1), "studies": results})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
