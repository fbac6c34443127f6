"""The fast structure pass writes exactly torch.save's archive, and hands anything unusual back."""
from __future__ import annotations

import io
from collections import OrderedDict

import pytest
import torch

from ckpt.file_image import crc32_off, image_of
from ckpt.structure_pickle import Fallback, save_structure


@pytest.fixture(autouse=True)
def _no_crc():
    crc32_off()


def _skeleton_of_torch_save(obj) -> bytes:
    """torch.save's own bytes under skip_data (headers + data.pkl, zeros where data goes)."""
    out = io.BytesIO()
    with torch.serialization.skip_data():
        torch.save(obj, out)
    return out.getvalue()


def _skeleton_of_fast(obj) -> bytes:
    out = io.BytesIO()
    with torch.serialization.skip_data():
        save_structure(obj, out)
    return out.getvalue()


def _filled(image) -> bytearray:
    """What a writer puts on disk: each hole filled with its storage's bytes."""
    out = bytearray(image.size)
    for offset, buffer in image.segments([torch.empty(0, dtype=torch.uint8).set_(s)
                                          for s in image.storages]):
        data = buffer.numpy().tobytes() if isinstance(buffer, torch.Tensor) else bytes(buffer)
        out[offset:offset + len(data)] = data
    return out


def _trained_state():
    """A module and AdamW after two steps: the state dicts DeepSpeed's model-states file holds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    for _ in range(2):
        model(torch.randn(5, 6)).sum().backward()
        optimizer.step()
        scheduler.step()
    return {"module": model.state_dict(), "optimizer": optimizer.state_dict(),
            "lr_scheduler": {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"},
            "global_steps": 2, "ds_config": {"train_batch_size": 16, "zero_optimization": {"stage": 0}},
            "ds_version": "0.19.8", "dp_world_size": 1, "buffer_names": ["running"],
            "param_shapes": [OrderedDict(w=torch.Size([4, 6]))], "frozen": None}


CASES = {
    "trained": _trained_state,
    "shared storage views": lambda: {"flat": (flat := torch.randn(40)), "a": flat[:8],
                                     "b": flat[8:20].view(3, 4), "t": flat[1:30:3]},
    "parameters": lambda: OrderedDict(p=torch.nn.Parameter(torch.randn(2, 3)),
                                      frozen=torch.nn.Parameter(torch.ones(4), requires_grad=False)),
    "dtypes": lambda: {str(d): torch.zeros(3, dtype=d) for d in (
        torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int32, torch.bool,
        torch.complex64, torch.uint8)},
    "empty and scalar": lambda: {"empty": torch.empty(0), "scalar": torch.tensor(3.5),
                                 "step": torch.tensor(7.0), "noncontig": torch.randn(4, 5).t()},
    "the same tensor twice": lambda: (lambda t: {"x": t, "again": [t, (t,)]})(torch.arange(5)),
    "no tensors": lambda: {"ints": list(range(700)), "text": "x" * 300, "nested": [[1.5, None]]},
}


@pytest.mark.parametrize("case", CASES)
def test_bytes_match_torch_save(case):
    state = CASES[case]()
    assert _skeleton_of_fast(state) == _skeleton_of_torch_save(state)


@pytest.mark.parametrize("alignment", [64, 4096])
def test_filled_image_is_torch_save_and_loads(alignment):
    state = _trained_state()
    image = image_of(state, alignment)
    out = _filled(image)
    from torch.utils.serialization import config
    config.save.storage_alignment = alignment
    try:
        expected = io.BytesIO()
        torch.save(state, expected)
    finally:
        config.save.storage_alignment = 64
    assert bytes(out) == expected.getvalue()
    loaded = torch.load(io.BytesIO(bytes(out)), weights_only=True)
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


def _with_attribute():
    tensor = torch.randn(3)
    tensor.ds_id = 4  # ZeRO-3's flat groups carry attributes: torch's other path
    return {"t": tensor}


def _with_hook():
    tensor = torch.randn(3, requires_grad=True)
    tensor.register_hook(lambda grad: grad)
    return {"t": tensor}


FALLBACKS = {
    "attribute": _with_attribute,
    "sparse": lambda: {"s": torch.eye(3).to_sparse()},
    "uint16 (an untyped-storage dtype)": lambda: {"u": torch.zeros(3, dtype=torch.uint16)},
    "two dtypes on one storage": lambda: (lambda t: {"f": t, "i": t.view(torch.int32)})(torch.randn(4)),
    "a bare storage": lambda: {"s": torch.randn(3).untyped_storage()},
    "a hook": _with_hook,
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_unusual_tensors_fall_back_before_writing(case):
    out = io.BytesIO()
    with pytest.raises(Fallback), torch.serialization.skip_data():
        save_structure(FALLBACKS[case](), out)
    assert out.getvalue() == b""  # nothing written: the caller starts over with torch.save


@pytest.mark.parametrize("case", ["attribute", "uint16 (an untyped-storage dtype)"])
def test_image_of_still_matches_torch_save_through_the_fallback(case):
    state = FALLBACKS[case]()
    image = image_of(state)
    out = _filled(image)
    expected = io.BytesIO()
    torch.save(state, expected)
    assert bytes(out) == expected.getvalue()


def test_a_copyreg_reduction_for_tensors_sends_it_back_to_torch_save():
    import copyreg

    copyreg.pickle(torch.Tensor, lambda t: (torch.zeros, (t.numel(),)))
    try:
        with pytest.raises(Fallback), torch.serialization.skip_data():
            save_structure({"t": torch.ones(3)}, io.BytesIO())
    finally:
        del copyreg.dispatch_table[torch.Tensor]


def test_it_refuses_to_run_where_torch_save_would_write_the_data():
    with pytest.raises(ValueError, match="skip_data"):
        save_structure({"t": torch.ones(3)}, io.BytesIO())
