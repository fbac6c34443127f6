"""The numerics probe's inputs and its comparison (stages.numerics_probe)."""
from __future__ import annotations

import torch

from stages.numerics_probe import differing, digest, fixed_values


def test_fixed_inputs_are_the_same_bits_every_time_and_spread_over_the_range():
    first, again = fixed_values((64, 32), 3), fixed_values((64, 32), 3)
    assert first.dtype == torch.float32 and torch.equal(first, again)
    assert first.min() >= -1 and first.max() < 1 and first.unique().numel() == first.numel()
    assert not torch.equal(first, fixed_values((64, 32), 4))  # the salt gives other values


def test_a_digest_changes_with_the_last_bit():
    values = fixed_values((16,), 1)
    nudged = values.clone()
    nudged[5] = torch.nextafter(nudged[5], torch.tensor(2.0))
    assert digest(values) == digest(values.clone()) != digest(nudged)


def test_differing_names_changed_and_missing_operations_in_battery_order():
    recorded = {"gemm": "a", "softmax": "b", "adamw": "c", "old op": "d"}
    found = {"gemm": "a", "softmax": "B", "adamw": "c", "new op": "e"}
    assert differing(recorded, found) == ["softmax", "new op", "old op"]
    assert differing(found, dict(found)) == []
