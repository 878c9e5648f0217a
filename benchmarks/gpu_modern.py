"""The second GPU script: the knobs of 2026 on one GPU (issue 22), in a call of its own, apart from the GPU check.

``benchmarks/gpu_check.py`` answers whether the engine works on a GPU; this one measures what the newer knobs do
there, in the device plan's second run after ``gpu_probes.py``, with what is left of that run's 280 s, built with
the GPU check's machinery (its budget, plan runner, report and budgeted bursts):

1. fail fast: a one-rank, 5-step CUDA burst (required: nothing later runs without it);
2. activation checkpointing on the 124M-parameter LM in bf16 (off, blocks, selective): the allocator's peak and the
   step time, side by side; checkpointing must lower the peak (PASS/FAIL), the step-time ratio is reported;
3. the allocator: the same LM with expandable segments against the checkpointing-off rung (the same config without
   them): the rank's allocator must say its segments were expandable, and the default's were not (PASS/FAIL);
   reserved against allocated is reported;
4. FSDP against DDP on the GPUs there are (one rank each on a single GPU: what the wrapper costs; half the training
   state per rank from two GPUs on, a PASS/FAIL);
5. float8 (required): a Llama-3-8B-shaped MLP stack (4096 -> 14336 -> 4096 blocks) compiled in bf16, then with
   float8 tensorwise and rowwise, judged on the GPU's compute time per step (the step clock's compute part: what
   float8 changes), samples/s beside it (reported, against torchao's published +28% tokens/s for Llama3-8B on
   8 H100s in torchtitan, per layer 0.80-1.39x). Its data is made cheap, or it would be what is measured: each
   step's 8,192 x 4,096 batch is built once on the GPU and taken whole (the loader indexes one item a step), where
   it was 8,192 rows stacked and 256 MiB copied from pageable memory each step (70-120 ms against a 12-18 ms GPU
   step); a check says the bf16 rung's steps waited on data and copies under 5% of their time. Without torchao the
   float8 rungs check the refusal names ``pip install torchao``, and are skipped.

    python benchmarks/gpu_modern.py [--dry-run] [--budget-s 280] [--call-start EPOCH] [--seconds 3]

The call (benchmarks/README.md): torchao 0.17.0 (the release built for torch 2.11) installed from the carried wheel
with ``--no-index --no-deps --target``, then ``gpu_probes.py`` and this script, both counting the run's budget from
``--call-start``. Its header records torchao's version and what importing it warned. ``--dry-run`` prints the plan
for an H200 on any machine (the planned seconds as the clock, starting where the probes' plan ends) and exits 0 when
it fits; ``tests/benchmarks/test_gpu_modern.py`` runs it in CI. Writes ``$OUT/gpu_modern.json``
(``benchmarks/results/gpu_modern.json`` without ``$OUT``) at once and after every piece.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

if "--dry-run" in sys.argv:  # a plan launches nothing: no forkserver to start on import
    os.environ.setdefault("ACCEL_WIDGETS_PRESTART", "0")

import psutil
import torch
from _common import environment
from gpu_check import (
    H200_MIB,
    Budget,
    PlannedClock,
    Report,
    Step,
    Work,
    execute,
    fake_h200,
    first_line,
    output_dir,
    plan_verdict,
    run_budgeted,
)
from gpu_probes import planned_total_s as probes_planned_s
from torch import nn

import accel_widgets as aw
from accel_widgets.analysis.usage import (
    allocator_expandable,
    allocator_slack_share,
    mfu,
    mfu_basis,
    model_state_bytes,
    peak_reserved_bytes,
)
from accel_widgets.knobs.float8 import INSTALL
from accel_widgets.knobs.rules import check_config

#: The device call's limit and what the plan keeps of it for the last teardown, the last JSON write and the exit.
CALL_LIMIT_S, CALL_RESERVE_S = 300.0, 20.0
DEFAULT_BUDGET_S = CALL_LIMIT_S - CALL_RESERVE_S
FAIL_FAST_S = 20.0
RUNG_SETUP_S, RUNG_CAP_S = 15.0, 45.0  # an eager rung's floor is its measured seconds + setup
FLOAT8_FLOOR_S, FLOAT8_CAP_S = 50.0, 75.0  # a compiled rung: the MLP stack compiles in well under a minute
LM_BATCH = 16  # the GPU check's LM reference batch: GPT-2 small at sequence 1024
#: The float8 rungs measure the matmuls only while the step waits on data and copies for less than this share of it.
MAX_DATA_SHARE = 0.05
TORCHAO_IMPORT_TIMEOUT_S = 60.0
#: The torchao the call carries (benchmarks/README.md's wheel): the release built against torch 2.11, the image's.
TORCHAO_VERSION = "0.17.0"

#: Seconds each piece should take on one H200, from the GPU check's measured ones (benchmarks/gpu_check.py's
#: H200_SECONDS: fail fast 10 s, an eager LM rung 6-9 s, a cold compile 25-60 s); the float8 MLP stack is smaller
#: than the LM, so its compile is planned at 35 s. Planned, not yet measured: a real call's timeline replaces them.
H200_SECONDS: dict[str, float] = {
    "start": 5.0,
    "fail fast": 10.0,
    "checkpointing off": 9.0, "checkpointing blocks": 9.0, "checkpointing selective": 9.0,
    "allocator expandable": 8.0,
    "parallel ddp": 10.0, "parallel fsdp": 10.0,
    "float8 off": 45.0, "float8 tensorwise": 45.0, "float8 rowwise": 45.0,
}


# -- the workloads --------------------------------------------------------------------------------------------------
class StepBatches(torch.utils.data.Dataset):
    """Whole steps' batches, built once on the rank's GPU: each item is (``tokens`` x ``width`` inputs, their row
    numbers as the target), taken whole by the loader (batch size 1, :func:`only_item`), so a step costs the host one
    index and nothing to copy. The inputs are regressed onto nothing: the loss is the outputs' mean square."""

    def __init__(self, steps: int = 2, tokens: int = 8192, width: int = 4096) -> None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        generator = torch.Generator(device).manual_seed(0)
        self.inputs = torch.randn(steps, tokens, width, generator=generator, device=device)
        self.rows = torch.arange(tokens, device=device)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.rows


def only_item(items: list[Any]) -> Any:
    """The loader's collate for :class:`StepBatches`: its one item is the step's batch already."""
    (item,) = items
    return item


def mean_square(output: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return output.float().square().mean()


class MlpStack(nn.Module):
    """Llama-3-8B's MLP shape (4096 -> 14336 -> 4096, SiLU) in a stack of residual blocks: where float8 gains."""

    def __init__(self, blocks: int = 2, width: int = 4096, hidden: int = 14336) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, hidden, bias=False), nn.SiLU(),
                                                  nn.Linear(hidden, width, bias=False)) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def mlp_workload(tokens: int = 8192, width: int = 4096, hidden: int = 14336) -> aw.Workload:
    """8,192 tokens a step (a batch of 8 x 1024 tokens, flattened), two steps' batches built in each rank on its GPU
    (256 MiB would otherwise be pickled to it, and copied to the GPU every step)."""
    return aw.Workload(model=functools.partial(MlpStack, width=width, hidden=hidden),
                       dataset=functools.partial(StepBatches, tokens=tokens, width=width), loss_fn=mean_square,
                       collate_fn=only_item, batch_size=1, name="mlp-stack")


#: (piece, workload, config) of every measured rung, in plan order.
def rungs(device: aw.DeviceInfo) -> list[tuple[str, str, aw.Config]]:
    bf16 = aw.Config(precision="bf16", batch_size=LM_BATCH)
    ranks = max(1, min(2, len(device.gpus)))
    compiled = aw.Config(precision="bf16", compile_mode="default")
    return [
        *((f"checkpointing {mode}", "lm", bf16.replace(activation_checkpointing=mode))
          for mode in ("off", "blocks", "selective")),
        ("allocator expandable", "lm", bf16.replace(expandable_segments=True)),
        *((f"parallel {mode}", "lm", bf16.replace(parallel=mode, world_size=ranks)) for mode in ("ddp", "fsdp")),
        *((f"float8 {recipe}", "mlp-stack", compiled.replace(float8=recipe))
          for recipe in ("off", "tensorwise", "rowwise")),
    ]


# -- what the rungs say -------------------------------------------------------------------------------------------
def ratio(mine: float | None, theirs: float | None) -> str:
    return f"{mine / theirs:.2f}x" if mine and theirs else "-"


def memory_text(result: aw.BurstResult) -> str:
    peak, reserved = result.peak_memory_bytes or 0, peak_reserved_bytes(result)
    text = f"allocated {peak / 2**30:.2f} GiB"
    if reserved is not None:
        text += f", reserved {reserved / 2**30:.2f} GiB ({allocator_slack_share(result) or 0:.0%} unused at peak)"
    return text


def checkpointing_verdict(off: aw.BurstResult, other: aw.BurstResult, mode: str) -> tuple[str, str]:
    """Checkpointing must lower the allocator's peak; its step-time cost is reported."""
    lower = (other.peak_memory_bytes or 0) < (off.peak_memory_bytes or 0)
    step = ratio(other.step_time.median if other.step_time else None, off.step_time.median if off.step_time else None)
    return ("PASS" if lower else "FAIL"), (f"{mode}: peak {ratio(other.peak_memory_bytes, off.peak_memory_bytes)} "
                                           f"of off's, step time {step}; {memory_text(other)}")


def expandable_verdict(plain: aw.BurstResult, expandable: aw.BurstResult) -> tuple[str, str]:
    """The knob must act: the rank's allocator says its segments were expandable, and the same config's without the
    knob were not (a setting in this machine's environment would make both so, and the rung would measure nothing)."""
    default, asked = allocator_expandable(plain), allocator_expandable(expandable)
    text = (f"allocator segments expandable: default {default}, knob on {asked}; default: {memory_text(plain)}; "
            f"expandable: {memory_text(expandable)}; samples/s {ratio(expandable.samples_per_s, plain.samples_per_s)}")
    return ("PASS" if asked is True and default is False else "FAIL"), text


def median_compute_s(result: aw.BurstResult) -> float | None:
    """The median of the measured steps' compute part (GPU time on the step clock, data wait and copy excluded)."""
    times = [step.compute_s for step in result.measured_steps()]
    return statistics.median(times) if times else None


def data_share(result: aw.BurstResult) -> float | None:
    """The share of the measured steps spent waiting on the loader and copying to the GPU."""
    wait, copy = result.data_wait_share, result.h2d_share
    return None if wait is None or copy is None else wait + copy


def data_cost_verdict(result: aw.BurstResult) -> tuple[str, str]:
    """The float8 rungs measure the matmuls only while data is cheap: the bf16 rung's steps wait and copy < 5%."""
    share = data_share(result)
    if share is None:
        return "FAIL", "no measured steps"
    return ("PASS" if share < MAX_DATA_SHARE else "FAIL"), (
        f"data wait + copy {share:.1%} of the bf16 step (at most {MAX_DATA_SHARE:.0%}: above it the samples/s of the "
        "float8 rungs measure the loader)")


def float8_verdict(base: aw.BurstResult, run: aw.BurstResult, recipe: str) -> tuple[str, str]:
    """float8 against bf16 + compile on the GPU's compute time per step (what float8 changes), samples/s beside it;
    reported, not judged: torchao's published gains vary by shape (0.80-1.39x per layer)."""
    mine, theirs = median_compute_s(run), median_compute_s(base)
    if not mine or not theirs:
        return "FAIL", "no measured steps to compare"
    return "INFO", (f"{recipe}: GPU compute {theirs / mine:.2f}x faster than bf16 + compile ({theirs * 1e3:.2f} -> "
                    f"{mine * 1e3:.2f} ms a step), samples/s {ratio(run.samples_per_s, base.samples_per_s)}, MFU "
                    f"{(mfu(run) or 0):.1%} ({mfu_basis(run)}); torchao/torchtitan: +28% tokens/s for Llama3-8B on 8 "
                    "H100s")


def sharding_verdict(ddp: aw.BurstResult, fsdp: aw.BurstResult) -> tuple[str, str]:
    """FSDP holds 1/ranks of the training state per rank: a PASS from two ranks on, reported on one."""
    share = (model_state_bytes(fsdp) or 0) / (model_state_bytes(ddp) or 1)
    text = (f"{fsdp.world_size} rank(s): training state per rank {share:.2f}x DDP's, peak "
            f"{ratio(fsdp.peak_memory_bytes, ddp.peak_memory_bytes)}, samples/s "
            f"{ratio(fsdp.samples_per_s, ddp.samples_per_s)}")
    if fsdp.world_size < 2:
        return "INFO", text
    return ("PASS" if share <= 1 / fsdp.world_size + 0.05 else "FAIL"), text


# -- the call ----------------------------------------------------------------------------------------------------
class Call:
    """The pieces of work of one call and what they share: the report, the device, the workloads, the results."""

    def __init__(self, report: Report, device: aw.DeviceInfo, args: argparse.Namespace) -> None:
        self.report, self.device, self.args = report, device, args
        self.results: dict[str, aw.BurstResult] = {}
        self.workloads: dict[str, aw.Workload] = {}

    def plan(self) -> list[Work]:
        floor = self.args.seconds + RUNG_SETUP_S
        works = [Work("fail fast", "fail fast", H200_SECONDS["fail fast"], FAIL_FAST_S, FAIL_FAST_S, True,
                      self.fail_fast)]
        for name, workload, config in rungs(self.device):
            compiled = config.compile_mode != "off"
            works.append(Work(name, "checks", H200_SECONDS[name], FLOAT8_FLOOR_S if compiled else floor,
                              FLOAT8_CAP_S if compiled else RUNG_CAP_S, name in ("float8 off", "float8 tensorwise"),
                              functools.partial(self.rung, name, workload, config)))
        return works

    def run(self, work: Work, timeout: float) -> str:
        try:
            return work.action(timeout)
        except Exception as exc:  # a bug in one piece must not cost the others
            self.report.check(work.name, "FAIL", f"{type(exc).__name__}: {first_line(str(exc))}")
            return "FAIL"

    def fail_fast(self, timeout: float) -> str:
        outcome = run_budgeted(aw.demo_workload("mlp", size="small"), aw.Config(), timeout_s=timeout, cap_s=timeout,
                               label="fail fast", steps=5, options=aw.BurstOptions(warmup_steps=1))
        self.report.burst("fail fast", outcome)
        if outcome.status != "ok" or outcome.result is None:
            self.report.check("fail fast", "FAIL", f"{outcome.message}; stopping: nothing later can run")
            return "STOP"
        kind = outcome.result.environment.get("device_kind")
        status = "PASS" if kind == "cuda" or self.args.allow_cpu else "FAIL"
        self.report.check("fail fast", status, f"5 steps on {outcome.result.environment.get('device_name')}")
        return status if status == "PASS" else "STOP"

    def rung(self, name: str, workload_name: str, config: aw.Config, timeout: float) -> str:
        if config.float8 != "off" and importlib.util.find_spec("torchao") is None:
            return self.float8_refused(name, config)
        outcome = run_budgeted(self.workload(workload_name), config, timeout_s=timeout, cap_s=timeout,
                               seconds=self.args.seconds, label=name)
        self.report.burst(name, outcome)
        if outcome.status != "ok" or outcome.result is None:
            status = "SKIP" if outcome.status in ("cut", "skipped") else "FAIL"
            self.report.check(name, status, outcome.message)
            return status
        self.results[name] = outcome.result
        rate = outcome.result.samples_per_s or 0.0
        self.report.check(name, "INFO", f"{rate:,.1f} samples/s, {memory_text(outcome.result)}")
        return "INFO"

    def float8_refused(self, name: str, config: aw.Config) -> str:
        """Without torchao the knob must refuse, naming the install line, before any process starts."""
        try:
            aw.run_burst(self.workload("mlp-stack"), config, steps=1, options=aw.BurstOptions(device=self.device))
        except aw.ConfigError as exc:
            ok = INSTALL in str(exc)
            self.report.check(name, "PASS" if ok else "FAIL", f"torchao absent, refused: {first_line(str(exc))}")
            return "PASS" if ok else "FAIL"
        self.report.check(name, "FAIL", "torchao absent, and the burst was not refused")
        return "FAIL"

    def workload(self, name: str) -> aw.Workload:
        if name not in self.workloads:
            self.workloads[name] = mlp_workload() if name == "mlp-stack" else aw.demo_workload(name, size="gpu")
        return self.workloads[name]

    def finish(self) -> None:
        """The side-by-side lines: each knob against its reference rung of this call."""
        found = self.results
        off = found.get("checkpointing off")
        for mode in ("blocks", "selective"):
            other = found.get(f"checkpointing {mode}")
            if off is not None and other is not None:
                self.report.check(f"checkpointing {mode} vs off", *checkpointing_verdict(off, other, mode))
        plain, expandable = found.get("checkpointing off"), found.get("allocator expandable")
        if plain is not None and expandable is not None:
            self.report.check("expandable segments", *expandable_verdict(plain, expandable))
        ddp, fsdp = found.get("parallel ddp"), found.get("parallel fsdp")
        if ddp is not None and fsdp is not None:
            self.report.check("fsdp vs ddp", *sharding_verdict(ddp, fsdp))
        base = found.get("float8 off")
        if base is not None:
            self.report.check("float8 data cost", *data_cost_verdict(base))
        for recipe in ("tensorwise", "rowwise"):
            run = found.get(f"float8 {recipe}")
            if base is not None and run is not None:
                self.report.check(f"float8 {recipe} vs bf16", *float8_verdict(base, run, recipe))


# -- before anything runs -------------------------------------------------------------------------------------------
def preflight(device: aw.DeviceInfo) -> list[tuple[str, str, str]]:
    """Every planned config is valid on ``device`` by the rules (float8 included: the H200 has float8 tensor cores)."""
    refused = []
    for name, _, config in rungs(device):
        try:
            check_config(config, device)
        except aw.ConfigError as exc:
            refused.append(f"{name}: {first_line(str(exc))}")
    configs = len(rungs(device))
    return [("FAIL" if refused else "PASS", "configs",
             "; ".join(refused) if refused else f"{configs} planned configs valid on {device.name}")]


def dry_run(args: argparse.Namespace) -> int:
    """Plan the call for an H200 with the planned seconds as its clock; 0 when it fits, 1 when not."""
    device = fake_h200()
    after_probes = probes_planned_s()  # the run's first seconds are the probes'
    clock = PlannedClock(after_probes + H200_SECONDS["start"])
    budget = Budget(args.budget_s, clock=clock, started=0.0)
    with tempfile.TemporaryDirectory() as scratch:
        call = Call(Report(Path(scratch) / "plan.json", {}, budget), device, args)
        plan = call.plan()

    def simulate(work: Work, timeout: float) -> str:
        clock.advance(min(work.planned_s, timeout))
        return "PLANNED" if work.planned_s <= timeout else "CUT"

    print(f"gpu_modern plan (dry run) for {device.name}, {H200_MIB:,} MiB (NVML): budget {args.budget_s:.0f} s of "
          f"the call's {CALL_LIMIT_S:.0f} s, the clock the H200's planned seconds, after the probes' "
          f"{after_probes:.0f} s")
    print(f"{'start s':>8} {'planned':>8} {'timeout':>8}  {'work':<24} status")
    steps = execute(plan, budget, simulate, on_step=lambda step: print(
        f"{step.start_s:>8.0f} {step.work.planned_s:>8.0f} "
        f"{'-' if step.timeout_s is None else f'{step.timeout_s:.0f}':>8}  {step.work.name:<24} "
        f"{step.status if step.status != 'SKIP' else step.why}" + (" (required)" if step.work.required else "")))
    return plan_verdict(plan, steps, preflight(device), budget, args.budget_s, CALL_LIMIT_S,
                        after_probes + H200_SECONDS["start"])


def header(args: argparse.Namespace, device: aw.DeviceInfo) -> dict[str, Any]:
    return {"benchmark": "gpu_modern", "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(), "device": {"name": device.name, "gpus": [g.name for g in device.gpus]},
            "budget_s": args.budget_s, "call_limit_s": CALL_LIMIT_S, "seconds_per_rung": args.seconds,
            "torchao": {"found": importlib.util.find_spec("torchao") is not None}}


#: Imports torchao as a rank will, and says what it is and what importing it said (its log lines and warnings:
#: torchao logs each C++ extension it cannot load, and warns when it was built for another torch).
_TORCHAO_IMPORT = """
import json, logging, warnings
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(f"{record.levelname} {record.name}: {record.getMessage()}")
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.INFO)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch, torchao
    from torchao.float8 import convert_to_float8_training
print(json.dumps({"version": torchao.__version__, "torch": torch.__version__,
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught], "log": records}))
"""


def torchao_import(timeout_s: float = TORCHAO_IMPORT_TIMEOUT_S) -> dict[str, Any]:
    """torchao's version and what importing it warned or logged, read in a process of its own (this one stays free
    of CUDA libraries); ``{"found": False}`` without it, its error when the import fails."""
    if importlib.util.find_spec("torchao") is None:
        return {"found": False}
    try:
        done = subprocess.run([sys.executable, "-c", _TORCHAO_IMPORT], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"found": True, "error": f"importing torchao took over {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"found": True, "error": first_line(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                                                   else f"exit {done.returncode}"), "stderr": done.stderr[-2000:]}
    return {"found": True, **json.loads(lines[-1]), "stderr": done.stderr[-2000:]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"the call's budget from --call-start (default {DEFAULT_BUDGET_S:.0f} s)")
    parser.add_argument("--call-start", type=float, default=None,
                        help="when the device call started, seconds since the epoch (the probes ran first in it); "
                             "default: this process's start")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per rung")
    parser.add_argument("--dry-run", action="store_true", help="print the plan for an H200 and exit")
    parser.add_argument("--allow-cpu", action="store_true", help="run the plumbing on a CPU (GPU checks fail)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    budget = Budget(args.budget_s, started=args.call_start or psutil.Process().create_time())
    device = aw.probe_device()
    report = Report(output_dir() / "gpu_modern.json", header(args, device), budget)
    report.save()
    torchao: dict[str, Any] = {}
    reading = threading.Thread(target=lambda: torchao.update(torchao_import()), name="torchao-import", daemon=True)
    reading.start()  # beside fail fast: a few seconds of imports the plan need not wait for
    if not device.has_cuda and not args.allow_cpu:
        report.check("cuda", "FAIL", "no CUDA GPU visible through NVML (--allow-cpu runs the plumbing on a CPU)")
        return 2
    call = Call(report, device, args)
    plan = call.plan()
    report.plan(plan)
    report.step(Step(Work("start", "start", H200_SECONDS["start"], 0.0, 0.0), 0.0, None, budget.elapsed(), "INFO"))
    for status, name, message in preflight(device):
        report.check(f"preflight {name}", status, message)
    execute(plan, budget, call.run, on_step=report.step)
    reading.join(timeout=TORCHAO_IMPORT_TIMEOUT_S)
    report.data["torchao"] = torchao or {"found": True, "error": "the import did not answer in time"}
    if torchao.get("found"):
        carried = torchao.get("version") == TORCHAO_VERSION and not torchao.get("error")
        report.check("torchao", "PASS" if carried else "FAIL", f"{torchao.get('version', '?')} (carried: "
                     f"{TORCHAO_VERSION}) under torch {torchao.get('torch', '?')}; {len(torchao.get('warnings', []))} "
                     f"warnings, {len(torchao.get('log', []))} log lines on import"
                     + (f"; {torchao['error']}" if torchao.get("error") else ""))
    call.finish()
    report.save()
    print(f"{'FAIL' if report.failed else 'PASS'}  overall in {budget.elapsed():.0f} s; wrote {report.path}",
          flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
