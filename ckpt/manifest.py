"""`manifest.json`: every file of a checkpoint with size and checksum, written last.

A directory is a checkpoint only if its manifest exists and matches its files; all
loading goes through `verify` (or `check_structure` + per-file checksums) first.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ckpt import content_hash
from ckpt.errors import CorruptCheckpoint, NotACheckpoint, UnconfinedPath
from ckpt.layout import MANIFEST, TMP_SUFFIX, referenced_path

FORMAT = "baton.checkpoint/1"
# Components every complete checkpoint must have; `grad_accum` only mid-accumulation.
REQUIRED = ("model", "optimizer", "scheduler", "rng", "data", "progress", "meta")
GRAD_ACCUM = "grad_accum"
RL_STATE = "rl_state"
# Components only some stages have: RL's KL controller and frozen-model identities.
STAGE_REQUIRED = {"rl": (RL_STATE,)}
# `extra[ADOPTED]` marks a checkpoint brought in by `baton ckpt adopt` (origin, absent
# components): it has only weights and meta, so only those are required.
ADOPTED = "adopted"
ADOPTED_REQUIRED = ("model", "meta")
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Manifest:
    stage: str
    step: int
    components: dict[str, list[str]]
    """component name -> files (relative paths) that hold it; a file may hold several."""
    files: dict[str, dict] = field(default_factory=dict)
    """relative path -> {"size": bytes, "chunks": [sha256 hex per chunk]} under `hashing`,
    or {"size", "sha256": hex of the whole file} (older and adopted checkpoints)."""
    parallel: dict = field(default_factory=dict)
    mid_accumulation: bool = False
    format: str = FORMAT
    extra: dict = field(default_factory=dict)
    """Stage-specific facts (RL: reference identity, KL controller, ...)."""
    signature: dict | None = None
    """{"alg": "hmac-sha256", "value": hex} when written with ckpt.signing_key_env (ckpt.signing)."""
    hashing: dict | None = None
    """{"alg": "sha256", "chunk_bytes": N}: how `files[*].chunks` were computed (ckpt.content_hash)."""
    references: dict[str, dict] = field(default_factory=dict)
    """Files this checkpoint uses but an earlier one of the same directory holds (selective
    persistence, ckpt.selective): rel -> {"checkpoint": its name, "size", "chunks"}."""

    def required_components(self) -> tuple[str, ...]:
        if self.adopted is not None:
            return ADOPTED_REQUIRED
        return (REQUIRED + STAGE_REQUIRED.get(self.stage, ())
                + ((GRAD_ACCUM,) if self.mid_accumulation else ()))

    @property
    def layout(self):
        """`parallel` as a typed `ckpt.parallel_layout.Layout` (old manifests read too)."""
        from ckpt.parallel_layout import Layout
        return Layout.from_dict(self.parallel)

    @property
    def adopted(self) -> dict | None:
        """Origin of an adopted checkpoint (source, kind, sha256s, absent components)."""
        return self.extra.get(ADOPTED)

    def total_bytes(self) -> int:
        return sum(entry["size"] for entry in self.files.values())

    def record(self) -> dict:
        """What is written (and signed): `references` only when there are any, so a
        manifest without them is byte for byte what it was before they existed."""
        return {k: v for k, v in self.__dict__.items() if k != "references" or v}

    def to_json(self) -> str:
        return json.dumps(self.record(), indent=2, sort_keys=True)


def checksum_of(manifest_path: Path) -> str:
    return sha256_file(manifest_path)


def write(directory: Path, manifest: Manifest) -> Path:
    """Write the manifest (fsynced): the last file of a checkpoint. Signed when this
    process has a signing key configured (ckpt.signing)."""
    from ckpt import signing

    manifest.signature = None
    manifest.signature = signing.signature_for(manifest.record())
    path = directory / MANIFEST
    with open(path, "w") as handle:
        handle.write(manifest.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    return path


def read(directory: str | Path) -> Manifest:
    directory = Path(directory)
    if directory.name.endswith(TMP_SUFFIX):
        raise NotACheckpoint(directory, "uncommitted checkpoint (a '.tmp' directory left by an "
                             "interrupted save); resume from the `latest` committed one instead")
    if not directory.is_dir():
        raise NotACheckpoint(directory, "no such checkpoint directory")
    path = directory / MANIFEST
    if not path.is_file():
        from ckpt.foreign import refusal  # a foreign checkpoint is named as such, not "unfinished"
        foreign = refusal(directory)
        if foreign is not None:
            raise foreign
        raise NotACheckpoint(directory, f"missing {MANIFEST}: not a committed checkpoint "
                             "(the manifest is written last, so the save never finished)")
    try:
        data = json.loads(path.read_bytes())  # read once: what is checked is what is used
        manifest = Manifest(**data)
    except (ValueError, TypeError) as exc:
        raise CorruptCheckpoint(directory, [f"{MANIFEST} is unreadable: {exc}"]) from exc
    from ckpt import confine, signing

    signing.check(directory, data)  # before any other byte of the checkpoint is read
    if not _well_formed(manifest):
        raise CorruptCheckpoint(directory, [f"{MANIFEST} is unreadable: 'files' must map each "
                                            "path to {size, chunks} (or {size, sha256}) and "
                                            "'components' each name "
                                            "to a list of paths"])
    escaping = confine.problems(directory, manifest.files, manifest.components)
    escaping += confine.reference_problems(directory, manifest.references)
    if escaping:
        raise UnconfinedPath(directory, escaping)
    return manifest


def _well_formed(manifest: Manifest) -> bool:
    entries_ok = isinstance(manifest.files, dict) and all(
        content_hash.well_formed(e, manifest.hashing) for e in manifest.files.values())
    entries_ok = entries_ok and isinstance(manifest.references, dict) and all(
        isinstance(e, dict) and content_hash.well_formed(e, manifest.hashing)
        for e in manifest.references.values())
    return entries_ok and isinstance(manifest.components, dict) and all(
        isinstance(names, list) for names in manifest.components.values())


def structure_problems(directory: Path, manifest: Manifest) -> list[str]:
    """Cheap checks: components present, files present with the recorded sizes, no extras."""
    problems = [f"missing component '{name}' in {MANIFEST}"
                for name in manifest.required_components() if not manifest.components.get(name)]
    for name, files in manifest.components.items():
        problems += [f"component '{name}' names {f} which is not in the file list"
                     for f in files if f not in manifest.files]
    for rel, entry in sorted(manifest.files.items()):
        path = directory / rel
        if not path.is_file():
            problems.append(f"missing file {rel}")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"size mismatch in {rel}: {path.stat().st_size} bytes on disk, "
                            f"{entry['size']} in the manifest (truncated or overwritten)")
    for rel, entry in sorted(manifest.references.items()):
        path = referenced_path(directory, rel, entry)
        if not path.is_file():
            problems.append(f"missing file {rel}, referenced in {entry['checkpoint']} (removed "
                            "from there: this checkpoint is incomplete)")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"size mismatch in {rel} referenced in {entry['checkpoint']}: "
                            f"{path.stat().st_size} bytes there, {entry['size']} in the manifest")
    on_disk = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
    problems += [f"unexpected file {rel} (not in the manifest)"
                 for rel in sorted(on_disk - set(manifest.files) - {MANIFEST})]
    return problems


def checksum_problems(directory: Path, manifest: Manifest, threads: int = 2) -> list[str]:
    """Read and hash every file (files in parallel, chunks hashed while read)."""
    from concurrent.futures import ThreadPoolExecutor

    def problem(item) -> str | None:
        rel, entry = item
        path = referenced_path(directory, rel, entry) if "checkpoint" in entry else directory / rel
        if not (path.is_file() and path.stat().st_size == entry["size"]):
            return None  # structure_problems names it
        _, wrong = content_hash.read_checked(path, entry, manifest.hashing, chunk_pool)
        return f"checksum mismatch in {rel}: {wrong} (corrupted)" if wrong else None

    with ThreadPoolExecutor(threads, thread_name_prefix="baton-verify") as chunk_pool, \
            ThreadPoolExecutor(threads, thread_name_prefix="baton-verify-files") as file_pool:
        found = list(file_pool.map(problem, sorted(manifest.files.items())
                                   + sorted(manifest.references.items())))
    return [p for p in found if p]


def verify(directory: str | Path, checksums: bool = True) -> Manifest:
    """Return the manifest of a sound checkpoint or raise naming every problem."""
    directory = Path(directory)
    manifest = read(directory)
    problems = structure_problems(directory, manifest)
    if checksums:
        problems += checksum_problems(directory, manifest)
    if problems:
        raise CorruptCheckpoint(directory, problems)
    if checksums:  # sound bytes may still be a hostile pickle: refuse it before any load
        from ckpt.safe_load import check_pickles
        check_pickles(directory, manifest)
    return manifest
