"""The commit floor's committer (bench.commit_floor), a process of its own: as baton's saver
process, its Python holds no GIL of the training process.

`python -m bench.commit_floor_child FD ROOT KEEP_LAST` maps the memory file FD (the
state's bytes, copied there by the training process) and reads the checkpoint's shape,
one JSON line, then one line per save from stdin. For each save it writes the files and fsyncs them and
their directories, answers `w` (the buffer may be filled again: baton frees its staging
slot at the same point), then commits as ckpt.commit does (the manifest last, the `.tmp`
directory fsynced and renamed into place, `latest` moved) and retires the checkpoint
beyond KEEP_LAST (renamed to `.deleting`, then deleted), and answers `c`. It stops at
`q` or at the end of stdin, so it never outlives the process that started it.
"""
from __future__ import annotations

import json
import mmap
import os
import sys
from pathlib import Path

from bench.methods.bounds import write_and_fsync
from ckpt.commit import discard, final_dir, fsync_dir, point_latest
from ckpt.layout import MANIFEST, TMP_SUFFIX

WRITTEN, COMMITTED, READY = b"w", b"c", b"r"


class Committer:
    def __init__(self, state: memoryview, root: Path, keep_last: int, shape: dict):
        self.state, self.root, self.keep_last = state, root, keep_last
        self.directories = shape["directories"]
        self.files = [(name, size) for name, size in shape["files"] if name != MANIFEST]
        self.manifest = memoryview(bytes(dict(shape["files"]).get(MANIFEST, 0)))
        # Directories holding a file, deepest first, then the checkpoint's own: baton
        # fsyncs each directory it wrote into.
        parents = {str(Path(name).parent) for name, _ in self.files} - {"."}
        self.synced = sorted(parents, key=lambda d: -d.count("/")) + [""]
        largest = max([size for _, size in self.files] + [0])
        self.padding = memoryview(bytes(max(0, largest - state.nbytes)))
        self.saves = 0

    def write_files(self) -> Path:
        self.saves += 1
        tmp = self.root / f"step-{self.saves:06d}{TMP_SUFFIX}"
        tmp.mkdir()
        for directory in self.directories:
            (tmp / directory).mkdir()
        for name, size in self.files:
            write_and_fsync(tmp / name, self._bytes(size))
        for directory in self.synced:
            fsync_dir(tmp / directory)
        return tmp

    def commit(self, tmp: Path) -> None:
        # Not from the shared buffer: after `w` the training process may be filling it again.
        write_and_fsync(tmp / MANIFEST, [self.manifest])
        fsync_dir(tmp)
        final = final_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(self.root)
        point_latest(final)  # ckpt.commit's own: written beside, fsynced, moved, dir fsynced
        retired = self.saves - self.keep_last
        if retired >= 1:  # renamed to `.deleting`, the directory fsynced, then deleted
            discard(self.root / f"step-{retired:06d}")

    def _bytes(self, size: int) -> list[memoryview]:
        """`size` bytes: the copied state first, zeros after it when the file is larger."""
        state = self.state[:size]
        return [state, self.padding[:size - state.nbytes]]


def main(argv: list[str]) -> int:
    buffer_fd, root, keep_last = argv
    mapped = mmap.mmap(int(buffer_fd), 0)
    commands = sys.stdin.buffer
    committer = Committer(memoryview(mapped), Path(root), int(keep_last),
                          json.loads(commands.readline()))
    os.write(1, READY)
    for line in commands:
        if line.strip() == b"q":
            break
        tmp = committer.write_files()
        os.write(1, WRITTEN)
        committer.commit(tmp)
        os.write(1, COMMITTED)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
