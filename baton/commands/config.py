"""`baton config [overrides]`: print the resolved config, or every error in it."""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--hash", action="store_true", help="print only the config hash")


def main(args) -> int:
    from core.config import compose, config_hash, resolved_yaml

    cfg = compose(args.overrides)
    print(config_hash(cfg) if args.hash else resolved_yaml(cfg), end="\n" if args.hash else "")
    return 0
