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
        from core.config.secrets import connectable
        # Without the `***` password: MLflow's clients read it from the environment.
        return connectable(cfg.mlflow.tracking_uri)
    return f"sqlite:///{Path(cfg.run.dir).resolve() / 'mlflow.db'}"


def artifact_root(cfg) -> str:
    """Absolute directory for MLflow artifacts: `<run.dir>/mlartifacts`."""
    return str(Path(cfg.run.dir).resolve() / "mlartifacts")


def safe_url(url) -> str:
    """The URL as text with any password masked, for every message and log line."""
    from core.config.secrets import redact_url
    return str(redact_url(url))


def normalize_path(path: str | Path) -> str:
    """Local paths are stored absolute; URIs (s3://…) are kept as given."""
    text = str(path)
    return text if "://" in text else str(Path(text).expanduser().resolve())


def sqlite_path(url) -> Path | None:
    """The file behind a sqlite URL; None for other backends and in-memory databases."""
    from sqlalchemy.engine import make_url
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).resolve()
