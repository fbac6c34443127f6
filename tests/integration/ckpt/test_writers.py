"""The native writer and its Python twin: same bytes, same chunk digests, same errors."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

from ckpt.content_hash import ALG, hash_chunks
from ckpt.writers import get_writer, native_unavailable_reason
from ckpt.writers.base import ALIGN, PIECE_BYTES
from bench.writers import bench_writers
from ckpt.writers.native import NativeWriter, load_extension
from ckpt.writers.python_writer import PythonWriter

REPO = Path(__file__).resolve().parents[3]
EXTENSION, WHY_NOT_NATIVE = load_extension()
# Without the extension the Python writer is still checked against content_hash; the
# native half of each parity test is what is skipped (and the test below fails loudly).
WRITERS = [PythonWriter()] + ([NativeWriter(EXTENSION)] if EXTENSION else [])
needs_native = pytest.mark.skipif(EXTENSION is None,
                                  reason=f"ckpt._native_writer is not built: {WHY_NOT_NATIVE}")
ALGS = ["sha256", "xxh3-128"]
EMPTY_DIGEST = {"sha256": hashlib.sha256(b"").hexdigest(), "xxh3-128": xxhash.xxh3_128(b"").hexdigest()}


def write_with_each(directory: Path, size: int, segments, **options) -> bytes:
    """Writes the file with every writer and checks that all agree with content_hash."""
    files = {}
    for writer in WRITERS:
        path = directory / f"{writer.name}.bin"
        digests = writer.write_file(str(path), size, segments, **options)
        data = path.read_bytes()
        alg = options.get("alg", ALG)
        assert digests == hash_chunks(data, options["chunk_bytes"], threads=1, alg=alg), writer.name
        files[writer.name] = data
    assert len(set(files.values())) == 1, "the writers wrote different bytes"
    return files["python"]


def random_layout(seed: int, size: int) -> tuple[bytes, list]:
    """Segments of mixed kinds and sizes (tiny headers, empty ones, big storages)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    kinds = [bytes, bytearray, memoryview, np.asarray, torch.from_numpy]
    segments, pos = [], 0
    while pos < size:
        length = int(rng.choice([0, rng.integers(1, 300), rng.integers(1, 300 << 10)]))
        piece = data[pos:pos + length].copy()
        kind = kinds[int(rng.integers(len(kinds)))]
        segments.append((pos, kind(piece.tobytes()) if kind in (bytes, bytearray) else kind(piece)))
        pos += piece.nbytes
    return data.tobytes(), segments


def aligned_array(nbytes: int, fill: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    out = raw[start:start + nbytes]
    out[:] = (np.arange(nbytes) * fill) % 251
    return out


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("chunk_bytes", [4096, (64 << 10) + 7, 16 << 20])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_layouts_give_the_same_bytes_and_digests(tmp_path, seed, chunk_bytes, threads, alg):
    data, segments = random_layout(seed, 1 << 20)
    written = write_with_each(tmp_path, len(data), segments, chunk_bytes=chunk_bytes,
                              threads=threads, alg=alg)
    assert written == data


@pytest.mark.parametrize("chunk_bytes", [(1 << 20) + 3, 8 << 20])
def test_a_segment_longer_than_a_write_piece_is_written_whole(tmp_path, chunk_bytes):
    big = aligned_array(2 * PIECE_BYTES + 12345, fill=7)
    segments = [(0, b"head"), (4, big), (4 + big.nbytes, b"tail")]
    size = big.nbytes + 8
    written = write_with_each(tmp_path, size, segments, chunk_bytes=chunk_bytes, threads=2)
    assert written == b"head" + big.tobytes() + b"tail"


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("segments", [[], [(0, b"")]], ids=["no-segment", "empty-segment"])
def test_an_empty_file_has_one_empty_chunk(tmp_path, segments, alg):
    for writer in WRITERS:
        path = tmp_path / f"{writer.name}.bin"
        path.write_bytes(b"old content")
        assert writer.write_file(str(path), 0, segments, chunk_bytes=16, threads=4,
                                 alg=alg) == [EMPTY_DIGEST[alg]]
        assert path.read_bytes() == b""


def test_an_existing_longer_file_is_truncated(tmp_path):
    for writer in WRITERS:
        path = tmp_path / f"{writer.name}.bin"
        path.write_bytes(b"x" * 10_000)
        writer.write_file(path, 3, [(0, b"abc")], chunk_bytes=2, threads=2)
        assert path.read_bytes() == b"abc"


def test_tensors_and_storages_are_written_as_their_bytes(tmp_path):
    floats = torch.arange(1000, dtype=torch.float32)
    halves = torch.linspace(-3, 3, 333, dtype=torch.bfloat16)
    longs = torch.arange(50, dtype=torch.int64)[7:20]  # contiguous, storage offset 7
    flags = torch.tensor([True, False, True])
    scalar = torch.tensor(2.5, dtype=torch.float64)
    storage = torch.arange(10, dtype=torch.int16).untyped_storage()
    expected = [floats.numpy().tobytes(), halves.view(torch.int16).numpy().tobytes(),
                longs.numpy().tobytes(), flags.numpy().tobytes(), scalar.numpy().tobytes(),
                bytes(storage.tolist())]
    segments, pos = [], 0
    for buffer, raw in zip([floats, halves, longs, flags, scalar, storage], expected):
        segments.append((pos, buffer))
        pos += len(raw)
    written = write_with_each(tmp_path, pos, segments, chunk_bytes=1000, threads=3)
    assert written == b"".join(expected)


@pytest.mark.parametrize("buffer, message", [
    (torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), "contiguous CPU tensor"),
    (np.arange(20, dtype=np.uint8)[::2], "C-contiguous"),
], ids=["transposed-tensor", "strided-array"])
def test_a_non_contiguous_buffer_is_refused(tmp_path, buffer, message):
    for writer in WRITERS:
        with pytest.raises(ValueError, match=message):
            writer.write_file(tmp_path / "f.bin", 48, [(0, buffer)], chunk_bytes=8, threads=1)


def _direct_locations() -> list:
    places = ["tmp", "repo-disk"]
    return places + (["tmpfs"] if os.path.isdir("/dev/shm") else [])


@pytest.mark.parametrize("place", _direct_locations())
def test_direct_and_buffered_writes_give_the_same_file(tmp_path, place):
    """Aligned pieces take the O_DIRECT descriptor, the rest the buffered one; where the
    filesystem refuses O_DIRECT the writers fall back to buffered, with the same result."""
    aligned = aligned_array(3 * ALIGN * 100, fill=3)
    misaligned_address = aligned_array(ALIGN * 2 + 1, fill=5)[1:]  # aligned length and offset
    header = b"h" * ALIGN
    segments = [(0, header), (ALIGN, aligned), (ALIGN + aligned.nbytes, misaligned_address),
                (2 * ALIGN + aligned.nbytes + ALIGN, b"tail: odd length")]
    size = segments[-1][0] + len(segments[-1][1])
    roots = {"tmp": tmp_path, "repo-disk": REPO / "build", "tmpfs": Path("/dev/shm")}
    roots[place].mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="baton-writer-test-", dir=roots[place]) as where:
        files = {direct: write_with_each(Path(where), size, segments, chunk_bytes=64 << 10,
                                         threads=4, direct=direct)
                 for direct in (False, True)}
    assert files[True] == files[False]
    assert files[True] == header + aligned.tobytes() + misaligned_address.tobytes() + b"tail: odd length"


BAD_LAYOUTS = [
    ([(0, b"ab"), (3, b"cd")], 5, "expected offset 2, got 3"),          # a gap
    ([(0, b"abc"), (2, b"cd")], 4, "expected offset 3, got 2"),         # an overlap
    ([(2, b"cd"), (0, b"ab")], 4, "expected offset 0, got 2"),          # unsorted
    ([(0, b"ab"), (2, b"cd")], 5, r"segments cover \[0, 4\) but the file size is 5"),
    ([(0, b"ab"), (2, b"cd")], 3, r"segments cover \[0, 4\) but the file size is 3"),
]


@pytest.mark.parametrize("segments, size, message", BAD_LAYOUTS)
def test_segments_that_do_not_tile_the_file_are_refused(tmp_path, segments, size, message):
    for writer in WRITERS:
        with pytest.raises(ValueError, match=message):
            writer.write_file(tmp_path / "f.bin", size, segments, chunk_bytes=2, threads=2)
        assert not (tmp_path / "f.bin").exists(), "nothing is written before the check"


@needs_native
@pytest.mark.parametrize("segments, size, message", BAD_LAYOUTS)
def test_the_extension_itself_refuses_bad_segments(tmp_path, segments, size, message):
    with pytest.raises(ValueError, match=message):
        EXTENSION.write_file(str(tmp_path / "f.bin"), size, segments, 2, 2, False, True)


@pytest.mark.parametrize("chunk_bytes, threads, message", [
    (0, 1, "chunk_bytes must be > 0, got 0"), (4, 0, "threads must be >= 1, got 0")])
def test_bad_chunk_size_or_thread_count_is_refused(tmp_path, chunk_bytes, threads, message):
    for writer in WRITERS:
        with pytest.raises(ValueError, match=message):
            writer.write_file(tmp_path / "f.bin", 1, [(0, b"x")], chunk_bytes=chunk_bytes,
                              threads=threads)


def test_a_full_device_raises_enospc_naming_the_path():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this machine")
    for writer in WRITERS:
        with pytest.raises(OSError) as caught:
            writer.write_file("/dev/full", 3 * ALIGN, [(0, b"x" * 3 * ALIGN)], chunk_bytes=ALIGN,
                              threads=2, fsync=False)
        assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, "/dev/full")


@pytest.mark.parametrize("target, error, code", [
    ("a-directory", IsADirectoryError, errno.EISDIR),
    ("missing/parent/f.bin", FileNotFoundError, errno.ENOENT),
])
def test_an_unwritable_path_raises_oserror_naming_it(tmp_path, target, error, code):
    (tmp_path / "a-directory").mkdir()
    path = str(tmp_path / target)
    for writer in WRITERS:
        with pytest.raises(error) as caught:
            writer.write_file(path, 1, [(0, b"x")], chunk_bytes=4, threads=1)
        assert (caught.value.errno, caught.value.filename) == (code, path)


def test_auto_picks_the_native_writer_where_it_is_built():
    if os.environ.get("BATON_ALLOW_NO_NATIVE") == "1":
        pytest.skip("BATON_ALLOW_NO_NATIVE=1: this machine may lack the native writer")
    assert get_writer("auto").name == "native", (
        f"the native writer did not build at install ({native_unavailable_reason()}); "
        "rebuild with `pip install -e .` (needs g++, libssl-dev and libxxhash-dev)")
    assert get_writer("python").name == "python"


def test_an_unknown_hash_is_refused_by_both_writers(tmp_path):
    for writer in WRITERS:
        with pytest.raises(ValueError, match="unknown content hash 'md5'"):
            writer.write_file(str(tmp_path / "x.bin"), 1, [(0, b"x")], chunk_bytes=16,
                              threads=1, alg="md5")


def test_an_unknown_writer_name_is_refused():
    with pytest.raises(ValueError, match="unknown checkpoint writer 'fast': expected one of "
                                         "auto, native, python"):
        get_writer("fast")


def test_without_the_extension_native_falls_back_to_python_with_one_notice():
    # A fresh interpreter where importing the extension fails as it would where it is not
    # built (a None entry in sys.modules makes the import raise ImportError).
    script = (
        "import logging, sys\n"
        "sys.modules['ckpt._native_writer'] = None\n"
        "logging.basicConfig(format='%(message)s')\n"
        "from ckpt.writers import get_writer, native_unavailable_reason\n"
        "print(get_writer('native').name, get_writer('native').name, get_writer('auto').name)\n"
        "print(native_unavailable_reason())\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    names, reason = proc.stdout.splitlines()
    assert names == "python python python"
    assert reason.startswith(("ImportError: ", "ModuleNotFoundError: ")), reason
    assert "ckpt._native_writer" in reason
    notices = proc.stderr.splitlines()
    assert len(notices) == 1 and notices[0].startswith(
        f"native checkpoint writer unavailable ({reason}); using the Python writer")


def test_the_writer_benchmark_measures_both_writers(tmp_path):
    result = bench_writers(1 << 20, rounds=3, directory=str(tmp_path), chunk_bytes=256 << 10,
                           fsync=False)
    assert result["python"]["min_s"] > 0 and len(result["python"]["times_s"]) == 3
    if EXTENSION is not None:
        assert result["native"]["min_s"] > 0
        assert result["python_over_native_median"] == (
            result["python"]["median_s"] / result["native"]["median_s"])
    with pytest.raises(ValueError, match="rounds must be >= 3"):
        bench_writers(1 << 20, rounds=2)
