"""PyTorch Distributed Checkpoint: `save`, and `async_save` three ways.

- default: `async_save` as called without a stager: a fresh CPU copy of the state per save;
- reused stager: one `DefaultStager` kept across saves, so its staging storages are
  allocated once and copied into afterwards (pinned where a GPU exists);
- process: the same with shared-memory staging and `AsyncCheckpointerType.PROCESS`, the
  write running in DCP's background process instead of a thread.

DCP's file writer fsyncs each file, so a finished future means durable.
"""
from __future__ import annotations

import torch

from bench.methods.base import ANCHOR_DCP_ASYNC, SaveMethod

DEFAULT, REUSED, PROCESS = "default", "reused", "process"
NAMES = {DEFAULT: "dcp async_save (default stager)", REUSED: ANCHOR_DCP_ASYNC,
         PROCESS: "dcp async_save (process, reused shm stager)"}


class DcpSave(SaveMethod):
    name = "dcp save"

    def save(self) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self.state.state_dict(), checkpoint_id=str(self.next_path()))


class DcpAsyncSave(SaveMethod):
    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.name = NAMES[variant]
        self.isolated = variant == PROCESS
        self.stager = self.future = None

    def prepare(self, state, directory) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        super().prepare(state, directory)
        if self.variant != DEFAULT:
            # Synchronous staging: the step continues once the copy is made, as baton's does.
            self.stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(),
                use_shared_memory=self.variant == PROCESS,
                use_async_staging=False, use_non_blocking_copy=False))

    def save(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        kind = (AsyncCheckpointerType.PROCESS if self.variant == PROCESS
                else AsyncCheckpointerType.THREAD)
        self.future = dcp.async_save(self.state.state_dict(), checkpoint_id=str(self.next_path()),
                                     async_stager=self.stager, async_checkpointer_type=kind)

    def wait_durable(self) -> None:
        self.future.result()

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()
        if self.variant == PROCESS:
            stop_dcp_process()

    def children(self) -> list[int]:
        process = dcp_process() if self.variant == PROCESS else None
        return [process._save_process.pid] if process is not None else []


def dcp_process():
    """DCP's one background checkpoint process (module-global in torch), if started."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    return executor._CHECKPOINT_PROCESS


def stop_dcp_process() -> None:
    """torch stops its checkpoint process only when that object is collected; do it now
    (its own shutdown: a terminate request, a join, then SIGTERM) so none outlives the bench."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    process, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
    if process is not None:
        process.__del__()
        process._save_process.join(timeout=10)
