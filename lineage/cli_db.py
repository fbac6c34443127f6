"""`baton db upgrade | current`: manage the lineage schema (Alembic, own version table)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("upgrade", help="migrate the lineage store to this baton's schema (head)")
    sub.add_parser("current", help="print the store's schema revision and this code's head")


def current(url: str) -> str:
    from sqlalchemy.exc import DBAPIError

    from lineage import schema
    from lineage.engine import make_engine
    from lineage.errors import StoreNotFound, StoreUnreachable
    from lineage.urls import safe_url, sqlite_path
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise StoreNotFound(safe_url(url), str(path))
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            state = schema.check(connection, url)
    except DBAPIError as exc:
        raise StoreUnreachable(safe_url(url), str(exc.orig).strip().splitlines()[0]) from None
    finally:
        engine.dispose()
    if state.current is None:
        verdict = "empty: run `baton db upgrade`"
    elif state.up_to_date:
        verdict = "up to date"
    else:
        verdict = "behind: run `baton db upgrade`"
    return f"{state.url}: revision {state.current or '(none)'}, code head {state.head} ({verdict})"


def main(args: argparse.Namespace) -> int:
    from baton.config import compose
    from lineage.urls import store_url
    url = store_url(compose(args.overrides))
    if args.action == "current":
        print(current(url))
        return 0
    from lineage.store import LineageStore
    with LineageStore.open(url) as store:
        print(f"{store.url}: upgraded to {_head()} (head)")
    return 0


def _head() -> str:
    from lineage.schema import code_head
    return code_head()
