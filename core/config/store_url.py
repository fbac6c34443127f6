"""Whether `store.url` can name a lineage store, checked when the config is composed.

Lives with the config (not in lineage) so that validation needs nothing above core;
SQLAlchemy is imported only when a URL is actually set.
"""
from __future__ import annotations


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a lineage store URL (unparseable, unknown database, driver not
    installed), or None. Checked when the config is composed, so that no command gets as
    far as SQLAlchemy with it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    example = ("expected an SQLAlchemy database URL such as sqlite:////abs/path/lineage.db or "
               "postgresql+psycopg://user@127.0.0.1:5432/baton (or store.url=null for "
               "<run.dir>/lineage.db)")
    try:
        dialect = make_url(url).get_dialect()
    except NoSuchModuleError:  # a subclass of ArgumentError: test it first
        return f"unknown database or driver '{str(url).split(':', 1)[0]}'; {example}"
    except ArgumentError:
        return f"not a database URL; {example}"
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        return f"its database driver is not installed ({exc}); {example}"
    return None
