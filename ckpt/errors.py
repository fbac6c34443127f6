"""Checkpoint errors. Each names the path and what is wrong with it."""
from __future__ import annotations

from pathlib import Path

from core.errors import BatonError


class CheckpointError(BatonError):
    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self):
        # Raised in the saver process and raised again in the worker (ckpt.saver_process):
        # rebuilt from its message and fields, as subclasses' __init__ take other arguments.
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(kind: type, args: tuple, fields: dict) -> CheckpointError:
    error = kind.__new__(kind)
    Exception.__init__(error, *args)
    error.__dict__.update(fields)
    return error


class NotACheckpoint(CheckpointError):
    """No committed checkpoint at the path (missing directory or manifest, or uncommitted)."""


class ForeignCheckpoint(NotACheckpoint):
    """A checkpoint baton did not write (plain DeepSpeed, Hugging Face): `kind` says which;
    `baton ckpt adopt` brings it in."""

    def __init__(self, path, kind: str, description: str):
        self.kind = kind
        super().__init__(path, description)


class CorruptCheckpoint(CheckpointError):
    """Files differ from the manifest, or required components are missing."""

    def __init__(self, path, problems: list[str]):
        self.problems = list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(path, f"checkpoint is damaged; nothing was loaded:\n{body}")


class IncompatibleCheckpoint(CheckpointError):
    """A sound checkpoint that this run cannot load as it is (model or layout differs)."""


class ReshardError(CheckpointError):
    """A checkpoint could not be converted to the requested layout."""


class ReshardUnsupported(ReshardError):
    """DeepSpeed (or this machine) cannot do this layout transform; names both layouts and why."""

    def __init__(self, path, source: dict, target: dict, why: str):
        self.source, self.target = dict(source), dict(target)
        super().__init__(path, f"cannot reshard world_size={source.get('world_size')} zero_stage="
                         f"{source.get('zero_stage')} -> world_size={target.get('world_size')} "
                         f"zero_stage={target.get('zero_stage')}: {why}")


class ReshardNotEquivalent(ReshardError):
    """The converted checkpoint does not reproduce the source; no DST was committed."""

    def __init__(self, src, dst, details: dict):
        self.src, self.dst, self.details = str(src), str(dst), dict(details)
        failed = ", ".join(k for k, ok in details.get("checks", {}).items() if not ok)
        super().__init__(dst, f"resharded checkpoint of {self.src} is not equivalent to it "
                         f"(failed: {failed or 'unknown'}); nothing was committed at {self.dst}. "
                         f"Details: {details}")


class CheckpointWriteFailed(CheckpointError):
    """The disk refused a save (full, quota, I/O error): nothing of it was committed."""

    def __init__(self, path, step: int, error: OSError, latest: str | None, file: str | None = None):
        self.step, self.errno, self.strerror = step, error.errno, error.strerror or str(error)
        self.latest, self.file = latest, file
        kept = (f"`latest` still points to {latest}, the previous complete checkpoint"
                if latest else "no earlier checkpoint of this stage was committed")
        where = f" (writing {file})" if file else ""
        if getattr(error, "internal", False):  # not the disk: a bug, said as such
            super().__init__(path, (
                f"could not save the checkpoint of step {step}: {self.strerror}{where}. Nothing "
                f"of this save was committed; {kept}. This is not a disk problem; rerun with "
                "BATON_DEBUG=1 and report it, or set ckpt.mode=sync to save on the training "
                "thread, then resume the stage with resume=latest"))
            return
        super().__init__(path, (
            f"could not save the checkpoint of step {step}: [Errno {self.errno}] "
            f"{self.strerror}{where}. Nothing of this save was committed (its partial "
            f"directory is discarded); {kept}. Free space on the filesystem that holds "
            f"{Path(str(path)).parent} (delete other files there, or keep fewer checkpoints "
            "with a lower stage.keep_last), then resume the stage with resume=latest"))


class NodeCopyIncomplete(CheckpointWriteFailed):
    """Across nodes, this node committed its copy of a memory-tier save but another node's
    commit failed: the save did not happen as a whole, though this node's `latest` names it."""

    def __init__(self, path, step: int, error: OSError, node: dict, failed_rank: int,
                 file: str | None = None):
        self.step, self.errno, self.strerror = step, error.errno, error.strerror or str(error)
        self.latest, self.file, self.failed_rank = None, file, failed_rank
        where = f" (writing {file})" if file else ""
        cause = f"[Errno {self.errno}] {self.strerror}" if self.errno is not None else self.strerror
        CheckpointError.__init__(self, path, (
            f"could not save the checkpoint of step {step} on every node: rank {failed_rank}'s "
            f"node could not commit its copy: {cause}{where}. This node (node {node['index']}, "
            f"ranks {node['ranks']}) did commit its copy, but a copy that only some nodes hold "
            "is never resumed from: a resume agrees on the newest step every node holds, and "
            "each node keeps its older copies until every node has a newer one. Free space in "
            f"ckpt.tiers.memory.dir on rank {failed_rank}'s node, then resume the stage with "
            "resume=latest"))


class UnreadablePayload(CheckpointError):
    """A file that matches its manifest but cannot be read safely (e.g. a pickle that a
    weights_only load refuses): checkpoints holding it cannot be compared or loaded."""

    def __init__(self, path, file: str, cause: BaseException):
        self.file = file
        self.cause = f"{type(cause).__name__}: " + (str(cause).strip().splitlines() or [""])[0]
        super().__init__(path, f"{file} cannot be read safely ({self.cause}); nothing in it was "
                         "executed. Check where this checkpoint came from (`baton ckpt verify` "
                         "only proves its bytes match its manifest)")


class UnsafeCheckpoint(CheckpointError):
    """A pickle holding objects outside the weights_only allow-list (docs/security.md):
    refused unread, so nothing in it ran."""

    def __init__(self, path, found: list[str] | str):
        self.found = [found] if isinstance(found, str) else list(found)
        super().__init__(path, (
            f"contains objects outside the allow-list of safe types ({', '.join(self.found)}); "
            "it was not loaded and nothing in it was executed. baton and DeepSpeed write only "
            "tensors, plain containers and the allow-listed DeepSpeed classes (docs/security.md), "
            "so this file was altered or comes from an untrusted source: do not use this "
            "checkpoint; take one from a run you trust"))


class UnconfinedPath(CheckpointError):
    """The manifest names a path outside its checkpoint directory (absolute, `..`, a
    symlink out): refused before any listed file is read."""

    def __init__(self, path, problems: list[str]):
        self.problems = list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(path, (
            f"manifest.json lists paths outside the checkpoint directory; nothing was read:\n"
            f"{body}\nEvery manifest path must be relative and normalized (no '..', '.', empty "
            "segments or backslashes) and stay inside the checkpoint directory, symlinks "
            "included. baton never writes such a manifest: this one was altered"))


class BadSignature(CheckpointError):
    """Signing is on (ckpt.signing_key_env) and the manifest is unsigned or signed with
    another key: refused before any other byte of the checkpoint is read."""

    def __init__(self, path, env_name: str, why: str):
        self.env_name, self.why = env_name, why
        super().__init__(path, (
            f"manifest.json {why}; with ckpt.signing_key_env={env_name} only manifests signed "
            f"with the key in ${env_name} are accepted, so nothing else was read. Use a "
            f"checkpoint written by a run holding that key, or check that ${env_name} holds "
            "the key it was signed with"))
