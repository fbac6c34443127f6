"""What a save's manifest will say, fixed at the save call and filled in at the commit.

The save call knows the stage, the step, the layout and the payload; the commit knows
each file's hashes, which the writers computed. A recipe carries the first to the second
as plain data, so it can travel to another process (ckpt.saver_process) as well as to
the saver thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ckpt import content_hash
from ckpt import manifest as manifest_io
from ckpt.layout import MANIFEST
from ckpt.node_copies import NODE
from ckpt.state_files import classify


@dataclass
class ManifestRecipe:
    tmp: Path
    stage: str
    step: int
    parallel: dict
    zero_stage: int
    mid_accumulation: bool
    hashing: dict
    extra: dict
    """The payload's extra fields plus "parent" (the run the state came from)."""
    references: dict[str, str] = field(default_factory=dict)
    """Selective saves: layer file -> the earlier checkpoint holding it."""

    def __call__(self, files: dict, node_record: dict | None) -> manifest_io.Manifest:
        """`files`: rel -> entry as the writers reported them; `node_record`: a node
        copy's record, which ends with the save's id known once every rank reported."""
        extra = {**self.extra, NODE: node_record} if node_record else self.extra
        # Files DeepSpeed copies without its engine (its zero_to_fp32.py helper) are hashed here.
        for path in self.tmp.rglob("*"):
            rel = path.relative_to(self.tmp).as_posix()
            if path.is_file() and rel not in files and rel != MANIFEST:
                files[rel] = content_hash.hash_file(path, self.hashing)
        components: dict[str, list[str]] = {}
        for rel in sorted(files):
            for name in classify(rel, self.zero_stage):
                components.setdefault(name, []).append(rel)
        return manifest_io.Manifest(
            stage=self.stage, step=self.step, components=components, files=files,
            parallel=self.parallel, mid_accumulation=self.mid_accumulation,
            hashing=self.hashing, extra=extra,
            references=selective_references(self.tmp.parent, self.references))


def selective_references(root: Path, held_in: dict[str, str]) -> dict[str, dict]:
    """rel -> {"checkpoint", "size", "chunks"}: each referenced file's entry, copied from
    the manifest of the checkpoint that holds it (committed before this one: saves commit
    in order), so this manifest alone checks those bytes."""
    entries, manifests = {}, {}
    for rel, name in held_in.items():
        if name not in manifests:
            manifests[name] = manifest_io.read(root / name)
        entries[rel] = {"checkpoint": name, **manifests[name].files[rel]}
    return entries
