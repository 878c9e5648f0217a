"""Run history: every burst kept in one SQLite file, so a kernel restart or a second notebook loses nothing.

Why SQLite (the stdlib ``sqlite3``): one embedded file that any SQLite tool can open, atomic transactions,
and several processes writing at once without corrupting it. The file runs in WAL mode (a crash mid-write
leaves the last committed state, readers never block the writer) with a busy timeout, and every write is
one ``BEGIN IMMEDIATE`` transaction, which takes the write lock up front, so a second writer waits its turn
instead of failing halfway.

A file this process cannot write (a history shared read-only, or in a directory it cannot write) is opened
read-only: its runs can be listed and loaded, and recording into it raises :class:`HistoryError` saying so.

A file is only ever written once it is known to be ours (``PRAGMA application_id`` plus a ``meta`` table
naming this application and its format version) or is new/empty. Anything else (not SQLite, another
application's database, a newer format, damage found by ``PRAGMA quick_check``) raises
:class:`HistoryError` naming the file, and its bytes are left exactly as they were: a mistyped path must
never destroy someone's data.

Runs are grouped by :func:`workload_fingerprint`, a digest of what makes two runs comparable, so the panel
can reload the earlier runs of the workload it is tuning. Measurements that cost bursts and belong to the
workload rather than to one run (the guard's noise band) are kept per fingerprint too, in a ``measurements``
table created on first use: older versions, which do not know it, read the file as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..data.fingerprint import FingerprintError, dataset_fingerprint, length_of
from ..inputs.workload import Workload
from ..knobs import facts
from ..knobs.config import Config
from .burst import BurstResult

DEFAULT_HISTORY_FILE = "accel_widgets_history.sqlite"
#: Environment variable naming the history file when ``RunHistory()`` is given no path.
HISTORY_ENV = "ACCEL_WIDGETS_HISTORY"
#: ``PRAGMA application_id`` of our files ("AWHI" in ASCII): tells them from other SQLite files without a query.
APPLICATION_ID = 0x41574849
#: Bumped when the schema or the stored results change; a file of a newer format is refused rather than misread,
#: and one of an older format is brought up to date (:data:`_UPGRADES`): in place where this process may write
#: it, row by row as it is read where it may not.
FORMAT_VERSION = 4
#: How long a write waits for another process's transaction before giving up with a HistoryError.
BUSY_TIMEOUT_S = 10.0

_APPLICATION = "accel_widgets"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        workload TEXT NOT NULL,
        label TEXT NOT NULL,
        status TEXT NOT NULL,
        samples_per_s REAL,
        config_json TEXT NOT NULL,
        result_json TEXT NOT NULL,
        environment_json TEXT NOT NULL,
        tags_json TEXT NOT NULL
    )""",
    "CREATE INDEX runs_by_fingerprint ON runs (fingerprint, id)",
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {FORMAT_VERSION}",
)
#: Created on first use rather than with the file, so files written before it existed need no new format.
_MEASUREMENTS = """CREATE TABLE IF NOT EXISTS measurements (
    fingerprint TEXT NOT NULL,
    key TEXT NOT NULL,
    created_at TEXT NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY (fingerprint, key)
)"""
_ANOTHER_PATH = f"Pass another path to RunHistory() or set ${HISTORY_ENV}."
_DAMAGED = ("Move it aside to start a new history there (`sqlite3 FILE .recover` can save its runs), or pass "
            f"another path to RunHistory() or set ${HISTORY_ENV}.")
_COLUMNS = "id, created_at, fingerprint, workload, label, status, samples_per_s, result_json, tags_json"


class HistoryError(RuntimeError):
    """The history file cannot be used (corrupt, foreign, newer, locked, closed); the message names the file
    and what to do about it."""


@dataclass(frozen=True)
class StoredRun:
    """One recorded burst. ``label`` is the result's label, or its config's label when it has none (what
    tables show); ``created_at`` is the UTC time it was recorded, in ISO 8601."""

    id: int
    created_at: str
    fingerprint: str
    workload: str
    label: str
    status: str
    samples_per_s: float | None
    result: BurstResult
    tags: dict[str, str]


# -- fingerprints ------------------------------------------------------------------------------------------


def workload_fingerprint(workload: Workload) -> str:
    """Hex digest of what makes two runs comparable, so runs from another session can be found again.

    It covers the model's architecture and initial weights (class, ``repr`` and every ``state_dict`` entry's
    name, shape, dtype and bytes; a factory is built under the workload seed as a burst builds it), the
    dataset (:func:`~accel_widgets.data.fingerprint.dataset_fingerprint`, with its limits), the names of
    ``loss_fn``, ``optimizer`` and ``collate_fn``, ``batch_size``, ``seed`` and ``name``.

    Limits: callables are identified by module and qualified name only, so two lambdas defined in one function
    (say, two learning rates) look the same: give such workloads different names. A dataset that cannot be
    pickled (it holds a lock or an open file) is identified by its class and length only.

    A ``scheduler`` is covered by its name too. A ``data_seed`` other than ``seed`` is covered too (the data order
    differs); the usual one, none, leaves the digest as it was before data seeds existed.
    """
    parts = {
        "name": workload.name,
        "seed": workload.seed,
        **({"data_seed": workload.data_seed} if workload.data_seed not in (None, workload.seed) else {}),
        "batch_size": workload.batch_size,
        "model": _model_digest(_initial_model(workload)),
        "dataset": _dataset_digest(workload.dataset),
        "loss_fn": _qualname(workload.loss_fn),
        "optimizer": _qualname(workload.optimizer),
        "collate_fn": _qualname(workload.collate_fn),
        # A schedule changes what is trained; a workload without one keeps the digest it had before schedules.
        **({"scheduler": _qualname(workload.scheduler)} if workload.scheduler is not None else {}),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _initial_model(workload: Workload) -> nn.Module:
    """The model a burst starts from; ``fork_rng`` keeps a factory's seeding off the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        return workload.build_model()


def _model_digest(model: nn.Module) -> str:
    """Architecture and weights, hashed tensor by tensor so no second copy of the weights is made."""
    digest = hashlib.sha256(f"{_qualname(type(model))}\n{model!r}".encode())
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):  # a module's get_extra_state() may return anything
            digest.update(f"{name}={value!r}".encode())
            continue
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # bytes: numpy has no bfloat16
    return digest.hexdigest()


def _dataset_digest(dataset: Any) -> str:
    """The data cache's own fingerprint; a dataset that does not pickle falls back to its class and length."""
    try:
        return dataset_fingerprint(dataset)
    except FingerprintError:
        return f"unpicklable {_qualname(type(dataset))} len={length_of(dataset)}"


def _qualname(obj: Any) -> str:
    """``module.qualname`` of a function or class; other objects (a partial, a loss module) by their type."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', None)}.{named.__qualname__}"


# -- the file ----------------------------------------------------------------------------------------------


class RunHistory:
    """Recorded bursts in the SQLite file at ``path``: ``$ACCEL_WIDGETS_HISTORY``, else
    ``./accel_widgets_history.sqlite``, when not given. A missing or empty file is created.

    One connection per instance, shared by threads under a lock, so the panel's background thread can record
    while the kernel reads. Other processes may use the same file at the same time. ``read_only`` is True for
    an existing file that this process may not write (the file or its directory): it is read, never written.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = _resolve_path(path)
        self._lock = threading.Lock()
        self.read_only = _read_only(self.path)
        self._conn: sqlite3.Connection | None
        self._conn, self._format = _open(self.path, self.read_only)  # the format its rows are stored in

    def record(self, result: BurstResult, *, fingerprint: str, tags: Mapping[str, str] | None = None) -> int:
        """Store ``result`` under ``fingerprint`` (see :func:`workload_fingerprint`); returns its run id."""
        tags = dict(tags or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
            raise TypeError(f"tags must map str to str, got {tags!r}")
        data = result.to_dict()  # JSON-safe: NaN losses are spelled as strings
        row = (
            datetime.now(timezone.utc).isoformat(), fingerprint, result.workload,
            result.label or result.config.label(), result.status, result.samples_per_s,
            json.dumps(data["config"], sort_keys=True), json.dumps(data), json.dumps(data["environment"]),
            json.dumps(tags, sort_keys=True),
        )
        with self._connection("recording a run in", write=True) as conn, _transaction(conn):
            cursor = conn.execute(
                "INSERT INTO runs (created_at, fingerprint, workload, label, status, samples_per_s, config_json,"
                " result_json, environment_json, tags_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        run_id = cursor.lastrowid
        assert run_id is not None  # set by every INSERT
        return run_id

    def runs(self, *, fingerprint: str | None = None, workload: str | None = None,
             limit: int | None = None) -> list[StoredRun]:
        """Stored runs, newest first (by id, i.e. commit order), optionally only one fingerprint or workload."""
        filters = {"fingerprint": fingerprint, "workload": workload}
        where = [(f"{column} = ?", value) for column, value in filters.items() if value is not None]
        sql = f"SELECT {_COLUMNS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(clause for clause, _ in where)
        params: list[Any] = [value for _, value in where]
        sql += " ORDER BY id DESC"
        if limit is not None:
            if limit < 0:
                raise ValueError(f"limit must be >= 0 or None, got {limit}")
            sql += " LIMIT ?"
            params.append(limit)
        with self._connection("reading runs from") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [_stored_run(self.path, row, self._format) for row in rows]

    def get(self, run_id: int) -> StoredRun:
        """The run with id ``run_id``; KeyError if there is none."""
        with self._connection("reading a run from") as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id} in {self.path}")
        return _stored_run(self.path, row, self._format)

    def delete(self, run_id: int) -> None:
        """Remove one run; KeyError if there is none."""
        with self._connection("deleting a run from", write=True) as conn, _transaction(conn):
            deleted = conn.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount
        if not deleted:
            raise KeyError(f"no run {run_id} in {self.path}")

    def save_measurement(self, fingerprint: str, key: str, value: Mapping[str, Any]) -> None:
        """Keep ``value`` (JSON data) as measurement ``key`` of the workload ``fingerprint``, replacing an older one.

        For what is measured once per workload and would cost bursts to measure again in another session.
        """
        row = (fingerprint, key, datetime.now(timezone.utc).isoformat(), json.dumps(dict(value), sort_keys=True))
        with self._connection("saving a measurement in", write=True) as conn, _transaction(conn):
            conn.execute(_MEASUREMENTS)
            conn.execute("INSERT OR REPLACE INTO measurements (fingerprint, key, created_at, value_json) "
                         "VALUES (?, ?, ?, ?)", row)

    def measurement(self, fingerprint: str, key: str) -> dict[str, Any] | None:
        """The value saved by :meth:`save_measurement`, or ``None`` (also in a file without measurements yet)."""
        with self._connection("reading a measurement from") as conn:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'measurements'").fetchone() is None:
                return None
            row = conn.execute("SELECT value_json FROM measurements WHERE fingerprint = ? AND key = ?",
                               (fingerprint, key)).fetchone()
        return None if row is None else json.loads(row[0])

    def close(self) -> None:
        """Close the connection (idempotent); the last one to close folds the WAL back into the file."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RunHistory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunHistory({str(self.path)!r})"

    @contextlib.contextmanager
    def _connection(self, doing: str, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection, held under the lock, with sqlite errors turned into HistoryError."""
        if write and self.read_only:
            raise HistoryError(
                f"{doing} {self.path}: this process may not write that file or its directory, so the history is "
                f"open read-only (its runs can be listed and loaded, not added to). To record runs, pass a writable "
                f"path to RunHistory() or set ${HISTORY_ENV} to one.")
        with self._lock, _sqlite_errors(self.path, doing):
            if self._conn is None:
                raise HistoryError(f"{self!r} is closed; open a new RunHistory on {self.path}")
            yield self._conn


def _resolve_path(path: str | os.PathLike[str] | None) -> Path:
    """The explicit path, else ``$ACCEL_WIDGETS_HISTORY``, else the default file in the working directory;
    made absolute now so error messages name the file even after a ``chdir``."""
    chosen = path if path is not None else os.environ.get(HISTORY_ENV) or DEFAULT_HISTORY_FILE
    return Path(chosen).expanduser().absolute()


def _read_only(path: Path) -> bool:
    """Whether ``path`` is an existing file this process may read but not write: the file itself, or its directory
    (SQLite keeps its journal and WAL index next to the file)."""
    return path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def _open(path: Path, read_only: bool) -> tuple[sqlite3.Connection, int]:
    """A connection to a checked (and, if new and writable, initialised; if older and writable, upgraded) history
    file, and the format its rows are stored in."""
    _refuse_non_sqlite(path)
    with _sqlite_errors(path, "opening"):
        if read_only:
            conn = sqlite3.connect(_read_only_uri(path), uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
        else:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    try:
        with _sqlite_errors(path, "opening"):
            if read_only:
                return conn, _check_read_only(conn, path)
            _prepare_when_free(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn, FORMAT_VERSION


def _read_only_uri(path: Path) -> str:
    """SQLite's read-only URI for ``path``. A WAL file is read through its ``-shm`` index, which a reader creates
    when it may write the directory; where it may not and none exists, the file is opened ``immutable`` (read as it
    is on disk: nobody is writing it then, since every writer leaves the index behind while it works)."""
    shm = path.with_name(path.name + "-shm")
    immutable = not os.access(path.parent, os.W_OK) and not shm.exists()
    return f"{path.as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")


def _check_read_only(conn: sqlite3.Connection, path: Path) -> int:
    """The read-only file must already be a history of ours, undamaged: there is nothing to create in it.
    Returns its format."""
    version = _inspect_snapshot(conn, path)
    if version == "new":
        raise HistoryError(f"{path} is empty and this process may not write it: there is no run history to read. "
                           f"{_ANOTHER_PATH}")
    _check_integrity(conn, path)
    return version


def _prepare_when_free(conn: sqlite3.Connection, path: Path) -> None:
    """Prepare the file, retrying while another process holds it, up to the busy timeout.

    SQLite answers some lock conflicts at once instead of waiting (switching a new file to WAL while
    another connection opens it; a lock upgrade it judges a deadlock), so two notebooks opening one
    history together must retry here rather than rely on the busy handler alone.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            _prepare(conn, path)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            time.sleep(0.05)


def _refuse_non_sqlite(path: Path) -> None:
    """Refuse a directory, or a non-empty file without the SQLite header, before SQLite touches it at all."""
    if path.is_dir():
        raise HistoryError(f"{path} is a directory, not a run history file: pass a file path such as "
                           f"{path / DEFAULT_HISTORY_FILE} to RunHistory(), or set ${HISTORY_ENV} to one.")
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
        if head and head != _SQLITE_MAGIC:
            raise HistoryError(f"{path} is not an SQLite file, so not a run history; it was left untouched. "
                               f"{_ANOTHER_PATH}")


def _prepare(conn: sqlite3.Connection, path: Path) -> None:
    """Check the file read-only first; only then switch to WAL and, for a new file, create the schema; an older
    format is brought up to date."""
    state = _inspect_snapshot(conn, path)
    if state != "new":
        _check_integrity(conn, path)
    conn.execute("PRAGMA journal_mode=WAL")
    if state == "new":
        _create_schema(conn, path)
    elif state < FORMAT_VERSION:
        _upgrade(conn, path)


def _with_facts(result: dict[str, Any]) -> dict[str, Any]:
    """Format 1 to 2: a result recorded before the knob owners' facts were stored with it gets them from the same
    owners, as its config and environment say the run went."""
    if result.get("facts") is not None:
        return result
    environment = result.get("environment") or {}
    found = facts(Config.from_dict(result["config"]), str(environment.get("device_kind", "cpu")),
                  len(environment.get("gpus", ())))
    return {**result, "facts": dataclasses.asdict(found)}


def _before_compile_reports(result: dict[str, Any]) -> dict[str, Any]:
    """Format 2 to 3: ranks record what torch.compile did (``compile_report``). A result stored before has no record
    to recover, and reads as not recorded (None) as it is; the new format is what makes an older accel_widgets refuse
    a file holding compile reports, which it could not read, rather than fail on one."""
    return result


def _before_headspace(result: dict[str, Any]) -> dict[str, Any]:
    """Format 3 to 4: a result says which part of its step a headspace burst made free (``freed``). Every result stored
    before trained its config as it is; the new format makes an older accel_widgets refuse a file holding the field
    rather than fail on it."""
    return {**result, "freed": result.get("freed")}


#: What brings a stored result from each older format to the next.
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _with_facts, 2: _before_compile_reports,
                                                                    3: _before_headspace}


def _upgraded(result: dict[str, Any], version: int) -> dict[str, Any]:
    for step in range(version, FORMAT_VERSION):
        result = _UPGRADES[step](result)
    return result


def _upgrade(conn: sqlite3.Connection, path: Path) -> None:
    """Rewrite every stored result in the current format, in one transaction (checked again under the lock)."""
    with _transaction(conn):
        version = _inspect(conn, path)
        if version == "new" or version >= FORMAT_VERSION:
            return
        rows = conn.execute("SELECT id, result_json FROM runs").fetchall()
        conn.executemany("UPDATE runs SET result_json = ? WHERE id = ?",
                         [(json.dumps(_upgraded(json.loads(text), version)), run_id) for run_id, text in rows])
        conn.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (str(FORMAT_VERSION),))
        conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")


def _create_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Initialise a new file, unless another process did so since we looked (checked again under the lock)."""
    with _transaction(conn):
        if _inspect(conn, path) == "new":
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("application", _APPLICATION), ("application_id", str(APPLICATION_ID)),
                ("format_version", str(FORMAT_VERSION))])


def _inspect_snapshot(conn: sqlite3.Connection, path: Path) -> Literal["new"] | int:
    """:func:`_inspect` on one snapshot of the file. Its reads are separate statements: outside a transaction,
    another process creating the schema between them would read as "tables, but not our application id", and a
    new history opened by two notebooks at once would be refused as another application's."""
    conn.execute("BEGIN")
    try:
        return _inspect(conn, path)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")  # a read transaction: nothing to write


def _inspect(conn: sqlite3.Connection, path: Path) -> Literal["new"] | int:
    """``"new"`` for an empty database, the format version of a history we read; HistoryError otherwise."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")]
    if app_id == 0 and not tables:
        return "new"
    if app_id != APPLICATION_ID or "meta" not in tables:
        raise HistoryError(
            f"{path} is an SQLite database of another application (application_id {app_id}, "
            f"tables: {', '.join(sorted(tables)) or 'none'}), not a run history; it was left untouched. "
            f"{_ANOTHER_PATH}")
    version = dict(conn.execute("SELECT key, value FROM meta")).get("format_version", "")
    if not (version.isdigit() and 1 <= int(version) <= FORMAT_VERSION):
        newer = version.isdigit() and int(version) > FORMAT_VERSION
        why = "was written by a newer accel_widgets; upgrade accel_widgets or" if newer else "is not one we know;"
        raise HistoryError(f"{path} has run history format {version!r} (this version reads 1 to {FORMAT_VERSION}) "
                           f"and {why} pass another path to RunHistory(); the file was left untouched.")
    return int(version)


def _check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged file before writing to it: writes could spread the damage and lose more runs."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        found = "; ".join("\n".join(problems).splitlines()[:4])
        raise HistoryError(f"{path} is damaged (PRAGMA quick_check: {found}); it was left untouched. {_DAMAGED}")


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One atomic write. IMMEDIATE takes the write lock at BEGIN, so a concurrent writer waits (busy timeout)
    instead of failing at its first write with a lock it cannot upgrade."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def _sqlite_errors(path: Path, doing: str) -> Iterator[None]:
    """Turn ``sqlite3`` errors into HistoryError naming the file and what to do."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            raise HistoryError(
                f"{doing} {path}: the file stayed locked by another process for {BUSY_TIMEOUT_S:g} s ({exc}); "
                "wait for the other notebook's burst to be recorded, or close its RunHistory, and retry") from exc
        raise HistoryError(f"{doing} {path} failed ({exc}); check that it is a writable file in an existing "
                           "directory, or pass another path to RunHistory()") from exc
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{doing} {path} failed: the file is damaged or not a run history ({exc}); it was "
                           f"left untouched. {_DAMAGED}") from exc


def _stored_run(path: Path, row: tuple[Any, ...], version: int) -> StoredRun:
    """A row as a StoredRun (stored in format ``version``); a row that no longer parses is named so it can be
    deleted."""
    run_id, created_at, fingerprint, workload, label, status, samples_per_s, result_json, tags_json = row
    try:
        result = BurstResult.from_dict(_upgraded(json.loads(result_json), version))
        tags = json.loads(tags_json)
    except (ValueError, TypeError, KeyError) as exc:
        raise HistoryError(f"run {run_id} in {path} cannot be read back ({exc}); "
                           f"remove it with RunHistory({str(path)!r}).delete({run_id})") from exc
    return StoredRun(run_id, created_at, fingerprint, workload, label, status, samples_per_s, result, tags)
