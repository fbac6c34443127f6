"""A pipeline run whose `store.url` carries a password: afterwards the password is in no
file under the run directory (checkpoints, launch files, MLflow's database and artifacts,
Prefect's database and logs), in no row of the PostgreSQL lineage store, and in no CLI
output. The local server trusts every login, so the password is a unique string that
can only be found where baton wrote it."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import run_baton

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PASSWORD = f"s3cr3t-{uuid.uuid4().hex}"
PG_HOST, PG_PORT, PG_ROLE = "127.0.0.1", 5432, "postgres"
TINY = ["stage.max_steps=2", "stage.save_every=2", "stage.eval_every=2",
        "pipeline.handoffs.cpt_sft.selection.probe_prompts=4"]


def _admin():
    import psycopg
    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_ROLE, dbname="postgres",
                           autocommit=True, connect_timeout=5)


@pytest.fixture(scope="module")
def database():
    try:
        _admin().close()
    except Exception as exc:  # any failure means: no server to test against
        pytest.skip(f"PostgreSQL not reachable on {PG_HOST}:{PG_PORT} as {PG_ROLE}: {exc}")
    name = f"baton_secrets_{uuid.uuid4().hex[:10]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _url(database: str, password: str | None) -> str:
    auth = f"{PG_ROLE}:{password}" if password else PG_ROLE
    return f"postgresql+psycopg://{auth}@{PG_HOST}:{PG_PORT}/{database}"


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory, database):
    """The pipeline (CPT -> handoff -> SFT) run once; every CLI output kept by command."""
    run_dir = tmp_path_factory.mktemp("secret-run")
    store = f"store.url={_url(database, PASSWORD)}"
    # Prefect's ephemeral database under the run dir, whatever the caller's environment.
    env = {"PREFECT_HOME": str(run_dir / ".prefect"), "PREFECT_API_URL": None}
    proc = run_baton("run", "--stages", "cpt,sft", f"run.dir={run_dir}", store, *TINY,
                     env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    outputs = {"run": proc.stdout + proc.stderr}
    for name, args in {"config": ("config",), "show --json": ("lineage", "show", "--json"),
                       "show": ("lineage", "show"), "handoff": ("lineage", "handoff", "1", "--json")
                       }.items():
        shown = run_baton(*args, f"run.dir={run_dir}", store, env=env, check=True)
        outputs[name] = shown.stdout + shown.stderr
    tree = json.loads(outputs["show --json"])
    checkpoint = tree["stage_runs"][-1]["checkpoints"][-1]["path"]
    inspected = run_baton("ckpt", "inspect", "--json", checkpoint, check=True)
    outputs["ckpt inspect"] = inspected.stdout + inspected.stderr
    outputs["trace"] = run_baton("lineage", "trace", checkpoint, "--json", f"run.dir={run_dir}",
                                 store, env=env, check=True).stdout
    return run_dir, database, outputs, tree


def test_the_config_keeps_the_url_with_the_password_masked(secret_run):
    run_dir, database, _, tree = secret_run
    redacted = _url(database, "***")
    assert tree["pipeline_run"]["config"]["store"]["url"] == redacted
    launches = sorted(run_dir.glob("pipeline-*/*/launch.json"))
    assert {p.parent.name for p in launches} == {"cpt", "sft"}
    for launch in launches:
        assert json.loads(launch.read_text())["config"]["store"]["url"] == redacted


def test_no_file_under_the_run_directory_holds_the_password(secret_run):
    run_dir, _, _, _ = secret_run
    files = [p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    leaking = [str(p.relative_to(run_dir)) for p in files if PASSWORD.encode() in p.read_bytes()]
    assert leaking == []
    names = {p.name for p in files}
    assert {"mlflow.db", "launch.json", "meta.json", "manifest.json", "resolved.json"} <= names
    # Prefect's database holds the flow's parameters: the URL is there, masked.
    prefect = b"".join(p.read_bytes() for p in files if ".prefect" in p.parts)
    assert f"{PG_ROLE}:***@{PG_HOST}".encode() in prefect


def test_no_row_of_the_lineage_database_holds_the_password(secret_run):
    import psycopg
    _, database, _, _ = secret_run
    dump = []
    with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_ROLE, dbname=database) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        for table in tables:
            dump += [row[0] for row in conn.execute(f'SELECT t::text FROM "{table}" t')]
    assert {"pipeline_runs", "stage_runs", "checkpoints", "handoffs"} <= set(tables)
    text = "\n".join(dump)
    assert PASSWORD not in text
    assert f"{PG_ROLE}:***@{PG_HOST}" in text


def test_mlflow_params_tags_and_artifacts_hold_no_password(secret_run):
    from mlflow import MlflowClient
    run_dir, database, _, _ = secret_run
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("baton")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 3  # the pipeline and its two stages
    for run in runs:
        assert PASSWORD not in json.dumps([run.data.params, run.data.tags])
    [pipeline] = [r for r in runs if r.data.tags["baton.kind"] == "pipeline"]
    assert pipeline.data.params["store.url"] == _url(database, "***")
    resolved = client.download_artifacts(pipeline.info.run_id, "config/resolved.json")
    assert json.loads(Path(resolved).read_text())["store"]["url"] == _url(database, "***")


def test_no_cli_output_shows_the_password(secret_run):
    _, database, outputs, _ = secret_run
    assert [name for name, text in outputs.items() if PASSWORD in text] == []
    assert f"url: {_url(database, '***')}" in outputs["config"]


def test_the_store_is_reached_with_the_password_from_the_environment(secret_run, monkeypatch):
    """What libpq used is the secret, though no URL baton keeps or passes holds it."""
    from core.config import compose
    from lineage.engine import make_engine
    from lineage.urls import store_url
    run_dir, database, _, _ = secret_run
    monkeypatch.setenv("PGPASSWORD", "before")
    cfg = compose([f"run.dir={run_dir}", f"store.url={_url(database, PASSWORD)}"])
    engine = make_engine(store_url(cfg))
    assert PASSWORD not in store_url(cfg) and engine.url.password is None
    with engine.connect() as conn:
        assert conn.connection.dbapi_connection.info.password == PASSWORD
    engine.dispose()
    # The documented way: no password in the URL, PGPASSWORD (or ~/.pgpass) set.
    shown = run_baton("lineage", "show", f"run.dir={run_dir}", f"store.url={_url(database, None)}",
                      env={"PGPASSWORD": PASSWORD}, check=True)
    assert "cpt" in shown.stdout and PASSWORD not in shown.stdout + shown.stderr
