"""One fork server per test process (stages.fork_server): every stage or reshard launch a
test makes, through `baton` subprocesses, Prefect workers or in this process, forks its
workers from a warm process instead of importing torch, DeepSpeed and transformers
again. The launches whose process tree a test inspects start cold (tests.process_tree).
With BATON_FORK_SERVER_REPORT set to a directory, each test process writes there how many
workers were forked and why each warm process was started (its fingerprint's change).

And one Prefect API server per test process (tests.integration.prefect_api) for the flows
the tests run, except those that test Prefect's temporary server (EPHEMERAL_PREFECT).
"""
from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def fork_server():
    from stages import fork_server as server_module

    server = server_module.start()
    os.environ.update(server.environment)
    yield server
    report = os.environ.get("BATON_FORK_SERVER_REPORT")  # a directory: how warm the session ran
    if report:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(report, f"fork-server-{worker}.json"), "w") as handle:
            json.dump({"forks": len(server.forks()), "warm_starts": server.warm_starts()}, handle)
    for name in server.environment:
        os.environ.pop(name, None)
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def prefect_api(tmp_path_factory):
    from tests.integration.prefect_api import PrefectApi

    home = tmp_path_factory.mktemp("prefect-api")
    server = PrefectApi(home / "server")
    settings = {"PREFECT_API_URL": server.url, "PREFECT_HOME": str(home / "client")}
    before = {name: os.environ.get(name) for name in settings}
    try:
        server.wait_healthy()
        os.environ.update(settings)
        yield server
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()
