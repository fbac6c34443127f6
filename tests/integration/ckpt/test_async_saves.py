"""Asynchronous saves in one in-process rank (a real DeepSpeed engine, gloo): what the step
hands over is a copy, commits happen in order in the background, staging buffers are
reused, and a background failure surfaces at the next step boundary with `latest` kept."""
from __future__ import annotations

import threading

import pytest
import torch

from bench.state import build_state
from bench.training import train_steps
from ckpt import manifest as manifest_io
from ckpt.checkpointer import Checkpointer, SaveOptions
from ckpt.cleanup import find_leftovers
from ckpt.deferred_copy import CopyBatch, UpdateGuard
from ckpt.errors import CheckpointWriteFailed
from ckpt.layout import committed_steps, read_latest
from ckpt.reader import CheckpointReader
from tests.integration.ckpt.in_process_rank import payload, saved_weights

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    built = build_state("tiny", [], tmp_path_factory.mktemp("async-run"), None)
    yield built
    built.close()


def _checkpointer(state, root, **options) -> Checkpointer:
    return Checkpointer(state.engine, root, "cpt", state.layout, keep_last=3,
                        fail_write_at_step=options.pop("fail_write_at_step", -1),
                        options=SaveOptions(**options))


def test_the_saved_state_is_the_state_at_the_save_call(state, tmp_path):
    """Eager: the save call copies, so anything may change the weights right after it."""
    ck = _checkpointer(state, tmp_path, mode="async", writer="python", snapshot="eager")
    before = {k: v.detach().clone() for k, v in state.module.state_dict().items()}
    path = ck.save(1, payload(1))
    with torch.no_grad():  # training goes on and changes the weights while the save is written
        for parameter in state.module.parameters():
            parameter.add_(1.0)
    ck.close()
    manifest_io.verify(path)
    saved = saved_weights(path)
    assert all(torch.equal(saved[k], before[k]) for k in before)
    with torch.no_grad():
        for parameter in state.module.parameters():
            parameter.sub_(1.0)


def test_a_lazy_save_holds_the_state_at_the_save_call_across_the_next_step(state, tmp_path):
    """Lazy: the copy runs during the next forward and backward; the optimizer step, the
    first thing that changes the state, waits for it."""
    ck = _checkpointer(state, tmp_path, mode="async", writer="python", snapshot="lazy")
    before = {k: v.detach().clone() for k, v in state.module.state_dict().items()}
    moments = _moments(state)
    path = ck.save(1, payload(1))
    train_steps(state.engine, state.cfg.stage, steps=1)
    ck.close()
    after = state.module.state_dict()
    assert not all(torch.equal(after[k], before[k]) for k in before)  # the step changed them
    manifest_io.verify(path)
    saved = saved_weights(path)
    assert all(torch.equal(saved[k], before[k]) for k in before)
    saved_moments = _moments_in(path)
    assert saved_moments and all(torch.equal(a, b) for a, b in zip(saved_moments, moments))


def test_the_next_optimizer_step_waits_for_the_lazy_copy(state, tmp_path, monkeypatch):
    gate, reached = threading.Event(), threading.Event()
    copy_for_real, wait_for_real = CopyBatch.run, UpdateGuard.wait_all

    def held_copy(batch):
        gate.wait()  # the copy cannot finish before the test lets it
        copy_for_real(batch)

    def guard_reached(guard):
        reached.set()  # the optimizer step has come to the guard
        return wait_for_real(guard)

    monkeypatch.setattr(CopyBatch, "run", held_copy)
    monkeypatch.setattr(UpdateGuard, "wait_all", guard_reached)
    ck = _checkpointer(state, tmp_path, mode="async", writer="python", snapshot="lazy")
    before = {k: v.detach().clone() for k, v in state.module.state_dict().items()}
    path = ck.save(1, payload(1))
    stepped = threading.Event()

    def step():
        train_steps(state.engine, state.cfg.stage, steps=1)
        stepped.set()

    stepping = threading.Thread(target=step)
    stepping.start()
    try:
        assert reached.wait(timeout=120), "the optimizer step never reached the guard"
        # Nothing can release the step now but the copy: a bounded wait to see it is held.
        assert not stepped.wait(timeout=0.5), "the optimizer step ran before the staging copy"
    finally:
        gate.set()
        stepping.join()
    ck.close()
    saved = saved_weights(path)
    assert all(torch.equal(saved[k], before[k]) for k in before)
    assert ck.stats[0]["update_wait_s"] >= 0.5
    assert ck.stats[0]["stall_s"] >= ck.stats[0]["update_wait_s"]


def _moments(state) -> list[torch.Tensor]:
    optimizer = state.engine.optimizer
    return [optimizer.state[p]["exp_avg"].clone() for group in optimizer.param_groups
            for p in group["params"]]


def _moments_in(path) -> list[torch.Tensor]:
    reader = CheckpointReader(path)
    model_file = next(rel for rel in reader.manifest.files if rel.endswith("model_states.pt"))
    optimizer = reader.torch(model_file)["optimizer"]
    return [optimizer["state"][index]["exp_avg"] for index in sorted(optimizer["state"])]


def test_saves_commit_in_order_and_reuse_their_staging_buffers(state, tmp_path):
    ck = _checkpointer(state, tmp_path, mode="async", writer="auto", max_in_flight=2)
    addresses = []
    for step in (1, 2, 3, 4):
        ck.save(step, payload(step))
        addresses.append(sorted(b.data_ptr() for slot in ck.pool._all
                                for per_file in slot.buffers.values() for b in per_file))
    ck.close()
    assert [p.name for p in committed_steps(tmp_path)] == ["step-000002", "step-000003", "step-000004"]
    assert read_latest(tmp_path).name == "step-000004"
    assert find_leftovers(tmp_path) == []
    # Two slots: the first two saves allocate, the next two reuse those buffers.
    assert addresses[2] == addresses[3] and set(addresses[1]) >= set(addresses[0])
    assert ck.pool.allocated_bytes() <= 2 * state.nbytes() * 1.1
    assert [s["step"] for s in ck.stats] == [1, 2, 3, 4]
    assert all(s["stall_s"] <= s["durable_s"] for s in ck.stats)


def test_wait_committed_returns_at_the_commit_and_drain_after_retention(state, tmp_path):
    ck = Checkpointer(state.engine, tmp_path, "cpt", state.layout, keep_last=1,
                      options=SaveOptions(mode="async"))
    ck.save(1, payload(1))
    ck.drain()
    ck.save(2, payload(2))
    ck.wait_committed()
    # Committed: step 2 is `latest` and step 1 is out of the step namespace (retention
    # renamed it inside the commit); freeing its bytes may still be under way.
    assert read_latest(tmp_path).name == "step-000002"
    assert [p.name for p in committed_steps(tmp_path)] == ["step-000002"]
    ck.drain()
    assert find_leftovers(tmp_path) == []  # no step-000001.deleting left once drained
    ck.close()
    assert [s["step"] for s in ck.stats] == [1, 2]


def test_a_background_failure_surfaces_at_the_next_step_and_keeps_latest(state, tmp_path):
    ck = _checkpointer(state, tmp_path, mode="async", writer="python", fail_write_at_step=2)
    ck.save(1, payload(1))
    ck.drain()
    ck.save(2, payload(2))  # its first write fails with ENOSPC in the background
    with pytest.raises(CheckpointWriteFailed) as failed:
        ck.drain()
    assert failed.value.step == 2 and failed.value.latest == "step-000001"
    assert "No space left on device" in str(failed.value)
    assert read_latest(tmp_path).name == "step-000001"
    assert not (tmp_path / "step-000002.tmp").exists()
    with pytest.raises(CheckpointWriteFailed):  # no later save may move `latest` past it
        ck.save(3, payload(3))
    ck.close()
    assert read_latest(tmp_path).name == "step-000001"


def test_sync_and_async_saves_write_the_same_bytes(state, tmp_path):
    paths = {}
    for mode in ("sync", "async"):
        ck = _checkpointer(state, tmp_path / mode, mode=mode, writer="python")
        paths[mode] = ck.save(1, payload(1))
        ck.close()
    a, b = (manifest_io.verify(paths[m]) for m in ("sync", "async"))
    model_files = [rel for rel in a.files if rel.endswith(".pt")]
    assert model_files and all(a.files[rel] == b.files[rel] for rel in model_files)


def test_signed_manifests_hash_with_sha256_and_unsigned_with_xxh3(state, tmp_path, monkeypatch):
    from ckpt import signing

    monkeypatch.setenv("BATON_TEST_KEY", "k" * 64)
    algs = {}
    for name, key_env in (("unsigned", None), ("signed", "BATON_TEST_KEY")):
        signing.configure(key_env)
        try:
            ck = _checkpointer(state, tmp_path / name, mode="async", writer="auto")
            path = ck.save(1, payload(1))
            ck.close()
            algs[name] = manifest_io.verify(path).hashing["alg"]
        finally:
            signing.configure(None)
    assert algs == {"unsigned": "xxh3-128", "signed": "sha256"}
