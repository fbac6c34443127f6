"""Passwords in `store.url` / `mlflow.tracking_uri` leave the config for the environment;
what stays is `***`, in every form a URL can take, and the config hash ignores them."""
from __future__ import annotations

import os

import pytest

from core.config import compose, config_hash
from core.config.secrets import connectable, redact_text, redact_url, redact_values
from core.errors import ConfigError

ENV = ("PGPASSWORD", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
PG = "postgresql+psycopg://u:{}@127.0.0.1:5432/db"


@pytest.fixture
def clean_env(monkeypatch):
    """compose() writes os.environ; monkeypatch puts every variable back afterwards."""
    for name in ENV:
        monkeypatch.setenv(name, "before")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("url, redacted", [
    ("postgresql+psycopg://u:secretpw@127.0.0.1:5432/db", "postgresql+psycopg://u:***@127.0.0.1:5432/db"),
    ("postgresql://u:p%40ss@h/db?sslmode=require", "postgresql://u:***@h/db?sslmode=require"),
    ("postgresql://u@h/db?password=secretpw", "postgresql://u:***@h/db"),
    ("http://bob:secretpw@mlflow:5000/path", "http://bob:***@mlflow:5000/path"),
    ("https://bob:p%3Asecretpw@mlflow/x?y=1", "https://bob:***@mlflow/x?y=1"),
    ("pg://u:secretpw@h:notaport/db", "pg://u:***@h:notaport/db"),  # does not parse
])
def test_redact_url_masks_the_password_and_keeps_scheme_user_host_and_database(url, redacted):
    assert redact_url(url) == redacted
    assert "secretpw" not in redact_url(url)


@pytest.mark.parametrize("url", ["postgresql+psycopg://u@127.0.0.1:5432/db", "sqlite:////tmp/x.db",
                                 "http://mlflow:5000", "notaurl", "", "postgresql://u:***@h/db"])
def test_redact_url_leaves_a_url_without_a_password_as_it_is(url):
    assert redact_url(url) == url


def test_redact_url_takes_none_numbers_and_parsed_urls():
    from sqlalchemy.engine import make_url
    assert redact_url(None) is None
    assert redact_url(5432) == "5432"
    assert redact_url(make_url(PG.format("secretpw"))) == PG.format("***")


def test_redact_text_masks_every_url_in_a_message():
    text = "'store.url=postgresql://u:secretpw@h/db' or x://a:secretpw@c?password=secretpw&n=1"
    assert redact_text(text) == "'store.url=postgresql://u:***@h/db' or x://a:***@c?password=***&n=1"


def test_connectable_drops_a_redacted_password_so_the_driver_reads_the_environment():
    assert connectable(PG.format("***")) == "postgresql+psycopg://u@127.0.0.1:5432/db"
    assert connectable("http://bob:***@mlflow:5000/x") == "http://mlflow:5000/x"
    assert connectable("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    from lineage.engine import make_engine
    assert make_engine(PG.format("***")).url.password is None


def test_compose_moves_a_postgresql_password_into_pgpassword(clean_env):
    cfg = compose([f"store.url={PG.format('secretpw')}"])
    assert cfg.store.url == PG.format("***")
    assert os.environ["PGPASSWORD"] == "secretpw"


def test_compose_moves_mlflow_server_credentials_into_mlflow_tracking_variables(clean_env):
    from lineage.urls import mlflow_uri
    cfg = compose(["mlflow.tracking_uri=http://bob:secretpw@mlflow:5000"])
    assert cfg.mlflow.tracking_uri == "http://bob:***@mlflow:5000"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "bob"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "secretpw"
    assert mlflow_uri(cfg) == "http://mlflow:5000"


def test_the_config_hash_does_not_depend_on_the_password(clean_env):
    one = compose([f"store.url={PG.format('first-secret')}"])
    two = compose([f"store.url={PG.format('second-secret')}"])
    assert config_hash(one) == config_hash(two)
    assert config_hash(one) != config_hash(compose(["store.url=" + PG.format("x").replace("/db", "/other")]))


def test_a_password_for_a_backend_without_an_environment_variable_is_refused(clean_env):
    with pytest.raises(ConfigError) as info:
        compose(["store.url=mysql+pymysql://u:secretpw@h/db"])
    message = str(info.value)
    assert "store.url='mysql+pymysql://u:***@h/db': a password in a mysql URL would be written" in message
    assert "remove the password from the URL" in message and "secretpw" not in message
    assert "PGPASSWORD" not in os.environ


def test_two_different_postgresql_passwords_are_refused_with_the_pgpass_fix(clean_env):
    with pytest.raises(ConfigError, match=r"different PostgreSQL passwords.*~/\.pgpass") as info:
        compose([f"store.url={PG.format('one-secret')}",
                 "mlflow.tracking_uri=postgresql://u:two-secret@h/mlflow"])
    assert "one-secret" not in str(info.value) and "two-secret" not in str(info.value)


def test_config_errors_never_echo_a_password(clean_env):
    with pytest.raises(ConfigError) as info:
        compose(["stor.url=postgresql://u:secretpw@h/db", "postgresql://u:secretpw@h/db"])
    message = str(info.value)
    assert "'stor.url=postgresql://u:***@h/db': unknown config key 'stor.url'" in message
    assert "'postgresql://u:***@h/db': expected key=value" in message
    assert "secretpw" not in message


def test_the_flow_gets_overrides_without_the_password_that_compose_to_the_same_config(clean_env):
    from flows.safe_overrides import safe_overrides
    overrides = [f"store.url={PG.format('secretpw')}", "stage.max_steps=2",
                 "mlflow.tracking_uri='http://bob:secretpw@mlflow:5000'"]
    cfg = compose(overrides)
    safe = safe_overrides(overrides, cfg)
    assert not any("secretpw" in o for o in safe)
    assert config_hash(compose(safe)) == config_hash(cfg)
    assert os.environ["PGPASSWORD"] == "secretpw"  # recomposing kept what the first compose set


def test_redact_values_masks_each_string_of_a_record_on_its_own():
    record = {"config": {"store": {"url": "postgresql://u:secretpw@h/db"}},
              "paths": ["http://mlflow:5000/a", "me@example.org"], "step": 2}
    assert redact_values(record) == {"config": {"store": {"url": "postgresql://u:***@h/db"}},
                                     "paths": ["http://mlflow:5000/a", "me@example.org"], "step": 2}
