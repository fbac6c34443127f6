"""Find a dataset's files, digest their content, and load them as a `datasets.Dataset`.

A path is a file, a glob of files, a directory of data files, or a directory written
by `datasets.save_to_disk`. Loading goes through Hugging Face `datasets` (Arrow,
memory-mapped); its own error messages for a bad file are tracebacks from deep inside
a builder, so a failed load is re-read here to name the file and line at fault.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

SUFFIX_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SAVED_DATASET_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")
"""What `datasets.save_to_disk` writes beside its Arrow files (a DatasetDict: the last)."""


@dataclass(frozen=True)
class DataFiles:
    key: str
    """The config key that named them (for messages), e.g. data.sft.train.path."""
    path: str
    kind: str
    """json | parquet | saved (a save_to_disk directory)."""
    files: tuple[Path, ...]


def resolve(key: str, path: str) -> DataFiles:
    """The files `path` names; a path naming nothing usable is refused with the fix."""
    found = Path(path)
    if found.is_dir():
        if any((found / name).is_file() for name in SAVED_DATASET_FILES):
            return DataFiles(key, path, "saved", _saved_files(found))
        files = sorted(p for p in found.iterdir() if p.suffix in SUFFIX_KINDS)
        where = f"{key}={path!r} is a directory with no data files"
    elif any(ch in path for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(path, recursive=True) if Path(p).is_file())
        where = f"{key}={path!r} matches no file"
    elif found.is_file():
        files, where = [found], ""
    else:
        raise ConfigError([f"{key}={path!r}: no such file or directory; expected a JSON Lines, "
                           "JSON or Parquet file, a glob of them, or a directory written by "
                           "datasets.save_to_disk"])
    if not files:
        raise ConfigError([f"{where}; expected *.jsonl, *.json or *.parquet files, or a directory "
                           "written by datasets.save_to_disk (it holds state.json)"])
    kinds = {SUFFIX_KINDS.get(p.suffix) for p in files}
    if None in kinds:
        odd = next(p for p in files if p.suffix not in SUFFIX_KINDS)
        raise ConfigError([f"{key}={path!r}: {odd} has suffix {odd.suffix!r}; expected .jsonl, "
                           ".json or .parquet (rename it, or save the data with "
                           "datasets.save_to_disk and pass that directory)"])
    if len(kinds) > 1:
        raise ConfigError([f"{key}={path!r} mixes JSON and Parquet files ({', '.join(p.name for p in files)}); "
                           "expected files of one kind: pass one glob per kind of file"])
    return DataFiles(key, path, kinds.pop(), tuple(files))


def _saved_files(directory: Path) -> tuple[Path, ...]:
    """The files a save_to_disk directory's state.json names, and its metadata: not the
    cache files `datasets` may write beside them later, which would change the digest."""
    state = directory / "state.json"
    names = [name for name in SAVED_DATASET_FILES if (directory / name).is_file()]
    try:
        names += [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no state.json (a DatasetDict) or an unreadable one: load() names the problem
    return tuple(sorted(directory / name for name in set(names)))


MEMO_ENTRIES = 256
RACY_SECONDS = 2.0
"""A file changed this recently is not remembered: file times advance in clock ticks of a
few milliseconds, so a second write within the same tick would keep them (git's "racy"
entries, handled the same way)."""


def content_digest(data: DataFiles, memo: Path | None = None) -> str:
    """sha256 over each file's name (relative to the dataset's root) and bytes: equal
    exactly when the data is, wherever it lies.

    `memo`: a JSON file remembering digests by what `stat` says of the files (device,
    inode, size, and the modification and change times in nanoseconds), so a second launch
    on unchanged data does not read it all again. A write to a file changes its change
    time, which no user can set back, so a changed file is always read again."""
    if memo is None:
        return _hash_files(data)
    stats = [os.stat(path) for path in data.files]
    key = hashlib.sha256(json.dumps([[str(p), s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns]
                                     for p, s in zip(data.files, stats)]).encode()).hexdigest()
    known = _read_memo(memo)
    if key in known:
        return known[key]
    digest = _hash_files(data)
    newest = max(max(s.st_mtime_ns, s.st_ctime_ns) for s in stats)
    if time.time_ns() - newest < RACY_SECONDS * 1e9:
        return digest
    known = {**_read_memo(memo), key: digest}
    tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(list(known.items())[-MEMO_ENTRIES:])))
    os.replace(tmp, memo)  # two launches at once: the last write wins, both digests are right
    return digest


def _read_memo(memo: Path) -> dict:
    try:
        found = json.loads(memo.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _hash_files(data: DataFiles) -> str:
    root = Path(data.path) if data.kind == "saved" else Path(data.files[0]).parent
    hasher = hashlib.sha256()
    for path in data.files:
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
        hasher.update(f"{name}\n{path.stat().st_size}\n".encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 22):
                hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def load(data: DataFiles, cache_dir: Path):
    """The rows as a `datasets.Dataset` (Arrow, memory-mapped from `cache_dir`)."""
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()  # loading and saving are quick; tokenizing shows one
    if data.kind == "saved":
        try:
            loaded = datasets.load_from_disk(data.path)
        except Exception as exc:  # FileNotFoundError, JSON or Arrow errors: the directory is unusable
            raise ConfigError([f"{data.key}={data.path!r}: not a readable datasets.save_to_disk "
                               f"directory ({type(exc).__name__}: {exc}); save it again with "
                               "Dataset.save_to_disk"]) from None
        if isinstance(loaded, datasets.DatasetDict):
            raise ConfigError([f"{data.key}={data.path!r} holds a DatasetDict with splits "
                               f"{', '.join(loaded)}; expected one split: pass its directory "
                               f"({data.path}/{next(iter(loaded))}) and the held-out one as eval.path"])
        return loaded
    files = [str(p) for p in data.files]
    # A whole-file .json is checked first: datasets would read a top-level object of lists
    # as columns. JSON lines are parsed by datasets (Arrow, in blocks), and checked line by
    # line in Python only when it refuses them, to name the line at fault.
    whole = [path for path in data.files if path.suffix == ".json"] if data.kind == "json" else []
    if whole and sum(_check_json(data.key, path) for path in whole) == 0 and len(whole) == len(files):
        raise no_rows(data)
    try:
        return datasets.load_dataset(data.kind, data_files=files, split="train",
                                     cache_dir=str(cache_dir))
    except Exception as exc:  # Arrow's schema and parse errors: the file's content is at fault
        if data.kind == "json" and sum(_check_json(data.key, path) for path in data.files) == 0:
            raise no_rows(data) from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError([f"{data.key}={data.path!r}: datasets could not read the files "
                           f"({type(exc).__name__}: {first}); expected rows with the same "
                           "columns and types in every file"]) from None


def no_rows(data: DataFiles) -> ConfigError:
    return ConfigError([f"{data.key}={data.path!r} holds no rows; expected at least one"])


def _check_json(key: str, path: Path) -> int:
    """Every line of a .jsonl (or the whole .json) parses to an object: the first one that
    does not is named by file and line. Returns the number of rows."""
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigError([f"{key}: {path} is not valid JSON ({exc}); expected a list of "
                               "objects, one per row (or use .jsonl, one object per line)"]) from None
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise ConfigError([f"{key}: {path} holds a {type(rows).__name__}; expected a JSON list "
                               "of objects, one per row"])
        return len(rows)
    count = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (UnicodeDecodeError, ValueError) as exc:
                raise ConfigError([f"{key}: {path}:{number} is not valid JSON ({exc}); expected "
                                   "one JSON object per line"]) from None
            if not isinstance(row, dict):
                raise ConfigError([f"{key}: {path}:{number} holds a {type(row).__name__}; "
                                   "expected one JSON object per line"])
            count += 1
    return count
