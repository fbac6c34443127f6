"""Manifest paths stay inside their checkpoint directory.

A manifest is data an attacker may have written: a path like `../../x`, `/etc/hostname`
or a listed file that is a symlink out would make `verify` hash, and loaders read, files
outside the checkpoint. Every path in `files` and `components` must be relative and
normalized and resolve (symlinks followed) inside the directory; checked by
`manifest.read` before any listed file is touched.
"""
from __future__ import annotations

from pathlib import Path


def shape_problem(rel) -> str | None:
    """Why `rel` is not a relative, normalized POSIX path (None: it is)."""
    if not rel:
        return "is empty"
    if "\\" in rel:
        return "contains a backslash"
    if rel.startswith("/"):
        return "is absolute"
    if "\x00" in rel:
        return "contains a NUL byte"
    segments = rel.split("/")
    if any(s == "" for s in segments):
        return "has an empty segment ('//' or a trailing '/')"
    if any(s in (".", "..") for s in segments):
        return "has a '.' or '..' segment"
    return None


def escape_problem(directory: Path, rel: str) -> str | None:
    """Why `directory/rel` resolves outside `directory` (None: it stays inside)."""
    root = directory.resolve()
    target = (directory / rel).resolve()
    if target == root or not target.is_relative_to(root):
        link = next((p for p in _prefixes(directory, rel) if p.is_symlink()), None)
        via = f" through the symlink {link.relative_to(directory).as_posix()}" if link else ""
        return f"resolves to {target}{via}, outside the checkpoint directory"
    return None


def _prefixes(directory: Path, rel: str):
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        yield directory.joinpath(*parts[:i])


def problems(directory: Path, files: dict, components: dict) -> list[str]:
    """One line per offending path, naming it; empty when every path is confined."""
    listed = list(files) + [rel for names in components.values() for rel in names]
    found = [f"{r!r} is not a path string" for r in listed if not isinstance(r, str)]
    for rel in dict.fromkeys(r for r in listed if isinstance(r, str)):
        why = shape_problem(rel) or escape_problem(directory, rel)
        if why:
            found.append(f"{rel!r} {why}")
    return found


def reference_problems(directory: Path, references: dict) -> list[str]:
    """A reference names a sibling checkpoint (`step-N`, nothing else) and a confined path
    inside it (selective persistence)."""
    from ckpt.layout import position_of

    found = []
    for rel, entry in references.items():
        name = entry.get("checkpoint") if isinstance(entry, dict) else None
        if not isinstance(name, str) or "/" in name or position_of(name) is None:
            found.append(f"reference {rel!r} names checkpoint {name!r}, not a sibling step-N "
                         "directory")
            continue
        why = shape_problem(rel) if isinstance(rel, str) else "is not a path string"
        why = why or escape_problem(Path(directory).parent / name, rel)
        if why:
            found.append(f"reference {rel!r} in {name} {why}")
    return found
