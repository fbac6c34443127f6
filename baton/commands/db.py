"""`baton db upgrade | current`: manage the lineage schema (Alembic, own version table)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("upgrade", help="migrate the lineage store to this baton's schema (head)")
    sub.add_parser("current", help="print the store's schema revision and this code's head")


def current(url: str) -> str:
    from lineage import schema
    state = schema.status(url)
    return f"{state.url}: revision {state.current or '(none)'}, code head {state.head} ({state.verdict})"


def main(args: argparse.Namespace) -> int:
    from core.config import compose
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
