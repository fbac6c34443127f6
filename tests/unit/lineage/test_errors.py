"""Lineage errors are BatonErrors that carry their data and say how to fix the problem."""
from __future__ import annotations

from core.errors import BatonError
from lineage.errors import (ForeignDatabase, InvalidValue, LineageError, SchemaAheadOfCode,
                            StoreNotFound, StoreUnreachable, UnknownRecord)


def test_every_lineage_error_is_a_baton_error_so_the_cli_exits_2():
    assert issubclass(LineageError, BatonError)
    for cls in (ForeignDatabase, InvalidValue, SchemaAheadOfCode, StoreNotFound,
                StoreUnreachable, UnknownRecord):
        assert issubclass(cls, LineageError)


def test_schema_ahead_of_code_names_both_revisions_and_the_fix():
    err = SchemaAheadOfCode("sqlite:////r/lineage.db", "abc999", "0001")
    assert (err.db_revision, err.code_head) == ("abc999", "0001")
    assert str(err) == (
        "the lineage schema at sqlite:////r/lineage.db is at revision 'abc999', which this baton "
        "does not know (its newest is '0001'); the database was written by a newer baton: "
        "upgrade baton (pip install -U baton) rather than downgrading the database")


def test_unknown_record_names_kind_key_and_where_it_looked():
    err = UnknownRecord("handoff", 7, "sqlite:////r/lineage.db", "list them")
    assert str(err) == "no handoff 7 in sqlite:////r/lineage.db; list them"


def test_store_not_found_says_how_to_create_or_point_at_a_store():
    err = StoreNotFound("sqlite:////r/lineage.db", "/r/lineage.db")
    assert "no lineage store at /r/lineage.db" in str(err)
    assert "run `baton run run.dir=...` first" in str(err)


def test_invalid_value_names_key_value_and_expectation():
    assert str(InvalidValue("status", "done", "one of running, completed")) == \
        "status='done': expected one of running, completed"
