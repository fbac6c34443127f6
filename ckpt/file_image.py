"""A torch.save file described as segments, so its bytes can be written later, elsewhere.

`torch.save` under `torch.serialization.skip_data()` pickles only the structure: it
writes the zip headers, `data.pkl` and the central directory, and seeks over the space
each storage's bytes would take. Recording those writes and holes costs milliseconds
and snapshots every non-tensor value; filling each hole with its storage's bytes gives
a file byte-identical to `torch.save` with CRC32 off (tests/unit/ckpt/test_file_image.py).
So a save can capture a state in two cheap steps (structure + storage copies) and leave
the writing, hashing and fsync to a background thread or a native writer.

CRC32 stays off: every byte is covered by the manifest's sha256 chunks already, and
torch.load does not need it.
"""
from __future__ import annotations

import pickle
import types
from dataclasses import dataclass, field

import torch

from ckpt.structure_pickle import Fallback, save_structure

ALIGNMENT = 64  # torch's default storage alignment inside the zip
DIRECT_ALIGNMENT = 4096  # what O_DIRECT needs of file offsets (ckpt.direct=true)


def crc32_off() -> None:
    """torch.save's per-record CRC32 is a redundant pass over every byte (baton hashes).
    A per-thread setting: `image_of` turns it off on whichever thread pickles."""
    torch.serialization.set_crc32_options(False)


def as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over a storage's bytes (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class FileImage:
    size: int = 0
    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    """(offset, bytes) torch wrote itself: headers, data.pkl, the central directory."""
    holes: list[tuple[int, int]] = field(default_factory=list)
    """(offset, nbytes) left for storage bytes, in storage order."""
    storages: list[torch.UntypedStorage] = field(default_factory=list)
    """The non-empty storages, in the order of `holes`."""

    def segments(self, buffers: list) -> list[tuple[int, object]]:
        """The whole file as sorted (offset, buffer) segments; `buffers[i]` fills hole i."""
        filled = [(offset, buffer) for (offset, _), buffer in zip(self.holes, buffers)]
        return sorted(self.pieces + filled, key=lambda segment: segment[0])

    @classmethod
    def of_bytes(cls, data: bytes) -> "FileImage":
        return cls(size=len(data), pieces=[(0, bytes(data))])


class _Recorder:
    """The file object torch.save writes into: keeps pieces, notes holes."""

    def __init__(self, image: FileImage):
        self.image, self.position = image, 0

    def write(self, data) -> int:
        view = memoryview(data)
        pieces = self.image.pieces
        if pieces and pieces[-1][0] + len(pieces[-1][1]) == self.position:
            # One piece per run of torch's writes (hundreds of small zip headers per file):
            # every piece costs the writers a segment, and a pwrite in the Python twin.
            pieces[-1][1].extend(view)
        else:
            pieces.append((self.position, bytearray(view)))
        self.position += view.nbytes
        return view.nbytes

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            if offset:
                self.image.holes.append((self.position, offset))
            self.position += offset
        elif whence == 0:
            self.position = offset
        else:
            raise ValueError("torch.save seeking from the end is not expected")
        return self.position

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass


def _storage_recording_pickle_module(found: list, seen: set) -> types.SimpleNamespace:
    """A pickle module whose Pickler notes each tensor's storage as pickling reaches it:
    torch numbers storages in that same first-seen order (its persistent ids)."""

    class StorageNotingPickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, torch.Tensor):
                storage = obj.untyped_storage()
                if storage._cdata not in seen:
                    seen.add(storage._cdata)
                    found.append(storage)
            return NotImplemented

    return types.SimpleNamespace(Pickler=StorageNotingPickler, __name__="pickle")


class UnexpectedLayout(RuntimeError):
    """torch.save's holes did not match the storages pickling found."""


def image_of(obj, alignment: int = ALIGNMENT) -> FileImage:
    """Describe `torch.save(obj)` without copying any storage bytes. `alignment`: of each
    storage's offset in the file (torch records it in the archive; any value loads)."""
    from torch.utils.serialization import config

    image, found, seen = FileImage(), [], set()
    recorder = _Recorder(image)
    # torch's serialization settings are per thread: set them on the thread that pickles.
    saved = config.save.storage_alignment, config.save.compute_crc32
    config.save.storage_alignment, config.save.compute_crc32 = alignment, False
    try:
        with torch.serialization.skip_data():
            try:  # the same bytes without torch's per-object Python (ckpt.structure_pickle)
                found = save_structure(obj, recorder)
            except Fallback:  # raised before anything was written
                torch.save(obj, recorder, pickle_module=_storage_recording_pickle_module(found, seen))
    finally:
        config.save.storage_alignment, config.save.compute_crc32 = saved
    image.size = recorder.position
    image.pieces = [(offset, bytes(piece)) for offset, piece in image.pieces]
    image.storages = [s for s in found if s.nbytes() > 0]
    sizes = [n for _, n in image.holes]
    if sizes != [s.nbytes() for s in image.storages]:
        raise UnexpectedLayout(f"torch.save left holes of {sizes[:8]} bytes for storages of "
                               f"{[s.nbytes() for s in image.storages][:8]} bytes")
    return image
