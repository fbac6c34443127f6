"""The typed parallel layout: built from config, read from old manifests, compared with ==."""
from __future__ import annotations

from types import SimpleNamespace as NS

from ckpt.parallel_layout import Layout, Sharding


def _cfg(world_size=2, zero_stage=2, micro_batch=4, global_batch=16):
    return NS(parallel=NS(world_size=world_size, zero_stage=zero_stage),
              stage=NS(micro_batch=micro_batch, global_batch=global_batch))


def test_accumulation_and_round_trip():
    layout = Layout.from_config(_cfg())
    assert layout.accumulation == 2
    assert Layout.from_dict(layout.to_dict()) == layout
    assert layout.to_dict()["gradient_accumulation_steps"] == 2


def test_an_existing_manifests_parallel_dict_reads_back():
    old = {"backend": "gloo", "global_batch": 16, "gradient_accumulation_steps": 2,
           "micro_batch": 4, "world_size": 2, "zero_stage": 2}
    assert Layout.from_dict(old) == Layout(2, 2, 4, 16)
    adopted = {"world_size": 1, "zero_stage": 0}  # adopted checkpoints carry only these
    assert Layout.from_dict(adopted).sharding == Sharding(1, 0)


def test_sharding_ignores_batch_sizes_but_not_world_or_zero():
    a = Layout.from_config(_cfg(micro_batch=4))
    assert a.sharding == Layout.from_config(_cfg(micro_batch=2, global_batch=8)).sharding
    assert a.sharding != Layout.from_config(_cfg(world_size=1)).sharding
    assert a.sharding != Layout.from_config(_cfg(zero_stage=3)).sharding
    assert Layout.from_config(_cfg(), world_size=1).world_size == 1
