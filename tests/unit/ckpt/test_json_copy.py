"""The saver process encodes a save's JSON payloads itself, from a copy made at the save
call (ckpt.save_job.json_copy): the copy must encode to the same bytes, must not change
when the caller's payload does, and must refuse what json would treat differently."""
from __future__ import annotations

import random

import pytest

from ckpt.save_job import NotPlainJson, encode_json, json_copy
from ckpt.state import RngState


def test_an_rng_payload_encodes_to_the_same_bytes_and_is_cut_off_from_the_original():
    random.seed(3)
    payload = {"rng": RngState.state_dict(), "progress": {"step": 7, "tokens": 1.5, "done": None}}
    copied = json_copy(payload)
    assert encode_json(copied) == encode_json(payload)
    before = encode_json(copied)
    payload["rng"]["python"]["state"][0] += 1
    payload["progress"]["step"] = 8
    payload["new"] = True
    assert encode_json(copied) == before


@pytest.mark.parametrize("value", [
    {1: "an int key"},
    {"a": (1, 2)},  # json writes a tuple as a list: encoded at the save call instead
    {"a": [1, {2}]},
    {"a": object()},
])
def test_anything_but_plain_json_data_is_refused(value):
    with pytest.raises(NotPlainJson):
        json_copy(value)
