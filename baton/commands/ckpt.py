"""`baton ckpt verify|inspect|diff|reshard`: look at, check and convert checkpoints."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = sub.add_parser("verify", help="exit 0 if complete and intact, else 1 naming each problem")
    verify.add_argument("path")
    inspect = sub.add_parser("inspect", help="stage, step, components, layout, sizes, parent")
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    diff = sub.add_parser("diff", help="compare two checkpoints; exit 0 only if identical")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--atol", type=float, default=0.0, help="allowed max abs difference")
    diff.add_argument("--json", action="store_true")
    try:
        from ckpt.reshard_cli import add_reshard_arguments
    except ModuleNotFoundError:
        return
    add_reshard_arguments(sub)


def _verify(args) -> int:
    from ckpt import manifest as manifest_io
    from ckpt.errors import CheckpointError

    try:
        manifest = manifest_io.verify(args.path)
    except CheckpointError as exc:
        print(f"FAILED {exc}", file=sys.stderr)
        return 1
    print(f"OK {Path(args.path).resolve()}: {manifest.stage} step {manifest.step}, "
          f"{len(manifest.files)} files, {manifest.total_bytes()} bytes, checksums match")
    return 0


def _inspect(args) -> int:
    from ckpt import manifest as manifest_io
    from ckpt.compat import read_meta

    directory = Path(args.path).resolve()
    manifest = manifest_io.verify(directory, checksums=False)
    meta = read_meta(directory, manifest)
    info = {"path": str(directory), "stage": manifest.stage, "step": manifest.step,
            "mid_accumulation": manifest.mid_accumulation, "parallel": manifest.parallel,
            "components": {name: {"files": files,
                                  "bytes": sum(manifest.files[f]["size"] for f in files)}
                           for name, files in sorted(manifest.components.items())},
            "total_bytes": manifest.total_bytes(), "parent": meta.get("parent"),
            "config_hash": meta.get("config_hash"), "versions": meta.get("versions")}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{manifest.stage} step {manifest.step}  ({directory})")
    table.add_column("component")
    table.add_column("files", justify="right")
    table.add_column("bytes", justify="right")
    for name, comp in info["components"].items():
        table.add_row(name, str(len(comp["files"])), f"{comp['bytes']:,}")
    console = Console()
    console.print(table)
    console.print(f"parallel: {manifest.parallel}")
    console.print(f"mid-accumulation: {manifest.mid_accumulation}   total: {info['total_bytes']:,} bytes")
    console.print(f"parent: {info['parent']}   config hash: {info['config_hash']}")
    return 0


def _diff(args) -> int:
    from ckpt.diff import diff_checkpoints

    report = diff_checkpoints(args.a, args.b, atol=args.atol)
    if args.json:
        print(json.dumps({"identical": report.identical, "only_in_a": report.only_in_a,
                          "only_in_b": report.only_in_b, "notes": report.notes,
                          "files": [vars(f) for f in report.files]}, indent=2))
        return 0 if report.identical else 1
    for f in report.files:
        status = "identical" if f.identical else f"DIFFERS max|Δ|={f.max_abs_diff:.3e} first at {f.first_difference}"
        print(f"{'/'.join(f.components) or '-':28s} {f.file:48s} {status}")
    for rel in report.only_in_a:
        print(f"only in A: {rel}")
    for rel in report.only_in_b:
        print(f"only in B: {rel}")
    for note in report.notes:
        print(f"note: {note}")
    print("IDENTICAL" if report.identical else "DIFFERENT")
    return 0 if report.identical else 1


def main(args) -> int:
    if args.action == "reshard":
        from ckpt.reshard_cli import run_reshard
        return run_reshard(args)
    return {"verify": _verify, "inspect": _inspect, "diff": _diff}[args.action](args)
