"""export_script: a standalone torchrun script that really trains, with 2 CPU ranks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_widgets import Config
from accel_widgets.export import export_script

ROOT = Path(__file__).resolve().parent.parent


def test_exported_script_trains_under_torchrun_with_two_ranks(tmp_path):
    config = Config(parallel="ddp", world_size=2, grad_accum_steps=2, batch_size=16, sync_every=2,
                    optimizer_impl="foreach", precision="bf16")
    script = export_script("tests.workloads:exported_workload", config, tmp_path / "train.py")
    text = script.read_text()
    assert "torch.amp.GradScaler" in text and "torch.cuda.amp" not in text
    assert "--rdzv-backend c10d --rdzv-endpoint HOST:29400" in text
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}  # torchelastic_* dirs stay in tmp_path
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    done = subprocess.run([*torchrun, "--standalone", "--nproc-per-node", "2", str(script), "--steps", "6"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 6 steps" in done.stdout and "over 2 ranks" in done.stdout
    assert done.stdout.count("step ") == 3  # the loss is read every 2 steps, on rank 0 only


def test_export_rejects_what_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match="MODULE:FUNCTION"):
        export_script("no_colon", Config(), tmp_path / "x.py")
    with pytest.raises(ValueError, match="use parallel='ddp'"):
        export_script("a:b", Config(parallel="dataparallel"), tmp_path / "x.py")


def test_deterministic_script_fixes_the_cublas_workspace_before_cuda_starts(tmp_path):
    text = export_script("a:b", Config(deterministic=True), tmp_path / "train.py").read_text()
    assert "DETERMINISTIC = True" in text
    workspace = text.index('os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")')
    assert workspace < text.index("torch.cuda.set_device(local_rank)")  # first CUDA call of the script
    assert workspace < text.index("torch.use_deterministic_algorithms(DETERMINISTIC)")


def test_default_config_script_keeps_pytorch_tf32_defaults(tmp_path):
    plain = export_script("a:b", Config(), tmp_path / "plain.py").read_text()
    tf32 = export_script("a:b", Config(tf32=True), tmp_path / "tf32.py").read_text()
    assert "TF32 = False" in plain and "TF32 = True" in tf32
    assert "torch.backends.cuda.matmul.allow_tf32 = TF32" in plain
    assert "fp32_precision" not in plain and "cudnn.allow_tf32" not in plain  # cuDNN keeps its TF32 default
