"""`baton bench ckpt [--size-gb X ...] [--rounds N] [--json PATH] [--plot PATH] [--quick]
[--every-step-blocks N]`:
measure every checkpoint save method on the same state (docs/bench.md); with `--tiers`,
restore and copy time per checkpoint tier instead; with `--selective`, bytes written by
full vs selective saves over a real SFT stage and the loss after a restart from one.
`baton bench repro` and `baton bench batch-invariant`: step time per mode of a real stage
(bench.stage_modes). `baton bench data`: what your own data costs (bench.data)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

ROUNDS_DEFAULT = 3


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    ckpt = sub.add_parser("ckpt", help="time every checkpoint save method on the same state: "
                          "stall, time until durable, bytes, peak extra memory, ratios")
    ckpt.add_argument("--size-gb", type=float, nargs="+", default=None, metavar="X",
                      help="state sizes in GB (fp32 weights + Adam moments); the largest is "
                      "the main table, all form the size sweep (default: 0.25 0.5 1 2)")
    ckpt.add_argument("--rounds", type=int, default=ROUNDS_DEFAULT,
                      help="measured saves per method (>= 3)")
    ckpt.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    ckpt.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG")
    ckpt.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                      help="write the headline numbers and the machine as markdown "
                      "(a dated docs/results/ document)")
    ckpt.add_argument("--quick", action="store_true",
                      help="skip the checkpoint-every-step run on the large model")
    ckpt.add_argument("--every-step-blocks", type=int, default=None, metavar="N",
                      help="rounds of the default model's checkpoint-every-step blocks "
                      "(>= 3; default 12, 3 with --quick): more narrow its 95%% intervals")
    ckpt.add_argument("--dir", type=Path, default=None, metavar="PATH",
                      help="where to write checkpoints (default: the system temp directory)")
    ckpt.add_argument("--tiers", action="store_true",
                      help="instead: restore time from each checkpoint tier (memory, peer, "
                      "persistent, remote) and the time to copy into each, on one checkpoint "
                      "of the largest --size-gb (default 1)")
    _add_selective_arguments(ckpt)

    repro = sub.add_parser("repro", help="step time of portable vs native kernels (repro.mode), "
                           "interleaved rounds of real stage runs")
    repro.add_argument("--stage", default="cpt", choices=("cpt", "sft"), help="stage to time")
    repro.add_argument("--rounds", type=int, default=3, help="rounds, each one run per mode (>= 3)")
    repro.add_argument("--steps", type=int, default=20, help="training steps per run (>= 5)")
    repro.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    repro.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG")

    data = sub.add_parser("data", help="what your own data costs: tokenizing against a plain "
                          "datasets.map, the cache, a worker's memory, loading's share of a step")
    data.add_argument("--rows", type=int, default=200_000, help="chat rows to tokenize (default 200000)")
    data.add_argument("--rounds", type=int, default=3, help="tokenize rounds, each one of both (>= 3)")
    data.add_argument("--memory-gb", type=float, default=2.0,
                      help="size of the tokenized dataset a worker reads (default 2)")
    data.add_argument("--memory-steps", type=int, default=500, help="steps read from it (default 500)")
    data.add_argument("--stage-steps", type=int, default=30, help="steps of the timed SFT stage (>= 5)")
    data.add_argument("--dir", type=Path, default=None, metavar="PATH",
                      help="where to write the data (default: the system temp directory)")
    data.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    data.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                      help="write the results as a dated docs/results/ document")

    invariant = sub.add_parser("batch-invariant", help="RL step time with rl.batch_invariant=true vs "
                               "the default batched log-probs, interleaved rounds of real RL stages")
    invariant.add_argument("--rounds", type=int, default=3, help="rounds, each one run per mode (>= 3)")
    invariant.add_argument("--steps", type=int, default=10, help="RL steps per run (>= 5)")
    invariant.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results")
    invariant.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG")


def _add_selective_arguments(ckpt) -> None:
    """`--selective` and its own flags; they default to None so that one given without
    --selective is refused rather than silently ignored (SELECTIVE_FLAGS)."""
    ckpt.add_argument("--selective", action="store_true",
                      help="instead: bytes written by full vs selective saves "
                      "(ckpt.selective) over a real SFT stage, and the loss deviation after a "
                      "restart from a composite checkpoint (docs/bench.md)")
    ckpt.add_argument("--steps", type=int, default=None,
                      help="with --selective: stage.max_steps of every run (default 200)")
    ckpt.add_argument("--save-every", type=int, default=None,
                      help="with --selective: stage.save_every (default 5)")
    ckpt.add_argument("--threshold", type=float, default=None,
                      help="with --selective: ckpt.selective.threshold (default 0.05)")
    ckpt.add_argument("--full-every", type=int, default=None,
                      help="with --selective: ckpt.selective.full_every (default 10)")
    ckpt.add_argument("--restart-steps", type=int, default=None,
                      help="with --selective: steps compared after the restart (default 20)")


SELECTIVE_FLAGS = {"--steps": "steps", "--save-every": "save_every", "--threshold": "threshold",
                   "--full-every": "full_every", "--restart-steps": "restart_steps"}


def main(args) -> int:
    if args.action == "data":
        return data_main(args)
    if args.action in ("repro", "batch-invariant"):
        return modes_main(args)
    if args.selective:
        return selective_main(args)
    from core.errors import UsageError

    for flag, name in SELECTIVE_FLAGS.items():
        if getattr(args, name) is not None:
            raise UsageError(flag, getattr(args, name), "only with --selective")
    if args.tiers:
        return tiers_main(args)
    from bench.options import DEFAULT_SIZES_GB, BenchOptions

    options = BenchOptions(
        sizes_gb=list(args.size_gb or DEFAULT_SIZES_GB), rounds=args.rounds,
        json_path=args.json, plot_path=args.plot, quick=args.quick,
        every_step_blocks=args.every_step_blocks, workdir=args.dir,
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
    if args.markdown is not None:
        from bench.markdown import markdown
        args.markdown.write_text(markdown(result))
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
        plot_path=args.plot, workdir=args.dir, overrides=list(args.overrides), quick=args.quick,
        every_step_blocks=args.every_step_blocks)
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
    publish(result, options, "bench-tiers", write_tier_plot, uri and log_tiers_to_mlflow, uri)
    return 0


def publish(result: dict, options, name: str, write_plot, log, uri: str | None) -> None:
    """The JSON and the PNG (where asked for, else in a scratch directory), and both logged
    to MLflow when `log` is given: with MLflow on and no path given, they are made only to
    be logged."""
    with tempfile.TemporaryDirectory(prefix="baton-bench-out-") as scratch:
        json_path = options.json_path or Path(scratch) / f"{name}.json"
        plot_path = options.plot_path or Path(scratch) / f"{name}.png"
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        write_plot(result, plot_path)
        if log:
            run_id = log(uri, result, [json_path, plot_path])
            print(f"[bench] logged to MLflow at {uri}: run {run_id}")


def selective_main(args) -> int:
    """`bench ckpt --selective`: bytes per save and post-restart loss (bench.selective)."""
    from bench.selective_options import SelectiveBenchOptions

    given = {name: getattr(args, name) for name in SELECTIVE_FLAGS.values()
             if getattr(args, name) is not None}
    refused = {"--tiers": args.tiers, "--quick": args.quick, "--size-gb": args.size_gb,
               "--every-step-blocks": args.every_step_blocks,
               "--rounds": args.rounds if args.rounds != ROUNDS_DEFAULT else None}
    options = SelectiveBenchOptions(
        **given, json_path=args.json, plot_path=args.plot, workdir=args.dir,
        overrides=list(args.overrides), not_applicable={k: v for k, v in refused.items() if v})
    options.check()  # bad input fails before the config is composed or any stage starts
    from core.config import compose
    from bench.console import stdout_to_stderr
    from bench.mlflow_log import tracking_uri
    from bench.selective import run_selective_bench
    from bench.selective_mlflow import log_selective_to_mlflow
    from bench.selective_plot import write_selective_plot
    from bench.selective_report import print_selective_report
    from bench.selective_stage import common_overrides, selective_overrides

    # The stages' own config, composed and validated here: a bad override is one message
    # before the first stage starts, not a failed stage minutes in.
    compose(["stage=sft", *common_overrides(options), *selective_overrides(options)])
    uri = tracking_uri(compose(options.overrides))
    with stdout_to_stderr():
        result = run_selective_bench(options)
    print_selective_report(result)
    publish(result, options, "bench-selective", write_selective_plot,
            uri and log_selective_to_mlflow, uri)
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


def data_main(args) -> int:
    """`bench data` (bench.data)."""
    import sys

    from core.errors import BatonError
    from bench.console import stdout_to_stderr
    from bench.data import markdown, report_lines, run_data_bench

    if args.rounds < 3 or args.rows < 100 or args.memory_gb <= 0 or args.memory_steps < 1 or args.stage_steps < 5:
        raise BatonError(f"bench data: --rounds {args.rounds} --rows {args.rows} --memory-gb {args.memory_gb} "
                         f"--memory-steps {args.memory_steps} --stage-steps {args.stage_steps}: expected at "
                         "least 3 rounds, 100 rows, a positive size, 1 memory step and 5 stage steps")
    with tempfile.TemporaryDirectory(prefix="baton-bench-data-", dir=args.dir) as work:
        with stdout_to_stderr():  # library chatter must not land between the lines
            result = run_data_bench(args.rows, args.rounds, args.memory_gb, args.memory_steps,
                                    args.stage_steps, Path(work), list(args.overrides),
                                    progress=lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(report_lines(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(result, "baton bench data " + " ".join(sys.argv[3:])))
    return 0
