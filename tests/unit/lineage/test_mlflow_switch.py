"""`mlflow.enabled` picks the real MLflow view or a null object with the same verbs."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

from lineage.mlflow_bridge import MlflowLineage, NullMlflowLineage, mlflow_lineage


def _cfg(tmp_path, enabled):
    return SimpleNamespace(run=SimpleNamespace(dir=str(tmp_path), name="exp"),
                           mlflow=SimpleNamespace(enabled=enabled, tracking_uri=None))


def test_disabled_mlflow_gives_a_null_object_that_logs_nothing(tmp_path):
    view = mlflow_lineage(_cfg(tmp_path, False))
    assert isinstance(view, NullMlflowLineage)
    assert view.start_pipeline(object()) == ""
    assert view.log_checkpoint("", object(), None) == ""
    assert list(tmp_path.iterdir()) == []


def test_enabled_mlflow_points_at_the_run_dir_without_connecting(tmp_path):
    view = mlflow_lineage(_cfg(tmp_path, True))
    assert isinstance(view, MlflowLineage)
    assert (view.tracking_uri, view.artifact_root, view.experiment) == (
        f"sqlite:///{tmp_path}/mlflow.db", f"{tmp_path}/mlartifacts", "exp")
    assert list(tmp_path.iterdir()) == []


def test_the_null_object_has_every_public_verb_of_the_real_one():
    public = {n for n, _ in inspect.getmembers(MlflowLineage, inspect.isfunction)
              if not n.startswith("_") and n != "experiment_id"}
    assert public <= set(dir(NullMlflowLineage))
