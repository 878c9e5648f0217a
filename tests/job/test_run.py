"""The exported job, run as a user runs it: stopped by SIGTERM, killed with SIGKILL, resumed, and every step after a
resume trains as the uninterrupted burst does, loss for loss (one process, and DDP x 2 under torchrun).

The workload (``tests.workloads:augmented_job_workload``) augments every item at random in the loader workers, keyed to
the item, and has an LR schedule and an evaluation set; the test arms it to send its own process a signal at a known
training forward (``AW_TEST_SIGNAL``), so the stop lands at a known step.
Each launch costs seconds (importing torch), so each test chains its launches: the stops and the resumes of one job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from accel_widgets import BurstOptions, Config, run_burst
from accel_widgets.engine.training import build_loop
from accel_widgets.job import run
from accel_widgets.job.checkpoint import Checkpoints
from accel_widgets.job.export import export_script
from accel_widgets.job.log import JobLog
from accel_widgets.job.options import JobOptions
from accel_widgets.job.signals import StopRequest
from accel_widgets.knobs.plan import resolve
from tests.devices import cpu_device
from tests.workloads import TinyNet, augmented_job_workload, tiny_workload

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = "tests.workloads:augmented_job_workload"


def launch(script: Path, nproc: int, where: Path, *flags: str, signal_at: str | None = None, steps: int,
           checkpoint_every: int) -> subprocess.CompletedProcess[str]:
    """The script as a user starts it: plain ``python`` for one process, ``torchrun`` for DDP."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(where)}
    env.pop("AW_TEST_SIGNAL", None)
    if signal_at is not None:
        env["AW_TEST_SIGNAL"] = signal_at
    runner = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc-per-node", str(nproc)]
    common = ["--steps", str(steps), "--checkpoint-dir", str(where / "ckpt"), "--checkpoint-every",
              str(checkpoint_every)]
    return subprocess.run([*runner, str(script), *common, *flags], cwd=where, env=env, capture_output=True,
                          text=True, timeout=240)


def final_line(done: subprocess.CompletedProcess[str]) -> tuple[list[float], int]:
    (line,) = [line for line in done.stdout.splitlines() if line.startswith('{"losses"')]
    record = json.loads(line)
    return record["losses"], record["first_step"]


def steps_saved(where: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (where / "ckpt").glob("step_*") if (p / ".metadata").is_file())


def logged_losses(where: Path) -> list[tuple[int, float]]:
    """(step, loss) of every line the job's launches logged, in order (a step trained again after a resume twice)."""
    lines = (where / "ckpt" / "log.jsonl").read_text().splitlines()
    return [(record["step"], record["loss"]) for record in map(json.loads, lines)]


def reference_losses(config: Config, steps: int) -> list[float]:
    """The uninterrupted run: a burst of ``config`` with no loader workers (keyed items make the workers' count
    irrelevant, so the job's 2 workers per rank must reproduce it too)."""
    burst = run_burst(augmented_job_workload(), config, steps=steps - 2,
                      options=BurstOptions(warmup_steps=2, device=cpu_device()))
    assert burst.ok, burst.error
    assert burst.ranks[0].random_data and burst.ranks[0].keyed_data
    return burst.losses(rank=0)


@pytest.mark.slow
def test_one_process_with_augmenting_loader_workers_killed_five_times_inside_epochs_resumes_exactly(
        short_tmp: Path) -> None:
    """fp16 with GradScaler, 2 loader workers, random augmentation from torch, Python and NumPy, 6 batches an epoch, a
    StepLR schedule, a checkpoint every 5 steps: stopped in steps 7 (SIGKILL), 9 (SIGTERM: a checkpoint and exit 0),
    13 (SIGKILL), 14 (SIGTERM) and 17 (SIGKILL), resumed each time from a checkpoint inside an epoch (after steps 5, 9,
    10, 14, 15), then trained to step 22, evaluating every 5 steps, with TensorBoard and the model saved. Every step
    any launch trained, logged each step, has the uninterrupted run's loss: equal, not close."""
    steps = 22
    config = Config(precision="fp16")
    script = export_script(WORKLOAD, config.replace(num_workers=2), short_tmp / "train.py")
    reference = reference_losses(config, steps)

    def run(*flags: str, signal_at: str | None = None) -> subprocess.CompletedProcess[str]:
        return launch(script, 1, short_tmp, "--log-every", "1", *flags, signal_at=signal_at, steps=steps,
                      checkpoint_every=5)

    assert run(signal_at="SIGKILL@7").returncode == -9
    stopped = run("--resume", signal_at="SIGTERM@4")  # step 9 of a job resumed after step 5
    assert stopped.returncode == 0 and "stopped by SIGTERM after step 9" in stopped.stdout, stopped.stderr[-3000:]
    assert final_line(stopped) == (reference[5:9], 5)
    assert run("--resume", signal_at="SIGKILL@4").returncode == -9  # step 13, resumed after step 9
    stopped = run("--resume", signal_at="SIGTERM@4")  # step 14, resumed after step 10
    assert "stopped by SIGTERM after step 14" in stopped.stdout and final_line(stopped) == (reference[10:14], 10)
    assert run("--resume", signal_at="SIGKILL@3").returncode == -9  # step 17, resumed after step 14
    done = run("--resume", "--eval-every", "5", "--save-model", "model.pt", "--tensorboard", "tb")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epoch 2, its first 3 batches skipped at the sampler (not read)" in done.stdout
    assert final_line(done) == (reference[15:], 15)

    logged = logged_losses(short_tmp)
    assert [step for step, _ in logged] == [*range(1, 7), *range(6, 10), *range(10, 13), *range(11, 15),
                                            *range(15, 17), *range(16, 23)]
    assert max(abs(loss - reference[step - 1]) for step, loss in logged) == 0.0
    log = {record["step"]: record for record in map(json.loads, (short_tmp / "ckpt" / "log.jsonl").open())}
    assert [log[step]["lr"] for step in (16, 20)] == [1e-3 * 0.5 ** 3, 1e-3 * 0.5 ** 4]  # StepLR: halved every 5
    assert [step for step, record in log.items() if "eval" in record] == [20]
    assert 0.5 < log[20]["eval"]["loss"] < 3 and all(record["samples_per_s"] > 0 for record in log.values())
    assert list(torch.load(short_tmp / "model.pt")) == list(TinyNet().state_dict())  # the plain module's keys
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(short_tmp / "tb")).Reload()
    assert [s.step for s in events.Scalars("train/loss")] == list(range(16, 23))
    assert events.Scalars("eval/loss")[-1].value == float(torch.tensor(log[20]["eval"]["loss"]))


@pytest.mark.slow
def test_ddp_ranks_with_augmenting_loader_workers_killed_then_stopped_together_inside_epochs_resume_exactly(
        short_tmp: Path) -> None:
    """DDP x 2 (gloo), bf16, 2 micro-batches a step (no_sync), 2 loader workers a rank augmenting keyed items, 3
    batches an epoch per rank, a checkpoint every 5 steps. Rank 0 SIGKILLed in step 7 is resumed after step 5 (inside
    epoch 4). Logging every 2 steps and evaluating every 4, a SIGTERM that only rank 0 gets in step 9 stops both ranks
    at the next log step, 10, where they agree, with a checkpoint and exit 0 (a rank that went on would fail in step
    11's all-reduce); resumed from there (inside epoch 7) to step 13. Every step rank 0 trained, logged each step, is
    the uninterrupted run's: equal, not close; evaluating changed none of them."""
    steps = 13
    config = Config(parallel="ddp", world_size=2, precision="bf16", grad_accum_steps=2)
    script = export_script(WORKLOAD, config.replace(num_workers=2), short_tmp / "train.py")
    reference = reference_losses(config, steps)

    def run(*flags: str, signal_at: str | None = None) -> subprocess.CompletedProcess[str]:
        return launch(script, 2, short_tmp, *flags, signal_at=signal_at, steps=steps, checkpoint_every=5)

    killed = run("--log-every", "1", signal_at="SIGKILL@13")  # forward 13: step 7's first micro-batch
    assert killed.returncode != 0 and steps_saved(short_tmp) == [5]
    stopped = run("--resume", "--log-every", "2", "--eval-every", "4", signal_at="SIGTERM@7")  # step 9, resumed at 5
    assert stopped.returncode == 0 and "stopped by SIGTERM after step 10" in stopped.stdout, stopped.stderr[-3000:]
    assert final_line(stopped) == (reference[5:10], 5)
    assert steps_saved(short_tmp) == [5, 10]
    log = [json.loads(line) for line in (short_tmp / "ckpt" / "log.jsonl").read_text().splitlines()]
    assert [(record["step"], "eval" in record) for record in log[-3:]] == [(6, False), (8, True), (10, False)]
    assert 0.5 < log[-2]["eval"]["loss"] < 3  # both ranks' halves of the 96 items, averaged
    done = run("--resume", "--log-every", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert final_line(done) == (reference[10:], 10)
    assert max(abs(loss - reference[step - 1]) for step, loss in logged_losses(short_tmp)) == 0.0


def test_a_checkpoint_is_due_by_the_clock_and_a_signal_stops_the_loop_after_its_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's hooks on a burst's own loop, in this process: no checkpoint before the minute is up, one at the first
    step after it; a SIGTERM noted mid-step ends the loop after that step, with its checkpoint."""
    workload = tiny_workload(tokens_per_sample=8)
    plan = resolve(Config(), cpu_device(), workload)
    loop, raw = build_loop(workload, plan, torch.device("cpu"), 0, cache_dir=str(tmp_path), emit=lambda event: None,
                           clock_origin=time.perf_counter())
    now = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    options = JobOptions(steps=10, log_every=2, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_minutes=1)
    log = JobLog(0, options.log_path, None)
    job = run.Job(loop, raw, workload, plan, options, Checkpoints(tmp_path / "ckpt", keep=3, rank=0), log,
                  StopRequest(), 0, None)
    loop.hooks, loop.should_stop = job, job.stopping
    first_step_s, _ = loop.warm_up(1)
    now[0] = 59.0
    loop.measure(1, None, first_step_s)
    assert steps_saved(tmp_path) == []
    now[0] = 60.0
    loop.measure(1, None, first_step_s)
    assert steps_saved(tmp_path) == [3]
    job.stop.received = "SIGTERM"
    loop.measure(5, None, first_step_s)
    log.close()
    assert job.step == 4 and job.stopped_by == "SIGTERM" and steps_saved(tmp_path) == [3, 4]
    lines = [json.loads(text) for text in (tmp_path / "ckpt" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    assert lines[0]["tokens_per_s"] == pytest.approx(8 * lines[0]["samples_per_s"], rel=1e-3)  # tokens_per_sample
