"""`baton ui [--port N]`: the MLflow UI on 127.0.0.1 against this run's tracking store."""
from __future__ import annotations

import argparse
import os
import signal
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


def training_runs_page(uri: str) -> str | None:
    """The baton experiment's runs table. MLflow 3's UI opens an experiment on its GenAI
    overview (traces, judges) unless told otherwise: the experiment's kind tag is no longer
    read for that, the page address is."""
    from mlflow import MlflowClient

    from lineage.mlflow_bridge import EXPERIMENT
    found = MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT)
    return f"#/experiments/{found.experiment_id}/runs?workflowType=machine_learning" if found else None


def main(args: argparse.Namespace) -> int:
    from core.config import compose
    from core.server_guard import guarded
    from lineage.mlflow_server import server_command
    from lineage.urls import artifact_root, mlflow_uri, safe_url
    cfg = compose(args.overrides)
    uri, root = mlflow_uri(cfg), artifact_root(cfg)
    Path(root).mkdir(parents=True, exist_ok=True)
    print(f"MLflow UI for {safe_url(uri)} at http://127.0.0.1:{args.port} (Ctrl-C to stop)")
    runs = training_runs_page(uri)
    if runs:
        print(f"baton's training runs: http://127.0.0.1:{args.port}/{runs}")
    # The server runs under core.server_guard, which stops everything MLflow starts when
    # this process is stopped or dies. MLflow's job runner (huey consumers) serves GenAI
    # jobs the UI of a training run never submits: not started.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    guard = subprocess.Popen(guarded(server_command(uri, root, args.port)), env=env)
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGHUP):  # SIGINT arrives as KeyboardInterrupt
        signal.signal(sig, lambda number, _frame: stopped.append(number))
    try:
        while not stopped:
            try:
                return guard.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        pass
    guard.terminate()  # the guard stops the server and all it started, then exits
    guard.wait()
    return 0
