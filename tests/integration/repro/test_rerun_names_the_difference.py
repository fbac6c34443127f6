"""`baton rerun` on another (simulated) machine in native mode: the re-run diverges, and the
verdict names the first diverging step, the first differing checkpoint and tensor, and
the environment differences that explain it (tests.integration.repro.machines)."""
from __future__ import annotations

import pytest

from tests.conftest import run_baton
from tests.integration.repro.machines import SSE_MACHINE

pytestmark = pytest.mark.slow

SMALL = ["repro.mode=native", "stage.max_steps=2", "stage.save_every=1", "stage.eval_every=2",
         "stage.eval_samples=8", "pipeline.handoffs.cpt_sft.selection.probe_prompts=4"]


def test_a_native_rerun_elsewhere_diverges_and_names_the_fingerprint_difference(tmp_path):
    run_baton("run", "--stages", "cpt,sft", f"run.dir={tmp_path}", *SMALL, timeout=900, check=True)
    proc = run_baton("rerun", "--handoff", "1", f"run.dir={tmp_path}", env=SSE_MACHINE, timeout=900)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "DIVERGED at step 1" in out
    assert "first differing checkpoint: step 1, tensor " in out
    assert "environment differences that can explain it: CPU capability AVX" in out
    assert "→ DEFAULT" in out and "MKL_ENABLE_INSTRUCTIONS unset → SSE4_2" in out
    # The re-run computes the recorded config, only elsewhere: no config difference to blame.
    assert "config hash" not in out
