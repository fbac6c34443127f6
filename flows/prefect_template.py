"""A migrated, empty Prefect database that each run's ephemeral API starts from.

Without a Prefect server, every run home gets an ephemeral API of its own
(flows.prefect_env), and its fresh SQLite database is migrated when the server starts:
about 11 of the 17 s that start takes on 2 cores, before any stage runs. `python -m
flows.prefect_template` (run by `make install`) migrates one database once into the
virtual environment, under Prefect's version; a run home without a database starts from
a copy of it. Without a template for the installed Prefect (no `make install`, another
version), the server migrates the run's database itself, as before.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

DATABASE = "prefect.db"


def template_path() -> Path:
    return Path(sys.prefix) / "baton-prefect" / f"prefect-{version('prefect')}.db"


def seed_database(home: Path) -> bool:
    """Copy the template into `home` as its database, where there is a template and `home`
    has no database yet; whether it did. The copy is renamed into place, so a server never
    opens half of it."""
    target, template = Path(home) / DATABASE, template_path()
    if target.exists() or not template.is_file():
        return False
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(template, partial)
    os.replace(partial, target)
    return True


def main() -> int:
    """Migrate a database in a scratch home (Prefect's own server start-up does it), then
    keep a consistent one-file copy of it (SQLite's backup: the live file has a WAL)."""
    target = template_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="baton-prefect-") as scratch:
        os.environ["PREFECT_HOME"] = scratch
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        server.start()
        server.stop()
        partial = target.with_name(target.name + ".partial")
        source, copy = sqlite3.connect(Path(scratch) / DATABASE), sqlite3.connect(partial)
        try:
            source.backup(copy)
        finally:
            source.close()
            copy.close()
        os.replace(partial, target)
    print(f"baton: Prefect's database migrated once, for every run's ephemeral API: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
