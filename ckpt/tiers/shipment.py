"""What a tier copy of a committed checkpoint consists of: its files and its manifest.

A checkpoint saved selectively (ckpt.selective) uses layer files of earlier checkpoints
in its own directory. Another tier keeps its own, shorter history, so a copy there must
not depend on them: the copy carries the referenced files itself, and its manifest lists
them as its own files (re-signed when manifests are signed). The checkpoint's content
digest does not change (it counts referenced and own files alike).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.layout import MANIFEST, referenced_path


@dataclass
class Shipment:
    name: str
    files: list[tuple[str, Path]]
    """(relative path in the copy, where to read it now), the manifest excluded."""
    manifest: bytes


def shipment_of(final: Path) -> Shipment:
    own = sorted((p.relative_to(final).as_posix(), p) for p in final.rglob("*")
                 if p.is_file() and p.relative_to(final).as_posix() != MANIFEST)
    raw = (final / MANIFEST).read_bytes()
    manifest = manifest_io.read(final)
    if not manifest.references:
        return Shipment(final.name, own, raw)
    from ckpt import signing
    from ckpt.state_files import classify

    carried = [(rel, referenced_path(final, rel, entry))
               for rel, entry in sorted(manifest.references.items())]
    for rel, entry in manifest.references.items():
        manifest.files[rel] = {k: v for k, v in entry.items() if k != "checkpoint"}
        for component in classify(rel, manifest.layout.zero_stage):
            manifest.components.setdefault(component, []).append(rel)
    manifest.references = {}
    manifest.signature = None
    manifest.signature = signing.signature_for(manifest.record())
    return Shipment(final.name, sorted(own + carried), manifest.to_json().encode())
