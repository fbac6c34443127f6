"""A checkpoint's identity by content: equal for two checkpoints exactly when they hold
the same training state, wherever they were written and by whichever command.

The manifest's own sha256 is not that: a manifest records where a checkpoint came from
(`source`, `resharded_from` and other location facts in `extra`), and `meta.json`
records argv, paths and versions. Two reproductions of one run in two run directories
have different manifests but the same state. The content digest covers:
- every state file's content hash as the manifest records it (the chunk digests under
  its `hashing` scheme), by relative path; `meta.json` and DeepSpeed's copied `.py`
  helper scripts are left out;
- the training-relevant facts about that state: stage, step, parallel layout (not the
  collective backend), mid-accumulation, and the hashing scheme the file hashes are under.

No path, time or argv is in it. It is computed from the manifest alone, so it costs
nothing to compute; that the files match the manifest is what `manifest.verify` checks.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ckpt import content_hash

PREFIX = "cd1:"
# Files in a manifest that do not hold training state.
NOT_STATE = ("meta.json",)


def is_state_file(rel: str) -> bool:
    return rel not in NOT_STATE and not rel.endswith(".py")


def _layout(parallel: dict) -> dict:
    """The layout without the collective backend: gloo on CPU and NCCL on GPUs save the
    same state."""
    return {key: value for key, value in (parallel or {}).items() if key != "backend"}


def content_digest(manifest) -> str:
    """`cd1:<sha256 hex>` of the canonical description above, for a `ckpt.manifest.Manifest`."""
    description = {
        "stage": manifest.stage, "step": manifest.step, "parallel": _layout(manifest.parallel),
        "mid_accumulation": manifest.mid_accumulation,
        "hashing": manifest.hashing or {"alg": "sha256", "whole_file": True},
        # A layer file referenced in an earlier checkpoint (ckpt.selective) is state all the
        # same: where it is stored does not change what the checkpoint holds.
        "files": {rel: content_hash.identity(entry) for rel, entry in sorted(
            {**getattr(manifest, "references", {}), **manifest.files}.items())
            if is_state_file(rel)},
    }
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return PREFIX + hashlib.sha256(canonical.encode()).hexdigest()


def content_digest_of(directory: str | Path) -> str:
    """The content digest of the checkpoint in `directory`, read from its manifest (its
    structure checked; call `manifest.verify` first where the files must match too)."""
    from ckpt import manifest as manifest_io

    return content_digest(manifest_io.verify(Path(directory), checksums=False))
