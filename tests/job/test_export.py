"""Export = burst: the exported script, run under torchrun, trains loss for loss as the burst did."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import accel_widgets as aw
from accel_widgets import BurstOptions, Config, run_burst
from accel_widgets.inputs.workload import WorkloadReferenceError
from accel_widgets.job.export import export_ray_train, export_script, export_slurm
from accel_widgets.knobs.rules import ConfigError
from tests.devices import cpu_device
from tests.ray_cluster import command_of, gone, train_processes
from tests.workloads import exported_workload

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "tests.workloads:exported_workload"
STEPS = 6  # 2 warm-up steps and 4 measured ones in the burst; 6 steps of the script

#: Each torchrun costs seconds, so each config carries several knobs: the data path, the step's own overheads and
#: accumulation, and DDP.
# The stock config's path is the first config's with its knobs at their defaults: each of these runs it too.
REPRESENTATIVE = [
    Config(num_workers=1, data_cache="memmap"),
    Config(grad_accum_steps=2, batch_size=16, script_loss=True, optimizer_impl="foreach", sync_every=0),
    Config(parallel="ddp", world_size=2, grad_accum_steps=2, batch_size=16, set_to_none=False),
]


def run_script(script: Path, nproc: int, tmp_path: Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}  # torchelastic_* dirs stay in tmp_path
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(script), "--steps", str(STEPS)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith('{"losses"')]
    return json.loads(line)["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("config", REPRESENTATIVE, ids=lambda c: c.label())
def test_the_exported_script_trains_exactly_as_the_burst_did(config, short_tmp):
    script = export_script(REFERENCE, config, short_tmp / "train.py")
    burst = run_burst(exported_workload(), config, steps=STEPS - 2,
                      options=BurstOptions(warmup_steps=2, device=cpu_device()))
    assert burst.ok
    assert run_script(script, config.ranks, short_tmp) == burst.losses(rank=0)  # equal, not close


def test_the_script_names_every_knob_and_the_multi_machine_launch(tmp_path):
    assert aw.export_script is export_script  # as the README writes it
    text = export_script(REFERENCE, Config(parallel="ddp", world_size=2, precision="bf16"),
                         tmp_path / "train.py").read_text()
    assert text.index("    parallel='ddp',") < text.index("    num_workers=0,")  # what the burst changed first
    assert "num_workers=0,  # DataLoader worker processes that load and augment batches in parallel. (default)" in text
    assert "--rdzv-backend c10d --rdzv-endpoint HOST:29400" in text
    assert "from accel_widgets.job.run import JobOptions, train" in text


def test_export_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(WorkloadReferenceError, match="MODULE:FUNCTION"):
        export_script("no_colon", Config(), tmp_path / "x.py")
    with pytest.raises(WorkloadReferenceError, match="no module named 'made_up'"):
        export_script("made_up.module:make", Config(), tmp_path / "x.py")
    with pytest.raises(WorkloadReferenceError, match="has no 'nothing_here'"):
        export_script("tests.workloads:nothing_here", Config(), tmp_path / "x.py")
    with pytest.raises(WorkloadReferenceError, match=r"must return an accel_widgets\.Workload"):
        export_script("tests.workloads:tensors", Config(), tmp_path / "x.py")
    with pytest.raises(ValueError, match="use parallel='ddp'"):
        export_script(REFERENCE, Config(parallel="dataparallel"), tmp_path / "x.py")
    assert not (tmp_path / "x.py").exists()


def test_a_config_the_rules_refuse_on_every_machine_is_not_exported(tmp_path):
    with pytest.raises(ConfigError, match="contradict each other"):
        export_script(REFERENCE, Config(deterministic=True, cudnn_benchmark=True), tmp_path / "x.py")
    assert not (tmp_path / "x.py").exists()


def test_a_ddp_script_of_a_loader_whose_batches_cannot_be_split_is_refused_with_the_reason(tmp_path):
    """Every rank would read the same batches: the export refuses, as a burst does, before writing anything."""
    export_script("tests.workloads:batch_sampler_workload", Config(), tmp_path / "one.py")  # one rank: fine
    with pytest.raises(ConfigError, match="cannot be split across DDP ranks"):
        export_script("tests.workloads:batch_sampler_workload", Config(parallel="ddp", world_size=2),
                      tmp_path / "x.py")
    assert not (tmp_path / "x.py").exists()


def test_a_script_refuses_a_config_its_machine_cannot_run_before_it_trains(short_tmp):
    """A config a GPU can run is exported; the script run on this CPU machine checks it as a burst would and stops
    with the rule's reason, without a step."""
    script = export_script(REFERENCE, Config(sdpa_backend="efficient"), short_tmp / "train.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(short_tmp)}
    done = subprocess.run([sys.executable, str(script), "--steps", "2"], cwd=short_tmp, env=env,  # one process,
                          capture_output=True, text=True, timeout=240)  # as torchrun's one rank would run it
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and "is a CUDA kernel" in done.stderr
    assert '{"losses"' not in done.stdout


#: Stand-ins for Slurm's own commands, on this machine: srun starts one task per node of the job with the variables
#: Slurm sets, and scontrol names every node by the loopback address.
SRUN = """#!/bin/bash
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 SLURM_NTASKS=$SLURM_NNODES "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
SCONTROL = "#!/bin/bash\necho 127.0.0.1\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_slurm_batch_file_trains_on_two_nodes_as_a_two_rank_burst(short_tmp):
    """One DDP rank a node on two (stand-in) Slurm nodes: torchrun numbers them 0 and 1 of 2, and rank 0's losses
    equal a local burst of two ranks, step for step."""
    config = Config(parallel="ddp", world_size=1)
    script = export_script(REFERENCE, config, short_tmp / "train.py")
    batch = export_slurm(script, config, short_tmp / "job.sbatch", nnodes=2)
    stand_ins = short_tmp / "bin"
    stand_ins.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (stand_ins / name).write_text(text)
        (stand_ins / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_ins}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "TMPDIR": str(short_tmp), "SLURM_NNODES": "2", "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node[1-2]", "RDZV_PORT": str(_free_port())}
    done = subprocess.run(["bash", str(batch), "--steps", str(STEPS)], cwd=short_tmp, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith('{"losses"')]
    burst = run_burst(exported_workload(), Config(parallel="ddp", world_size=2), steps=STEPS - 2,
                      options=BurstOptions(warmup_steps=2, device=cpu_device()))
    assert json.loads(line)["losses"] == burst.losses(rank=0)  # equal, not close
    assert "#SBATCH --nodes=2" in batch.read_text() and "--nproc-per-node 1" in batch.read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("ray-cluster")  # with tests/engine/test_ray.py: one worker starts the cluster, once
def test_the_ray_train_driver_trains_on_two_nodes_as_a_two_rank_burst(ray_cluster, short_tmp):
    """A TorchTrainer of two workers, one on each node of the local cluster: Ray Train makes their group and sets
    the torchrun variables, and rank 0's losses equal a local burst of two ranks, step for step. Its checkpoint is
    the job's own, and nothing of the job is left on the cluster after it."""
    config = Config(parallel="ddp", world_size=1)
    script = export_script(REFERENCE, config, short_tmp / "train.py")
    driver = export_ray_train(script, config, short_tmp / "ray_train.py", nnodes=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(short_tmp)}
    niceness: set[int] = set()
    with (short_tmp / "stderr").open("w+") as stderr, subprocess.Popen(
            [sys.executable, str(driver), "--address", ray_cluster.address, "--steps", str(STEPS), "--log-every", "1",
             "--checkpoint-dir", "ckpt", "--storage-path", str(short_tmp / "runs")],
            cwd=short_tmp, env=env, stdout=subprocess.DEVNULL, stderr=stderr) as job:
        deadline = time.monotonic() + 240
        while job.poll() is None and time.monotonic() < deadline:
            niceness.update(_niceness(p) for p in train_processes() if command_of(p).startswith("ray::RayTrainWorker"))
            time.sleep(0.2)
        job.kill()
        job.wait()
        stderr.seek(0)
        assert job.returncode == 0, stderr.read()[-3000:]
    assert niceness - {None} == {0}, f"Ray Train's workers ran at nice {niceness}, not a torchrun rank's 0"
    lines = [json.loads(line) for line in (short_tmp / "ckpt" / "log.jsonl").read_text().splitlines()]
    burst = run_burst(exported_workload(), Config(parallel="ddp", world_size=2), steps=STEPS - 2,
                      options=BurstOptions(warmup_steps=2, device=cpu_device()))
    assert [line["loss"] for line in lines] == burst.losses(rank=0)  # equal, not close
    assert sorted(path.name for path in (short_tmp / "ckpt").glob("step_*")) == [f"step_{STEPS:08d}"]
    assert not gone(train_processes)


def _niceness(process: psutil.Process) -> int | None:
    with contextlib.suppress(psutil.Error):
        return process.nice()
    return None


def test_the_ray_train_driver_reads_the_scripts_knobs_and_refuses_what_cannot_run(tmp_path):
    config = Config(parallel="ddp", world_size=2, num_workers=2)
    script = export_script(REFERENCE, config, tmp_path / "train.py")
    text = export_ray_train(script, config, tmp_path / "ray_train.py", nnodes=3).read_text()
    assert "from train import CONFIG, WORKLOAD" in text  # the knobs stay in one file
    assert "WORKERS = 6 " in text and "default=3, help=\"CPUs per worker" in text  # 3 nodes x 2 ranks; 2 loaders + 1
    compile(text, "ray_train.py", "exec")
    with pytest.raises(ConfigError, match="trains in one process"):
        export_ray_train(script, Config(), tmp_path / "one.py", nnodes=2)
    with pytest.raises(ValueError, match="a Python module's"):
        export_ray_train(tmp_path / "my-train.py", config, tmp_path / "two.py")
    with pytest.raises(ValueError, match="nnodes=0"):
        export_ray_train(script, config, tmp_path / "three.py", nnodes=0)
