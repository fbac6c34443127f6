"""Where the lineage store and MLflow live for a composed config. Paths are absolute
because Prefect workers run in temporary directories."""
from __future__ import annotations

from pathlib import Path


def store_url(cfg) -> str:
    """`store.url`, or `sqlite:///<run.dir>/lineage.db` when it is null."""
    if cfg.store.url:
        return cfg.store.url
    return f"sqlite:///{Path(cfg.run.dir).resolve() / 'lineage.db'}"


def mlflow_uri(cfg) -> str:
    """`mlflow.tracking_uri`, or `sqlite:///<run.dir>/mlflow.db` (never lineage.db)."""
    if cfg.mlflow.tracking_uri:
        from baton.config.secrets import connectable
        # Without the `***` password: MLflow's clients read it from the environment.
        return connectable(cfg.mlflow.tracking_uri)
    return f"sqlite:///{Path(cfg.run.dir).resolve() / 'mlflow.db'}"


def artifact_root(cfg) -> str:
    """Absolute directory for MLflow artifacts: `<run.dir>/mlartifacts`."""
    return str(Path(cfg.run.dir).resolve() / "mlartifacts")


def safe_url(url) -> str:
    """The URL as text with any password masked, for every message and log line."""
    from baton.config.secrets import redact_url
    return str(redact_url(url))


def sqlite_path(url) -> Path | None:
    """The file behind a sqlite URL; None for other backends and in-memory databases."""
    from sqlalchemy.engine import make_url
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).resolve()


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
