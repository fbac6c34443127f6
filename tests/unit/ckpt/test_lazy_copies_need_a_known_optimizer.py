"""Lazy staging copies rely on the optimizer changing nothing saved outside its step();
an optimizer not known to do so makes saves copy in the save call instead."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ckpt.checkpointer import lazy_copies_are_safe


def _engine(inner, **wrapper):
    """A DeepSpeed-shaped engine: `optimizer` is the torch optimizer or a ZeRO-like wrapper."""
    optimizer = SimpleNamespace(optimizer=inner, **wrapper) if wrapper or inner is None else inner
    return SimpleNamespace(optimizer=optimizer)


def _params():
    return [torch.nn.Parameter(torch.ones(2))]


def test_torch_adamw_directly_or_inside_a_zero_wrapper_is_lazy_safe():
    assert lazy_copies_are_safe(_engine(torch.optim.AdamW(_params())))
    assert lazy_copies_are_safe(_engine(torch.optim.AdamW(_params()), use_muon=False))


def test_other_optimizers_make_saves_eager_and_say_so(caplog):
    assert not lazy_copies_are_safe(_engine(torch.optim.RMSprop(_params())))
    assert "optimizer RMSprop is not known to change the state only inside step()" in caplog.text
    assert not lazy_copies_are_safe(_engine(torch.optim.AdamW(_params()), use_muon=True))
