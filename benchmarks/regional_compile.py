"""Regional compilation (issue #22): compiling a model's alike blocks one by one against compiling it whole.

``compile_scope="blocks"`` compiles each repeated block in place, so alike blocks share one compiled graph and the
cold compile costs about one block's; the code between the blocks runs eagerly. This measures, per workload, cold
compiles of both scopes (each burst gets an empty inductor cache, as a first run on a machine would) and an eager
burst for scale, interleaved: each repetition runs eager, model, blocks for every workload, the order rotating
between repetitions so that a machine that slows down or speeds up weighs on every variant alike. Per variant:

* the compile time: the first step's excess over a steady step (``result.compile_s``, what the user waits for),
  and torch's own account of its compiling (every frame, forward and backward: ``compile_report.compile_s``);
* the median step time over the measured steps;
* what the compiler did: graphs, graph breaks, recompiles (``result.compile_report``).

The ratios blocks / model of compile time and of step time are taken within each repetition and summarised by
their median and range: the machine is shared (2 cores, other jobs), which moves absolute times by tens of
percent, so only side-by-side ratios are read. Each burst starts once the machine is quiet (``QuietGate``), and
the load averages and other processes' CPU share during each measured window are recorded.

Workloads: the LM demo (2 blocks of a small GPT), and two transformers models with random weights built from
configs (no download): GPT-2 (4 layers, width 256, causal LM loss) and BERT (4 layers, width 256, sequence
classification).

    .venv/bin/python benchmarks/regional_compile.py [--repeats 3] [--steps 10] [--workloads lm,gpt2,bert]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import QuietGate, fmt_ratio, load_average, positive_int, spread, table, write_json

import accel_widgets as aw
from accel_widgets.results.reliability import foreign_cpu_pct, reliability

VOCAB, SEQ, BATCH, SAMPLES = 2048, 64, 8, 512
SCOPES = ("eager", "model", "blocks")


def tokens(classify: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token windows and their labels: the next tokens (a causal LM) or a class (a classifier)."""
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=generator)
    if classify:
        return windows[:, :-1].contiguous(), torch.randint(0, 2, (SAMPLES,), generator=generator)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def own_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """transformers models compute their loss from ``labels``."""
    return model(input_ids=batch[0], labels=batch[1]).loss


def gpt2() -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=256, n_layer=4, n_head=4,
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def bert() -> torch.nn.Module:
    import transformers

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024, max_position_embeddings=SEQ)
    return transformers.BertForSequenceClassification(config)


WORKLOADS: dict[str, Callable[[], aw.Workload]] = {
    "lm": lambda: aw.demo_workload("lm"),
    "gpt2": lambda: aw.Workload(model=gpt2, dataset=tokens(classify=False), step=own_loss, batch_size=BATCH,
                                name="gpt2-4x256", tokens_per_sample=SEQ),
    "bert": lambda: aw.Workload(model=bert, dataset=tokens(classify=True), step=own_loss, batch_size=BATCH,
                                name="bert-4x256", tokens_per_sample=SEQ),
}


def config_of(scope: str) -> aw.Config:
    return aw.Config() if scope == "eager" else aw.Config(compile_mode="default", compile_scope=scope)


def cold_burst(workload: aw.Workload, scope: str, steps: int) -> dict[str, Any]:
    """One burst compiling into an empty inductor cache (a user's ``TORCHINDUCTOR_CACHE_DIR`` is what the ranks
    use), removed afterwards."""
    cache = tempfile.mkdtemp(prefix="regional-compile-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    load = load_average()
    try:
        started = time.perf_counter()
        result = aw.run_burst(workload, config_of(scope), steps=steps)
        wall_s = time.perf_counter() - started
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
        shutil.rmtree(cache, ignore_errors=True)
    assert result.ok and result.step_time is not None, result.error
    report = result.compile_report
    return {
        "scope": scope, "wall_s": wall_s, "first_step_s": result.first_step_s, "compile_s": result.compile_s,
        "torch_compile_s": report.compile_s if report is not None else None,
        "step_median_s": result.step_time.median, "step_relative_iqr": result.step_time.relative_iqr,
        "compiled": report.scope if report is not None else "",
        "graphs": report.graphs if report is not None else 0,
        "graph_breaks": [b.text() for b in report.graph_breaks] if report is not None else [],
        "recompiles": [r.text() for r in report.recompile_reasons] if report is not None else [],
        "foreign_cpu_pct": foreign_cpu_pct(result), "load_average_before": load,
        "reliable": reliability(result).reliable, "warnings": result.warnings,
    }


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """One repetition's blocks / model (and compiled / eager step) ratios."""
    model, blocks, eager = runs["model"], runs["blocks"], runs["eager"]
    return {
        "compile_blocks_over_model": blocks["compile_s"] / model["compile_s"],
        "torch_compile_blocks_over_model": blocks["torch_compile_s"] / model["torch_compile_s"],
        "step_blocks_over_model": blocks["step_median_s"] / model["step_median_s"],
        "step_model_over_eager": model["step_median_s"] / eager["step_median_s"],
        "step_blocks_over_eager": blocks["step_median_s"] / eager["step_median_s"],
    }


def workload_names(text: str) -> list[str]:
    """Parse ``--workloads lm,gpt2`` and reject names that are not workloads of this benchmark."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown or text!r}; choose from {', '.join(WORKLOADS)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--steps", type=positive_int, default=10, help="measured steps per burst")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), type=workload_names)
    args = parser.parse_args()
    gate, started = QuietGate(), time.perf_counter()
    workloads = {name: WORKLOADS[name]() for name in args.workloads}
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in workloads}
    for repeat in range(args.repeats):
        order = SCOPES[repeat % len(SCOPES):] + SCOPES[:repeat % len(SCOPES)]
        for name, workload in workloads.items():
            done = {}
            for scope in order:
                gate.wait()
                done[scope] = cold_burst(workload, scope, args.steps)
                print(f"{name:5} {scope:6} compile {done[scope]['compile_s'] or 0:6.1f} s, step "
                      f"{done[scope]['step_median_s'] * 1e3:7.1f} ms, {done[scope]['graphs']} graphs", flush=True)
            runs[name].append(done)
    summary = {name: {key: spread([ratios(r)[key] for r in reps]) for key in ratios(reps[0])}
               for name, reps in runs.items()}
    rows = [[name, f"{spread([r['model']['compile_s'] for r in reps])['median']:.1f} s",
             f"{spread([r['blocks']['compile_s'] for r in reps])['median']:.1f} s",
             fmt_ratio(summary[name]["compile_blocks_over_model"]),
             fmt_ratio(summary[name]["torch_compile_blocks_over_model"]),
             fmt_ratio(summary[name]["step_blocks_over_model"]),
             fmt_ratio(summary[name]["step_model_over_eager"]), fmt_ratio(summary[name]["step_blocks_over_eager"])]
            for name, reps in runs.items()]
    print(table(["workload", "compile model", "compile blocks", "compile blocks/model", "torch's compile b/m",
                 "step blocks/model", "step model/eager", "step blocks/eager"], rows))
    path = write_json("regional_compile", {"repeats": args.repeats, "steps": args.steps, "summary": summary,
                                           "runs": runs, "gate_waited_s": gate.waited_s,
                                           "duration_s": time.perf_counter() - started})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
