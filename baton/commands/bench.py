"""`baton bench ckpt [--size-gb X ...] [--rounds N] [--json PATH] [--plot PATH] [--quick]`:
measure every checkpoint save method on the same state (docs/bench.md); with `--tiers`,
restore and copy time per checkpoint tier instead. `baton bench repro` and `baton bench
batch-invariant`: step time per mode of a real stage (bench.stage_modes)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    ckpt = sub.add_parser("ckpt", help="time every checkpoint save method on the same state: "
                          "stall, time until durable, bytes, peak extra memory, ratios")
    ckpt.add_argument("--size-gb", type=float, nargs="+", default=None, metavar="X",
                      help="state sizes in GB (fp32 weights + Adam moments); the largest is "
                      "the main table, all form the size sweep (default: 0.25 0.5 1 2)")
    ckpt.add_argument("--rounds", type=int, default=3, help="measured saves per method (>= 3)")
    ckpt.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    ckpt.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG")
    ckpt.add_argument("--quick", action="store_true",
                      help="skip the checkpoint-every-step run on the large model")
    ckpt.add_argument("--dir", type=Path, default=None, metavar="PATH",
                      help="where to write checkpoints (default: the system temp directory)")
    ckpt.add_argument("--tiers", action="store_true",
                      help="instead: restore time from each checkpoint tier (memory, peer, "
                      "persistent, remote) and the time to copy into each, on one checkpoint "
                      "of the largest --size-gb (default 1)")


    repro = sub.add_parser("repro", help="step time of portable vs native kernels (repro.mode), "
                           "interleaved rounds of real stage runs")
    repro.add_argument("--stage", default="cpt", choices=("cpt", "sft"), help="stage to time")
    repro.add_argument("--rounds", type=int, default=3, help="rounds, each one run per mode (>= 3)")
    repro.add_argument("--steps", type=int, default=20, help="training steps per run (>= 5)")
    repro.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    repro.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG")

    invariant = sub.add_parser("batch-invariant", help="RL step time with rl.batch_invariant=true vs "
                               "the default batched log-probs, interleaved rounds of real RL stages")
    invariant.add_argument("--rounds", type=int, default=3, help="rounds, each one run per mode (>= 3)")
    invariant.add_argument("--steps", type=int, default=10, help="RL steps per run (>= 5)")
    invariant.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    invariant.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG")


def main(args) -> int:
    if args.action in ("repro", "batch-invariant"):
        return modes_main(args)
    if args.tiers:
        return tiers_main(args)
    from bench.options import DEFAULT_SIZES_GB, BenchOptions

    options = BenchOptions(
        sizes_gb=list(args.size_gb or DEFAULT_SIZES_GB), rounds=args.rounds,
        json_path=args.json, plot_path=args.plot, quick=args.quick, workdir=args.dir,
        overrides=list(args.overrides))
    options.check()  # bad input fails before the config, the model or DeepSpeed load
    from core.config import compose
    from bench.console import stdout_to_stderr
    from bench.mlflow_log import log_to_mlflow, tracking_uri
    from bench.report import print_report
    from bench.run import run_bench

    uri = tracking_uri(compose(options.overrides))

    with stdout_to_stderr():  # library chatter must not land between the tables
        result = run_bench(options)
    print_report(result)
    # With MLflow on and no path given, the JSON and PNG are made only to be logged.
    with tempfile.TemporaryDirectory(prefix="baton-bench-out-") as scratch:
        files = [options.json_path or Path(scratch) / "bench-ckpt.json",
                 options.plot_path or Path(scratch) / "bench-ckpt.png"]
        write_outputs(result, *files)
        if uri:
            run_id = log_to_mlflow(uri, result, files)
            print(f"[bench] logged to MLflow at {uri}: run {run_id}")
    return 0


def write_outputs(result: dict, json_path: Path, plot_path: Path) -> None:
    from bench.plot import write_plot

    json_path.write_text(json.dumps(result, indent=2) + "\n")
    write_plot(result, plot_path)


def tiers_main(args) -> int:
    """`bench ckpt --tiers`: restore and copy time per checkpoint tier (bench.tiers)."""
    from bench.tiers_options import DEFAULT_SIZE_GB, TierBenchOptions

    options = TierBenchOptions(
        size_gb=max(args.size_gb or [DEFAULT_SIZE_GB]), rounds=args.rounds, json_path=args.json,
        plot_path=args.plot, workdir=args.dir, overrides=list(args.overrides), quick=args.quick)
    options.check()  # bad input fails before the config, the model or DeepSpeed load
    from core.config import compose
    from bench.console import stdout_to_stderr
    from bench.mlflow_log import tracking_uri
    from bench.tiers import run_tier_bench
    from bench.tiers_mlflow import log_tiers_to_mlflow
    from bench.tiers_plot import write_tier_plot
    from bench.tiers_report import print_tier_report

    uri = tracking_uri(compose(options.overrides))
    with stdout_to_stderr():
        result = run_tier_bench(options)
    print_tier_report(result)
    with tempfile.TemporaryDirectory(prefix="baton-bench-out-") as scratch:
        json_path = options.json_path or Path(scratch) / "bench-tiers.json"
        plot_path = options.plot_path or Path(scratch) / "bench-tiers.png"
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        write_tier_plot(result, plot_path)
        if uri:
            run_id = log_tiers_to_mlflow(uri, result, [json_path, plot_path])
            print(f"[bench] logged to MLflow at {uri}: run {run_id}")
    return 0


def modes_main(args) -> int:
    """`bench repro` and `bench batch-invariant`: step time per mode (bench.stage_modes)."""
    import os
    import sys

    from core.errors import BatonError
    from bench.machine import cpu_model
    from bench.stage_modes import report_lines, run_mode_bench, write_plot

    if args.rounds < 3 or args.steps < 5:
        raise BatonError(f"bench {args.action}: --rounds {args.rounds} --steps {args.steps}: expected "
                         "at least 3 rounds (min and median need them) and 5 steps per run")
    if args.action == "repro":
        from bench.repro import repro_bench
        bench = repro_bench(args.stage)
    else:
        from bench.batch_invariant import batch_invariant_bench
        bench = batch_invariant_bench()
    result = run_mode_bench(bench, args.rounds, args.steps, list(args.overrides),
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    result["machine"] = f"{cpu_model()}, {os.cpu_count()} cores"
    print("\n".join(report_lines(bench, result, result["machine"])))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        write_plot(bench, result, args.plot)
    return 0
