"""Every method the bench measures, in table order: bounds, baton, DeepSpeed, PyTorch."""
from __future__ import annotations

from bench.methods.base import SaveMethod
from bench.methods.baton_checkpointer import BatonSave
from bench.methods.bounds import DdWriteBound, MemcpyBound, PythonWriteBound
from bench.methods.dcp import DEFAULT, PROCESS, REUSED, DcpAsyncSave, DcpSave
from bench.methods.deepspeed_engines import FAST, PYTHON, DeepSpeedSave
from bench.methods.torch_save import TorchSave


def all_methods() -> list[SaveMethod]:
    return [
        MemcpyBound(), PythonWriteBound(), DdWriteBound(),
        BatonSave("sync"), BatonSave("async", "python"), BatonSave("async", "native"),
        DeepSpeedSave(), DeepSpeedSave(FAST), DeepSpeedSave(PYTHON),
        DeepSpeedSave(FAST, decoupled=True), DeepSpeedSave(PYTHON, decoupled=True),
        TorchSave(), DcpSave(),
        DcpAsyncSave(DEFAULT), DcpAsyncSave(REUSED), DcpAsyncSave(PROCESS),
    ]
