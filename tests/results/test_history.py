"""Run history: runs survive a restart and concurrent writers; files that are not ours are refused untouched."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import accel_widgets.results.history as history
from accel_widgets import Config, StepRecord, Workload
from accel_widgets.results.burst import ErrorInfo
from accel_widgets.results.history import (
    APPLICATION_ID,
    DEFAULT_HISTORY_FILE,
    FORMAT_VERSION,
    HistoryError,
    RunHistory,
    workload_fingerprint,
)
from tests.results.test_burst import compiled_result, make_result
from tests.workloads import LockedDataset, TinyNet, tensors, tiny_workload

# Records 50 runs once told to start, so two copies write at the same moment (the file is created then too).
WRITER = """
import sys
from accel_widgets import BurstResult, Config
from accel_widgets.results.burst import RankSummary
from accel_widgets.results.history import RunHistory

path, who = sys.argv[1], sys.argv[2]
result = BurstResult(workload=who, config=Config(), status="ok",
                     ranks=[RankSummary(0, 96, 0.3, 1, "rss", 0.1, 0.2, "cpu")])
print("ready", flush=True)
sys.stdin.readline()
with RunHistory(path) as runs:
    for i in range(50):
        runs.record(result, fingerprint=who, tags={"i": str(i)})
"""


def failed_result():
    """A failed burst with a diverged (NaN) loss: the hardest case for an exact round trip."""
    steps = [StepRecord(0, 0, 0.1, 0.0, 0.0, 0.1, 0.1, 32, loss=1.5),
             StepRecord(0, 1, 0.2, 0.0, 0.0, 0.1, 0.1, 32, loss=float("nan"))]
    return make_result(workload="other", steps=steps, ranks=[], status="failed", label="bf16 try",
                       config=Config(precision="bf16"), error=ErrorInfo("exception", "ValueError: x", 0, "tb"),
                       environment={"torch": "2.13.0", "cpus": 4})


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def raw(path: Path) -> sqlite3.Connection:
    """A plain connection, as another tool would open the file."""
    return sqlite3.connect(path, isolation_level=None)


# -- recording and reading back ------------------------------------------------------------------------


def test_runs_survive_a_restart_exactly(tmp_path):
    path = tmp_path / "h.sqlite"
    originals = [make_result(), failed_result()]
    with RunHistory(path) as runs:
        ids = [runs.record(originals[0], fingerprint="fp-a", tags={"rung": "0"}),
               runs.record(originals[1], fingerprint="fp-b")]
    with RunHistory(path) as runs:  # a new kernel
        stored = runs.runs()
    assert [s.id for s in stored] == ids[::-1]  # newest first
    for run, original in zip(stored[::-1], originals, strict=True):
        assert run.result.to_dict() == original.to_dict()
        assert run.result.samples_per_s == original.samples_per_s == run.samples_per_s
        assert run.result.config == original.config
        assert run.result.step_times() == original.step_times()
        assert run.result.steps[0] == original.steps[0]
        assert run.result.error == original.error
        assert (run.workload, run.status) == (original.workload, original.status)
        assert datetime.fromisoformat(run.created_at).utcoffset() == timezone.utc.utcoffset(None)
    assert math.isnan(stored[0].result.losses()[1])
    assert [s.label for s in stored] == ["bf16 try", "compile_mode=default"]  # a result's own label first
    assert [s.tags for s in stored] == [{}, {"rung": "0"}]
    assert [s.fingerprint for s in stored] == ["fp-b", "fp-a"]


def test_filters_limit_get_and_delete(tmp_path):
    with RunHistory(tmp_path / "h.sqlite") as runs:
        a1 = runs.record(make_result(workload="w1"), fingerprint="a")
        b1 = runs.record(make_result(workload="w2"), fingerprint="b")
        a2 = runs.record(make_result(workload="w2"), fingerprint="a")
        assert [r.id for r in runs.runs(fingerprint="a")] == [a2, a1]
        assert [r.id for r in runs.runs(workload="w2")] == [a2, b1]
        assert [r.id for r in runs.runs(fingerprint="a", workload="w2")] == [a2]
        assert [r.id for r in runs.runs(limit=2)] == [a2, b1]
        assert runs.runs(fingerprint="none") == [] and runs.runs(limit=0) == []
        assert runs.get(b1).workload == "w2"
        runs.delete(b1)
        assert [r.id for r in runs.runs()] == [a2, a1]
        with pytest.raises(KeyError, match=f"no run {b1}"):
            runs.get(b1)
        with pytest.raises(KeyError):
            runs.delete(b1)
        assert runs.record(make_result(), fingerprint="c") > a2  # ids are never reused
        with pytest.raises(ValueError, match="limit"):
            runs.runs(limit=-1)
        with pytest.raises(TypeError, match="tags"):
            runs.record(make_result(), fingerprint="a", tags={"n": 1})


def test_default_path_is_the_environment_then_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(history.HISTORY_ENV, raising=False)
    with RunHistory() as runs:
        assert runs.path == tmp_path / DEFAULT_HISTORY_FILE
    monkeypatch.setenv(history.HISTORY_ENV, str(tmp_path / "elsewhere.sqlite"))
    with RunHistory() as runs:
        assert runs.path == tmp_path / "elsewhere.sqlite"
    assert (tmp_path / "elsewhere.sqlite").exists()


def test_file_is_marked_as_ours_and_uses_wal(tmp_path):
    path = tmp_path / "h.sqlite"
    path.touch()  # an empty file is a new history
    with RunHistory(path) as runs:
        runs.record(make_result(), fingerprint="a")
        other = raw(path)  # a second reader sees the committed run while the writer is still open
        try:
            assert other.execute("SELECT count(*) FROM runs").fetchone() == (1,)
            assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert other.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
            assert other.execute("PRAGMA user_version").fetchone() == (FORMAT_VERSION,)
            meta = dict(other.execute("SELECT key, value FROM meta"))
            indexes = {row[0] for row in other.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        finally:
            other.close()
    assert meta["application"] == "accel_widgets" and meta["format_version"] == str(FORMAT_VERSION)
    assert "runs_by_fingerprint" in indexes


def test_compile_reports_survive_and_a_format_2_file_is_brought_to_format_3(tmp_path):
    """Format 3 stores what torch.compile did; a format-2 file's runs have no record of it and read as before."""
    path = tmp_path / "h.sqlite"
    with RunHistory(path) as runs:
        runs.record(make_result(), fingerprint="a")
    conn = raw(path)
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'format_version'")
    conn.execute("PRAGMA user_version = 2")
    conn.close()
    with RunHistory(path) as runs:
        runs.record(compiled_result(), fingerprint="a")
        old, new = runs.runs()[::-1]
    assert old.result.compile_report is None and old.result.to_dict() == make_result().to_dict()
    assert new.result.compile_report == compiled_result().compile_report
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (FORMAT_VERSION,) == (4,)
    conn.close()


def test_a_format_3_file_reads_every_run_as_its_config_as_it_is(tmp_path):
    """Format 4 says which part of a step a headspace burst made free; a format-3 file's runs trained their configs
    as they are, and a data-free burst recorded now keeps its part."""
    path = tmp_path / "h.sqlite"
    with RunHistory(path) as runs:
        runs.record(make_result(), fingerprint="a")
    conn = raw(path)
    conn.execute("UPDATE runs SET result_json = json_remove(result_json, '$.freed')")
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'format_version'")
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    with RunHistory(path) as runs:
        runs.record(dataclasses.replace(make_result(), freed="data"), fingerprint="a")
        old, new = runs.runs()[::-1]
    assert old.result.freed is None and old.result.to_dict() == make_result().to_dict()
    assert new.result.freed == "data"


def test_closed_history_says_so(tmp_path):
    runs = RunHistory(tmp_path / "h.sqlite")
    runs.close()
    runs.close()
    with pytest.raises(HistoryError, match="is closed"):
        runs.runs()


def test_unreadable_row_names_the_run_to_delete(tmp_path):
    path = tmp_path / "h.sqlite"
    with RunHistory(path) as runs:
        run_id = runs.record(make_result(), fingerprint="a")
        other = raw(path)
        other.execute("UPDATE runs SET result_json = '{' WHERE id = ?", (run_id,))
        other.close()
        with pytest.raises(HistoryError, match=rf"run {run_id} in .*delete\({run_id}\)"):
            runs.runs()
        runs.delete(run_id)
        assert runs.runs() == []


# -- read-only ---------------------------------------------------------------------------------------
NOBODY = 65534


def as_reader_without_write_access(path: Path, read: Callable[[Path], Any], *, directory_writable: bool) -> Any:
    """``read(path)`` as a user who may read ``path`` but not write it (nor its directory, unless
    ``directory_writable``).

    Root writes any file whatever its mode, so as root the read runs in a forked child that has become
    ``nobody`` (the directory made traversable, or writable, for it); otherwise the file (and the directory)
    are made read-only for the duration. What ``read`` returns (or raises) comes back pickled.
    """
    if os.geteuid() != 0:
        modes = path.stat().st_mode, path.parent.stat().st_mode
        path.chmod(0o444)
        if not directory_writable:
            path.parent.chmod(0o555)
        try:
            return read(path)
        finally:
            path.parent.chmod(modes[1])
            path.chmod(modes[0])
    path.parent.chmod(0o777 if directory_writable else 0o755)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(reader)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                outcome: tuple[str, Any] = ("value", read(path))
            except Exception as exc:
                outcome = ("error", exc)
            with os.fdopen(writer, "wb") as out:
                pickle.dump(outcome, out)
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as received:
        data = received.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value


def listed_and_refused(path: Path) -> tuple[bool, list[str], str, str]:
    """Open ``path``, list its runs, read one, then try to record: (read_only, labels, one label, the error)."""
    with RunHistory(path) as runs:
        listed = runs.runs()
        one = runs.get(listed[-1].id).label
        try:
            runs.record(make_result(), fingerprint="a")
            refused = ""
        except HistoryError as exc:
            refused = str(exc)
        return runs.read_only, [run.label for run in listed], one, refused


@pytest.mark.parametrize("directory_writable", [False, True], ids=["read-only directory", "read-only file"])
def test_a_history_shared_read_only_can_be_listed_and_says_why_it_cannot_record(short_tmp: Path,
                                                                                directory_writable: bool) -> None:
    path = short_tmp / "shared.sqlite"
    with RunHistory(path) as runs:
        runs.record(make_result(label="first"), fingerprint="a")
        runs.record(make_result(label="second"), fingerprint="a")
    before = digest(path)
    read_only, labels, one, refused = as_reader_without_write_access(path, listed_and_refused,
                                                                     directory_writable=directory_writable)
    assert read_only and labels == ["second", "first"] and one == "first"
    assert refused == (f"recording a run in {path}: this process may not write that file or its directory, so the "
                       "history is open read-only (its runs can be listed and loaded, not added to). To record runs, "
                       "pass a writable path to RunHistory() or set $ACCEL_WIDGETS_HISTORY to one.")
    assert digest(path) == before
    with RunHistory(path) as runs:  # its owner still writes it
        assert not runs.read_only and len(runs.runs()) == 2


# -- concurrency -------------------------------------------------------------------------------------


def test_two_processes_write_at_once(tmp_path):
    path = tmp_path / "h.sqlite"
    env = {**os.environ, "ACCEL_WIDGETS_PRESTART": "0"}  # writers run no burst: no forkserver to start
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"writer{k}"], text=True, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for k in range(2)]
    try:
        for writer in writers:
            assert writer.stdout.readline() == "ready\n"
        for writer in writers:
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            writer.communicate(timeout=120)
            assert writer.returncode == 0
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    check = raw(path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        check.close()
    with RunHistory(path) as runs:
        stored = runs.runs()
    assert len(stored) == len({s.id for s in stored}) == 100
    assert [len([s for s in stored if s.fingerprint == f"writer{k}"]) for k in range(2)] == [50, 50]


def test_two_threads_share_one_history(tmp_path):
    with RunHistory(tmp_path / "h.sqlite") as runs:
        errors: list[BaseException] = []

        def write(fingerprint: str) -> None:
            try:
                for _ in range(25):
                    runs.record(make_result(), fingerprint=fingerprint)
            except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(f"t{k}",)) for k in range(2)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            assert len(runs.runs(limit=5)) <= 5  # the kernel reads while the panel's thread records
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(runs.runs()) == 50


def test_locked_file_gives_a_history_error_not_a_hang(tmp_path, monkeypatch):
    path = tmp_path / "h.sqlite"
    monkeypatch.setattr(history, "BUSY_TIMEOUT_S", 0.2)
    with RunHistory(path) as runs:
        other = raw(path)
        other.execute("BEGIN IMMEDIATE")  # another notebook mid-write
        try:
            with pytest.raises(HistoryError, match="locked by another process"):
                runs.record(make_result(), fingerprint="a")
        finally:
            other.execute("ROLLBACK")
            other.close()
        runs.record(make_result(), fingerprint="a")  # the failed write left no transaction open
        assert len(runs.runs()) == 1


# -- files that are not ours ------------------------------------------------------------------------------


def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _sqlite_header_then_garbage(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))


def _foreign_database(path: Path) -> None:
    conn = raw(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('precious')")
    conn.close()


def _history_with_runs(path: Path) -> None:
    with RunHistory(path) as runs:
        for i in range(30):
            runs.record(make_result(), fingerprint=f"fp{i}")


def _truncated_history(path: Path) -> None:
    _history_with_runs(path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _damaged_index(path: Path) -> None:
    """Garbage in the fingerprint index's page: only an integrity check finds it (plain reads still work)."""
    _history_with_runs(path)
    conn = raw(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs_by_fingerprint'").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size + 8)
        f.write(b"\xff" * 64)


def _newer_format(path: Path) -> None:
    _history_with_runs(path)
    conn = raw(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (str(FORMAT_VERSION + 1),))
    conn.execute(f"PRAGMA user_version = {FORMAT_VERSION + 1}")
    conn.close()


@pytest.mark.parametrize(("make", "message"), [
    (_random_bytes, "not an SQLite file"),
    (_sqlite_header_then_garbage, "damaged or not a run history"),
    (_foreign_database, r"another application \(application_id 0, tables: notes\)"),
    (_truncated_history, "damaged"),
    (_damaged_index, "PRAGMA quick_check"),
    (_newer_format, "newer accel_widgets"),
])
def test_files_that_are_not_ours_are_refused_untouched(tmp_path, make, message):
    path = tmp_path / "h.sqlite"
    make(path)
    before, listing = digest(path), sorted(os.listdir(tmp_path))
    with pytest.raises(HistoryError, match=message) as error:
        RunHistory(path)
    assert str(path) in str(error.value) and "untouched" in str(error.value)
    assert digest(path) == before
    assert sorted(os.listdir(tmp_path)) == listing  # no -wal/-shm left behind either


def test_a_directory_is_refused_with_a_history_error_naming_a_file_to_use(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(HistoryError) as error:
        RunHistory(tmp_path)
    assert str(error.value) == (f"{tmp_path} is a directory, not a run history file: pass a file path such as "
                                f"{tmp_path / DEFAULT_HISTORY_FILE} to RunHistory(), or set $ACCEL_WIDGETS_HISTORY "
                                "to one.")
    assert os.listdir(tmp_path) == ["notes.txt"]


# -- workload fingerprints ---------------------------------------------------------------------------------


SHARED_DATA = TensorDataset(*tensors())


def _workload(**overrides) -> Workload:
    fields = dict(model=TinyNet, dataset=SHARED_DATA, loss_fn=F.cross_entropy, batch_size=32, name="tiny")
    fields.update(overrides)
    return Workload(**fields)


def _seeded_net(seed: int) -> TinyNet:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TinyNet()


def test_fingerprint_is_stable_for_the_same_workload():
    fingerprint = workload_fingerprint(_workload())
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    assert workload_fingerprint(_workload()) == fingerprint  # the factory is rebuilt: same seed, same weights
    # an instance with the weights the factory makes under seed 0 is the same starting point
    assert workload_fingerprint(_workload(model=_seeded_net(0))) == fingerprint
    assert workload_fingerprint(_workload(model=_seeded_net(1))) == workload_fingerprint(
        _workload(model=_seeded_net(1)))


def test_fingerprint_changes_with_what_makes_runs_incomparable():
    base = workload_fingerprint(_workload())
    other_data = TensorDataset(*tensors(seed=1))
    relu = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    gelu = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    gelu.load_state_dict(relu.state_dict())
    variants = [
        _workload(model=_seeded_net(1)),  # other initial weights
        _workload(seed=1),  # a factory under another seed
        _workload(dataset=other_data),
        _workload(name="tiny2"),
        _workload(loss_fn=F.nll_loss),
        _workload(optimizer=lambda params: torch.optim.SGD(params, lr=0.1)),
        _workload(batch_size=64),
    ]
    fingerprints = [base, *(workload_fingerprint(w) for w in variants)]
    assert len(set(fingerprints)) == len(fingerprints)
    # same weights, another architecture
    assert workload_fingerprint(_workload(model=relu)) != workload_fingerprint(_workload(model=gelu))


def test_fingerprint_does_not_move_the_callers_rng():
    state = torch.get_rng_state()
    workload_fingerprint(_workload())
    assert torch.equal(torch.get_rng_state(), state)


def test_fingerprint_handles_buffers_bfloat16_and_extra_state():
    class WithExtraState(nn.Module):
        def __init__(self, note: str) -> None:
            super().__init__()
            self.norm = nn.BatchNorm1d(4).to(torch.bfloat16)  # 0-dim num_batches_tracked buffer too
            self.note = note

        def get_extra_state(self) -> dict[str, str]:
            return {"note": self.note}

        def set_extra_state(self, state: dict[str, str]) -> None:
            self.note = state["note"]

    assert workload_fingerprint(_workload(model=WithExtraState("a"))) == workload_fingerprint(
        _workload(model=WithExtraState("a")))
    assert workload_fingerprint(_workload(model=WithExtraState("a"))) != workload_fingerprint(
        _workload(model=WithExtraState("b")))


def test_unpicklable_dataset_falls_back_to_class_and_length():
    locked = workload_fingerprint(_workload(dataset=LockedDataset()))
    assert locked == workload_fingerprint(_workload(dataset=LockedDataset()))  # documented: class + length only
    assert locked != workload_fingerprint(_workload())


def test_fingerprint_survives_rebuilding_the_dataset():
    assert workload_fingerprint(tiny_workload()) == workload_fingerprint(tiny_workload())
