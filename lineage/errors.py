"""Errors of the lineage store. Each carries the data a user needs to act on it.

Every URL in a message is rendered without its password (see `lineage.urls.safe_url`).
"""
from __future__ import annotations

from core.errors import BatonError


class LineageError(BatonError):
    """Base of every lineage-store error (exit code 2 in the CLI)."""


class UnknownRecord(LineageError):
    """An id or path that names no record of that kind."""

    def __init__(self, kind: str, key: object, url: str = "", hint: str = ""):
        self.kind, self.key, self.url = kind, key, url
        where = f" in {url}" if url else ""
        fix = f"; {hint}" if hint else ""
        super().__init__(f"no {kind} {key!r}{where}{fix}")


class StoreUnreachable(LineageError):
    """The database could not be connected to (server down, wrong host, bad file)."""

    def __init__(self, url: str, cause: str):
        self.url, self.cause = url, cause
        super().__init__(
            f"cannot reach the lineage store at {url}: {cause}; check that the database "
            "server is running and store.url is right (baton db current store.url=...)")


class StoreNotFound(LineageError):
    """A read-only command was pointed at a SQLite file that does not exist."""

    def __init__(self, url: str, path: str):
        self.url, self.path = url, path
        super().__init__(
            f"no lineage store at {path} ({url}); run `baton run run.dir=...` first, or point "
            "at an existing store with run.dir=... or store.url=...")


class SchemaAheadOfCode(LineageError):
    """The database was migrated by a newer baton than the one running."""

    def __init__(self, url: str, db_revision: str, code_head: str):
        self.url, self.db_revision, self.code_head = url, db_revision, code_head
        super().__init__(
            f"the lineage schema at {url} is at revision {db_revision!r}, which this baton does "
            f"not know (its newest is {code_head!r}); the database was written by a newer "
            "baton: upgrade baton (pip install -U baton) rather than downgrading the database")


class ForeignDatabase(LineageError):
    """The URL points at a database that holds someone else's tables (MLflow, Prefect)."""

    def __init__(self, url: str, tables: list[str]):
        self.url, self.tables = url, list(tables)
        shown = ", ".join(sorted(self.tables)[:8])
        super().__init__(
            f"the database at {url} already holds tables that are not baton's ({shown}) and has "
            "no baton_alembic_version table; the lineage store needs a database of its own "
            "(never share one with MLflow or Prefect): set store.url to an empty database")


class InvalidValue(LineageError):
    """A value passed to a store verb is outside what the schema accepts."""

    def __init__(self, key: str, value: object, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{key}={value!r}: expected {expected}")


class LineageConflict(LineageError):
    """A write contradicts what is already recorded (e.g. a handoff to another stage)."""

    def __init__(self, message: str):
        super().__init__(message)
