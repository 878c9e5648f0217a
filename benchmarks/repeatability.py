"""(c) Repeatability: how much the same burst's numbers move between repeats.

Why: a knob's speed-up is only readable if it is larger than the burst-to-burst spread of an
unchanged config. For each small demo this runs ``--repeats`` bursts of the baseline ``Config()`` and
of one second config, interleaved (baseline, variant, variant, baseline, ...) so both see the same machine
conditions (each burst starts once the machine is quiet), and reports:

* the spread across repeats of samples/s and of each burst's median step time (IQR/median, and
  (max-min)/median);
* each burst's own within-burst relative IQR of step times (``result.step_time.relative_iqr``; the
  package marks >= 10% as noisy);
* the same spread over the quiet bursts only (other processes used < 15% of the CPU: the package's
  ``foreign_cpu_pct(result)``), since this 2-core machine is shared with other jobs;
* the variant/baseline samples/s ratio of each interleaved pair: the number a user would read.

Second configs (the usual "faster" candidates): ``num_workers=2`` for the data-bound image demo
(augmentation moves off the training loop) and ``precision="bf16"`` for the MLP and the LM (bf16
autocast; this CPU has AVX512-BF16). Whether they are faster on this machine is part of the output:
on 2 cores neither is clearly faster, and the spread printed here says how large a difference one
burst could have shown.

Run:  .venv/bin/python benchmarks/repeatability.py [--repeats 5] [--workloads mlp,lm,image]
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    QUIET_PCT,
    QuietGate,
    fmt_ratio,
    load_average,
    positive_int,
    spread,
    table,
    workloads_arg,
    write_json,
)

import accel_widgets as aw
from accel_widgets.results.reliability import foreign_cpu_pct

# Measured steps per burst: a few seconds each on 2 cores (mlp steps take ~3 ms, lm ~50 ms, image ~200 ms).
STEPS = {"mlp": 200, "lm": 40, "image": 20}
VARIANT = {
    "mlp": aw.Config(precision="bf16"),
    "lm": aw.Config(precision="bf16"),
    "image": aw.Config(num_workers=2),
}


def burst(workload: aw.Workload, config: aw.Config, steps: int) -> dict[str, Any]:
    result = aw.run_burst(workload, config, steps=steps)
    assert result.samples_per_s is not None and result.step_time is not None
    return {"samples_per_s": result.samples_per_s, "step_median_s": result.step_time.median,
            "within_relative_iqr": result.step_time.relative_iqr, "noisy": result.step_time.noisy,
            "foreign_cpu_pct": foreign_cpu_pct(result), "warnings": result.warnings}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    within = [r["within_relative_iqr"] for r in runs]
    quiet = [r for r in runs if (r["foreign_cpu_pct"] or 0.0) < QUIET_PCT]
    return {
        "samples_per_s": spread([r["samples_per_s"] for r in runs]),
        "step_median_s": spread([r["step_median_s"] for r in runs]),
        "within_burst_relative_iqr": within,
        "noisy_bursts": sum(r["noisy"] for r in runs),
        # Other processes' share of the CPU during each burst (the package warns at >= 25%).
        "foreign_cpu_pct": [r["foreign_cpu_pct"] for r in runs],
        "quiet_runs": len(quiet),
        "samples_per_s_quiet_runs": spread([r["samples_per_s"] for r in quiet]) if len(quiet) >= 2 else None,
        "runs": runs,
    }


def measure(name: str, repeats: int, gate: QuietGate) -> dict[str, Any]:
    workload = aw.demo_workload(name)
    steps = STEPS[name]
    configs = {"baseline": aw.Config(), "variant": VARIANT[name]}
    aw.run_burst(workload, aw.Config(), steps=3)  # unmeasured: pays the forkserver start and first-burst costs
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key in configs}
    for i in range(repeats):
        for key in configs if i % 2 == 0 else list(configs)[::-1]:
            gate.wait()
            runs[key].append(burst(workload, configs[key], steps))
        base, fast = runs["baseline"][-1], runs["variant"][-1]
        print(f"  {name} repeat {i + 1}/{repeats}: baseline {base['samples_per_s']:.1f}/s, variant "
              f"{fast['samples_per_s']:.1f}/s, foreign load {_pct(base['foreign_cpu_pct'])} / "
              f"{_pct(fast['foreign_cpu_pct'])}", flush=True)
    speedups = [f["samples_per_s"] / b["samples_per_s"] for b, f in zip(runs["baseline"], runs["variant"], strict=True)]
    return {
        "workload": name,
        "steps": steps,
        "configs": {key: {"label": cfg.label(), "config": cfg.to_dict()} for key, cfg in configs.items()},
        "baseline": summarise(runs["baseline"]),
        "variant": summarise(runs["variant"]),
        "speedup_variant_over_baseline": spread(speedups),
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=5, help="bursts per config (default 5)")
    parser.add_argument("--workloads", type=workloads_arg, default=["mlp", "lm", "image"],
                        help="comma-separated small demos (default mlp,lm,image)")
    args = parser.parse_args()
    load_at_start = load_average()
    gate = QuietGate()
    results = [measure(name, args.repeats, gate) for name in args.workloads]

    rows = []
    for r in results:
        for key in ("baseline", "variant"):
            s = r[key]
            within = s["within_burst_relative_iqr"]
            rows.append([
                r["workload"], r["configs"][key]["label"], f"{s['samples_per_s']['median']:.1f}",
                f"{s['samples_per_s']['relative_iqr']:.1%}", f"{s['samples_per_s']['relative_range']:.1%}",
                f"{s['step_median_s']['relative_iqr']:.1%}",
                f"{min(within):.1%}-{max(within):.1%}", f"{s['noisy_bursts']}/{len(within)}",
                f"{s['quiet_runs']}: " + (f"{q['relative_iqr']:.1%}" if (q := s["samples_per_s_quiet_runs"]) else "-"),
            ])
    print()
    print(table(["workload", "config", "samples/s median", "IQR/median", "range/median",
                 "step-median IQR/median", "within-burst rel. IQR", "noisy (>= 10%)",
                 f"quiet bursts: IQR/median (foreign < {QUIET_PCT:g}%)"], rows))
    print()
    print(table(["workload", "variant", "variant/baseline samples/s, median (min-max)"],
                [[r["workload"], r["configs"]["variant"]["label"], fmt_ratio(r["speedup_variant_over_baseline"])]
                 for r in results]))
    path = write_json("repeatability", {"repeats": args.repeats, "load_average_at_start": load_at_start,
                                        "quiet_pct": QUIET_PCT, "waited_for_quiet_s": gate.waited_s,
                                        "workloads": results})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
