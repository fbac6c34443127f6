"""What `baton ckpt inspect` reports about a checkpoint, without reading its tensors.

Sizes and the content digest (ckpt.content_digest: what the checkpoint holds, wherever
it lies) come from the manifest (checked for shape, not checksums) and lineage from the
checkpoint's meta, so inspecting a large checkpoint stays instant.
"""
from __future__ import annotations

from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.compat import read_meta
from ckpt.content_digest import content_digest
from ckpt.retention import pins_of


def describe(directory: Path) -> tuple:
    """(manifest, info): info is the JSON-ready summary, components with their sizes."""
    manifest = manifest_io.verify(directory, checksums=False)
    meta = read_meta(directory, manifest)
    info = {"path": str(directory), "stage": manifest.stage, "step": manifest.step,
            "content_digest": content_digest(manifest),
            "mid_accumulation": manifest.mid_accumulation, "parallel": manifest.parallel,
            "components": {name: {"files": files,
                                  "bytes": sum(manifest.files[f]["size"] for f in files)}
                           for name, files in sorted(manifest.components.items())},
            "total_bytes": manifest.total_bytes(), "parent": meta.get("parent"),
            "config_hash": meta.get("config_hash"), "versions": meta.get("versions"),
            # Checkpoint tiers this save was sent to (ckpt.tiers), and the files it uses
            # from earlier checkpoints (selective persistence).
            "tiers": manifest.extra.get("tiers"),
            # A node copy (the memory tier across nodes) holds only its node's ranks' files.
            "node": manifest.extra.get("node"),
            "references": {rel: e["checkpoint"] for rel, e in sorted(manifest.references.items())},
            "referenced_bytes": sum(e["size"] for e in manifest.references.values()),
            # The metrics of its step (what stage.keep_best ranks), and why no retention deletes it.
            "metrics": meta.get("metrics"), "pinned_by": pins_of(Path(directory))}
    return manifest, info
