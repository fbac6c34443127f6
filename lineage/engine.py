"""Engines for the lineage store and the retry policy for concurrent writers.

SQLite: WAL (readers never block the writer), foreign keys on, a busy timeout, and
write transactions opened with BEGIN IMMEDIATE so that two writers queue on the
lock instead of both reading and then failing to upgrade to a write lock (which
SQLite reports as "database is locked" without waiting).
"""
from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 5
WRITE_OPTION = "baton_write"
MAX_ATTEMPTS = 12


def make_engine(url: str) -> Engine:
    from core.config.secrets import connectable

    # A `***` password (how a composed config holds one) means: libpq reads it from
    # PGPASSWORD, ~/.pgpass or PGPASSFILE.
    parsed = make_url(connectable(url))
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine)
        return engine
    connect_args = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Autocommit at the driver level so that the "begin" hook below decides how
        # each transaction starts (pysqlite would otherwise issue a deferred BEGIN).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def is_transient(exc: BaseException) -> bool:
    """Lock contention and serialization failures: safe to retry the whole transaction."""
    if isinstance(exc, IntegrityError):
        # Only the attempt-number race is retried; other integrity errors are real.
        return "attempt" in str(exc.orig)
    if isinstance(exc, OperationalError) and "locked" in str(exc.orig).lower():
        return True
    if isinstance(exc, DBAPIError):
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        return sqlstate in ("40001", "40P01")  # serialization failure, deadlock
    return False


def with_retries(fn: Callable[[], T], attempts: int = MAX_ATTEMPTS) -> T:
    """Run `fn` (one whole transaction) again on transient failures, with jittered backoff."""
    delay = 0.01
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except DBAPIError as exc:
            if attempt == attempts or not is_transient(exc):
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")
