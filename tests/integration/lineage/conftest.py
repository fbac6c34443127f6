"""Fixtures of the lineage integration tests: real SQLite files, a real PostgreSQL
database per test (created on 127.0.0.1:5432 and dropped afterwards), a real MLflow
tracking store, and a four-stage lineage (CPT→SFT, SFT→RM, SFT→RL, RM→RL)."""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

PG_HOST, PG_PORT, PG_ROLE = "127.0.0.1", 5432, "postgres"
HERE = Path(__file__).resolve().parent
# Helper modules next to this file must be importable by name, also from the
# processes that multiprocessing's spawn starts (they inherit sys.path).
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _admin_connection():
    import psycopg
    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_ROLE, dbname="postgres",
                           autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def postgres_available() -> bool:
    try:
        _admin_connection().close()
    except Exception as exc:  # any failure means: no server to test against
        pytest.skip(f"PostgreSQL not reachable on {PG_HOST}:{PG_PORT} as {PG_ROLE}: {exc}")
    return True


@pytest.fixture
def pg_url(postgres_available) -> str:
    """A fresh, uniquely named database, dropped after the test."""
    name = f"baton_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with _admin_connection() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://{PG_ROLE}@{PG_HOST}:{PG_PORT}/{name}"
    with _admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lineage.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url):
    from lineage.store import LineageStore
    with LineageStore.open(db_url) as opened:
        yield opened


@pytest.fixture(scope="session")
def four_stage_run(tmp_path_factory):
    """One pipeline recorded through the store and mirrored in MLflow, on SQLite under
    a run dir so that `baton lineage … run.dir=<dir>` finds it."""
    from lineage.mlflow_bridge import MlflowLineage
    from lineage.store import LineageStore
    from lineage_four_stage import build_four_stage
    run_dir = tmp_path_factory.mktemp("run")
    mlf = MlflowLineage(f"sqlite:///{run_dir / 'mlflow.db'}", str(run_dir / "mlartifacts"))
    with LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}") as opened:
        ids = build_four_stage(opened, run_dir, mlf)
    return run_dir, mlf, ids
