"""Multi-node launch settings: config checks, per-node file names, torchrun arguments."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.config import compose
from core.errors import ConfigError
from stages.nodes import node_file, rendezvous_args


def test_one_node_is_standalone_and_keeps_the_single_node_names(tmp_path):
    cfg = compose(["parallel.world_size=2"])
    assert rendezvous_args(cfg.parallel, tmp_path, "cpt") == ["--standalone", "--nproc-per-node=2"]
    assert node_file(tmp_path, "launch.json", cfg.parallel) == tmp_path / "launch.json"


def test_every_node_names_the_same_c10d_job_and_its_own_files(tmp_path):
    args = {}
    for k in (0, 1):
        cfg = compose(["parallel.world_size=4", "parallel.nodes=2", f"parallel.node_rank={k}",
                       "parallel.rdzv_endpoint=10.0.0.1:29400", f"run.dir={tmp_path}"])
        args[k] = rendezvous_args(cfg.parallel, cfg.run.dir, "sft")
        assert node_file(Path("/s"), "worker_error.json", cfg.parallel) == Path(
            "/s/worker_error.json" if k == 0 else "/s/worker_error-node-1.json")
    assert args[0] == args[1]
    assert {"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            "--rdzv-endpoint=10.0.0.1:29400"} <= set(args[0])


@pytest.mark.parametrize("overrides,message", [
    (["parallel.nodes=2", "parallel.world_size=3", "parallel.rdzv_endpoint=h:1"],
     "parallel.world_size=3 does not split evenly over parallel.nodes=2"),
    (["parallel.nodes=2", "parallel.world_size=2"],
     "parallel.rdzv_endpoint=None: expected host:port of the c10d rendezvous"),
    (["parallel.nodes=2", "parallel.node_rank=2", "parallel.world_size=2",
      "parallel.rdzv_endpoint=h:1"], "parallel.node_rank=2: expected 0..1"),
    (["parallel.nodes=2", "parallel.world_size=2", "parallel.rdzv_endpoint=h:1",
      "ckpt.tiers.memory.every=1", "ckpt.selective.threshold=0"],
     "selective saves into per-node memory-tier copies are not supported yet"),
    (["parallel.nodes=0"], "parallel.nodes=0: expected >= 1"),
])
def test_bad_node_settings_are_named_with_the_fix(overrides, message):
    with pytest.raises(ConfigError) as caught:
        compose(overrides)
    assert message in str(caught.value)


def test_the_memory_tier_is_allowed_across_nodes():
    cfg = compose(["parallel.nodes=2", "parallel.world_size=2", "parallel.rdzv_endpoint=h:1",
                   "ckpt.tiers.memory.every=1"])
    assert cfg.ckpt.tiers.memory.every == 1
