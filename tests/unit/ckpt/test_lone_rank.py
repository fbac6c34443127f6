"""DeepSpeed's barriers are skipped inside a save only when there is one rank, and are
back as they were after it, also when the save raises."""
from __future__ import annotations

import pytest
from deepspeed import comm

from ckpt.lone_rank import barriers_skipped


def test_one_rank_skips_the_barriers_and_restores_them_after_a_failure():
    original = comm.barrier
    with pytest.raises(RuntimeError):
        with barriers_skipped(1):
            assert comm.barrier is not original
            assert comm.barrier() is None  # no process group needed: nobody to wait for
            raise RuntimeError("the save failed")
    assert comm.barrier is original


def test_more_ranks_keep_the_barriers():
    original = comm.barrier
    with barriers_skipped(2):
        assert comm.barrier is original
    assert comm.barrier is original
