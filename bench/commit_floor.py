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
  call that releases the GIL (baton's lazy copier does the same during the next step);
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
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench.commit_floor_child import COMMITTED, READY, WRITTEN
from bench.state_copy import StateCopy, state_bytes
from ckpt.layout import MANIFEST

STOP_WAIT_S = 10.0


def files_of(checkpoint: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(subdirectories, [(file, size)]) of a committed checkpoint, relative to it, parents
    before children; the manifest last, as the commit writes it."""
    if checkpoint is None or not (checkpoint / MANIFEST).is_file():
        raise ValueError(f"the commit floor needs a committed checkpoint, got {checkpoint}")
    directories = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_dir())
    files = sorted((str(p.relative_to(checkpoint)), p.stat().st_size)
                   for p in checkpoint.rglob("*") if p.is_file())
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
        # The buffer both processes map: memory, never written back to a disk.
        self.fd = os.memfd_create("baton-bench-commit-floor")
        os.ftruncate(self.fd, max(1, state_bytes(state)))
        self.mapped = mmap.mmap(self.fd, 0)
        self.copier = StateCopy(state, torch.frombuffer(self.mapped, dtype=torch.uint8)[:state_bytes(state)])
        self.copying = ThreadPoolExecutor(1, thread_name_prefix="bench-commit-floor-copy")
        self.pending, self.child = None, None
        self.sent = self.written = self.committed = 0
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "bench.commit_floor_child", str(self.fd), str(self.root),
                 str(keep_last)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(self.fd,))
            shape = {"directories": directories, "files": files}
            self.child.stdin.write(json.dumps(shape).encode() + b"\n")
            self.child.stdin.flush()
            self._read_until(lambda: self.ready, first=True)
        except BaseException:
            self.close()  # the caller never gets this object to close
            raise

    def save(self) -> None:
        self._copied()
        self._read_until(lambda: self.written == self.sent)  # the buffer is free again
        self.sent += 1
        self.pending = self.copying.submit(self._copy_and_send)

    def _copy_and_send(self) -> None:
        self.copier.copy()
        self.child.stdin.write(b"s\n")
        self.child.stdin.flush()

    def drain(self) -> None:
        """Every save sent is committed and its retired checkpoint deleted."""
        self._copied()
        self._read_until(lambda: self.committed == self.sent)

    def _copied(self) -> None:
        if self.pending is not None:
            self.pending, pending = None, self.pending
            pending.result()

    def _read_until(self, done, first: bool = False) -> None:
        """Read the committer's answers (one byte per event) until `done()`."""
        self.ready = not first
        while not done():
            answers = os.read(self.child.stdout.fileno(), 64)
            if not answers:
                raise RuntimeError(f"the commit floor's committer exited ({self.child.wait()}) "
                                   f"after {self.committed} of {self.sent} saves")
            self.ready = self.ready or READY in answers
            self.written += answers.count(WRITTEN)
            self.committed += answers.count(COMMITTED)

    def close(self) -> None:
        """Drain, stop the committer (killed if it does not stop), free the buffer, and
        remove everything it wrote, whatever failed first."""
        try:
            if self.child is not None and self.child.poll() is None:
                self.drain()
        finally:
            self.copying.shutdown()
            if self.child is not None:
                _stop(self.child)
            self.copier = None  # the tensor over the mapping goes before the mapping
            try:
                self.mapped.close()
            except BufferError:
                pass  # a view still held elsewhere: the mapping goes with it
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
