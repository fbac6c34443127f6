"""Lineage of a baton pipeline: what ran, what it saved, what was handed on and why.

`LineageStore` records and queries it (SQLite or PostgreSQL, schema owned by Alembic);
`MlflowLineage` mirrors it into MLflow. Names are resolved lazily so that importing
`baton.commands.lineage` for `baton --help` does not import SQLAlchemy or MLflow.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "LineageStore": "lineage.store",
    "CandidateSpec": "lineage.store",
    "MlflowLineage": "lineage.mlflow_bridge",
    "NullMlflowLineage": "lineage.mlflow_bridge",
    "mlflow_lineage": "lineage.mlflow_bridge",
    "store_url": "lineage.urls",
    "mlflow_uri": "lineage.urls",
    "artifact_root": "lineage.urls",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lineage' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
