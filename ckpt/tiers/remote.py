"""The persistent tier at an fsspec URL (s3://, gs://, file://, …): upload a committed
checkpoint (the manifest last: a prefix without one is not a checkpoint, as on disk),
list what is committed there, fetch one back."""
from __future__ import annotations

from pathlib import Path

from ckpt.layout import LATEST, MANIFEST, position_of
from ckpt.tiers.shipment import Shipment, shipment_of


class RemoteUnavailable(OSError):
    def __init__(self, url: str, why: str):
        super().__init__(f"persistent URL {url}: {why}")
        self.url, self.why = url, why


def _fs(root: str):
    import fsspec
    try:
        fs, path = fsspec.core.url_to_fs(root)
    except (ImportError, ValueError) as exc:  # unknown protocol, its package missing
        raise RemoteUnavailable(root, str(exc)) from None
    return fs, path.rstrip("/")


def upload(source: Path | Shipment, root: str, keep: int) -> list[str]:
    """Returns the copies retention removed there (keeps the newest `keep`)."""
    shipment = source if isinstance(source, Shipment) else shipment_of(source)
    fs, base = _fs(root)
    try:
        target = f"{base}/{shipment.name}"
        if fs.exists(f"{target}/{MANIFEST}"):
            fs.rm(f"{target}/{MANIFEST}")  # no longer a checkpoint while it is replaced
        for rel, path in shipment.files:
            fs.makedirs(f"{target}/{rel}".rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(path), f"{target}/{rel}")
        fs.pipe_file(f"{target}/{MANIFEST}", shipment.manifest)
        fs.pipe_file(f"{base}/{LATEST}", shipment.name.encode())
        names = committed(root)
        dropped = names[:-keep] if keep > 0 else []
        for name in dropped:
            fs.rm(f"{base}/{name}", recursive=True)
        return dropped
    except RemoteUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - every backend has its own error types
        raise RemoteUnavailable(root, f"{type(exc).__name__}: {exc}") from None


def committed(root: str) -> list[str]:
    """Names of the checkpoints with a manifest there, oldest first."""
    fs, base = _fs(root)
    try:
        if not fs.exists(base):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
        found = [n for n in names if position_of(n) and fs.exists(f"{base}/{n}/{MANIFEST}")]
    except Exception as exc:  # noqa: BLE001
        raise RemoteUnavailable(root, f"{type(exc).__name__}: {exc}") from None
    return sorted(found, key=position_of)


def fetch(root: str, name: str, into: Path) -> None:
    fs, base = _fs(root)
    try:
        fs.get(f"{base}/{name}/", str(into) + "/", recursive=True)
    except Exception as exc:  # noqa: BLE001
        raise RemoteUnavailable(root, f"{type(exc).__name__}: {exc}") from None
