"""The fork agent keeps torchrun's failure contract: the first failing rank's recorded
exception reaches the launcher's error file, its root cause is reported in torchrun's
form, the other ranks are stopped, and the agent exits 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from stages.worker_output import _ROOT_CAUSE, python_error
from tests.conftest import REPO


def test_a_failing_rank_is_reported_and_the_others_are_stopped(tmp_path):
    error_file = tmp_path / "error.json"
    proc = subprocess.run(
        [sys.executable, "-u", "-m", "stages.launch_agent", "--standalone", "--nproc-per-node=2",
         "-m", "stages.lean_start", "tests.integration.stages.failing_rank", "ARG"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file),
             "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    match = _ROOT_CAUSE.search(proc.stderr)
    assert match and match.group(1) == "1" and match.group(2) == "1", proc.stderr[-3000:]
    assert python_error(error_file) == "ValueError: rank 1 fails on purpose (argv ['ARG'])"
    assert "py_callstack" in json.dumps(json.loads(error_file.read_text()))
