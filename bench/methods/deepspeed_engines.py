"""`engine.save_checkpoint` through DeepSpeed's own checkpoint engines.

- default: `TorchCheckpointEngine` (torch.save per file; no fsync of its own);
- FastPersist: `FastCheckpointEngine` with the `fast` (libaio) writer, and with the
  `python` writer where the aio one cannot start;
- decoupled: `DecoupledCheckpointEngine`, the same writers in a spawned process; the
  step continues once the state is queued to it, the commit waits for the process.

DeepSpeed leaves durability to the page cache, so `wait_durable` fsyncs what it wrote.
"""
from __future__ import annotations

import copy

from bench.methods.base import ANCHOR_DEEPSPEED, SaveMethod, Unavailable, fsync_tree

FAST, PYTHON = "fast", "python"


def writer_config(writer: str, decoupled: bool) -> dict:
    """DeepSpeed's `checkpoint.writer` section, defaults filled by DeepSpeed itself."""
    from deepspeed.runtime.model_checkpointing.config import get_checkpoint_writer_config

    return get_checkpoint_writer_config({"writer": {"type": writer, "decoupled": decoupled,
                                                    "data_parallel": "replica"}})


def config_with_writer(engine, writer: str, decoupled: bool):
    """A copy of the engine's DeepSpeed config whose checkpoint section names a writer."""
    config = copy.copy(engine._config)
    config.checkpoint_config = {**config.checkpoint_config,
                                "writer": writer_config(writer, decoupled)}
    return config


def make_engine(engine, writer: str | None, decoupled: bool):
    """What `deepspeed.initialize` would build from that config (its own factory)."""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.checkpoint_engine.fast_checkpoint_engine import FastCheckpointEngine
    from deepspeed.runtime.checkpoint_engine.utils import create_checkpoint_engine
    from deepspeed.runtime.model_checkpointing.utils import create_data_parallel_writer_config
    from deepspeed.utils import groups

    if writer is None:
        return TorchCheckpointEngine(engine._config)
    config = config_with_writer(engine, writer, decoupled)
    if decoupled:
        # The decoupled process builds this same engine first thing; where it cannot start,
        # the process would die and DeepSpeed report only that it died. Ask here instead.
        dp_config = create_data_parallel_writer_config(groups, "REPLICA", 0, False)
        FastCheckpointEngine(config, dp_config, optimize_dp_state=True)
    return create_checkpoint_engine(config, groups, zero_stage=0, has_moe_layers=False,
                                    optimize_dp_state=True)


class DeepSpeedSave(SaveMethod):
    def __init__(self, writer: str | None = None, decoupled: bool = False):
        super().__init__()
        self.writer, self.decoupled = writer, decoupled
        self.isolated = decoupled
        if writer is None:
            self.name = ANCHOR_DEEPSPEED
        else:
            kind = "decoupled" if decoupled else "fastpersist"
            self.name = f"deepspeed {kind} ({'aio' if writer == FAST else writer} writer)"

    def prepare(self, state, directory) -> None:
        super().prepare(state, directory)
        try:
            self.checkpoint_engine = make_engine(state.engine, self.writer, self.decoupled)
        except Exception as exc:  # DeepSpeed raises bare RuntimeErrors on CPU-only hosts
            raise Unavailable(f"{type(exc).__name__}: {exc}") from None

    def save(self) -> None:
        engine = self.state.engine
        engine.checkpoint_engine = self.checkpoint_engine
        tag = self.next_path().name
        engine.save_checkpoint(str(self.directory), tag=tag, save_latest=False)

    def wait_durable(self) -> None:
        if self.decoupled:
            self.state.engine._commit_decoupled_checkpoint()  # waits for its process
        fsync_tree(self.last)

    def close(self) -> None:
        if self.decoupled and getattr(self, "checkpoint_engine", None) is not None:
            self.checkpoint_engine.cleanup()  # stops its process

    def children(self) -> list[int]:
        process = getattr(getattr(self, "checkpoint_engine", None), "ckpt_process", None)
        return [process.pid] if process is not None else []
