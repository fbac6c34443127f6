"""The commit floor: the least a checkpoint that keeps baton's contract can cost every step.

The bound (`bench.raw_every_step`) writes the state's bytes to one file. A checkpoint that
keeps the contract (docs/checkpoints.md) writes several files per save and commits them:
each file fsynced, the manifest last, the `.tmp` directory renamed into place, `latest`
moved atomically, and the checkpoint that falls out of `keep_last` renamed out of the step
namespace before it is deleted, with the directory fsyncs each of those needs. This floor
does that with baton's own file names and sizes, read from a checkpoint baton committed,
and computes nothing: no structure pickle, no hash, no manifest contents.

It is built to cost the training process as little as such a checkpoint can:
- the copy of the state into the shared buffer runs on a background thread, one foreach
  call that releases the GIL, and the next optimizer step waits for it (baton's lazy
  copier does the same during the next forward and backward);
- the files and the commit are the work of another process (bench.commit_floor_child), so
  none of their Python holds the training process's GIL (baton's saver process);
- the next save's copy waits only until the last save's files are written, not for its
  commit or deletion (baton frees its staging slot at the same point).

So its throughput ratio bounds every checkpointer that keeps the contract on this machine
from above: where its whole interval is below 0.97, none can cost 3% or less every step.
"""
from __future__ import annotations

import json
import mmap
import os
import select
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bench.commit_floor_child import COMMITTED, READY, WRITTEN
from bench.state_copy import StateCopy
from ckpt.layout import MANIFEST

STOP_WAIT_S = 10.0
SILENT_S = 300.0
"""A committer that answers nothing for this long is stuck: the run fails instead of hanging."""


def files_of(checkpoint: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(subdirectories, [(file, size)]) of a committed checkpoint, relative to it, parents
    before children; the manifest last, as the commit writes it."""
    if checkpoint is None or not (checkpoint / MANIFEST).is_file():
        raise ValueError(f"the commit floor needs a committed checkpoint, got {checkpoint}")
    entries = list(checkpoint.rglob("*"))
    directories = sorted(str(p.relative_to(checkpoint)) for p in entries if p.is_dir())
    files = sorted((str(p.relative_to(checkpoint)), p.stat().st_size)
                   for p in entries if p.is_file())
    files.sort(key=lambda entry: entry[0] == MANIFEST)  # stable: the rest keep their order
    return directories, files


class CommitFloorEveryStep:
    """After each step, the state's bytes copied and `template`'s files committed the way
    baton commits, `keep_last` kept; `save`, `drain` and `close` as the bound's."""

    def __init__(self, state, directory: Path, template: Path, keep_last: int):
        directories, files = files_of(template)
        self.home = Path(directory) / "commit-floor"
        self.root = self.home / "checkpoints"
        shutil.rmtree(self.home, ignore_errors=True)
        self.root.mkdir(parents=True)
        self.child = self.pending = self.hook = self.copier = self.mapped = self.copying = None
        self.ready = self.sent = self.written = self.committed = 0
        self.closed = False
        # The buffer both processes map: memory, never written back to a disk.
        self.fd = os.memfd_create("baton-bench-commit-floor")
        try:
            self.copier = StateCopy(state, self._shared_buffer)
            self.copying = ThreadPoolExecutor(1, thread_name_prefix="bench-commit-floor-copy")
            self.child = subprocess.Popen(
                [sys.executable, "-m", "bench.commit_floor_child", str(self.fd), str(self.root),
                 str(keep_last)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(self.fd,))
            shape = {"directories": directories, "files": files}
            self.child.stdin.write(json.dumps(shape).encode() + b"\n")
            self.child.stdin.flush()
            self._read_until(lambda: self.ready == 1)
        except BaseException:
            self.close()  # the caller never gets this object to close
            raise

    def _shared_buffer(self, nbytes: int) -> torch.Tensor:
        os.ftruncate(self.fd, max(1, nbytes))
        self.mapped = mmap.mmap(self.fd, 0)
        return torch.frombuffer(self.mapped, dtype=torch.uint8)[:nbytes]

    def save(self) -> None:
        self._copied()
        self._read_until(lambda: self.written == self.sent)  # the buffer is free again
        if self.hook is None:  # the next optimizer step waits for the copy, as for baton's
            self.hook = register_optimizer_step_pre_hook(self._before_step)  # lazy copies
        self.pending = self.copying.submit(self._copy_and_send)

    def _copy_and_send(self) -> None:
        self.copier.copy()
        self.child.stdin.write(b"s\n")
        self.child.stdin.flush()
        self.sent += 1  # only once the committer has it: a failed copy is no save to wait for

    def _before_step(self, optimizer, args, kwargs) -> None:
        pending = self.pending
        if pending is not None:
            pending.result()

    def drain(self) -> None:
        """Every save sent is committed and its retired checkpoint deleted."""
        self._copied()
        self._read_until(lambda: self.committed == self.sent)
        if self.hook is not None:  # blocks of other kinds run without it
            self.hook, hook = None, self.hook
            hook.remove()

    def _copied(self) -> None:
        """The copy thread is done: `sent` is final and a failed copy is raised here."""
        if self.pending is not None:
            self.pending, pending = None, self.pending
            pending.result()

    def _read_until(self, done) -> None:
        """Read the committer's answers (one byte per event) until `done()`."""
        answers_from = self.child.stdout.fileno()
        while not done():
            if not select.select([answers_from], [], [], SILENT_S)[0]:
                raise TimeoutError(f"the commit floor's committer said nothing for {SILENT_S:g} s")
            answers = os.read(answers_from, 64)
            if not answers:
                raise RuntimeError(f"the commit floor's committer exited ({self.child.wait()}) "
                                   f"after {self.committed} of {self.sent} saves")
            self.ready += answers.count(READY)
            self.written += answers.count(WRITTEN)
            self.committed += answers.count(COMMITTED)

    def close(self) -> None:
        """Drain, stop the committer (killed if it does not stop), free the buffer, and
        remove everything it wrote, whatever failed first; once."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.child is not None and self.child.poll() is None:
                self.drain()
        finally:
            if self.hook is not None:
                self.hook.remove()
            if self.copying is not None:
                self.copying.shutdown()
            if self.child is not None:
                _stop(self.child)
            # No tensor over the mapping may outlive it: torch.frombuffer keeps no buffer
            # export, so nothing would stop the unmap, and a later read would crash.
            self.copier = None
            if self.mapped is not None:
                self.mapped.close()
            os.close(self.fd)
            shutil.rmtree(self.home, ignore_errors=True)


def _stop(child: subprocess.Popen) -> None:
    try:
        child.stdin.write(b"q\n")
        child.stdin.close()
    except (BrokenPipeError, ValueError):
        pass  # already gone
    try:
        child.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    child.stdout.close()
