"""The exported job, run as a user runs it: stopped by SIGTERM, killed with SIGKILL, resumed, and every step after a
resume trains as the uninterrupted burst does, loss for loss (one process, and DDP x 2 under torchrun).

The workload (``tests.workloads:job_workload``) has an LR schedule and an evaluation set; the test arms it to send
its own process a signal at a known training forward (``AW_TEST_SIGNAL``), so the stop lands at a known step.
Each launch costs seconds (importing torch), so each test chains its launches: the stops and the resumes of one job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from accel_widgets import Config, run_burst
from accel_widgets.job.export import export_script
from tests.devices import cpu_device
from tests.workloads import TinyNet, job_workload

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "tests.workloads:job_workload"
STEPS = 20


def launch(script: Path, nproc: int, where: Path, *flags: str, signal_at: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    """The script as a user starts it: plain ``python`` for one process, ``torchrun`` for DDP."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(where)}
    env.pop("AW_TEST_SIGNAL", None)
    if signal_at is not None:
        env["AW_TEST_SIGNAL"] = signal_at
    runner = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc-per-node", str(nproc)]
    common = ["--steps", str(STEPS), "--checkpoint-dir", str(where / "ckpt"), "--checkpoint-every", "4"]
    if "--log-every" not in flags:
        common += ["--log-every", "5"]
    return subprocess.run([*runner, str(script), *common, *flags], cwd=where, env=env, capture_output=True,
                          text=True, timeout=240)


def final_line(done: subprocess.CompletedProcess[str]) -> tuple[list[float], int]:
    (line,) = [line for line in done.stdout.splitlines() if line.startswith('{"losses"')]
    record = json.loads(line)
    return record["losses"], record["first_step"]


def burst_losses(config: Config) -> list[float]:
    """The uninterrupted reference: a burst of the same config, 20 steps (the job trains through the same loop)."""
    burst = run_burst(job_workload(), config, steps=STEPS - 2, warmup_steps=2, device=cpu_device())
    assert burst.ok, burst.error
    return burst.losses(rank=0)


def steps_saved(where: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (where / "ckpt").glob("step_*") if (p / ".metadata").is_file())


def test_one_process_stopped_by_sigterm_then_killed_resumes_exactly(short_tmp: Path) -> None:
    """fp16 with GradScaler, 2 micro-batches a step, a StepLR schedule, epochs of 8 steps: SIGTERM in step 7 stops
    the job after it with a checkpoint and exit 0; the resumed job is SIGKILLed in step 13, after its checkpoint at
    12; resumed again (evaluating every 5 steps), steps 13-20 are the uninterrupted burst's."""
    config = Config(precision="fp16", grad_accum_steps=2)
    script = export_script(REFERENCE, config, short_tmp / "train.py")
    reference = burst_losses(config)

    stopped = launch(script, 1, short_tmp, signal_at="SIGTERM@13")  # forward 13: step 7's first micro-batch
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 7" in stopped.stdout
    assert final_line(stopped) == (reference[:7], 0)

    killed = launch(script, 1, short_tmp, "--resume", signal_at="SIGKILL@11")  # step 13 of a job resumed at 7
    assert killed.returncode == -9
    assert steps_saved(short_tmp) == [7, 8, 12]

    resumed = launch(script, 1, short_tmp, "--resume", "--eval-every", "5", "--save-model", "model.pt",
                     "--tensorboard", "tb")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipped at the sampler (not read)" in resumed.stdout
    assert final_line(resumed) == (reference[12:], 12)  # equal, not close
    assert steps_saved(short_tmp) == [12, 16, 20]

    log = [json.loads(line) for line in (short_tmp / "ckpt" / "log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [5, 10, 15, 20]  # stopped after 7, killed in 13, resumed to 20
    assert [record["loss"] for record in log[-2:]] == [reference[14], reference[19]]
    assert [record["lr"] for record in log[-2:]] == [1e-3 * 0.5 ** 3, 1e-3 * 0.5 ** 4]  # StepLR: halved every 5
    assert set(log[-1]["eval"]) == {"loss"} and 0.5 < log[-1]["eval"]["loss"] < 3
    assert "eval" not in log[-3] and all(record["samples_per_s"] > 0 for record in log)

    saved = torch.load(short_tmp / "model.pt")
    assert list(saved) == list(TinyNet().state_dict())  # the plain module's keys
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(short_tmp / "tb")).Reload()
    assert [s.step for s in events.Scalars("train/loss")] == [15, 20]
    assert events.Scalars("eval/loss")[-1].value == float(torch.tensor(log[-1]["eval"]["loss"]))


def test_ddp_ranks_killed_resume_exactly_and_stop_together_on_one_ranks_sigterm(short_tmp: Path) -> None:
    """DDP x 2 (gloo), bf16, 2 micro-batches a step (no_sync): rank 0 is SIGKILLed in step 13, after the checkpoint
    at 12. Resumed (logging every 2 steps), a SIGTERM that only rank 0 gets in step 17 stops both ranks at the next
    log step, 18, where they agree, with a checkpoint and exit 0 (a rank that went on would fail in step 19's
    all-reduce); steps 13-18 are the uninterrupted burst's. (The one-process test resumes after a SIGTERM.)"""
    config = Config(parallel="ddp", world_size=2, precision="bf16", grad_accum_steps=2)
    script = export_script(REFERENCE, config, short_tmp / "train.py")
    reference = burst_losses(config)

    killed = launch(script, 2, short_tmp, signal_at="SIGKILL@25")
    assert killed.returncode != 0 and steps_saved(short_tmp) == [4, 8, 12]

    resumed = launch(script, 2, short_tmp, "--resume", "--log-every", "2", signal_at="SIGTERM@9")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stopped by SIGTERM after step 18" in resumed.stdout
    assert final_line(resumed) == (reference[12:18], 12)  # equal, not close
    assert steps_saved(short_tmp) == [12, 16, 18]
