"""Across nodes, a memory-tier save is committed once per node (ckpt.node_copies): what
happens when one node commits and another cannot, how copies of one save are told from
copies of another save at the same step, and how the ranks agree on a step to resume.

The commit test runs two real processes on a gloo process group (one rank per "node",
each with its own checkpoints directory), through the same SaveRunner training uses.
The two-node training runs are tests/integration/stages/test_two_nodes.py."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckpt import content_hash
from ckpt.save_job import save_identity
from core.errors import BatonError
from stages.engine_setup import ranks_follow_nodes
from stages.tier_restore import AGREED, next_step

REPO = Path(__file__).resolve().parents[3]

WORKER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import torch.distributed as dist
    from ckpt import content_hash, manifest as manifest_io
    from ckpt.errors import CheckpointWriteFailed, NodeCopyIncomplete
    from ckpt.file_image import FileImage
    from ckpt.layout import committed_steps, read_latest
    from ckpt.save_job import CapturedFile, Faults, SaveJob, SaveRunner
    from ckpt.writers.python_writer import PythonWriter

    rank, base, port, fail_at = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    root = base / f"node-{rank}"
    hashing = content_hash.scheme(content_hash.CHUNK_BYTES, content_hash.XXH3)
    runner = SaveRunner(PythonWriter(), root, keep_last=1, group=None, rank=rank, world=2,
                        faults=Faults(), hashing=hashing, threads=1, direct=False)

    def build(step):
        def manifest(entries, node):
            return manifest_io.Manifest(stage="cpt", step=step, components={"rng": sorted(entries)},
                                        files=entries, parallel={"world_size": 2, "zero_stage": 0},
                                        hashing=hashing, extra={"node": node})
        return manifest

    outcomes = {}
    for step in (1, 2, 3):
        tmp = root / f"step-{step:06d}.tmp"
        if step == fail_at and rank == 1:  # the manifest cannot be written: the commit fails
            (tmp / "manifest.json").mkdir(parents=True)
        state = f"rank {rank} step {step}".encode()
        job = SaveJob(step=step, tmp=tmp, files=[CapturedFile(f"rng_{rank}.json", FileImage.of_bytes(state))],
                      build_manifest=build(step), node={"index": rank, "ranks": [rank]})
        try:
            runner.run(job)
            outcomes[step] = "committed"
        except NodeCopyIncomplete as exc:
            outcomes[step] = "incomplete: " + str(exc)
        except CheckpointWriteFailed as exc:
            outcomes[step] = "failed: " + str(exc)
        runner.free_discarded()
        if step == fail_at:
            break
    saves = {p.name: manifest_io.read(p).extra["node"]["save"] for p in committed_steps(root)}
    print(json.dumps({"outcomes": outcomes, "saves": saves, "latest": read_latest(root).name}))
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_node_that_committed_while_another_failed_keeps_its_older_copy(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path), str(port), "3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in (0, 1)]
    try:
        results = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:  # ours: stopped by PID whatever happened
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in results]
    node0, node1 = (json.loads(out.strip().splitlines()[-1]) for out, _ in results)

    # Steps 1 and 2 committed on both nodes, with one save id per step on both.
    assert node0["outcomes"]["1"] == node1["outcomes"]["1"] == "committed"
    assert node0["outcomes"]["2"] == node1["outcomes"]["2"] == "committed"
    assert node0["saves"]["step-000002"] == node1["saves"]["step-000002"]
    # Step 3: node 1's commit failed. Node 0 did commit, and says so instead of claiming
    # nothing was committed; node 1 reports its own failure, `latest` at its step 2.
    assert node0["outcomes"]["3"].startswith("incomplete: ")
    assert "rank 1's node could not commit its copy" in node0["outcomes"]["3"]
    assert "This node (node 0, ranks [0]) did commit its copy" in node0["outcomes"]["3"]
    assert node1["outcomes"]["3"].startswith("failed: ")
    assert "`latest` still points to step-000002" in node1["outcomes"]["3"]
    # keep_last=1, yet node 0 still holds step 2, the newest step both nodes hold: its
    # retention waited for node 1's outcome. Step 1 went once both held step 2.
    assert sorted(node0["saves"]) == ["step-000002", "step-000003"]
    assert sorted(node1["saves"]) == ["step-000002"] and node1["latest"] == "step-000002"


def _report(files: dict[str, bytes]) -> dict:
    return {"written": {rel: content_hash.entry(len(data), [content_hash.digest(data, "xxh3-128")])
                        for rel, data in files.items()}, "failure": None}


def test_a_save_id_names_the_state_of_every_rank_and_nothing_else():
    reports = [_report({"rng_0.json": b"a", "meta.json": b"argv 1"}), _report({"rng_1.json": b"b"})]
    same = [_report({"rng_0.json": b"a", "meta.json": b"argv 2"}), _report({"rng_1.json": b"b"})]
    other = [_report({"rng_0.json": b"a"}), _report({"rng_1.json": b"c"})]
    assert save_identity("step-000003", reports) == save_identity("step-000003", same)
    assert save_identity("step-000003", reports) != save_identity("step-000003", other)
    assert save_identity("step-000003", reports) != save_identity("step-000004", reports)
    swapped = [reports[1], reports[0]]  # the same bytes held by other ranks: another state
    assert save_identity("step-000003", reports) != save_identity("step-000003", swapped)


S2, S3 = "step-000002", "step-000003"


def test_the_ranks_agree_only_on_one_save_of_one_step():
    assert next_step([(S3, "a"), (S3, "a")]) is AGREED
    assert next_step([None, None]) is AGREED
    # Different steps: the ones ahead go back to the oldest offered, or older.
    assert next_step([(S3, "a"), (S2, "b")]) == ("not_after", S2)
    # One step, two saves (a restart re-saved it on one node): neither is shared.
    assert next_step([(S3, "a"), (S3, "b")]) == ("before", S3)
    # A rank with nothing: every rank starts at step 0.
    assert next_step([(S3, "a"), None]) is None


def test_different_checkpoints_that_are_not_steps_are_refused_in_words():
    with pytest.raises(BatonError, match="not a step directory"):
        next_step([("exported", "a"), (S3, "b")])
    with pytest.raises(BatonError, match="copies of exported from different saves"):
        next_step([("exported", "a"), ("exported", "b")])


def test_ranks_are_numbered_by_node_rank_only_when_the_agent_hosts_the_store(monkeypatch):
    parallel = SimpleNamespace(nodes=2, node_rank=1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "0")  # torchrun numbered this node first
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    ranks_follow_nodes(parallel)
    assert os.environ["RANK"] == "0"  # a worker may host the store: torchrun's number stays
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    ranks_follow_nodes(parallel)
    assert os.environ["RANK"] == "3"  # node 1's second rank
    monkeypatch.setenv("RANK", "0")
    ranks_follow_nodes(SimpleNamespace(nodes=1, node_rank=0))
    assert os.environ["RANK"] == "0"
