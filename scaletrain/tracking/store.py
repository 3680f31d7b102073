"""The run store: every training run, its config, environment, per-epoch metrics, system samples
and summary, in one embedded SQLite file (default ./scaletrain-runs/runs.db).

Many processes write to one store at once (parallel trials, sweep points, the ranks of nothing
else: only a run's chief writes). SQLite serialises writers with a file lock; WAL journaling lets
readers go on while one writes, and every write is one short `BEGIN IMMEDIATE` transaction, so a
writer waits for the lock (up to `timeout_s`) instead of failing, and a crash mid-write rolls
back to the last committed state. WAL needs a local file system (not NFS).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.errors import UserError

DEFAULT_STORE = Path("scaletrain-runs") / "runs.db"
SCHEMA_VERSION = 1
STATUSES = ("running", "finished", "failed", "pruned", "interrupted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    status TEXT NOT NULL,
    group_name TEXT,
    name TEXT,
    run_dir TEXT,
    host TEXT,
    pid INTEGER,
    config TEXT,
    environment TEXT,
    summary TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS runs_group ON runs (group_name, created_at);
CREATE TABLE IF NOT EXISTS epochs (
    run_id TEXT NOT NULL REFERENCES runs (id),
    epoch INTEGER NOT NULL,
    elapsed_s REAL NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (run_id, epoch)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT NOT NULL REFERENCES runs (id),
    elapsed_s REAL NOT NULL,
    rss_bytes INTEGER,
    cpu_percent REAL,
    gpu_memory_bytes INTEGER,
    gpu_util_percent REAL
);
CREATE INDEX IF NOT EXISTS samples_run ON samples (run_id, elapsed_s);
CREATE TABLE IF NOT EXISTS evaluations (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step INTEGER NOT NULL,
    epoch REAL NOT NULL,
    evaluated_at REAL NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
"""


def new_run_id() -> str:
    """Eight hex digits: short enough to type, and any unique prefix of it works too."""
    return uuid.uuid4().hex[:8]


def _dumps(value) -> str | None:
    return None if value is None else json.dumps(value, default=float)


def _loads(text: str | None):
    return None if text is None else json.loads(text)


@dataclass(slots=True)
class RunRecord:
    id: str
    created_at: float
    updated_at: float
    status: str
    group: str | None
    name: str | None
    run_dir: str | None
    host: str | None
    pid: int | None
    config: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    summary: dict | None = None
    error: str | None = None

    @property
    def display_status(self) -> str:
        """'running' for a run whose process is gone (killed, out of memory) reads 'died'."""
        if self.status == "running" and self.host == socket.gethostname() and self.pid and not process_alive(self.pid):
            return "died"
        return self.status

    def summary_value(self, key: str, default=None):
        return (self.summary or {}).get(key, default)


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(slots=True)
class Sample:
    elapsed_s: float
    rss_bytes: int | None = None
    cpu_percent: float | None = None
    gpu_memory_bytes: int | None = None
    gpu_util_percent: float | None = None


def _is_locked(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_BUSY and SQLITE_LOCKED: another connection holds the lock."""
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _use_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switches the file to WAL journaling (a setting kept in the file), waiting for other openers.

    SQLite answers `journal_mode = WAL` with SQLITE_BUSY at once, without calling the busy
    handler, while another connection is switching the same new file (two `multi` trainings
    opening a fresh store together: 3 of 11 runs of that test failed), so the wait is ours.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


class RunStore:
    """One SQLite run store. Opening creates the file (and its folder) unless `create=False`."""

    def __init__(self, path: str | Path = DEFAULT_STORE, create: bool = True, timeout_s: float = 60.0):
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise UserError(f"no run store at {self.path}; train a run first (it creates the store) "
                                "or pass --store PATH")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif self.path.is_dir():
            raise UserError(f"run store {self.path} is a folder; pass the path of the SQLite file (e.g. "
                            f"{self.path / 'runs.db'})")
        self.timeout_s = timeout_s
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            _use_wal(self._conn, timeout_s)
            # In WAL mode NORMAL still never corrupts the database (a crashed process loses nothing
            # committed; only a power cut can drop the last transactions) and skips an fsync per
            # commit: the epoch-end write of a 20 ms epoch costs ~0.3 ms instead of ~2 ms.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            with self._write() as conn:
                # Statement by statement: executescript would COMMIT the open transaction first.
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(statement)
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as exc:
            if _is_locked(exc):
                raise UserError(f"run store {self.path} stayed locked by another process for {timeout_s:g} s; "
                                "wait for it to finish or point --store at another file") from None
            raise UserError(f"run store {self.path} is not a readable SQLite database ({exc}); "
                            "point --store at another file or move this one away") from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _write(self):
        # A write that a signal cut short between its BEGIN and the `with` body (where no
        # rollback runs) left its transaction open; the next write, often the interrupted run's
        # own "interrupted", would fail on it ("cannot start a transaction within a transaction").
        # Every write here is one `_write`, so an open transaction is always such a leftover.
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        # BEGIN IMMEDIATE takes the write lock up front, so two writers never deadlock upgrading
        # read locks; busy_timeout makes the second one wait.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # -- writing ------------------------------------------------------------------------------

    def start_run(self, run_id: str, *, name: str | None = None, group: str | None = None,
                  run_dir: str | None = None, config: dict | None = None, environment: dict | None = None) -> None:
        """Creates the run, or re-opens it (a resumed run keeps its id and its earlier epochs)."""
        now = time.time()
        with self._write() as conn:
            conn.execute(
                """INSERT INTO runs (id, created_at, updated_at, status, group_name, name, run_dir, host, pid,
                                     config, environment)
                   VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at, status = 'running',
                       host = excluded.host, pid = excluded.pid, config = excluded.config,
                       environment = excluded.environment, error = NULL""",
                (run_id, now, now, group, name, run_dir, socket.gethostname(), os.getpid(),
                 _dumps(config), _dumps(environment)))

    def continue_run(self, run_id: str, from_epoch: int) -> float:
        """A resumed run: drops the epochs it will train again (from `from_epoch` on) and returns
        the wall time its record reaches so far, from which its new elapsed times continue."""
        with self._write() as conn:
            reached = conn.execute(
                "SELECT MAX(t) FROM (SELECT MAX(elapsed_s) AS t FROM epochs WHERE run_id = ? "
                "UNION ALL SELECT MAX(elapsed_s) FROM samples WHERE run_id = ?)", (run_id, run_id)).fetchone()[0]
            conn.execute("DELETE FROM epochs WHERE run_id = ? AND epoch >= ?", (run_id, from_epoch))
        return float(reached or 0.0)

    def exists(self, run_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None

    def log_epoch(self, run_id: str, epoch: int, elapsed_s: float, metrics: dict,
                  samples: list[Sample] = ()) -> None:
        """One epoch's metrics (and the system samples taken since the last call), one transaction."""
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO epochs VALUES (?, ?, ?, ?)",
                         (run_id, epoch, elapsed_s, _dumps(metrics)))
            conn.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (time.time(), run_id))
            self._insert_samples(conn, run_id, samples)

    def log_evaluation(self, run_id: str, step: int, epoch: float, metrics: dict) -> None:
        """A sidecar evaluator's result for the checkpoint at global step `step`."""
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?, ?)",
                         (run_id, step, epoch, time.time(), _dumps(metrics)))

    def log_samples(self, run_id: str, samples: list[Sample]) -> None:
        if samples:
            with self._write() as conn:
                self._insert_samples(conn, run_id, samples)

    @staticmethod
    def _insert_samples(conn, run_id: str, samples) -> None:
        conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?)",
                         [(run_id, s.elapsed_s, s.rss_bytes, s.cpu_percent, s.gpu_memory_bytes,
                           s.gpu_util_percent) for s in samples])

    def finish_run(self, run_id: str, status: str, summary: dict | None = None, error: str | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}")
        with self._write() as conn:
            conn.execute("UPDATE runs SET status = ?, updated_at = ?, summary = COALESCE(?, summary), error = ? "
                         "WHERE id = ?", (status, time.time(), _dumps(summary), error, run_id))

    def record_failure(self, run_id: str, error: str, *, name: str | None = None, group: str | None = None,
                       config: dict | None = None) -> None:
        """Marks a run failed from outside it (its process died before it could say so, or before
        it had started): a sweep or tune parent calls this with the exit code and the last lines."""
        now = time.time()
        with self._write() as conn:
            conn.execute(
                """INSERT INTO runs (id, created_at, updated_at, status, group_name, name, config, error)
                   VALUES (?, ?, ?, 'failed', ?, ?, ?, ?)
                   ON CONFLICT (id) DO UPDATE SET status = 'failed', updated_at = excluded.updated_at,
                       error = excluded.error""",
                (run_id, now, now, group, name, _dumps(config), error))

    def set_chosen(self, group: str, run_id: str) -> None:
        """Records `run_id` as the run an experiment picked among its group's (autotune's winner,
        starred in `runs report`); a resumed experiment may pick again."""
        with self._write() as conn:
            conn.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                         (f"chosen:{group}", run_id))

    # -- reading ------------------------------------------------------------------------------

    def chosen(self, group: str | None) -> str | None:
        """The run an experiment picked among `group`'s runs (set_chosen), if any."""
        if group is None:
            return None
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (f"chosen:{group}",)).fetchone()
        return row[0] if row else None

    _COLUMNS = ("id, created_at, updated_at, status, group_name, name, run_dir, host, pid, config, environment, "
                "summary, error")

    @staticmethod
    def _record(row) -> RunRecord:
        return RunRecord(id=row[0], created_at=row[1], updated_at=row[2], status=row[3], group=row[4], name=row[5],
                         run_dir=row[6], host=row[7], pid=row[8], config=_loads(row[9]) or {},
                         environment=_loads(row[10]) or {}, summary=_loads(row[11]), error=row[12])

    def runs(self, group: str | None = None, limit: int | None = None) -> list[RunRecord]:
        """Runs, oldest first (the newest `limit` of them when a limit is given)."""
        query = f"SELECT {self._COLUMNS} FROM runs"
        params: list = []
        if group is not None:
            query += " WHERE group_name = ?"
            params.append(group)
        query += " ORDER BY created_at DESC, id DESC"
        if limit is not None:
            query += " LIMIT ?"
            params.append(limit)
        return [self._record(r) for r in reversed(self._conn.execute(query, params).fetchall())]

    def resolve(self, run_id: str) -> str:
        """The full id of the run that `run_id` names (the whole id or a unique prefix of it)."""
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
            return run_id   # an exact id always works, whatever characters it holds
        if not run_id:
            raise UserError("an empty run id; `scaletrain runs list` shows the ids")
        # A prefix match without LIKE: no character of the prefix is a wildcard.
        rows = self._conn.execute("SELECT id FROM runs WHERE substr(id, 1, ?) = ? ORDER BY id",
                                  (len(run_id), run_id)).fetchall()
        if not rows:
            raise UserError(f"no run '{run_id}' in {self.path}; `scaletrain runs list --store {self.path}` shows the "
                            "ids")
        if len(rows) > 1 and rows[0][0] != run_id:
            ids = ", ".join(r[0] for r in rows[:5])
            raise UserError(f"run id prefix '{run_id}' is ambiguous ({ids}{', ...' if len(rows) > 5 else ''}); "
                            "type more of it")
        return rows[0][0]

    def get(self, run_id: str) -> RunRecord:
        full = self.resolve(run_id)
        row = self._conn.execute(f"SELECT {self._COLUMNS} FROM runs WHERE id = ?", (full,)).fetchone()
        return self._record(row)

    def epochs(self, run_id: str) -> list[dict]:
        """Per-epoch metrics, each with its `epoch` and `elapsed_s` (wall time since the run began)."""
        rows = self._conn.execute("SELECT epoch, elapsed_s, metrics FROM epochs WHERE run_id = ? ORDER BY epoch",
                                  (run_id,)).fetchall()
        return [{**json.loads(m), "epoch": e, "elapsed_s": t} for e, t, m in rows]

    def samples(self, run_id: str) -> list[Sample]:
        rows = self._conn.execute("SELECT elapsed_s, rss_bytes, cpu_percent, gpu_memory_bytes, gpu_util_percent "
                                  "FROM samples WHERE run_id = ? ORDER BY elapsed_s", (run_id,)).fetchall()
        return [Sample(*r) for r in rows]

    def evaluations(self, run_id: str) -> list[dict]:
        rows = self._conn.execute("SELECT step, epoch, evaluated_at, metrics FROM evaluations WHERE run_id = ? "
                                  "ORDER BY step", (run_id,)).fetchall()
        return [{"step": step, "epoch": epoch, "evaluated_at": at, **_loads(metrics)}
                for step, epoch, at, metrics in rows]
