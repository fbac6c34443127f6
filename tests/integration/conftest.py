"""One fork server per test process (stages.fork_server): every stage or reshard launch a
test makes, through `baton` subprocesses, Prefect workers or in this process, forks its
workers from a warm process instead of importing torch, DeepSpeed and transformers
again. The launches whose process tree a test inspects start cold (tests.process_tree).
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def fork_server():
    from stages import fork_server as server_module

    server = server_module.start()
    os.environ.update(server.environment)
    yield server
    for name in server.environment:
        os.environ.pop(name, None)
    server.stop()
