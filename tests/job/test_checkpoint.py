"""Checkpoints: written through or never picked, the newest K kept, only resumed by as many ranks as wrote them, a
damaged one moved aside for the one before it, and a kill during a save harmless."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accel_widgets import Config
from accel_widgets.data.resume import DataPosition
from accel_widgets.job.checkpoint import Checkpoints, JobState, RankState, damage, restore_rng, rng_states
from accel_widgets.job.export import export_script
from tests.workloads import TinyNet

ROOT = Path(__file__).resolve().parents[2]


def save(checkpoints: Checkpoints, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    return checkpoints.save(step, model, optimizer, JobState(step, 1, None, None),
                            RankState(DataPosition(0, step, None), rng_states()))


def test_only_checkpoints_written_through_are_resumed_from_and_the_newest_k_are_kept(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    checkpoints = Checkpoints(tmp_path, keep=2, rank=0)
    for step in (3, 6, 9):
        save(checkpoints, step, model, optimizer)
    (tmp_path / ".step_00000012.tmp").mkdir()  # a save the job died in
    (tmp_path / "step_00000015").mkdir()  # a folder without DCP's metadata: never complete
    assert [path.name for path in checkpoints.complete()] == ["step_00000006", "step_00000009"]
    assert checkpoints.newest() == tmp_path / "step_00000009"

    fresh = TinyNet()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    job, mine = checkpoints.read_states(tmp_path / "step_00000009", ranks=1)
    checkpoints.load_training(tmp_path / "step_00000009", fresh, fresh_optimizer)
    assert job.step == 9 and mine.data == DataPosition(0, 9, None)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(),
                                                 strict=True))
    moments = [opt.state_dict()["state"][0]["exp_avg"] for opt in (fresh_optimizer, optimizer)]
    assert torch.equal(*moments)
    with pytest.raises(ValueError, match="written by 1 rank\\(s\\) and this job runs 2"):
        checkpoints.read_states(tmp_path / "step_00000009", ranks=2)


def test_every_generator_comes_back_where_it_was() -> None:
    import random

    import numpy as np

    states = rng_states()
    drawn = (torch.rand(3), random.random(), np.random.rand())
    torch.rand(7), random.random(), np.random.rand()
    restore_rng(states)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (drawn[0].tolist(), *drawn[1:])


# -- a job against damaged checkpoints and kills during its saves ------------------------------------------------
#: Runs jobs of ``tests.workloads:job_workload`` as children forked from one process that imported torch, DCP and
#: the package and ran nothing (so a fork is safe): each job starts in milliseconds instead of a new interpreter's
#: seconds, and can be killed at any moment. ``argv``: the scratch folder, the scenario, a seed.
JOBS = '''
import json, os, random, shutil, signal, sys, time
from pathlib import Path

import torch.distributed.checkpoint  # noqa: F401 -- imported here once: every job forked below starts at once

import tests.workloads  # noqa: F401
from accel_widgets import Config
from accel_widgets.job.checkpoint import damage
from accel_widgets.job.options import JobOptions
from accel_widgets.job.run import train

WHERE, SCENARIO, SEED = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])


def start(name, steps, directory=None, **options):
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        with open(WHERE / f"{name}.log", "w") as out:
            os.dup2(out.fileno(), 1)
            try:
                losses = train("tests.workloads:job_workload", Config(), JobOptions(
                    steps=steps, log_every=1, checkpoint_dir=str(directory) if directory else None, **options))
                result = {"losses": losses}
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
        (WHERE / f"{name}.json").write_text(json.dumps(result))
        code = 0
    finally:
        os._exit(code)


def run(name, steps, directory=None, **options):
    os.waitpid(start(name, steps, directory, **options), 0)
    return {**json.loads((WHERE / f"{name}.json").read_text()), "log": (WHERE / f"{name}.log").read_text()}


def corrupt(folder, kind):
    if kind == "garbage":  # every file overwritten, at its length, with the same bytes each run
        garbage = random.Random(SEED)
        for file in sorted(folder.iterdir()):
            file.write_bytes(garbage.randbytes(file.stat().st_size))
    elif kind == "truncated":
        data = folder / "__0_0.distcp"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    else:
        (folder / ".metadata").unlink()


if SCENARIO == "damaged":
    out = {"reference": run("reference", 10)["losses"], "cases": {}}
    base = WHERE / "base"
    run("base", 8, base, checkpoint_every=2, keep_checkpoints=4)
    for kind in ("garbage", "truncated", "no-metadata"):
        shutil.copytree(base, WHERE / kind)
        corrupt(WHERE / kind / "step_00000008", kind)
        result = run(kind, 10, WHERE / kind, resume=True, checkpoint_every=2, keep_checkpoints=4)
        out["cases"][kind] = {**result, "folders": sorted(p.name for p in (WHERE / kind).iterdir())}
else:
    steps, rng, directory = 40, random.Random(SEED), WHERE / "ckpt"
    out = {"reference": run("reference", steps)["losses"], "kills": []}

    def saves_begun():  # a save's hidden folder, told apart from a killed save's leftover of the same name
        found = os.scandir(directory) if directory.is_dir() else []
        return {(entry.name, entry.inode()) for entry in found if entry.name.endswith(".tmp")}

    for kill in range(10):
        leftovers, saves, seen = saves_begun(), rng.randint(1, 3), set()
        pid = start(f"killed{kill}", steps, directory, resume=True, checkpoint_every=1, keep_checkpoints=2)
        while len(seen) < saves and os.waitpid(pid, os.WNOHANG) == (0, 0):  # until the chosen save has begun
            seen |= saves_begun() - leftovers
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.01))  # a save takes 10-30 ms here
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        steps_now = [p for p in directory.iterdir() if p.name.startswith("step_")]
        out["kills"].append({"killed": os.waitstatus_to_exitcode(status) == -signal.SIGKILL,
                             "damaged": [p.name for p in steps_now if damage(p, 1) is not None],
                             "partial": sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))})
    final = run("final", steps, directory, resume=True, checkpoint_every=1, keep_checkpoints=2)
    out["final"] = final["losses"]
    out["logged"] = [json.loads(line) for line in (directory / "log.jsonl").read_text().splitlines()]
print(json.dumps(out))
'''


def run_jobs(where: Path, scenario: str, seed: int = 0) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(where), "ACCEL_WIDGETS_PRESTART": "0"}
    done = subprocess.run([sys.executable, "-c", JOBS, str(where), scenario, str(seed)], env=env, cwd=where,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_named_moved_aside_and_the_one_before_it_resumed_exactly(short_tmp: Path):
    """Checkpoints at steps 2, 4, 6, 8; the newest overwritten with garbage, truncated, or without its .metadata:
    --resume says which and why, keeps it as step_00000008.damaged, and steps 7-10 are the uninterrupted job's."""
    seen = run_jobs(short_tmp, "damaged")
    why = {"garbage": r"its \.metadata cannot be read \(\w+: .*\)",  # the unpickler's error
           "truncated": r"__0_0\.distcp is truncated \([\d,]+ of [\d,]+ bytes\)",
           "no-metadata": r"its \.metadata is missing"}
    for kind, case in seen["cases"].items():
        assert case.get("error") is None, case
        assert re.search(f"checkpoint step_00000008 is damaged: {why[kind]}.*moved aside to step_00000008.damaged "
                         r"\(kept\)", case["log"]), case["log"]
        assert all(line.isprintable() for line in case["log"].splitlines()), case["log"]
        assert "resumed from" in case["log"] and "step_00000006 at step 6" in case["log"]
        assert case["losses"] == seen["reference"][6:10], kind  # equal, not close
        assert "step_00000008.damaged" in case["folders"] and "step_00000010" in case["folders"]


def test_a_metadata_file_of_raw_bytes_is_named_in_printable_words(tmp_path: Path) -> None:
    """The unpickler's error quotes the bytes it choked on: the reason reaches the job's log without them raw."""
    (tmp_path / ".metadata").write_bytes(b"\x80\x04F\x1b[2J\xff\n.")  # a float opcode: its line, an escape, is quoted
    reason = damage(tmp_path, 1)
    assert reason is not None and reason.startswith("its .metadata cannot be read (") and reason.isprintable(), reason


def test_no_usable_checkpoint_ends_the_script_with_one_line_and_an_error_code(short_tmp: Path):
    script = export_script("tests.workloads:job_workload", Config(), short_tmp / "train.py")
    (short_tmp / "ckpt" / "step_00000004").mkdir(parents=True)  # a step's name without its .metadata
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(short_tmp)}
    done = subprocess.run([sys.executable, str(script), "--steps", "8", "--checkpoint-dir", "ckpt", "--resume"],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: --resume: no usable checkpoint in ckpt: step_00000004 (its .metadata is "
                                   "missing (the save was cut short, or the file was removed)). Moved aside "
                                   "(*.damaged, kept); start without --resume to train from step 0"), done.stderr
    assert (short_tmp / "ckpt" / "step_00000004.damaged").is_dir()


@pytest.mark.slow
def test_every_resume_after_a_kill_during_a_save_is_exact(short_tmp: Path):
    """A checkpoint every step, killed 10 times at random moments during a save: the checkpoints before each kill
    are intact, the partial one is only ever under its hidden name, and every step trained after each resume has
    the uninterrupted job's loss."""
    seed = int.from_bytes(os.urandom(2), "little")
    seen = run_jobs(short_tmp, "kills", seed)
    assert len(seen["kills"]) == 10 and all(kill["killed"] for kill in seen["kills"]), seed
    assert not [kill for kill in seen["kills"] if kill["damaged"]], (seed, seen["kills"])
    assert sum(bool(kill["partial"]) for kill in seen["kills"]) >= 3, (seed, seen["kills"])  # killed inside a save
    logged = [(record["step"], record["loss"]) for record in seen["logged"]]
    assert len(logged) > 40 and all(loss == seen["reference"][step - 1] for step, loss in logged), seed
    assert seen["final"] == seen["reference"][40 - len(seen["final"]):] and len(seen["final"]) < 40
