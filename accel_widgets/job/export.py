"""Beyond one machine: the chosen configuration as a ``torchrun`` training script that trains as the burst did.

A burst tells you which knobs help; a real job then runs for hours, maybe across machines. The
exported script holds the workload reference and every knob's value (each with its one-line what, to
edit), and trains through the very code a burst runs (:mod:`accel_widgets.job.run`): the same seed, weights,
data order and step, so its losses equal the burst's, step for step: there is no second copy of the loop to
drift from it. It is a real job: checkpoints, an exact ``--resume``, a clean stop on SIGTERM, evaluation, the
LR schedule, JSON and TensorBoard logs and the final model (:class:`~accel_widgets.job.options.JobOptions`).

The workload is ``module:function`` (returning an ``accel_widgets.Workload``); it is checked when the
script is written, and must be importable on every machine that runs it, as ``accel_widgets`` is.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..inputs.workload import load_workload
from ..knobs import KNOBS, data, parallel
from ..knobs.config import Config
from ..knobs.plan import portable_errors
from ..knobs.rules import ConfigError
from .options import argparse_lines

_TEMPLATE = '''"""Training script exported by accel_widgets for workload {workload_ref!r}.

Configuration: {label}

It trains through the same code a burst runs, so its losses equal the burst's step for step (same
seed, weights and data order). Edit the knob values below to change the job.

One machine, {nproc} process(es):
    torchrun --standalone --nproc-per-node {nproc} {name} --steps 1000 --checkpoint-dir ckpt --checkpoint-every 200
{multinode_block}After a stop (SIGTERM, preemption) or a crash, the same command with --resume carries on from the
newest checkpoint, exactly (one that is damaged is moved aside, said, and the one before it used); with
no checkpoint yet --resume starts at step 0, so pass it from the start and torchrun's restarts
(--max-restarts) carry on by themselves. Each log line is JSON (step, loss, lr,
samples_per_s, ...); the last line holds every loss this process trained.
"""

import argparse
import os

os.environ.setdefault("ACCEL_WIDGETS_PRESTART", "0")  # this process trains itself: no burst forkserver needed

from accel_widgets import Config  # noqa: E402
from accel_widgets.job.checkpoint import NoUsableCheckpoint  # noqa: E402
from accel_widgets.job.run import JobOptions, train  # noqa: E402

WORKLOAD = {workload_ref!r}
CONFIG = Config(
{knob_lines}
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
{flag_lines}
    try:
        options = JobOptions(**vars(parser.parse_args()))
    except ValueError as exc:  # a flag that makes no sense: said before anything starts
        parser.error(str(exc))
    try:
        train(WORKLOAD, CONFIG, options)
    except NoUsableCheckpoint as exc:  # one line, not a traceback: what is wrong is said, nothing to debug
        raise SystemExit(f"error: {{exc}}") from None
'''


def torchrun_command(script: str | os.PathLike[str], *, nproc_per_node: int, nnodes: int = 1,
                     endpoint: str = "HOST:29400", job_id: str = "accel-widgets") -> str:
    """The multi-machine launch line (c10d rendezvous: no extra service to run)."""
    return (f"torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint {endpoint} --rdzv-id {job_id} {Path(script).name}")


def export_script(workload_ref: str, config: Config, path: str | os.PathLike[str], *, nnodes: int = 2,
                  endpoint: str = "HOST:29400") -> Path:
    """Write the training script for ``config``; returns its path.

    ``workload_ref`` is ``module:function`` and is imported and called now (the current directory
    first, as ``python -m`` does), so a reference that names nothing fails here, not on the cluster.
    A config the rules refuse on every machine, or one the knobs cannot run with the workload's own DataLoader,
    raises :class:`ConfigError` and writes nothing; the script checks the rest on the machine it runs on.
    Directories of ``path`` that do not exist yet are created.
    """
    workload = load_workload(workload_ref)
    if parallel.single_process_multi_gpu(config):
        raise ConfigError("export_script writes a torchrun script; DataParallel is single-process legacy: "
                          "use parallel='ddp'")
    problems = portable_errors(config, workload)
    if problems:
        raise ConfigError(f"this config cannot run as a job: {' '.join(problems)}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)  # -o runs/today/train.py, as a user would type it
    nproc = parallel.ranks(config)
    multinode = ""
    if parallel.distributed(config):
        multinode = ("Several machines (run on each; HOST:PORT is reachable from all of them):\n    "
                     + torchrun_command(target, nproc_per_node=nproc, nnodes=nnodes, endpoint=endpoint) + "\n")
    target.write_text(_TEMPLATE.format(
        workload_ref=workload_ref, label=config.label(), nproc=nproc, name=target.name,
        multinode_block=multinode, knob_lines=_knob_lines(config), flag_lines="\n".join(argparse_lines()),
    ))
    return target


_SLURM_TEMPLATE = """#!/bin/bash
# Slurm batch file exported by accel_widgets: {script} on {nnodes} nodes, {nproc} process(es) each ({label}).
# One torchrun per node (srun starts them), numbered by Slurm's node id and meeting at the job's first node, whose
# torchrun holds the store (static rendezvous: no service to run, and no node fails leaving a rendezvous whose host
# has already gone, as c10d's can when the nodes finish together).
# Submit from the directory holding {script}: sbatch {name} [flags of the script, e.g. --steps 1000 --resume]
#SBATCH --job-name=accel-widgets
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
set -euo pipefail

HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
HEAD_PORT=${{RDZV_PORT:-{port}}}
export HEAD_NODE HEAD_PORT
# Single quotes: each node's task reads its own SLURM_NODEID.
srun bash -c 'exec torchrun --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --nproc-per-node {nproc} \\
    --master-addr "$HEAD_NODE" --master-port "$HEAD_PORT" {script} "$@"' torchrun "$@"
"""


def export_slurm(script: str | os.PathLike[str], config: Config, path: str | os.PathLike[str], *, nnodes: int = 2,
                 port: int = 29400) -> Path:
    """Write a Slurm batch file that runs the exported ``script`` (:func:`export_script`, of ``config``) under
    torchrun on ``nnodes`` nodes, ``config``'s ranks on each; returns its path.

    ``srun`` starts one torchrun per node; they meet at the job's first node, at ``port`` (``RDZV_PORT`` in the job's
    environment overrides it), and the script's own flags follow ``sbatch <file>``. The global ranks are nodes x the
    config's ranks, as torchrun numbers them, so a DDP config of one rank a node trains as a local burst of
    ``nnodes`` ranks does."""
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes={nnodes!r} is invalid: use an integer >= 1")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_SLURM_TEMPLATE.format(script=Path(script).name, nnodes=nnodes, nproc=parallel.ranks(config),
                                             label=config.label(), name=target.name, port=port))
    target.chmod(0o755)
    return target


_RAY_TRAIN_TEMPLATE = '''"""Ray Train job exported by accel_widgets: {script}'s config on {workers} worker(s) ({label}).

Ray Train's TorchTrainer starts the workers (one rank each, placed by its placement group), makes their process
group (gloo; NCCL with --use-gpu) and sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE as torchrun would; each
worker then runs {script}'s job: the loop a burst runs, its checkpoints, --resume and logs. The knobs are {script}'s
(edit them there); this file, {script}, the workload's module and --checkpoint-dir must be on a filesystem every
node sees, as for torchrun on several machines.

    python {name} --address auto --steps 1000 --checkpoint-dir ckpt --checkpoint-every 200 --resume

With --max-failures N Ray Train restarts the workers after a failure, up to N times, and --resume carries each
restart on from the newest checkpoint, exactly.
"""

import argparse
import os
import sys
from pathlib import Path

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

os.environ.setdefault("ACCEL_WIDGETS_PRESTART", "0")  # the workers train themselves: no burst forkserver needed
sys.path.insert(0, str(Path(__file__).resolve().parent))
from {module} import CONFIG, WORKLOAD  # noqa: E402 -- the exported torchrun script: the knobs live there

from accel_widgets.job.run import COLLECTIVE_TIMEOUT_S, JobOptions, train  # noqa: E402

WORKERS = {workers}  # nodes x the ranks the burst ran on one machine
RAY_FLAGS = ("address", "workers", "cpus_per_worker", "use_gpu", "max_failures", "storage_path")


def train_loop_per_worker(flags: dict) -> None:
    """One rank of the job, in the submitting directory (relative paths of the flags mean what they meant there)."""
    os.chdir(flags.pop("directory"))
    train(WORKLOAD, CONFIG, JobOptions(**flags))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
{flag_lines}
    parser.add_argument("--address", default=None, help="Ray cluster: auto, ray://HOST:10001, none (a new one)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="ranks in all, one Ray Train worker each")
    parser.add_argument("--cpus-per-worker", type=float, default={cpus}, help="CPUs per worker, loaders included")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL between them")
    parser.add_argument("--max-failures", type=int, default=0, help="restart the workers after a failure N times")
    parser.add_argument("--storage-path", default=None, help="Ray Train's run folder (default: ./ray_results)")
    flags = vars(parser.parse_args())
    settings = {{name: flags.pop(name) for name in RAY_FLAGS}}
    try:
        JobOptions(**flags)
    except ValueError as exc:  # a flag that makes no sense: said before any worker starts
        parser.error(str(exc))
    # The workers import what this process imports: Ray adds this directory to their path, and PYTHONPATH goes too.
    # They run at nice 0, as torchrun's ranks and the burst's did, not at the nice 15 Ray starts its workers at.
    env_vars = {{"RAY_worker_niceness": "0"}}
    if "PYTHONPATH" in os.environ:
        env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
    ray.init(address=settings["address"], runtime_env={{"env_vars": env_vars}})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={{**flags, "directory": os.getcwd()}},
        scaling_config=ScalingConfig(num_workers=settings["workers"], use_gpu=settings["use_gpu"],
                                     resources_per_worker={{"CPU": settings["cpus_per_worker"]}}),
        torch_config=TorchConfig(timeout_s=int(COLLECTIVE_TIMEOUT_S)),
        run_config=RunConfig(name="accel-widgets",
                             storage_path=settings["storage_path"] or os.path.abspath("ray_results"),
                             failure_config=FailureConfig(max_failures=settings["max_failures"])),
    )
    trainer.fit()
'''


def export_ray_train(script: str | os.PathLike[str], config: Config, path: str | os.PathLike[str], *,
                     nnodes: int = 2) -> Path:
    """Write a Ray Train driver that runs the exported ``script``'s job (:func:`export_script`, of ``config``) as a
    ``TorchTrainer`` of ``nnodes`` x ``config``'s ranks; returns its path.

    The knobs stay in ``script`` (the driver imports its ``CONFIG`` and ``WORKLOAD``); each Ray Train worker runs
    :func:`~accel_widgets.job.run.train` in the group Ray Train made, so a DDP config of one rank a node trains on two
    nodes as a local burst of two ranks does. Each worker reserves a CPU per loader worker and one for itself."""
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes={nnodes!r} is invalid: use an integer >= 1")
    if nnodes > 1 and not parallel.distributed(config):
        raise ConfigError(f"{config.label()} trains in one process: on {nnodes} nodes use parallel='ddp' or 'fsdp'")
    module = Path(script).stem
    if not module.isidentifier():
        raise ValueError(f"{Path(script).name}: the driver imports it, so its name must be a Python module's "
                         "(letters, digits, _)")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_RAY_TRAIN_TEMPLATE.format(
        script=Path(script).name, module=module, workers=nnodes * parallel.ranks(config), label=config.label(),
        name=target.name, cpus=1 + data.loader_workers(config), flag_lines="\n".join(argparse_lines())))
    return target


def _knob_lines(config: Config) -> str:
    """Every knob with its value and what it does: the knobs the burst changed first, then the defaults."""
    changed = config.diff()
    names = [*changed, *(name for name in KNOBS if name not in changed)]
    return "\n".join(f"    {name}={getattr(config, name)!r},  # {_first_sentence(KNOBS[name].what)}"
                     + ("" if name in changed else " (default)") for name in names)


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")
