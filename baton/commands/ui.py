"""`baton ui [--port N]`: the MLflow UI on 127.0.0.1 against this run's tracking store."""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

DEFAULT_PORT = 5000


def port(text: str) -> int:
    """A TCP port, refused by argparse (exit 2) before any server starts."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: expected a TCP port between 1 and 65535")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=port, default=DEFAULT_PORT, help="port on 127.0.0.1")


def main(args: argparse.Namespace) -> int:
    from core.config import compose
    from lineage.mlflow_server import server_command
    from lineage.urls import artifact_root, mlflow_uri, safe_url
    cfg = compose(args.overrides)
    uri, root = mlflow_uri(cfg), artifact_root(cfg)
    Path(root).mkdir(parents=True, exist_ok=True)
    print(f"MLflow UI for {safe_url(uri)} at http://127.0.0.1:{args.port} (Ctrl-C to stop)")
    process = subprocess.Popen(server_command(uri, root, args.port))
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait(timeout=10)
        return 0
