"""The golden numerics test: in portable mode, every operation of the numerics probe and a
short CPT stage's checkpoint must equal the committed golden values
(tests/golden/numerics-portable-avx2.json) on whatever CPU this suite runs on (MKL's
vendor check answered "Intel" by baton's preload, core.mkl_preload). A mismatch names the
operations that differ.
The golden values change only through `baton probe --record … --why …`."""
from __future__ import annotations

import json

import pytest

from baton.commands.probe import GOLDEN
from tests.conftest import run_baton
from tests.integration.repro.machines import other_vendor_machine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def other_vendor(tmp_path_factory):
    return other_vendor_machine(tmp_path_factory.mktemp("vendor"))


def test_the_golden_values_were_recorded_by_the_command_with_a_reason():
    golden = json.loads(GOLDEN.read_text())
    assert golden["recorded_by"] == "baton probe --record" and golden["why"].strip()
    assert golden["repro"] == {"mode": "portable", "isa": "avx2", "threads": 1}
    assert golden["machine"]["mkl_branch"] == "AVX2" and golden["machine"]["sqrt"] == "ieee"
    assert golden["stage"]["content_digest"].startswith("cd1:")


def test_portable_numerics_equal_the_golden_values():
    proc = run_baton("probe", "--stage", "--compare", str(GOLDEN), timeout=600)
    assert proc.returncode == 0, (
        f"portable numerics on this CPU differ from {GOLDEN.name}; the operations that differ:\n"
        + proc.stdout[proc.stdout.find("[baton]"):] + proc.stderr[-3000:])
    assert "SAME as" in proc.stdout and "the short stage's checkpoint" in proc.stdout
    assert "MKL code path AVX2, square root ieee" in proc.stdout


def test_the_probe_names_the_matmuls_that_mkl_runs_differently_per_vendor(tmp_path, other_vendor):
    """What portable mode pinned before (MKL_CBWR=AVX2, which MKL grants on Intel CPUs only):
    the two vendors' MKL run different code paths, and the probe names the GEMMs."""
    old_pin = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
    here = tmp_path / "here.json"
    run_baton("probe", "repro.mode=native", "--json", str(here), env=old_pin, check=True)
    proc = run_baton("probe", "repro.mode=native", "--compare", str(here),
                     env={**old_pin, **other_vendor})
    branches = json.loads(here.read_text())["machine"]["mkl_branch"], proc.stdout.split(
        "MKL code path ")[1].split()[0].rstrip(",")
    assert set(branches) == {"AUTO", "AVX2"}, branches  # the preloaded vendor check took
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERS" in proc.stdout and "operation linear q/o proj" in proc.stdout
    assert "operation tiny llama forward+backward" in proc.stdout


def test_recording_golden_values_needs_a_reason(tmp_path):
    target = tmp_path / "golden.json"
    proc = run_baton("probe", "--record", str(target))
    assert proc.returncode == 2 and "no --why given" in proc.stderr
    assert "Traceback" not in proc.stderr and not target.exists()


def test_a_file_that_is_not_a_recorded_probe_is_refused_by_name(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text('{"ops": []}')
    proc = run_baton("probe", "--compare", str(other))
    assert proc.returncode == 2 and f"--compare {other}: no 'operations' mapping" in proc.stderr
    assert "Traceback" not in proc.stderr
