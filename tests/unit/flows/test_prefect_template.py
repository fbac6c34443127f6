"""flows.prefect_template: a run home without a Prefect database starts from a copy of the
migrated template; one that has a database keeps it; without a template nothing is
copied (the server then migrates its own, as before)."""
from __future__ import annotations

from flows import prefect_template


def test_a_new_home_gets_a_copy_and_an_existing_database_is_kept(tmp_path, monkeypatch):
    template = tmp_path / "template.db"
    template.write_bytes(b"migrated")
    monkeypatch.setattr(prefect_template, "template_path", lambda: template)
    home = tmp_path / "home"
    home.mkdir()
    assert prefect_template.seed_database(home) is True
    assert (home / "prefect.db").read_bytes() == b"migrated"
    assert not list(home.glob("*.partial"))
    (home / "prefect.db").write_bytes(b"this run's flows")
    assert prefect_template.seed_database(home) is False
    assert (home / "prefect.db").read_bytes() == b"this run's flows"


def test_without_a_template_nothing_is_copied(tmp_path, monkeypatch):
    monkeypatch.setattr(prefect_template, "template_path", lambda: tmp_path / "absent.db")
    assert prefect_template.seed_database(tmp_path) is False
    assert not (tmp_path / "prefect.db").exists()


def test_the_template_is_kept_per_prefect_version():
    from importlib.metadata import version

    assert prefect_template.template_path().name == f"prefect-{version('prefect')}.db"
