"""`python -m experiments.gil_probe`: every kind of background work are measured against blocks
without it, and bad flags are refused in one line."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

LINE = re.compile(r"Python \(holds the GIL\) ([0-9.]+) / ([0-9.]+); GIL-free ([0-9.]+) / ([0-9.]+); "
                  r"Python in another process ([0-9.]+) / ([0-9.]+)$", re.MULTILINE)
BACKWARD = re.compile(r"^backward, median: ([0-9.]+) ms alone, ([0-9.]+) ms beside the Python "
                      r"thread$", re.MULTILINE)


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.gil_probe", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.slow
def test_the_probe_reports_a_min_and_median_ratio_for_each_kind():
    proc = probe("--steps", "1", "--rounds", "3", "--duty", "0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = LINE.search(proc.stdout.strip())
    assert found, proc.stdout
    values = list(map(float, found.groups()))
    for low, middle in zip(values[::2], values[1::2]):
        assert 0 < low <= middle
    backward = BACKWARD.search(proc.stdout)
    assert backward, proc.stdout
    assert all(float(ms) > 0 for ms in backward.groups())  # timed backward passes of both kinds
    assert proc.stderr.count("gil probe round") == 3  # progress, one line a round


@pytest.mark.parametrize("args", [["--duty", "1.5"], ["--rounds", "2"], ["--steps", "0"]])
def test_bad_flags_are_refused_without_a_traceback(args):
    proc = probe(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "--duty must lie in (0, 1)" in proc.stderr
