"""Every error a user can cause is one clear paragraph, a non-zero exit and no traceback."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import EPHEMERAL_PREFECT, metrics, run_baton

TRACEBACK = "Traceback"
DISK = "64m"
LEFT_FREE = 1 << 20  # room for launch.json and metrics lines, not for a 5 MB checkpoint


def _no_traceback(proc) -> None:
    assert TRACEBACK not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]


def _refused(proc, *phrases: str) -> None:
    """Exit 2, every phrase in the message, no traceback anywhere."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr
    _no_traceback(proc)


@contextmanager
def small_disk(path: Path):
    """A real tmpfs of DISK at `path` (yields True) or, where mounting is not permitted,
    a plain directory (yields False: the caller injects the write error instead)."""
    path.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(path)],
                           capture_output=True) if shutil.which("mount") else None
    mounted = mount is not None and mount.returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path, leave: int) -> Path:
    stat = os.statvfs(path)
    filler = path / "filler"
    with open(filler, "wb") as handle:
        handle.truncate(0)
        handle.write(b"\0" * (stat.f_bavail * stat.f_frsize - leave))
    return filler


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_one_message_and_latest_survives(tmp_path):
    with small_disk(tmp_path / "disk") as mounted:
        run_dir = tmp_path / "disk" / "run"
        common = ["stage", "cpt", f"run.dir={run_dir}", "parallel.world_size=2",
                  "parallel.zero_stage=1", "stage.save_every=1"]
        run_baton(*common, "stage.max_steps=2", check=True)
        root = run_dir / "cpt" / "checkpoints"
        if mounted:
            filler = _fill(tmp_path / "disk", LEFT_FREE)
            full = run_baton(*common, "stage.max_steps=4", "resume=latest")
        else:  # fallback: the same OSError(ENOSPC), raised by the engine's first write
            print("tmpfs could not be mounted: injecting ENOSPC with debug.fail_write_at_step")
            filler = None
            full = run_baton(*common, "stage.max_steps=4", "resume=latest",
                             "debug.fail_write_at_step=3")
        _refused(full, "No space left on device", f"{root / 'step-000003.tmp'}",
                 "`latest` still points to step-000002", "resume=latest",
                 f"{run_dir / 'cpt' / 'workers.log'}")
        assert full.stderr.count("\n") == 1, f"one paragraph, one line: {full.stderr}"
        assert "[cpt] step 3/4" in full.stdout, "progress lines still reach the terminal"
        assert (root / "latest").read_text() == "step-000002"
        assert run_baton("ckpt", "verify", str(root / "latest")).returncode == 0

        if filler is not None:
            filler.unlink()  # space freed
        resumed = run_baton(*common, "stage.max_steps=4", "resume=latest", check=True)
        _no_traceback(resumed)
        assert (root / "latest").read_text() == "step-000004"
        assert not list(root.glob("*.tmp")), "the next save of step 3 cleared what was left"
        assert sorted(metrics(run_dir, "cpt")) == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_worker_killed_by_a_signal_is_named_as_an_infrastructure_failure(tmp_path, world_size):
    """One process: the launched process is the worker, named by its exit status. Two:
    named from the agent's report (torchrun's form), which is kept in the log."""
    proc = run_baton("stage", "cpt", f"run.dir={tmp_path}", "stage.max_steps=1",
                     "stage.save_every=1", "debug.crash_in_save_at_step=1",
                     f"parallel.world_size={world_size}")
    _refused(proc, "rank 0 was killed by signal 9 (SIGKILL)", "an infrastructure failure",
             f"{tmp_path / 'cpt' / 'workers.log'}")
    if world_size > 1:
        assert "Root Cause (first observed failure)" in (tmp_path / "cpt" / "workers.log").read_text(), \
            "the agent's report is kept in the log"


# -- model.path ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """The built-in model, as save_pretrained wrote it (no workers needed)."""
    from core.config import compose
    from stages.model import ensure_model_dir

    return ensure_model_dir(compose([f"run.dir={tmp_path_factory.mktemp('home')}"]))


class _Payload:
    """A pickle that would create `marker` if it were ever unpickled unsafely."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _break(directory: Path, how: str, marker: Path) -> None:
    weights = directory / "model.safetensors"
    if how == "config not json":
        (directory / "config.json").write_text("{not json")
    elif how == "config a list":
        (directory / "config.json").write_text("[1, 2]")
    elif how == "config without model_type":
        (directory / "config.json").write_text(json.dumps({"hidden_size": 8}))
    elif how == "safetensors garbage":
        weights.write_bytes(os.urandom(4096))
    elif how == "safetensors truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "bin pickle":
        weights.unlink()
        (directory / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    elif how == "no weights":
        weights.unlink()


@pytest.mark.parametrize("how,message", [
    ("config not json", "config.json is not valid JSON"),
    ("config a list", "config.json holds a list, not a JSON object"),
    ("config without model_type", "config.json has neither 'model_type' nor 'architectures'"),
    ("safetensors garbage", "model.safetensors is not a readable safetensors file"),
    ("safetensors truncated", "model.safetensors is not a readable safetensors file"),
    ("bin pickle", "pytorch_model.bin cannot be loaded with weights_only=True"),
    ("no weights", "no weights there"),
])
def test_a_broken_model_directory_is_refused_before_any_worker(hf_model, tmp_path, how, message):
    model, marker = tmp_path / "model", tmp_path / "executed"
    shutil.copytree(hf_model, model)
    _break(model, how, marker)
    proc = run_baton("stage", "cpt", f"run.dir={tmp_path / 'run'}", f"model.path={model}",
                     "stage.max_steps=1", timeout=300)
    _refused(proc, f"model.path='{model}'", message)
    assert not (tmp_path / "run").exists(), "nothing was launched"
    assert not marker.exists(), "the pickle was executed"


def test_a_model_path_that_is_a_file_is_refused(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"x")
    _refused(run_baton("stage", "cpt", f"run.dir={tmp_path}", f"model.path={file}"),
             f"model.path='{file}': no config.json there")


# -- config arithmetic and store URLs ----------------------------------------------------
def test_micro_batch_zero_is_a_config_error_not_a_division_by_zero(tmp_path):
    proc = run_baton("stage", "cpt", f"run.dir={tmp_path}", "stage.micro_batch=0")
    _refused(proc, "stage.micro_batch=0: expected >= 1")
    assert "ZeroDivisionError" not in proc.stderr


@pytest.mark.parametrize("command", [["run"], ["lineage", "show"], ["db", "current"]])
def test_a_store_url_that_is_not_a_url_is_refused_by_every_command(tmp_path, command):
    proc = run_baton(*command, f"run.dir={tmp_path}", "store.url=notaurl", timeout=120,
                     env=EPHEMERAL_PREFECT)
    _refused(proc, "store.url='notaurl': not a database URL",
             "postgresql+psycopg://user@127.0.0.1:5432/baton")
    assert not (tmp_path / ".prefect").exists(), "refused before Prefect started"


# -- checkpoints on the command line --------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained")
    run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=2", "stage.save_every=1",
              check=True)
    return run_dir / "cpt" / "checkpoints"


def _rechecksummed(src: Path, dst: Path, rel: str, data: bytes) -> Path:
    """A copy of `src` whose `rel` holds `data` and whose manifest was rewritten to match."""
    shutil.copytree(src, dst)
    (dst / rel).write_bytes(data)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


@pytest.mark.slow
def test_diff_says_different_with_1_and_could_not_compare_with_2(trained, tmp_path):
    step1, step2 = trained / "step-000001", trained / "step-000002"
    same = run_baton("ckpt", "diff", str(step2), str(trained / "latest"))
    assert same.returncode == 0 and "IDENTICAL" in same.stdout, same.stdout + same.stderr
    different = run_baton("ckpt", "diff", str(step1), str(step2))
    assert different.returncode == 1 and "DIFFERENT" in different.stdout
    _no_traceback(different)

    garbage = _rechecksummed(step2, tmp_path / "step-000002", "mp_rank_00_model_states.pt",
                             b"not a torch archive" * 10)
    unreadable = run_baton("ckpt", "diff", str(step2), str(garbage))
    _refused(unreadable, "mp_rank_00_model_states.pt")
    assert "DIFFERENT" not in unreadable.stdout
    missing = run_baton("ckpt", "diff", str(step2), str(tmp_path / "nowhere"))
    _refused(missing, f"{tmp_path / 'nowhere'}: no such checkpoint directory")


@pytest.mark.slow
def test_verify_and_inspect_follow_the_latest_pointer(trained, tmp_path):
    verified = run_baton("ckpt", "verify", str(trained / "latest"))
    assert verified.returncode == 0, verified.stderr
    assert f"OK {trained / 'step-000002'}: cpt step 2" in verified.stdout
    inspected = run_baton("ckpt", "inspect", str(trained / "latest"), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["path"] == str(trained / "step-000002")

    dangling = tmp_path / "checkpoints"
    dangling.mkdir()
    (dangling / "latest").write_text("step-000009")
    proc = run_baton("ckpt", "verify", str(dangling / "latest"))
    assert proc.returncode == 1
    assert "the `latest` pointer names 'step-000009', which is not a checkpoint" in proc.stderr
    _no_traceback(proc)


@pytest.mark.parametrize("action", [["verify", ""], ["inspect", ""], ["diff", "", "x"]])
def test_an_empty_checkpoint_path_is_refused_not_read_as_the_current_directory(action):
    _refused(run_baton("ckpt", *action), "an empty path")


# -- starting checkpoints ------------------------------------------------------------------
def _deepspeed_root(trained: Path, root: Path) -> Path:
    """What DeepSpeed's own save_checkpoint leaves: `latest` + a tag directory, no manifest."""
    (root / "global_step2").mkdir(parents=True)
    shutil.copy(trained / "step-000002" / "mp_rank_00_model_states.pt", root / "global_step2")
    (root / "latest").write_text("global_step2")
    return root


@pytest.mark.slow
def test_init_from_a_foreign_or_wrong_checkpoint_is_refused_before_any_worker(trained, tmp_path):
    foreign = _deepspeed_root(trained, tmp_path / "deepspeed")
    reward_model = tmp_path / "rm" / "step-000002"
    shutil.copytree(trained / "step-000002", reward_model)
    manifest = json.loads((reward_model / "manifest.json").read_text())
    (reward_model / "manifest.json").write_text(json.dumps({**manifest, "stage": "rm"}))
    cases = [
        (foreign, ["stage.init_from", "without a baton manifest", "baton ckpt adopt"]),
        (foreign / "global_step2", ["stage.init_from", "baton ckpt adopt"]),
        (reward_model, ["is a 'rm' checkpoint; stage.init_from takes a checkpoint of stage "
                        "cpt or sft", "stage.reward_model_from"]),
        (trained / "latest", ["is the `latest` pointer file", f"{trained / 'step-000002'}"]),
    ]
    for init_from, phrases in cases:
        run_dir = tmp_path / "run"
        proc = run_baton("stage", "sft", f"run.dir={run_dir}", f"stage.init_from={init_from}",
                         "stage.max_steps=1", timeout=300)
        _refused(proc, *phrases)
        assert not (run_dir / "sft").exists(), f"workers were launched for {init_from}"


# -- the last resort --------------------------------------------------------------------------
def test_an_unexpected_exception_is_one_paragraph_exit_3_and_its_traceback_on_request(
        monkeypatch, capsys):
    from baton import cli
    from baton.commands import config as show_config

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(show_config, "main", broken)
    monkeypatch.delenv("BATON_DEBUG", raising=False)
    assert cli.main(["config"]) == 3
    err = capsys.readouterr().err
    assert "baton config: internal error: RuntimeError: boom second line." in err
    assert "This is a bug in baton" in err and "BATON_DEBUG=1" in err
    assert TRACEBACK not in err
    monkeypatch.setenv("BATON_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["config"])
