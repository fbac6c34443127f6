"""`baton report RUN_DIR [--pipeline N] [--out FILE] [overrides]`: a pipeline run's results
(handoffs, RL held-out evaluation, final checkpoints' content digests, the environment)
as markdown, generated from the lineage store and the stages' metrics files."""
from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="the pipeline's run.dir (e.g. runs/default)")
    parser.add_argument("--pipeline", type=int, help="pipeline run id (default: the latest)")
    parser.add_argument("--out", help="also write the markdown to this file")


def main(args) -> int:
    from core.config import compose
    from core.config.compose import quoted
    from core.errors import BatonError
    from lineage.report import pipeline_report
    from lineage.store import LineageStore
    from lineage.urls import store_url

    if not Path(args.run_dir).is_dir():
        raise BatonError(f"run directory {args.run_dir!r} is not a directory; expected the "
                         "run.dir of a pipeline (`baton run run.dir=DIR`), e.g. runs/default")
    cfg = compose([quoted("run.dir", args.run_dir), *args.overrides])
    with LineageStore.open(store_url(cfg), create=False) as store:
        pipeline = (store.pipeline_run(args.pipeline) if args.pipeline is not None
                    else store.latest_pipeline_run())
        if pipeline is None:
            raise BatonError(f"no pipeline run is recorded in {args.run_dir}'s lineage "
                             "store; run `baton run run.dir=...` first")
        text = pipeline_report(store, pipeline)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0
