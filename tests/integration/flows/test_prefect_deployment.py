"""A real Prefect server on 127.0.0.1, a process work pool, `prefect deploy --all`, a
worker, and the pipeline deployment run to completion with lineage written."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.prefect_api import free_port, wait_healthy

pytestmark = pytest.mark.slow
PREFECT = str(Path(sys.executable).with_name("prefect"))


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
def prefect_server(tmp_path):
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "BATON_REPO": str(REPO)}
    Path(env["PREFECT_HOME"]).mkdir()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(env["PREFECT_API_URL"], server, log.name)
        yield env
    finally:
        _stop(server)


def _prefect(env, *args, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([PREFECT, *args], env=env, cwd=REPO, text=True, capture_output=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _flow_run_state(env, flow_run_id: str) -> str:
    code = ("import sys; from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c: print(c.read_flow_run(sys.argv[1]).state.type.value)")
    out = subprocess.run([sys.executable, "-c", code, flow_run_id], env=env, text=True,
                         capture_output=True, timeout=60)
    return out.stdout.strip() or f"unknown ({out.stderr[-300:]})"


def test_pipeline_deployment_runs_on_a_process_worker_and_writes_lineage(prefect_server, tmp_path):
    env = prefect_server
    run_dir = tmp_path / "run"
    _prefect(env, "work-pool", "create", "baton-process", "--type", "process")
    deployed = _prefect(env, "--no-prompt", "deploy", "--all")
    assert "post_training/pipeline" in deployed.stdout and "rerun_stage/rerun-stage" in deployed.stdout
    worker_log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "baton-process"], env=env,
                              cwd=tmp_path, stdout=worker_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        overrides = [f"run.dir={run_dir}", "pipeline.stages=[cpt,sft]", "pipeline.parallel.sft=single",
                     "stage.max_steps=2", "stage.save_every=1", "stage.eval_every=1"]
        started = _prefect(env, "deployment", "run", "post_training/pipeline",
                           "--params", json.dumps({"overrides": overrides}))
        found = re.search(r"UUID[^0-9a-f]*([0-9a-f]{8}-[0-9a-f-]{27})", started.stdout)
        assert found, started.stdout
        flow_run_id = found.group(1)
        deadline, state = time.time() + 900, "SCHEDULED"
        while time.time() < deadline and state not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            time.sleep(5)
            state = _flow_run_state(env, flow_run_id)
        assert state == "COMPLETED", (tmp_path / "worker.log").read_text()[-5000:]
    finally:
        _stop(worker)

    from lineage import LineageStore

    store = LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}")
    pipeline = store.latest_pipeline_run()
    assert pipeline.status == "completed"
    assert pipeline.prefect_flow_run_id == flow_run_id
    stages = [run.stage for run in store.stage_runs(pipeline.id)]
    assert stages == ["cpt", "sft"]
    [handoff] = store.handoffs(pipeline.id)
    assert handoff.from_stage == "cpt" and handoff.to_stage == "sft" and handoff.entropy > 0
