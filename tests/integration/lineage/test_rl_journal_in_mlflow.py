"""The RL journal's MLflow side on a real MLflow store: per-step counts of environment
failures, dropped groups and alerts, and, for an asynchronous run, the staleness
histogram as JSON and a PNG (an on-policy run logs none)."""
from __future__ import annotations

import json
import uuid

from mlflow import MlflowClient

from lineage.mlflow_bridge import MlflowLineage

SEGMENTS = [{"step": 1, "staleness": {"0": 16}}, {"step": 2, "staleness": {"1": 16}},
            {"step": 3, "staleness": {"2": 16}}, {"step": 4, "staleness": {"2": 16}}]
EVENTS = [{"kind": "env_failure", "segment": 2}, {"kind": "env_failure", "segment": 2},
          {"kind": "drop", "segment": 2}, {"kind": "env_alert", "segment": 2},
          {"kind": "weight_sync", "segment": 1}]


def _run(tmp_path):
    view = MlflowLineage(f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts"),
                         experiment=f"rl-{uuid.uuid4().hex}")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return view, client, client.create_run(view.experiment_id()).info.run_id


def test_an_async_runs_staleness_histogram_and_environment_counts_reach_mlflow(tmp_path):
    view, client, run_id = _run(tmp_path)
    view.log_rl_journal(run_id, SEGMENTS, EVENTS)
    artifacts = {a.path for a in client.list_artifacts(run_id, "rl")}
    assert {"rl/journal.json", "rl/staleness.json", "rl/staleness.png"} <= artifacts
    local = client.download_artifacts(run_id, "rl/staleness.json", str(tmp_path))
    histogram = json.loads(open(local).read())
    assert histogram["total"] == {"0": 16, "1": 16, "2": 32}
    counts = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)}
              for key in ("rl_env_failures", "rl_drops", "rl_env_alerts")}
    assert counts == {"rl_env_failures": {1: 0.0, 2: 2.0, 3: 0.0, 4: 0.0},
                      "rl_drops": {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0},
                      "rl_env_alerts": {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0}}


def test_an_on_policy_run_logs_no_staleness_histogram(tmp_path):
    view, client, run_id = _run(tmp_path)
    view.log_rl_journal(run_id, [{"step": 1, "staleness": {"0": 16}}], [])
    assert {a.path for a in client.list_artifacts(run_id, "rl")} == {"rl/journal.json"}
