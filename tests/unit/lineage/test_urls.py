"""Where the lineage store and MLflow live for a composed config."""
from __future__ import annotations

from types import SimpleNamespace

from lineage.urls import artifact_root, mlflow_uri, safe_url, sqlite_path, store_url


def _cfg(run_dir, store=None, tracking=None):
    return SimpleNamespace(run=SimpleNamespace(dir=str(run_dir)), store=SimpleNamespace(url=store),
                           mlflow=SimpleNamespace(tracking_uri=tracking, enabled=True))


def test_the_default_store_and_tracking_databases_are_separate_files_under_the_run_dir(tmp_path):
    cfg = _cfg(tmp_path)
    assert store_url(cfg) == f"sqlite:///{tmp_path}/lineage.db"
    assert mlflow_uri(cfg) == f"sqlite:///{tmp_path}/mlflow.db"
    assert artifact_root(cfg) == f"{tmp_path}/mlartifacts"


def test_configured_urls_win_over_the_defaults(tmp_path):
    cfg = _cfg(tmp_path, "postgresql+psycopg://u@db/lineage", "http://mlflow:5000")
    assert store_url(cfg) == "postgresql+psycopg://u@db/lineage"
    assert mlflow_uri(cfg) == "http://mlflow:5000"


def test_the_composed_config_points_at_an_absolute_run_dir(tmp_path, monkeypatch):
    from core.config import compose
    monkeypatch.chdir(tmp_path)
    cfg = compose(["run.dir=rel/run"])
    assert store_url(cfg) == f"sqlite:///{tmp_path}/rel/run/lineage.db"


def test_printed_urls_never_show_a_password():
    assert safe_url("postgresql+psycopg://baton:pa55@db:5432/lineage") == \
        "postgresql+psycopg://baton:***@db:5432/lineage"
    assert safe_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_only_file_backed_sqlite_urls_have_a_path(tmp_path):
    assert sqlite_path(f"sqlite:///{tmp_path}/a.db") == tmp_path / "a.db"
    assert sqlite_path("sqlite://") is None
    assert sqlite_path("postgresql+psycopg://u@h/d") is None
