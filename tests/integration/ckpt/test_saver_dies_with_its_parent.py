"""The saver process dies with the worker that started it even while it is busy (writing a
save, not waiting on their socket, where it would also see the worker's end)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from core.processes import identity_of
from tests.conftest import REPO
from tests.process_tree import wait_until

PARENT = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    print(child.stdout.readline().strip(), flush=True)  # the child's pid, once it is armed
    sys.stdin.read()  # until the test kills this parent
""")
BUSY_CHILD = textwrap.dedent("""
    import os, time
    from ckpt.saver_main import die_with_parent
    die_with_parent()
    print(os.getpid(), flush=True)
    while True:  # busy, reading nothing: only the signal can end it
        time.sleep(0.01)
""")


def test_a_busy_saver_is_killed_when_its_worker_dies():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, BUSY_CHILD], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = identity_of(int(parent.stdout.readline()))
        assert child is not None and child.alive()
        parent.kill()
        parent.wait(timeout=30)
        wait_until(lambda: not child.alive(), 10, what="the busy child to die with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
