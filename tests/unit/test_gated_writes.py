"""Writing while the buffers are still being copied: both writers follow the copy's progress
(ckpt.writers.gate), write only bytes that landed, and stop on a failed copy."""
from __future__ import annotations

import errno
import threading
import time

import numpy as np
import pytest
import torch

from ckpt import deferred_copy
from ckpt.content_hash import hash_chunks
from ckpt.deferred_copy import CopyBatch
from ckpt.writers.gate import CopyProgress, SegmentGate
from ckpt.writers.native import NativeWriter, load_extension
from ckpt.writers.python_writer import PythonWriter

EXTENSION, WHY_NOT_NATIVE = load_extension()
WRITERS = [PythonWriter()] + ([NativeWriter(EXTENSION)] if EXTENSION else [])
needs_native = pytest.mark.skipif(EXTENSION is None,
                                  reason=f"ckpt._native_writer is not built: {WHY_NOT_NATIVE}")
PIECE = 1 << 20  # the writers' piece: a gate is checked per piece


def sources_and_buffers(sizes: list[int]) -> tuple[list, list[np.ndarray], list[np.ndarray]]:
    """A header, then one zeroed buffer per size, each followed by a small trailer piece:
    segments, the empty buffers a producer will fill, and what it will fill them with."""
    rng = np.random.default_rng(0)
    segments, targets, contents, pos = [(0, b"HEAD")], [], [], 4
    for size in sizes:
        target = np.zeros(size, np.uint8)
        targets.append(target)
        contents.append(rng.integers(1, 256, size, dtype=np.uint8))
        segments.append((pos, target))
        segments.append((pos + size, b"--"))
        pos += size + 2
    return segments, targets, contents


def fill_slowly(progress: CopyProgress, targets, contents, step: int, fail_at: int | None = None):
    """What the copier does: fill each buffer in pieces, marking each piece once written."""
    for index, (target, content) in enumerate(zip(targets, contents)):
        for start in range(0, len(target), step):
            if fail_at == index:
                progress.fail()
                return
            time.sleep(0.002)  # the writer must be waiting on the gate, not racing past it
            target[start:start + step] = content[start:start + step]
            progress.advance(index, min(start + step, len(target)))


def gate_for(progress: CopyProgress, segments) -> SegmentGate:
    buffer_index = {id(buffer): i for i, buffer in
                    enumerate(b for _, b in segments if isinstance(b, np.ndarray))}
    return SegmentGate(progress, [buffer_index.get(id(b), -1) for _, b in segments])


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
@pytest.mark.parametrize("threads", [1, 3])
def test_a_gated_write_waits_for_every_copied_piece(tmp_path, writer, threads):
    sizes = [3 * PIECE + 777, 5, PIECE // 2]
    segments, targets, contents = sources_and_buffers(sizes)
    progress = CopyProgress(len(targets))
    gate = gate_for(progress, segments)
    producer = threading.Thread(target=fill_slowly, args=(progress, targets, contents, PIECE // 3))
    producer.start()
    size = sum(sizes) + 4 + 2 * len(sizes)
    path = tmp_path / "f.bin"
    digests = writer.write_file(str(path), size, segments, chunk_bytes=PIECE, threads=threads,
                                alg="xxh3-128", gate=gate)
    producer.join()
    expected = b"HEAD" + b"".join(c.tobytes() + b"--" for c in contents)
    # Without the gate the writer reads the zeroed buffers: this would differ.
    assert path.read_bytes() == expected
    assert digests == hash_chunks(expected, PIECE, threads=1, alg="xxh3-128")


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_a_failed_copy_cancels_the_write(tmp_path, writer):
    segments, targets, contents = sources_and_buffers([2 * PIECE, PIECE])
    progress = CopyProgress(len(targets))
    producer = threading.Thread(target=fill_slowly,
                                args=(progress, targets, contents, PIECE, 1))
    producer.start()
    with pytest.raises(OSError) as raised:
        writer.write_file(str(tmp_path / "f.bin"), 3 * PIECE + 8, segments, chunk_bytes=PIECE,
                          threads=2, gate=gate_for(progress, segments))
    producer.join()
    assert raised.value.errno == errno.ECANCELED


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_a_gate_for_another_file_is_refused(tmp_path, writer):
    gate = SegmentGate(CopyProgress(1), [-1, 0])
    with pytest.raises(ValueError, match="the gate names 2 segments, the file has 1"):
        writer.write_file(str(tmp_path / "f.bin"), 1, [(0, b"x")], chunk_bytes=4, threads=1,
                          gate=gate)


def test_a_gate_naming_no_buffer_is_refused():
    with pytest.raises(ValueError, match="must index 1 buffers or be -1"):
        SegmentGate(CopyProgress(1), [1])


@needs_native
def test_the_extension_itself_checks_the_gate(tmp_path):
    landed = np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="gate source 1 of segment 0 names no buffer"):
        EXTENSION.write_file(str(tmp_path / "f.bin"), 1, [(0, b"x")], 4, 1, False, True,
                             "sha256", landed, np.array([1], np.int64))
    with pytest.raises(ValueError, match="needs both landed and sources"):
        EXTENSION.write_file(str(tmp_path / "f.bin"), 1, [(0, b"x")], 4, 1, False, True,
                             "sha256", landed, None)


def test_a_copy_batch_marks_each_piece_and_maps_segments_to_its_buffers(monkeypatch):
    monkeypatch.setattr(deferred_copy, "COPY_PIECE", 1000)
    sources = [torch.arange(n, dtype=torch.uint8).untyped_storage() for n in (2500, 10)]
    staged = [torch.empty(s.nbytes(), dtype=torch.uint8).untyped_storage() for s in sources]
    marks = []
    batch = CopyBatch(list(zip(staged, sources)))
    advance = batch.progress.advance
    monkeypatch.setattr(batch.progress, "advance",
                        lambda i, n: (marks.append((i, n)), advance(i, n)))
    batch.run()
    assert batch.wait() == 0.0
    assert marks == [(0, 1000), (0, 2000), (0, 2500), (1, 10)]
    assert [bytes(s) for s in staged] == [bytes(s) for s in sources]
    other = torch.zeros(4, dtype=torch.uint8)
    segments = [(0, b"hdr"), (3, torch.empty(0, dtype=torch.uint8).set_(staged[1])), (13, other)]
    assert batch.gate(segments).sources.tolist() == [-1, 1, -1]


def test_small_storages_are_copied_together_and_marked_at_once(monkeypatch):
    monkeypatch.setattr(deferred_copy, "COPY_PIECE", 1000)
    sizes = (300, 200, 400, 2500, 10, 20, 990)  # three small ones fit a piece; 2500 alone
    sources = [torch.randint(0, 255, (n,), dtype=torch.uint8).untyped_storage() for n in sizes]
    staged = [torch.empty(s.nbytes(), dtype=torch.uint8).untyped_storage() for s in sources]
    batch = CopyBatch(list(zip(staged, sources)))
    assert batch._runs() == [(0, 3), (3, 4), (4, 6), (6, 7)]
    marks = []
    advance_many = batch.progress.advance_many
    monkeypatch.setattr(batch.progress, "advance_many",
                        lambda first, n: (marks.append((first, list(n))), advance_many(first, n)))
    batch.run()
    assert batch.wait() == 0.0
    assert marks == [(0, [300, 200, 400]), (4, [10, 20])]
    assert batch.progress.landed[:-1].tolist() == list(sizes)
    assert [bytes(s) for s in staged] == [bytes(s) for s in sources]
