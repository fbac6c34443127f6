"""The lineage schema's migrations: locate them, upgrade to head, refuse a newer schema.

Alembic's script directory is found from this file, not from the working directory:
Prefect workers run in temporary directories. Baton keeps its own version table so a
misconfigured URL can never move MLflow's or Prefect's schema.
"""
from __future__ import annotations

import contextlib
import fcntl
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

from lineage.errors import ForeignDatabase, SchemaAheadOfCode
from lineage.urls import safe_url, sqlite_path

SCRIPT_LOCATION = Path(__file__).resolve().parents[1] / "alembic"
VERSION_TABLE = "baton_alembic_version"
# Arbitrary constant naming baton's PostgreSQL advisory lock for migrations.
PG_MIGRATION_LOCK = 0x0BA7_0001


def alembic_config(connection: Optional[Connection] = None, url: Optional[str] = None):
    from alembic.config import Config
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def code_head() -> str:
    from alembic.script import ScriptDirectory
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@dataclass(frozen=True)
class SchemaState:
    url: str
    current: Optional[str]
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def verdict(self) -> str:
        """What the store needs: nothing, or `baton db upgrade` (empty or behind)."""
        if self.current is None:
            return "empty: run `baton db upgrade`"
        return "up to date" if self.up_to_date else "behind: run `baton db upgrade`"


def current_revision(connection: Connection) -> Optional[str]:
    from alembic.runtime.migration import MigrationContext
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    heads = context.get_current_heads()
    return heads[0] if heads else None


def check(connection: Connection, url: str) -> SchemaState:
    """The database's revision; raise if it is unknown to this code or not baton's."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    current = current_revision(connection)
    if current is None:
        tables = [t for t in inspect(connection).get_table_names() if t != VERSION_TABLE]
        if tables:
            raise ForeignDatabase(safe_url(url), tables)
    else:
        try:
            script.get_revision(current)
        except CommandError:
            raise SchemaAheadOfCode(safe_url(url), current, head) from None
    return SchemaState(safe_url(url), current, head)


def status(url: str) -> SchemaState:
    """The store's schema state without creating or migrating anything: a missing SQLite
    file or an unreachable server is an error, not an empty store."""
    from sqlalchemy.exc import DBAPIError

    from lineage.engine import make_engine
    from lineage.errors import StoreNotFound, StoreUnreachable
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise StoreNotFound(safe_url(url), str(path))
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return check(connection, url)
    except DBAPIError as exc:
        raise StoreUnreachable(safe_url(url), str(exc.orig).strip().splitlines()[0]) from None
    finally:
        engine.dispose()


def upgrade(engine: Engine, revision: str = "head") -> SchemaState:
    """Migrate to `revision` under a cross-process lock, so that 8 workers opening a
    fresh store at once run the migration exactly once."""
    from alembic import command
    url = engine.url.render_as_string(hide_password=False)
    with _migration_lock(engine) as connection:
        state = check(connection, url)
        if state.current != revision and not (revision == "head" and state.up_to_date):
            command.upgrade(alembic_config(connection), revision)
            connection.commit()
        return SchemaState(state.url, current_revision(connection), state.head)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command
    with _migration_lock(engine) as connection:
        command.downgrade(alembic_config(connection), revision)
        connection.commit()


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    path = sqlite_path(engine.url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{path}.migrate.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                with engine.connect() as connection:
                    yield connection
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    with engine.connect() as connection:
        is_pg = engine.dialect.name == "postgresql"
        if is_pg:
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_MIGRATION_LOCK})
            connection.commit()
        try:
            yield connection
        finally:
            if is_pg:
                connection.rollback()
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_MIGRATION_LOCK})
                connection.commit()
