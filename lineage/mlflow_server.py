"""The `mlflow server` command line for browsing a run's tracking store.

Bound to loopback only: the MLflow UI has no authentication.
"""
from __future__ import annotations

import sys
from pathlib import Path


def server_command(tracking_uri: str, artifact_root: str, port: int) -> list[str]:
    """`mlflow server` bound to loopback only: the UI has no authentication."""
    return [sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", tracking_uri,
            "--default-artifact-root", Path(artifact_root).resolve().as_uri(),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
