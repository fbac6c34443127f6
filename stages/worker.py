"""The shared worker loop every stage runs: `python -m stages.worker LAUNCH.json` per rank.

Build (model, DeepSpeed engine, sampler), resume if asked, train with gradient
accumulation, evaluate, save complete checkpoints, and honour SIGTERM by saving at
the current micro-step. Objectives (what a batch and a loss are) live elsewhere.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from core import fingerprint
from core.config.compose import from_dict, training_config_hash
from core.repro import apply_in_process
from core.errors import BatonError
from ckpt import safe_load, signing
from ckpt.checkpointer import Checkpointer, SaveOptions, SavePayload, load_complete
from ckpt.layout import checkpoints_dir, resolve_resume, stage_dir
from ckpt.node_copies import NodeGroup
from ckpt.tiers.plan import PERSISTENT
from ckpt.parallel_layout import Layout
from ckpt.retention import KeepBest
from ckpt.state import RngState, TrainingProgress, derived_seed, seed_everything
from stages import grad_accum, run_files
from stages.engine_setup import build_engine, init_distributed
from stages.lifeline import worker_start
from stages.model import ensure_model_dir, model_files_digest, model_identity
from stages.data.examples import stage_examples
from stages.registry import objective_class
from stages.sampler import GlobalSampler
from stages.tasks import TRAIN, ArithmeticTasks
from stages.tier_saves import TierSaves
from stages.worker_output import report_error

log = logging.getLogger("baton.worker")


class Preemption:
    """SIGTERM sets a flag; ranks agree on it every micro-step so all stop together."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def agreed(self) -> bool:
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class StageWorker:
    def __init__(self, launch: dict):
        self.cfg = from_dict(launch["config"])
        self.launch = launch
        apply_in_process(self.cfg.repro)  # its variables came from the launcher (core.repro)
        # The built-in model if `baton stage` left it to the workers (stages.prepare): the
        # first rank to lock it makes it. Before the process group exists (save_pretrained
        # writes no weights on a rank other than 0) and before seeding (creation seeds).
        ensure_model_dir(self.cfg)
        self.rank, self.world = init_distributed(self.cfg.parallel)
        s = self.cfg.stage
        seed_everything(derived_seed(self.cfg.seed, s.name, self.rank))
        objective_cls = objective_class(s.name)
        model, self.tokenizer = objective_cls.build_model(launch["model_dir"])
        self.init_report = self._init_weights(model, objective_cls.new_head)
        self.identity = model_identity(model, self.tokenizer)
        self.model_files = model_files_digest(launch["model_dir"])
        tasks = ArithmeticTasks(self.cfg.seed, self.cfg.data.max_operand, self.cfg.data.heldout_fraction)
        data = stage_examples(launch.get("data_plan"), tasks, self.tokenizer, s)
        self.objective = objective_cls(s, self.tokenizer, tasks, data)
        self.objective.setup(launch["model_dir"])
        self.engine = build_engine(model, s, self.cfg.parallel)
        self.sampler = GlobalSampler(self.objective.dataset_size(TRAIN), s.global_batch,
                                     s.micro_batch, self.world, self.cfg.seed)
        self.accum = self.sampler.accumulation_steps
        self.objective.bind(self.cfg, self.sampler, self.cfg.run.dir)
        # `baton rl replay --to-step N` stops (and saves) at N without changing max_steps,
        # which the learning-rate schedule depends on.
        self.last_step = min(s.max_steps, self.cfg.rl.replay_to_step or s.max_steps)
        self.progress = TrainingProgress()
        self.layout = Layout.from_config(self.cfg, self.world)
        self.parallel = {**self.layout.to_dict(), "backend": dist.get_backend()}
        self.root = checkpoints_dir(self.cfg.run.dir, s.name)
        self.files = run_files.RunFiles(stage_dir(self.cfg.run.dir, s.name), self.rank == 0)
        self.files.environment(fingerprint.collect(self.cfg.repro.mode, training_config_hash(self.cfg)))
        p = self.cfg.parallel
        self.ckpt = Checkpointer(self.engine, self.root, s.name, self.parallel, s.keep_last,
                                 self.cfg.debug.crash_in_save_at_step,
                                 self.cfg.debug.fail_write_at_step,
                                 SaveOptions.from_config(self.cfg.ckpt),
                                 NodeGroup.gather(p.node_rank, p.nodes, self.world),
                                 KeepBest(s.keep_best, s.keep_best_metric, s.keep_best_mode)
                                 if s.keep_best else None)
        self.step_record: dict = {}  # the last finished step's metrics, saved with its checkpoint
        self.data_seconds = 0.0
        self.tier_saves = TierSaves(self.cfg)
        self.preemption = Preemption()
        self.window = grad_accum.Window()
        self.saved: list[dict] = []
        if self.init_report is not None:
            self.files.log(f"init_from {s.init_from}: new parameters (freshly initialised) "
                           f"{self.init_report['new']}, dropped {self.init_report['dropped']}")
        if s.init_from and (s.init_optimizer or s.init_scheduler or s.init_rng):
            from ckpt.carry import carry_from
            carried = carry_from(self.ckpt, s.init_from, optimizer=s.init_optimizer,
                                 scheduler=s.init_scheduler, rng=s.init_rng)
            self.files.log(f"inherited {', '.join(carried)} from {s.init_from}")

    def _init_weights(self, model, new_head: bool) -> dict | None:
        """Load stage.init_from into the model; report the parameters that are new (a head
        the checkpoint lacks) and the ones dropped (a head this model lacks)."""
        if not self.cfg.stage.init_from:
            return None
        from ckpt.weights import load_weights_into
        return load_weights_into(model, self.cfg.stage.init_from, allow_new_head=new_head)

    # -- one micro-step -------------------------------------------------------------
    def micro_step(self, micro: int) -> None:
        indices = self.sampler.micro_batch_indices(self.progress.step, micro, self.rank)
        self.objective.at_step(self.progress.step)
        started = time.perf_counter()
        batch = self.objective.batch(TRAIN, indices)
        self.data_seconds += time.perf_counter() - started
        loss = self.objective.loss(self.engine, batch)
        self.engine.backward(loss)
        self.engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        self.window.add(float(loss.detach()), self.objective.tokens_in(batch))

    def train(self) -> str:
        s = self.cfg.stage
        if s.eval_at_start and self.progress.step == 0 and self.progress.micro_in_window == 0:
            # The starting checkpoint's score, so a stage's gain is measured in one run.
            self.files.evaluation(0, self.objective.evaluate(self.engine.module), s.name)
        while self.progress.step < self.last_step:
            if self.progress.micro_in_window == 0:
                self.window.start(RngState.state_dict())
            for micro in range(self.progress.micro_in_window, self.accum):
                self.micro_step(micro)
                self.progress.micro_step += 1
                self.progress.micro_in_window = micro + 1
                if self.debug_preempt() or self.preemption.agreed():
                    if micro + 1 < self.accum:
                        self.save(mid_window=True)
                        return "preempted"
            self.finish_step()
            if self.preemption.agreed():
                if not self.just_saved():
                    self.save()
                return "preempted"
        return "completed"

    def finish_step(self) -> None:
        s, p = self.cfg.stage, self.progress
        self.stop_if_a_save_failed()
        self.log_committed()
        loss_sum, tokens = self.window.reduce(self.world)
        p.step += 1
        p.micro_in_window = 0
        p.tokens_seen += tokens
        p.samples_seen = p.step * s.global_batch
        self.sampler.advance_to_step(p.step)
        # data_seconds: this rank's time reading and collating its micro-batches this step.
        record = {"step": p.step, "loss": loss_sum / self.accum,
                  "lr": self.engine.get_lr()[0], "tokens": p.tokens_seen, "samples": p.samples_seen,
                  "data_seconds": round(self.data_seconds, 6)}
        self.data_seconds = 0.0
        record.update(self.objective.step_metrics())  # collective: every rank calls it
        if p.step % s.eval_every == 0 or p.step == s.max_steps:
            record.update(self.objective.evaluate(self.engine.module))
        self.files.step(record, s.name, s.max_steps)
        self.step_record = record
        due = self.tier_saves.due(p.step, final=p.step in (s.max_steps, self.last_step))
        if due:
            self.save(due=due)

    def debug_preempt(self) -> bool:
        """Fault injection: rank 0 signals the launcher (which forwards SIGTERM to every
        rank) and counts itself as signalled, so all ranks stop at this micro-step."""
        if self.rank == 0 and self.progress.micro_step == self.cfg.debug.preempt_at_micro_step:
            os.kill(os.getppid(), signal.SIGTERM)
            self.preemption.requested = True
        return False

    # -- checkpoints --------------------------------------------------------------------
    def save(self, mid_window: bool = False, due: list[str] | None = None) -> None:
        """`due`: the tiers this step goes to (stages.tier_saves); None: a final or
        preemption save, which always reaches the run directory."""
        due = due or self.tier_saves.due(self.progress.step, final=True)
        meta = self.files.meta(self.launch, self.identity, self.parallel, self.model_files)
        if not mid_window and self.step_record.get("step") == self.progress.step:
            meta["metrics"] = self.step_record  # what retention by metric ranks (ckpt.retention)
        payload = SavePayload(
            progress=self.progress.state_dict(), data=self.sampler.state_dict(), meta=meta,
            rng=RngState.state_dict(), objective=self.objective.state_dict(),
            extra={"tiers": due} if self.tier_saves.plan.enabled else {})
        if mid_window:
            payload.grad_record = self.window.record(self.progress)
            payload.grad_buffers = grad_accum.readable_buffers(self.engine, self.cfg.parallel.zero_stage)
        path = self.ckpt.save(self.progress.step, payload, self.tier_saves.destination(due))
        self.saved.append({"step": self.progress.step, "path": str(path),
                           "mid_accumulation": mid_window, "tiers": due})
        if not self.ckpt.asynchronous:
            self.files.log(f"saved checkpoint {path}")

    def just_saved(self) -> bool:
        """This very position is the last one saved (at the step boundary)."""
        last = self.saved[-1] if self.saved else None
        return (bool(last) and last["step"] == self.progress.step and not last["mid_accumulation"]
                and PERSISTENT in last["tiers"])

    def stop_if_a_save_failed(self) -> None:
        """Ranks agree at each step boundary on whether any background save failed, so
        all stop at the same step with the same error (`drain` waits for this rank's
        saver to learn the outcome every rank shares, then raises it)."""
        flag = torch.tensor([1 if self.ckpt.failed() else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            self.ckpt.drain()

    def log_committed(self) -> None:
        """One line per asynchronous save committed since the last call."""
        for done in self.ckpt.take_committed():
            self.files.log(f"saved checkpoint {done['path']} (training blocked "
                           f"{done['stall_s']:.3f} s; durable {done['durable_s']:.2f} s after the save began)")

    def finish_saves(self) -> None:
        """Drain the saves in flight (end of stage, preemption): what `latest` names is
        committed before the result is written and the launcher returns."""
        self.ckpt.close()
        self.log_committed()

    def saves_by_place(self) -> tuple[list[dict], list[dict]]:
        """(saves in the run directory, saves only in faster tiers), each with where its
        copies landed (rank 0 knows; other tiers' failures are recorded, not raised)."""
        placed = {done["path"]: done.get("tiers") or {} for done in self.ckpt.stats}
        saves = [{**save, "placement": placed.get(save["path"], {})} for save in self.saved]
        return ([save for save in saves if PERSISTENT in save["tiers"]],
                [save for save in saves if PERSISTENT not in save["tiers"]])

    def resume(self) -> None:
        path = resolve_resume(self.cfg.resume, self.root)
        if self.cfg.resume is not None and self.cfg.parallel.nodes > 1 and self.tier_saves.plan.enabled:
            from stages.tier_restore import agree_across_nodes
            agreed = agree_across_nodes(self.cfg, str(path) if path else None, self.rank, self.world)
            path = Path(agreed) if agreed else None
        if path is None:
            if self.cfg.resume == "latest":
                self.files.log(f"resume=latest: no checkpoint under {self.root} yet; starting at step 0")
            return
        state = load_complete(self.ckpt, path, self.cfg.stage.name, self.parallel,
                                         self.identity)
        self.progress.load_state_dict(state["progress"])
        self.sampler.load_state_dict(state["data"])
        self.engine.micro_steps = self.progress.micro_step
        if state["grad_record"] is not None:
            grad_accum.replay(self, state)
        if state["objective"] is not None:
            self.objective.load_state_dict(state["objective"])
        RngState.load_state_dict(state["rng"])
        self.files.log(f"resumed from {path} at step {self.progress.step}"
                       f" micro-step {self.progress.micro_step}")


@record
def main(launch_path: str) -> int:
    try:
        return run(launch_path)
    except BatonError as exc:
        # A problem the user can fix (a full disk, a damaged checkpoint): one message
        # to the launcher, no traceback. Anything else propagates to @record.
        report_error(exc)
        sys.exit(1)


def run(launch_path: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    launch = worker_start(launch_path)  # dies with its launcher; refuses another's launch file
    safe_load.install()  # every torch.load here, DeepSpeed's own included, is weights_only
    signing.configure((launch["config"].get("ckpt") or {}).get("signing_key_env"))
    worker = StageWorker(launch)
    t0 = time.time()
    worker.resume()
    # The imports, the model and the engine leave millions of long-lived objects, and a
    # full collection rescans them all (0.3-0.5 s here), stalling the training step and
    # the background saver together at unpredictable moments (often the first save).
    # Collect once now and exempt them from later collections.
    gc.collect()
    gc.freeze()
    status = worker.train()
    worker.finish_saves()
    in_run_dir, in_other_tiers = worker.saves_by_place()
    worker.files.result(status, worker.progress, in_run_dir, time.time() - t0,
                        init_from=worker.init_report, tier_checkpoints=in_other_tiers)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
