"""baton's own `Checkpointer`: sync, and async with each writer (ckpt/writers)."""
from __future__ import annotations

from dataclasses import replace

from bench.methods.base import SaveMethod, Unavailable, tree_bytes


def payload(step: int, tokens_per_step: int = 0):
    """The non-DeepSpeed part of a save, as a stage worker builds it (small JSON files)."""
    from ckpt.checkpointer import SavePayload
    from ckpt.state import RngState, TrainingProgress

    progress = TrainingProgress(step=step, micro_step=step, tokens_seen=step * tokens_per_step,
                                samples_seen=step)
    return SavePayload(progress=progress.state_dict(), data={}, meta={},
                       rng=RngState.state_dict())


def save_options(cfg, mode: str, writer: str | None = None):
    """The run's `ckpt.*` settings with the mode (and writer) this measurement asks for."""
    from ckpt.checkpointer import SaveOptions

    options = replace(SaveOptions.from_config(cfg.ckpt), mode=mode)
    return options if writer is None else replace(options, writer=writer)


def writer_problem(writer: str | None) -> str | None:
    if writer != "native":
        return None
    from ckpt.writers import native_unavailable_reason

    reason = native_unavailable_reason()
    return None if reason is None else f"native writer not built: {reason}"


class BatonSave(SaveMethod):
    def __init__(self, mode: str, writer: str | None = None):
        super().__init__()
        self.mode, self.writer = mode, writer
        self.name = f"baton {mode}" + (f" ({writer} writer)" if writer else "")

    def prepare(self, state, directory) -> None:
        from ckpt.checkpointer import Checkpointer

        super().prepare(state, directory)
        problem = writer_problem(self.writer)
        if problem:
            raise Unavailable(problem)
        # keep_last=1: retention removes the previous round's checkpoint at each commit.
        self.checkpointer = Checkpointer(state.engine, self.directory, state.cfg.stage.name,
                                         state.layout, keep_last=1,
                                         options=save_options(state.cfg, self.mode, self.writer))
        self.io = state.engine.checkpoint_engine  # the Checkpointer installed its engine

    def save(self) -> None:
        self.state.engine.checkpoint_engine = self.io  # other methods swap in their own
        self.saves += 1
        self.last = self.checkpointer.save(self.saves, payload(self.saves))

    def before_update(self) -> None:
        self.checkpointer.before_update()

    def wait_durable(self) -> None:
        # Committed: durable, manifest last, `latest` moved. Deleting the checkpoint that
        # retention retired is not part of it (cleanup waits for it, untimed, as the
        # harness deletes the other methods' files).
        self.checkpointer.wait_committed()

    def saved_bytes(self) -> int:
        return tree_bytes(self.last)

    def cleanup(self) -> None:
        # The newest checkpoint stays: the verified-load comparison reads it. The deletion
        # of the one before ends here, before the next method's round.
        self.checkpointer.drain()

    def close(self) -> None:
        if getattr(self, "checkpointer", None) is not None:
            self.checkpointer.close()
