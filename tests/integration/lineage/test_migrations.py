"""Alembic owns the lineage schema: up and down from empty, no drift from the models,
its own version table, and refusal of databases it must not touch."""
from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from lineage import schema
from lineage.engine import make_engine
from lineage.errors import ForeignDatabase, SchemaAheadOfCode, StoreUnreachable
from lineage.models import Base
from lineage.store import LineageStore

LINEAGE_TABLES = {"pipeline_runs", "stage_runs", "checkpoints", "handoffs",
                  "handoff_candidates", "events", "journal_segments", "studies",
                  "study_candidates"}


@pytest.fixture
def engine(db_url):
    made = make_engine(db_url)
    yield made
    made.dispose()


def _tables(engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_upgrade_from_empty_then_downgrade_to_base_leaves_only_the_version_table(engine):
    assert _tables(engine) == set()
    state = schema.upgrade(engine)
    assert state.current == state.head == schema.code_head()
    assert _tables(engine) == LINEAGE_TABLES | {"baton_alembic_version"}
    schema.downgrade(engine, "base")
    assert _tables(engine) == {"baton_alembic_version"}
    assert schema.upgrade(engine).up_to_date


def test_the_migrations_match_the_models_exactly(engine):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    schema.upgrade(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table": schema.VERSION_TABLE, "compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models and migrations drifted; autogenerate a revision: {diff}"


def test_the_version_table_is_batons_own_and_never_alembic_version(engine):
    schema.upgrade(engine)
    assert "alembic_version" not in _tables(engine)
    with engine.connect() as connection:
        version = connection.execute(text("SELECT version_num FROM baton_alembic_version")).scalar()
    assert version == schema.code_head()


def test_a_schema_newer_than_the_code_is_refused_with_the_fix(db_url, engine):
    schema.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE baton_alembic_version SET version_num = 'f00dcafe9999'"))
    with pytest.raises(SchemaAheadOfCode) as info:
        LineageStore.open(db_url)
    message = str(info.value)
    assert "revision 'f00dcafe9999'" in message
    assert f"its newest is '{schema.code_head()}'" in message
    assert "upgrade baton" in message
    assert (info.value.db_revision, info.value.code_head) == ("f00dcafe9999", schema.code_head())


def test_a_database_holding_another_tools_tables_is_refused(db_url, engine):
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY)"))
        connection.execute(text("CREATE TABLE runs (run_uuid VARCHAR(32) PRIMARY KEY)"))
    with pytest.raises(ForeignDatabase, match=r"holds tables that are not baton's "
                                              r"\(experiments, runs\).*never share one with "
                                              r"MLflow or Prefect"):
        LineageStore.open(db_url)
    assert _tables(engine) == {"experiments", "runs"}


def test_an_unreachable_server_is_reported_without_the_password():
    url = "postgresql+psycopg://baton:s3cret-pw@127.0.0.1:1/lineage"
    with pytest.raises(StoreUnreachable) as info:
        LineageStore.open(url)
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert "cannot reach the lineage store at postgresql+psycopg://baton:***@127.0.0.1:1/lineage" \
        in message
    assert "check that the database server is running" in message
    assert info.value.url == "postgresql+psycopg://baton:***@127.0.0.1:1/lineage"


def test_an_unwritable_sqlite_location_is_reported_as_unreachable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    # The parent "directory" is a plain file, so SQLite cannot create the database.
    with pytest.raises(StoreUnreachable) as info:
        LineageStore.open(f"sqlite:///{blocker / 'lineage.db'}")
    assert f"cannot reach the lineage store at sqlite:///{blocker / 'lineage.db'}: " in str(info.value)
    assert f"File exists: {str(blocker)!r}" in str(info.value)
