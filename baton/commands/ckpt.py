"""`baton ckpt verify|inspect|diff|reshard|adopt|export|gc|keeper|tiers`: look at, check,
convert, bring in and hand out checkpoints; keep and find copies in faster tiers."""
from __future__ import annotations

import json
import sys

from core.errors import UsageError


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = sub.add_parser("verify", help="exit 0 if complete and intact, else 1 naming each problem")
    verify.add_argument("path")
    inspect = sub.add_parser("inspect", help="stage, step, components, layout, sizes, parent")
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    diff = sub.add_parser("diff", help="compare two checkpoints; exit 0 identical, 1 different, 2 could not compare")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--atol", type=float, default=0.0, help="allowed max abs difference")
    diff.add_argument("--json", action="store_true")
    from baton.commands.ckpt_adopt_export import add_arguments as add_adopt_export
    add_adopt_export(sub)
    from baton.commands.ckpt_gc import add_gc_arguments
    add_gc_arguments(sub)
    from baton.commands.ckpt_reshard import add_reshard_arguments
    add_reshard_arguments(sub)
    from baton.commands.ckpt_tiers import add_tier_arguments
    add_tier_arguments(sub)


def _verify(args) -> int:
    from ckpt.named import named_checkpoint
    from ckpt import manifest as manifest_io
    from ckpt.errors import CheckpointError

    from ckpt.journal import JournalError

    journal_note = ""
    try:
        path = named_checkpoint(args.path)
        manifest = manifest_io.verify(path)
        if manifest.stage == "rl":  # the journal up to its cursor is part of an RL checkpoint
            from stages.rl.steps import verify_checkpoint_journal
            journal_note = "; " + verify_checkpoint_journal(path, manifest)[1]
    except (CheckpointError, JournalError) as exc:
        print(f"FAILED {exc}", file=sys.stderr)
        return 1
    print(f"OK {path.resolve()}: {manifest.stage} step {manifest.step}, "
          f"{len(manifest.files)} files, {manifest.total_bytes()} bytes, checksums match{journal_note}")
    return 0


def _inspect(args) -> int:
    from ckpt.named import named_checkpoint
    from ckpt.describe import describe

    directory = named_checkpoint(args.path).resolve()
    manifest, info = describe(directory)
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
    if info["metrics"]:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in info["metrics"].items()
                          if k != "step" and isinstance(v, float))
        console.print(f"metrics at step {info['metrics'].get('step')}: {shown}")
    for why in info["pinned_by"]:
        console.print(f"pinned (never deleted by retention): {why}")
    if info["references"]:
        held = sorted(set(info["references"].values()))
        console.print(f"selective: {len(info['references'])} layer files "
                      f"({info['referenced_bytes']:,} bytes) kept in {', '.join(held)}")
    if manifest.extra.get("tiers"):
        console.print(f"tiers: {', '.join(manifest.extra['tiers'])} (where this save was sent; "
                      "`baton ckpt tiers STAGE` shows what each tier holds now)")
    if info["node"]:
        console.print(f"node copy: node {info['node']['index']}, the files of ranks "
                      f"{info['node']['ranks']} and the shared ones (a resume of those ranks only)")
    console.print(f"content digest: {info['content_digest']}", soft_wrap=True)  # one line, to copy
    return 0


def _diff(args) -> int:
    from ckpt.named import named_checkpoint
    from ckpt.diff import diff_checkpoints

    # Exit 1 means "different"; anything that prevents comparing (a missing, damaged or
    # unreadable checkpoint) is a CheckpointError: exit 2, "could not compare".
    report = diff_checkpoints(named_checkpoint(args.a, "A"), named_checkpoint(args.b, "B"),
                              atol=args.atol)
    if args.json:
        print(json.dumps({"identical": report.identical, "only_in_a": report.only_in_a,
                          "only_in_b": report.only_in_b, "notes": report.notes,
                          "content_digest_a": report.content_digest_a,
                          "content_digest_b": report.content_digest_b,
                          "environment_differences": report.environment,
                          "files": [vars(f) for f in report.files]}, indent=2))
        return 0 if report.identical else 1
    for f in report.files:
        print(f"{'/'.join(f.components) or '-':28s} {f.file:48s} {_diff_status(f)}")
    for rel in report.only_in_a:
        print(f"only in A: {rel}")
    for rel in report.only_in_b:
        print(f"only in B: {rel}")
    for note in report.notes:
        print(f"note: {note}")
    _print_digests(report)
    if report.environment:
        label = "environment differences" if report.identical else \
            "environment differences that can explain it"
        print(f"{label}: " + "; ".join(report.environment))
    print("IDENTICAL" if report.identical else "DIFFERENT")
    return 0 if report.identical else 1


def _diff_status(f) -> str:
    if f.identical:
        return "identical"
    # A size is shown only where tensors differ; a JSON value differs by what it is.
    size = f" max|Δ|={f.max_abs_diff:.3e}" if f.max_abs_diff > 0 else ""
    return f"DIFFERS{size} first at {f.first_difference}"


def _print_digests(report) -> None:
    """Equal digests mean the same state; unequal ones may still be IDENTICAL (ckpt.diff)."""
    if report.same_content_digest:
        relation = "equal: the same state"
    elif report.identical:
        relation = ("differs, yet every state value compares equal: the same bytes hashed "
                    "another way, another backend, or within --atol")
    else:
        relation = "differs"
    print(f"content digest A: {report.content_digest_a}")
    print(f"content digest B: {report.content_digest_b} ({relation})")


def _configure_signing(args) -> None:
    """`ckpt.signing_key_env=NAME` among the trailing overrides turns signature checks on
    (read directly: verify should not pay for composing the whole config). verify, inspect
    and diff take no other override; reshard, adopt and export pass theirs on."""
    from ckpt import signing

    name, rest = signing.split_override(list(args.overrides))
    if args.action in ("verify", "inspect", "diff") and rest:
        raise UsageError(rest[0].split("=", 1)[0], rest[0].split("=", 1)[1], (
            f"`baton ckpt {args.action}` takes no config overrides except "
            f"{signing.CONFIG_KEY}=NAME (the environment variable holding the manifest "
            "signing key)"))
    signing.configure(name)


def main(args) -> int:
    _configure_signing(args)
    if args.action in ("adopt", "export"):
        from baton.commands.ckpt_adopt_export import main as adopt_export
        return adopt_export(args)
    if args.action == "gc":
        from baton.commands.ckpt_gc import run_gc
        return run_gc(args)
    if args.action == "keeper":
        from baton.commands.ckpt_tiers import run_keeper
        return run_keeper(args)
    if args.action == "tiers":
        from baton.commands.ckpt_tiers import show_tiers
        return show_tiers(args)
    if args.action == "reshard":
        from baton.commands.ckpt_reshard import run_reshard
        return run_reshard(args)
    return {"verify": _verify, "inspect": _inspect, "diff": _diff}[args.action](args)
