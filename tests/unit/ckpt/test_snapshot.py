"""The structural copy an asynchronous save takes pickles to the very bytes torch.save
writes for the original, and nothing the caller changes afterwards reaches it."""
from __future__ import annotations

import io
from collections import OrderedDict

import pytest
import torch

from ckpt.file_image import as_bytes, crc32_off, image_of
from ckpt.snapshot import Unsupported, snapshot
from ckpt.staging import StagingPool


class Scaler:  # an arbitrary object in a state dict, like DeepSpeed's loss scaler
    def __init__(self):
        self.cur_scale, self.history = 1024.0, [1, 2]


def _state():
    flat = torch.randn(40)
    tagged = torch.randn(5)
    tagged.ds_id = 3  # an attribute torch.save pickles with the tensor, as ZeRO-3 sets
    module = OrderedDict(w=torch.randn(3, 4), b=torch.zeros(4, dtype=torch.bfloat16))
    module._metadata = OrderedDict({"": {"version": 1}})
    return {"module": module, "views": (flat[:8], flat[8:20].view(3, 4)), "flat": flat,
            "empties": [torch.empty(0), torch.empty(0)], "param": torch.nn.Parameter(torch.ones(2)),
            "step": torch.tensor(7), "scaler": Scaler(), "meta": {"size": torch.Size([2]), "n": 3},
            "tagged": tagged}


def _file(image, buffers) -> bytes:
    out = bytearray(image.size)
    for offset, buffer in image.segments(buffers):
        data = buffer.numpy().tobytes() if isinstance(buffer, torch.Tensor) else bytes(buffer)
        out[offset:offset + len(data)] = data
    return bytes(out)


@pytest.fixture
def stager():
    pool = StagingPool(1)
    return pool.stager(pool.acquire(), "model_states.pt")


def test_snapshot_pickles_to_the_same_bytes_as_the_original(stager):
    crc32_off()
    state = _state()
    copy = snapshot(state, stager)
    expected = io.BytesIO()
    torch.save(state, expected)
    image = image_of(copy)
    assert _file(image, [as_bytes(s) for s in image.storages]) == expected.getvalue()


def test_snapshot_is_a_copy_taken_at_the_call(stager):
    state = _state()
    copy = snapshot(state, stager)
    state["flat"].add_(1.0)
    state["module"]["w"].zero_()
    state["scaler"].history.append(3)
    state["meta"]["n"] = 4
    assert not torch.equal(copy["flat"], state["flat"])
    assert copy["module"]["w"].abs().sum() > 0
    assert copy["scaler"].history == [1, 2] and copy["meta"]["n"] == 3
    assert copy["views"][0].untyped_storage().data_ptr() == copy["flat"].untyped_storage().data_ptr()
    assert copy["flat"].untyped_storage().data_ptr() % 4096 == 0  # O_DIRECT-ready


def test_tensors_hidden_inside_objects_are_refused(stager):
    holder = Scaler()
    holder.history = [torch.ones(2)]
    with pytest.raises(Unsupported):
        snapshot({"scaler": holder}, stager)


@pytest.mark.parametrize("lazy_bit", ["conj", "neg"])
def test_tensors_with_a_lazy_conjugate_or_negative_bit_are_refused(stager, lazy_bit):
    # A view of the staged bytes would drop the bit and save other values; refused, the
    # file is pickled the plain way, and torch.save keeps the bit.
    base = torch.randn(3, dtype=torch.complex64)
    tensor = base.conj() if lazy_bit == "conj" else base.conj().imag
    assert tensor.is_conj() or tensor.is_neg()
    with pytest.raises(Unsupported):
        snapshot({"t": tensor}, stager)


def test_a_lazy_stager_pairs_storages_and_copies_nothing_yet():
    pool = StagingPool(1, lazy=True)
    slot = pool.acquire()
    state = _state()
    copy = snapshot(state, pool.stager(slot, "model_states.pt"))
    assert len(slot.deferred) == len({t.untyped_storage()._cdata for t in _tensors(state)})
    state["flat"].add_(1.0)  # before the copy runs, a change still reaches the buffers
    from ckpt.deferred_copy import CopyBatch

    batch = CopyBatch(slot.deferred)
    batch.run()
    assert batch.wait() == 0.0
    assert torch.equal(copy["flat"], state["flat"])
    assert copy["tagged"].ds_id == 3


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def test_staged_buffers_keep_one_byte_view_each_across_saves():
    pool = StagingPool(1, lazy=True)
    slot = pool.acquire()
    state = _state()
    first = snapshot(state, pool.stager(slot, "model_states.pt"))
    views = [dst for dst, _ in slot.deferred]
    assert all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in views)
    staged = first["flat"].untyped_storage()
    assert slot.byte_view(staged) is slot.views[staged.data_ptr()]
    assert slot.byte_view(staged).numel() == staged.nbytes()
    pool.release(slot)
    slot = pool.acquire()
    slot.deferred = []
    snapshot(state, pool.stager(slot, "model_states.pt"))  # same sizes: same buffers, same views
    again = [dst for dst, _ in slot.deferred]
    assert len(again) == len(views) and all(a is b for a, b in zip(again, views))
    stranger = torch.zeros(5).untyped_storage()  # not staged: a fresh view of its own bytes
    assert slot.byte_view(stranger).data_ptr() == stranger.data_ptr()
    pool.forget_unused(slot, set())  # the file is gone: its buffers and their views too
    assert slot.views == {} and slot.buffers == {}


def test_live_storages_keep_one_byte_view_across_saves_and_replaced_ones_are_let_go():
    from ckpt.deferred_copy import CopyBatch

    pool = StagingPool(1, lazy=True)
    state = _state()

    def save() -> tuple[dict, list]:
        slot = pool.acquire()
        slot.deferred = []
        copy = snapshot(state, pool.stager(slot, "model_states.pt"))
        pool.forget_unused(slot, {"model_states.pt"})
        pairs = [pair for pair in slot.deferred if pair[1].numel()]  # empties share address 0
        CopyBatch(slot.deferred).run()
        pool.release(slot)
        return copy, pairs

    _, first = save()
    state["flat"].add_(1.0)  # the view reads the storage in place: the change is copied
    copy, second = save()
    assert all(a[1] is b[1] for a, b in zip(first, second))  # no new view, no torch call
    assert torch.equal(copy["flat"], state["flat"])
    old_ptr = state["flat"].data_ptr()
    state["flat"] = torch.full((40,), 9.0)  # the engine replaced a tensor (a load, say)
    state["views"] = (state["flat"][:8], state["flat"][8:20].view(3, 4))
    copy, third = save()
    assert torch.equal(copy["flat"], torch.full((40,), 9.0))  # the new storage's bytes
    assert old_ptr not in {view.data_ptr() for _, view in third}
    assert old_ptr not in {ptr for ptr, _ in pool._live_views}  # the old storage is not held


def test_the_next_save_into_the_same_slot_reuses_the_staged_tensors_and_pickles_the_same_bytes():
    crc32_off()
    pool = StagingPool(1)
    state = _state()
    state["again"] = state["flat"]  # one object twice: torch.save writes it once
    state["twin"] = state["module"]["w"].view(3, 4)  # another object, the same view
    slot = pool.acquire()
    first = snapshot(state, pool.stager(slot, "f"), slot.tensors)
    pool.forget_unused(slot, {"f"})
    state["flat"].add_(1.0)  # what the next optimizer step does between two saves
    second = snapshot(state, pool.stager(slot, "f"), slot.tensors)
    pool.forget_unused(slot, {"f"})
    assert second["module"]["w"] is first["module"]["w"] and second["param"] is first["param"]
    assert second["twin"] is not second["module"]["w"]
    assert second["again"] is second["flat"]
    expected = io.BytesIO()
    torch.save(state, expected)
    image = image_of(second)
    assert _file(image, [as_bytes(s) for s in image.storages]) == expected.getvalue()


def test_a_tensor_that_changes_shape_gets_a_new_staged_view_and_the_old_one_is_let_go():
    pool = StagingPool(1)
    slot = pool.acquire()
    weights = torch.randn(12)
    first = snapshot({"w": weights.view(3, 4)}, pool.stager(slot, "f"), slot.tensors)
    pool.forget_unused(slot, {"f"})
    second = snapshot({"w": weights.view(4, 3)}, pool.stager(slot, "f"), slot.tensors)
    pool.forget_unused(slot, {"f"})
    assert second["w"] is not first["w"] and second["w"].shape == (4, 3)
    assert len(slot.tensors) == 1
