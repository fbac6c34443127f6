"""Unit tests start no process: a unit test that starts Python (or forks) fails, naming
the command, so a test that needs processes lands in tests/integration instead.
(Libraries' own helper commands, such as `uname` behind platform.processor(), are not
Python and pass.)"""
from __future__ import annotations

import os
import sys

import pytest

_IN_UNIT_TEST = [False]


def _refuse_processes(event: str, args) -> None:
    if not _IN_UNIT_TEST[0]:
        return
    if event == "subprocess.Popen":
        executable = os.path.basename(str(args[0] or (args[1][0] if args[1] else "")))
        if "python" in executable:
            raise RuntimeError(f"a unit test started a process ({' '.join(map(str, args[1]))[:200]}): "
                               "unit tests start none; move the test to tests/integration")
    elif event in ("os.fork", "os.posix_spawn"):
        raise RuntimeError(f"a unit test started a process ({event}): unit tests start none; "
                           "move the test to tests/integration")


sys.addaudithook(_refuse_processes)  # audit hooks cannot be removed: it acts only inside unit tests


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process():
    _IN_UNIT_TEST[0] = True
    yield
    _IN_UNIT_TEST[0] = False
