"""The trainer's side of each RL step: obtain the step's groups (journal or roles) on
rank 0 and broadcast them; after the update, commit the step's journal segment, or, for
a step re-applied from the journal, check that the trainer computed exactly what the
journal says it computed the first time.

The journal lives in `<run.dir>/rl/journal/`, one segment per optimizer step
(`step-N` = the update that produced checkpoint step-N, from policy version N-1). RL
checkpoints store the cursor (the last step whose segment is committed), and `baton ckpt
verify` checks the journal beside them from its first segment up to that cursor.
"""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from ckpt import journal
from ckpt.layout import stage_dir
from core.errors import BatonError
from stages.rl.cluster import ENV_ATTEMPT, ENV_DIED_AT
from stages.rl.groups import segment_of, staleness_counts, trained_of
from stages.rl.source import StepSource

JOURNAL_DIR = "journal"
CURSOR = "cursor"


class ReplayDiverged(BatonError):
    def __init__(self, root, step: int, prompt_index: int, field: str):
        self.step, self.prompt_index, self.field = step, prompt_index, field
        super().__init__(
            f"{journal.segment_dir(root, step)}: re-applying step {step} gave a different "
            f"{field} for prompt {prompt_index} than the journal recorded: the run is not "
            "deterministic here (a different machine, library or thread count?). Training "
            "stopped at this step rather than continue from a state the journal does not "
            "describe; compare environments (meta.json of the checkpoints) and re-run there")


class JournalMismatch(BatonError):
    def __init__(self, root, step: int, found: list[int], expected: list[int]):
        super().__init__(
            f"{journal.segment_dir(root, step)} holds prompts {found[:6]}…, this run's sampler "
            f"draws {expected[:6]}… for step {step}: the journal belongs to a run with another "
            "seed or batch size. Replay with the original run's config (its checkpoints' "
            "meta.json), or point rl.replay_journal at that run's journal")


def journal_root(run_dir) -> os.PathLike:
    return stage_dir(run_dir, "rl") / JOURNAL_DIR


def policy_state(module) -> dict:
    return {name: tensor.detach() for name, tensor in module.state_dict().items()}


class RlSteps:
    def __init__(self, cfg, sampler, run_dir, objective):
        self.cfg, self.sampler = cfg, sampler
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.root = journal_root(run_dir)
        self.source = StepSource(cfg, self.root, objective.stop_ids(), objective.prompt_ids)
        self.attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
        self.ready_step: int | None = None
        self.groups: dict = {}
        self.trained: dict = {}
        self.journaled: tuple | None = None
        self.journaled_root = None
        self.events: list = []
        self.cursor = 0
        self.started_at: int | None = None
        self.caught_up: list[int] = []
        self.restart_reported = False
        self.resumed_after_s: float | None = None

    # -- before the update ---------------------------------------------------------------
    def step_indices(self, step: int) -> list[int]:
        """Every prompt of the step, in the order micro-batches and ranks consume them."""
        return [i for micro in range(self.sampler.accumulation_steps) for rank in range(self.world)
                for i in self.sampler.micro_batch_indices(step, micro, rank)]

    def groups_for(self, step: int, module) -> dict:
        """prompt index -> Group for `step`; obtained once per step (a collective)."""
        if self.ready_step == step:
            return self.groups
        payload = [self._obtain(step, module) if self.rank == 0 else None]
        if dist.is_initialized() and self.world > 1:
            dist.broadcast_object_list(payload, src=0)
        self.groups = {g.prompt_index: g for g in payload[0]}
        self.ready_step, self.trained = step, {}
        if self.started_at is None:
            self.started_at = step
        return self.groups

    def _obtain(self, step: int, module) -> list:
        self.events, self.journaled = [], None
        root = self.source.journaled(step)
        expected = self.step_indices(step)
        if root is not None:
            groups, records, tensors = self.source.from_journal(root, step)
            found = [p["prompt_index"] for p in records["prompts"]]
            if found != expected:
                raise JournalMismatch(root, step + 1, found, expected)
            self.journaled, self.journaled_root = (records, tensors), root
            self.caught_up.append(step + 1)
            return groups
        if self.attempt > 0 and self.resumed_after_s is None and os.environ.get(ENV_DIED_AT):
            # Trainer death -> relaunch, resume, catch-up done: the first new step starts now.
            self.resumed_after_s = round(time.time() - float(os.environ[ENV_DIED_AT]), 3)
        return self.source.from_roles(step, self.step_indices, lambda: policy_state(module), self.events)

    def record_trained(self, prompt_index: int, trained: dict) -> None:
        self.trained[prompt_index] = trained

    def maybe_kill_trainer(self, step: int) -> None:
        """rl.faults.kill_trainer_at_step: SIGKILL rank 0 mid-step (first attempt only)."""
        if (self.rank == 0 and self.cfg.rl.faults.kill_trainer_at_step == step
                and self.attempt == 0):
            os.kill(os.getpid(), signal.SIGKILL)

    # -- after the update ----------------------------------------------------------------
    def finish_step(self, step: int, kl_coef: float, mismatch: dict) -> None:
        """`mismatch`: the step's rollout/trainer mismatch over every rank, as the journal
        keeps it (stages.rl.mismatch.journal_record)."""
        gathered = [None] * self.world if self.rank == 0 else None
        if dist.is_initialized() and self.world > 1:
            dist.gather_object(self.trained, gathered, dst=0)
        else:
            gathered = [self.trained]
        if self.rank == 0:
            merged = {k: v for part in gathered for k, v in part.items()}
            if self.journaled is not None:
                self._check_reapplied(step + 1, merged)
            else:
                self._commit(step, kl_coef, merged, mismatch)
        self.cursor, self.ready_step = step + 1, None

    def _commit(self, step: int, kl_coef: float, trained: dict, mismatch: dict) -> None:
        events = list(self.events)
        if self.attempt > 0 and not self.restart_reported:
            events.insert(0, {"kind": "trainer_restart", "role": "trainer", "attempt": self.attempt,
                              "resumed_at_step": self.started_at, "caught_up": self.caught_up,
                              "seconds": self.resumed_after_s})
            self.restart_reported = True
        order = [self.groups[i] for i in self.step_indices(step)]
        s = self.cfg.stage
        records, tensors = segment_of(step + 1, kl_coef, order, trained, events,
                                      (s.reward_checker_weight, s.reward_model_weight))
        records["trainer"] = {"attempt": self.attempt, "world_size": self.world}
        records["mismatch"] = mismatch
        records["staleness"] = staleness_counts(step, order)
        journal.write_segment(self.root, step + 1, records, tensors)

    def _check_reapplied(self, step: int, trained: dict) -> None:
        recorded = trained_of(*self.journaled)  # dropped groups were not trained on, then or now
        if sorted(recorded) != sorted(trained):
            raise ReplayDiverged(self.journaled_root, step, min(set(recorded) ^ set(trained)), "set of trained groups")
        for prompt_index, values in recorded.items():
            for field, tensor in values.items():
                if not torch.equal(tensor, trained[prompt_index][field].to(tensor.dtype)):
                    raise ReplayDiverged(self.journaled_root, step, prompt_index, field)

    # -- checkpointed state --------------------------------------------------------------
    def journal_state(self) -> dict:
        """The cursor: the last step whose segment is committed (or re-applied). Nothing
        about where the journal starts: a run resumed from another run's checkpoint has a
        journal that starts later, and its checkpoints must still equal the original's."""
        return {CURSOR: self.cursor}

    def load_journal_state(self, state: dict | None) -> None:
        self.cursor = int(state[CURSOR]) if state else 0


def verify_checkpoint_journal(path, manifest) -> tuple[list[int], str]:
    """`baton ckpt verify` of an RL checkpoint: the journal beside its checkpoints must hold
    every segment from its first up to the checkpoint's cursor, intact. Returns (steps
    checked, what was checked in words); JournalDamaged names the first problem."""
    from pathlib import Path

    from ckpt.state_files import OBJECTIVE
    from ckpt.reader import CheckpointReader

    if OBJECTIVE not in manifest.files:
        return [], "no RL state"
    state = CheckpointReader(path, manifest).json(OBJECTIVE).get("journal")
    if not state or not state.get(CURSOR):
        return [], "no journal cursor (written before the journal existed)"
    root = Path(path).resolve().parents[1] / JOURNAL_DIR
    committed = journal.committed_steps(root)
    if not committed:
        raise journal.JournalDamaged(root, f"the journal is missing or empty; the checkpoint's "
                                     f"cursor is step {state[CURSOR]}")
    # From the journal's first segment: a run resumed from another run's checkpoint at
    # step c journals c+1 onwards, and the steps before are in that other run's journal.
    first = min(committed[0], state[CURSOR])
    steps = journal.verify(root, first, state[CURSOR])
    return steps, f"journal {root} steps {first}..{state[CURSOR]} intact"
