"""The lineage commands (baton lineage / db / ui) parse their arguments and import nothing heavy up front."""
from __future__ import annotations

import argparse
import subprocess
import sys


def test_importing_the_cli_modules_does_not_import_sqlalchemy_mlflow_or_rich():
    code = ("import sys, baton.commands.lineage, baton.commands.db, baton.commands.ui; "
            "print(sorted(m for m in ('sqlalchemy', 'mlflow', 'rich', 'alembic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lineage_subcommands_take_an_id_a_path_and_json():
    from baton.commands import lineage as cli
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["show"]).pipeline_id is None
    assert parser.parse_args(["trace", "/a/step-000010", "--json"]).json is True
    assert parser.parse_args(["handoff", "3"]).handoff_id == 3


def test_the_ui_server_binds_to_loopback_with_absolute_artifacts(tmp_path):
    from lineage.mlflow_server import server_command
    cmd = server_command("sqlite:////r/mlflow.db", str(tmp_path / "art"), 5055)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--default-artifact-root") + 1] == (tmp_path / "art").as_uri()
    assert cmd[cmd.index("--backend-store-uri") + 1] == "sqlite:////r/mlflow.db"
