"""The commit floor: the least a checkpoint that keeps baton's contract can do every step.

The bound (`bench.raw_every_step.RawWriteEveryStep`) writes the state's bytes to one file.
A checkpoint that keeps the contract in DESIGN.md writes several files per save and
commits them: each file fsynced, the manifest last, the `.tmp` directory renamed into
place, `latest` moved atomically, and the checkpoint that falls out of `keep_last` renamed
out of the step namespace before it is deleted, with the directory fsyncs each of those
needs. This floor does exactly that with baton's own file names and sizes, read from a
checkpoint baton committed, and nothing else: no structure pickle, no hash, no manifest
contents, no Python between the system calls beyond the loop that makes them. Its bytes are
the bound's: the state copied into one reused buffer on the training thread, written from
there (files larger than the state get zeros after it).

So its throughput ratio is what the contract's durability costs the step on this machine
whatever a checkpointer computes: where it is below 0.97, no checkpoint that keeps the
contract every step can cost 3% or less here.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from bench.raw_every_step import RawWriteEveryStep
from ckpt.commit import fsync_dir
from ckpt.layout import DELETING_SUFFIX, LATEST, MANIFEST, TMP_SUFFIX


def files_of(checkpoint: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(subdirectories, [(file, size)]) of a committed checkpoint, relative to it, parents
    before children; the manifest last, as the commit writes it."""
    directories = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_dir())
    files = sorted((str(p.relative_to(checkpoint)), p.stat().st_size)
                   for p in checkpoint.rglob("*") if p.is_file())
    files.sort(key=lambda entry: entry[0] == MANIFEST)  # stable: the rest keep their order
    return directories, files


class CommitFloorEveryStep(RawWriteEveryStep):
    """After each step, the bound's copy; then, on the background thread, one checkpoint
    with `template`'s files committed the way baton commits, `keep_last` kept."""

    def __init__(self, state, directory: Path, template: Path, keep_last: int):
        super().__init__(state, Path(directory) / "commit-floor")
        self.directories, self.files = files_of(template)
        self.keep_last = keep_last
        self.root = self.path.parent / "checkpoints"
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir()
        largest = max(size for _, size in self.files)
        self.padding = memoryview(bytes(max(0, largest - self.buffer.numel())))
        self.saves = 0

    def _write(self) -> None:
        self.saves += 1
        final = self.root / f"step-{self.saves:06d}"
        tmp = final.with_name(final.name + TMP_SUFFIX)
        tmp.mkdir()
        for directory in self.directories:
            (tmp / directory).mkdir()
        for name, size in self.files:  # the manifest last
            _write_durably(tmp / name, self._bytes(size))
        for directory in (*self.directories[::-1], ""):
            fsync_dir(tmp / directory)
        os.rename(tmp, final)
        fsync_dir(self.root)
        pointer = self.root / (LATEST + TMP_SUFFIX)
        _write_durably(pointer, [memoryview(final.name.encode())])
        os.replace(pointer, self.root / LATEST)
        fsync_dir(self.root)
        self._retire(self.saves - self.keep_last)

    def _retire(self, save: int) -> None:
        """The checkpoint beyond `keep_last`: renamed out of the step namespace, then deleted."""
        if save < 1:
            return
        leaving = self.root / f"step-{save:06d}"
        doomed = leaving.with_name(leaving.name + DELETING_SUFFIX)
        os.rename(leaving, doomed)
        fsync_dir(self.root)
        shutil.rmtree(doomed)

    def _bytes(self, size: int) -> list[memoryview]:
        """`size` bytes: the copied state first, zeros after it when the file is larger."""
        state = memoryview(self.buffer.numpy())[:size]
        return [state, self.padding[:size - state.nbytes]]

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.path.parent, ignore_errors=True)


def _write_durably(path: Path, pieces) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for piece in pieces:
            while piece.nbytes:
                piece = piece[os.write(fd, piece):]
        os.fsync(fd)
    finally:
        os.close(fd)
