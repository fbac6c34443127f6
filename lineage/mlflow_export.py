"""Register an exported Hugging Face directory as a version of an MLflow registered model.

The version's source is the export directory itself (nothing is copied into MLflow's
artifact store, as with checkpoints) and its run is the stage run that trained the
weights, so MLflow's UI links the version to that run's metrics and parameters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from core.errors import BatonError


class RegistrationFailed(BatonError):
    def __init__(self, name: str, tracking_uri: str, cause: str):
        self.name, self.tracking_uri = name, tracking_uri
        super().__init__(f"could not register model {name!r} in MLflow at {tracking_uri}: {cause}")


def register_export(bridge, name: str, export_dir: str | Path, run_id: Optional[str],
                    tags: Mapping[str, str]):
    """Create `name` if needed and add a version pointing at `export_dir`; return it."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

    from lineage.urls import safe_url

    client = bridge.client
    try:
        try:
            client.create_registered_model(name, tags={"baton.kind": "export"})
        except MlflowException as exc:
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
        return client.create_model_version(
            name, source=Path(export_dir).resolve().as_uri(), run_id=run_id,
            tags={k: str(v) for k, v in tags.items()},
            description=f"baton export of {tags.get('baton.checkpoint.path', export_dir)}")
    except MlflowException as exc:
        raise RegistrationFailed(name, safe_url(bridge.tracking_uri),
                                 str(exc).strip().splitlines()[0]) from None
