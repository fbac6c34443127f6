"""The steady-state snapshot (ckpt.steady_memo): a save that meets each tensor as the last
save did reuses its staging, and whatever changed takes the full way. Every save here is
checked byte for byte against torch.save of the live state at that moment."""
from __future__ import annotations

import io
from collections import OrderedDict

import pytest
import torch

from ckpt.deferred_copy import CopyBatch
from ckpt.file_image import as_bytes, crc32_off, image_of
from ckpt.snapshot import snapshot
from ckpt.staging import StagingPool
from ckpt.steady_memo import TensorMemo

FILE = "mp_rank_00_model_states.pt"


def _state() -> dict:
    """A module's weights (new detached tensors each save, as DeepSpeed's state dict),
    optimizer moments (the same objects each save), views of one flat buffer, a step."""
    weights = {"w": torch.nn.Parameter(torch.randn(3, 4)), "b": torch.nn.Parameter(torch.zeros(4))}
    flat = torch.randn(40)
    moments = {name: {"exp_avg": torch.zeros_like(p), "step": torch.tensor(0.0)}
               for name, p in weights.items()}
    return {"weights": weights, "moments": moments, "flat": flat}


def _as_saved(state: dict) -> dict:
    module = OrderedDict((name, p.detach()) for name, p in state["weights"].items())
    return {"module": module, "optimizer": state["moments"],
            "views": (state["flat"][:8], state["flat"][8:20].view(3, 4)), "flat": state["flat"]}


class Saver:
    """Saves into one slot of a lazy pool, as the Checkpointer does step after step."""

    def __init__(self):
        crc32_off()
        self.pool = StagingPool(1, lazy=True)

    def save(self, saved: dict) -> tuple[dict, bytes]:
        slot = self.pool.acquire()
        slot.deferred = []
        self.memo = slot.memos.setdefault(FILE, TensorMemo())
        copy = snapshot(saved, self.pool.stager(slot, FILE), slot.tensors, self.memo)
        self.pool.forget_unused(slot, {FILE})
        CopyBatch(slot.deferred).run()
        self.pool.release(slot)
        image = image_of(copy)
        out = bytearray(image.size)
        for offset, buffer in image.segments([as_bytes(s) for s in image.storages]):
            data = buffer.numpy().tobytes() if isinstance(buffer, torch.Tensor) else bytes(buffer)
            out[offset:offset + len(data)] = data
        return copy, bytes(out)


def _torch_save(saved: dict) -> bytes:
    out = io.BytesIO()
    torch.save(saved, out)
    return out.getvalue()


def _train(state: dict) -> None:
    """What an optimizer step does between two saves: every byte changes in place."""
    with torch.no_grad():
        for name, p in state["weights"].items():
            p.add_(0.5)
            state["moments"][name]["exp_avg"].add_(1.0)
            state["moments"][name]["step"].add_(1.0)
        state["flat"].mul_(2.0)


def test_a_steady_save_reuses_every_staged_tensor_and_writes_torch_saves_bytes():
    saver, state = Saver(), _state()
    first, _ = saver.save(_as_saved(state))
    for _ in range(3):
        _train(state)
        saved = _as_saved(state)
        copy, data = saver.save(saved)
        assert data == _torch_save(saved)
        assert copy["module"]["w"] is first["module"]["w"]  # not staged again
        assert copy["optimizer"]["b"]["exp_avg"] is first["optimizer"]["b"]["exp_avg"]
    assert len(saver.memo) == 9  # 2 weights, 4 moments, the flat buffer and 2 views of it


@pytest.mark.parametrize("change", [
    "replaced storage", "resized storage", "new view", "requires_grad", "inserted first",
    "aliased storage", "python attribute", "twin view"])
def test_whatever_changed_between_two_saves_is_staged_the_full_way(change):
    saver, state = Saver(), _state()
    saver.save(_as_saved(state))
    _train(state)
    with torch.no_grad():
        if change == "replaced storage":  # a load, or ZeRO swapping a parameter's data
            state["weights"]["w"].data = torch.full((3, 4), 7.0)
        elif change == "resized storage":  # freed and brought back, as FSDP-style code does
            storage = state["flat"].untyped_storage()
            storage.resize_(0)
            storage.resize_(40 * 4 + 16)
            state["flat"].set_(storage, 0, (40,), (1,)).fill_(3.0)
        elif change == "requires_grad":
            state["moments"]["w"]["exp_avg"].requires_grad_(True)
        elif change == "aliased storage":  # another storage object over the same bytes
            alias = state["flat"].untyped_storage()[0:40 * 4]
            state["flat"] = torch.empty(0).set_(alias, 0, (40,), (1,))
        elif change == "python attribute":
            state["moments"]["b"]["exp_avg"].ds_id = 4
    saved = _as_saved(state)
    if change == "inserted first":  # a new tensor before all the others in the file
        saved = {"first": torch.arange(12.0), **saved}  # w's bytes, so w's buffer
    if change == "new view":  # the same storage, viewed another way
        saved["views"] = (state["flat"][:8], state["flat"][8:20].view(4, 3))
    if change == "twin view":  # a second tensor object viewing the flat buffer the same way
        saved["twin"] = state["flat"].view(40)
    _, data = saver.save(saved)
    assert data == _torch_save(saved)
    _train(state)
    saved = {**saved, **_as_saved(state)}  # and the save after that is steady again
    _, data = saver.save(saved)
    assert data == _torch_save(saved)
