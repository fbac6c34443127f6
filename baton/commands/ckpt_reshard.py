"""`baton ckpt reshard SRC DST parallel.world_size=N parallel.zero_stage=K [overrides]`."""
from __future__ import annotations

import json


def add_reshard_arguments(sub) -> None:
    parser = sub.add_parser("reshard", help="convert a checkpoint to another world size / ZeRO "
                            "stage via a DeepSpeed universal checkpoint, with an equivalence check")
    parser.add_argument("src", help="committed checkpoint directory (step-N)")
    parser.add_argument("dst", help="new checkpoint directory to write (must not exist)")
    # Trailing key=value overrides (the target config, e.g. parallel.world_size=2
    # parallel.zero_stage=3) are split off by baton.cli into args.overrides.
    parser.add_argument("--json", action="store_true",
                        help="print the result as one line of JSON (the last line of stdout)")


def _fmt(value) -> str:
    return f"{value:.3e}" if isinstance(value, float) else str(value)


def print_result(result) -> None:
    from rich.console import Console
    from rich.table import Table

    eq, moments = result.equivalence, result.equivalence["optimizer_moments"]
    table = Table(title=f"reshard {result.source_parallel} -> {result.target_parallel}")
    for column in ("check", "source", "target", "max |diff|", "tolerance", "ok"):
        table.add_column(column)
    loss_diff = abs(eq["probe_loss_source"] - eq["probe_loss_target"])
    checks = eq["checks"]
    table.add_row("probe loss", f"{eq['probe_loss_source']:.8f}", f"{eq['probe_loss_target']:.8f}",
                  _fmt(loss_diff), _fmt(eq["tolerance"]), str(checks["probe_loss"]))
    table.add_row("probe logits", "", "", _fmt(eq["max_abs_logit_diff"]), _fmt(eq["tolerance"]),
                  str(checks["logits"]))
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        table.add_row(f"optimizer {key}", "", "", _fmt(moments[f"max_abs_diff_{key}"]),
                      _fmt(eq["moment_tolerance"]), str(checks["optimizer"]))
    table.add_row("optimizer step", _fmt(moments["step_source"]), _fmt(moments["step_target"]),
                  "", "equal", str(moments["step_source"] == moments["step_target"]))
    Console(width=120).print(table)
    print(f"converter: {result.converter} (DeepSpeed {result.deepspeed_version})")
    # The content digests name what each checkpoint holds (ckpt.content_digest); the
    # manifest sha256s also cover where each lies and came from.
    print(f"input content digest:   {result.input_content_digest}")
    print(f"output content digest:  {result.output_content_digest}")
    print(f"input manifest sha256:  {result.input_manifest_sha256}")
    print(f"output manifest sha256: {result.output_manifest_sha256}")
    print(f"[baton] resharded {result.source} -> {result.destination}: "
                  f"{'EQUIVALENT' if eq['passed'] else 'NOT EQUIVALENT'}")


def run_reshard(args) -> int:
    """BatonErrors (refusals, failed checks) propagate to the CLI, which reports them."""
    from handoff.reshard import reshard

    result = reshard(args.src, args.dst, list(args.overrides))
    if args.json:
        # One line, last: DeepSpeed's logger also writes to stdout.
        print(json.dumps(result.to_dict()))
    else:
        print_result(result)
    return 0
