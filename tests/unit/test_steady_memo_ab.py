"""`python -m bench.steady_memo_ab`: the save call is timed both ways, in interleaved
rounds, and bad flags are refused in one line."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

LINE = re.compile(r"^save call, min / median: ([0-9.]+) / ([0-9.]+) ms with the memo, "
                  r"([0-9.]+) / ([0-9.]+) ms without; ratio ([0-9.]+) / ([0-9.]+)$", re.MULTILINE)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.steady_memo_ab", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=300)


@pytest.mark.slow
def test_both_ways_are_timed_and_the_ratio_is_theirs():
    proc = run("--rounds", "3", "--saves", "2", "--saver", "thread")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = LINE.search(proc.stdout)
    assert found, proc.stdout
    memo_min, memo_median, full_min, full_median, ratio_min, ratio_median = map(float, found.groups())
    assert 0 < memo_min <= memo_median and 0 < full_min <= full_median
    assert ratio_min == pytest.approx(memo_min / full_min, abs=2e-3)
    assert ratio_median == pytest.approx(memo_median / full_median, abs=2e-3)
    assert "6 saves each way" in proc.stdout
    assert proc.stderr.count("steady memo round") == 3  # progress, one line a round


@pytest.mark.parametrize("args", [["--rounds", "2"], ["--saves", "0"]])
def test_bad_flags_are_refused_without_a_traceback(args):
    proc = run(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "must be at least" in proc.stderr
