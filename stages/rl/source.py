"""Where a step's rollouts come from (trainer rank 0): the journal when the step is
committed there, else the roles.

- A step already in this run's journal (a trainer restarted from an earlier checkpoint)
  is re-applied from its segment: no weight sync, no rollout, no reward call.
- Replay (`rl.replay_journal`) takes every step from that journal and starts no roles;
  a step the journal lacks is an error, never a silent regeneration.
- Otherwise rank 0 syncs the current policy to the rollout actors as version `step`,
  asks for every prompt's group and scores them.
"""
from __future__ import annotations

from pathlib import Path

from ckpt import journal
from core.errors import BatonError
from stages.rl.engine import RolloutRequest
from stages.rl.env_records import apply_environment, apply_reward_failures, step_alert
from stages.rl.groups import Group, group_from, groups_of
from stages.rl.environment import PROGRAM
from stages.sampling import TRAIN_STREAM, seeded_generator


class JournalIncomplete(BatonError):
    def __init__(self, root: Path, step: int, committed: list[int]):
        self.root, self.step = root, step
        span = f"{committed[0]}..{committed[-1]}" if committed else "none"
        super().__init__(
            f"{root}: replay needs journal segment {journal.segment_name(step)} and the journal "
            f"has no such step (committed steps: {span}). Nothing was replayed past step "
            f"{step - 1}; replay to a step the original run journaled (--to-step <= "
            f"{committed[-1] if committed else 0}), or from a checkpoint of that run")


def sample_seeds(seed: int, step: int, prompt_index: int, group_size: int) -> list[int]:
    """Per-request seeds keyed by (run seed, step, prompt, sample) only."""
    return [int(seeded_generator(seed, TRAIN_STREAM, step, prompt_index, sample).initial_seed())
            for sample in range(group_size)]


class StepSource:
    def __init__(self, cfg, journal_root: Path, stop_ids: tuple[int, ...], prompt_ids_of):
        self.cfg, self.stage = cfg, cfg.stage
        self.replay_root = Path(cfg.rl.replay_journal) if cfg.rl.replay_journal else None
        self.journal_root = journal_root
        self.stop_ids, self.prompt_ids_of = stop_ids, prompt_ids_of
        self.client = None
        self.pending: dict[int, list] = {}
        """step -> its rollout requests, sent ahead (rl.max_staleness), not yet collected."""

    def _roles(self):
        if self.client is None:
            from stages.rl.client import RoleClient
            from stages.rl.cluster import join_from_env

            ray = join_from_env()
            if ray is None:
                raise BatonError("the RL trainer was started without its roles (no Ray address "
                                 "from the launcher); run RL through `baton stage rl` or `baton run`")
            self.client = RoleClient(ray, self.cfg.rl.rollout.actors, self.cfg.rl.rollout.spares,
                                     self.cfg.rl.role_retries, self.cfg.rl.env.task == PROGRAM)
        return self.client

    def journaled(self, step: int) -> Path | None:
        """The journal that holds segment step+1 (the update made at 0-based `step`)."""
        if self.replay_root is not None:
            return self.replay_root
        if journal.is_committed(self.journal_root, step + 1):
            return self.journal_root
        return None

    def from_journal(self, root: Path, step: int) -> tuple[list[Group], dict, dict]:
        if not journal.is_committed(root, step + 1):
            raise JournalIncomplete(root, step + 1, journal.committed_steps(root))
        records, tensors = journal.read_segment(root, step + 1)  # checksums before parsing
        return groups_of(records, tensors), records, tensors

    def from_roles(self, step: int, indices_of, policy_state, events: list) -> list[Group]:
        """`indices_of(step)`: the prompts of a step, in order (for this and later steps)."""
        from stages.rl.client import global_rng_untouched

        state = policy_state()
        with global_rng_untouched():  # joining Ray and every call to the roles
            return self._from_roles(step, indices_of, state, events)

    def _requests(self, step: int, indices: list[int], version: int) -> list[RolloutRequest]:
        s = self.stage
        return [RolloutRequest(step, index, self.prompt_ids_of(index),
                               sample_seeds(self.cfg.seed, step, index, s.group_size),
                               version, s.max_new_tokens, s.temperature, self.cfg.rl.batch_invariant)
                for index in indices]

    def _from_roles(self, step: int, indices_of, state: dict, events: list) -> list[Group]:
        client = self._roles()
        client.sync_weights(step, state, events)
        # Policy version `step` is now on the actors: the requests of this step and of up to
        # max_staleness later ones that are not out yet go with it (rollouts generate while
        # the trainer updates); this step's were sent up to max_staleness versions ago.
        last = min(step + self.cfg.rl.max_staleness, self.stage.max_steps - 1)
        for ahead in range(step, max(last, step) + 1):
            if ahead not in self.pending:
                self.pending[ahead] = client.submit_rollouts(self._requests(ahead, indices_of(ahead), step))
        requests = [request for _, _, _, request, _ in self.pending[step]]
        results = client.collect_rollouts(self.pending.pop(step), events)
        groups = [group_from(results[r.prompt_index], r, {"checker": None, "rm": None}, self.stop_ids)
                  for r in requests]
        scores = client.rewards(step, [(g.prompt_index, g.prompt_ids, g.tokens, g.mask)
                                       for g in groups], events)
        for g in groups:
            g.checker, g.rm = scores[g.prompt_index]["checker"], scores[g.prompt_index]["rm"]
            apply_reward_failures(g, scores[g.prompt_index], step, events)
        if self.cfg.rl.env.task == PROGRAM:  # the checker's part comes from running the programs
            ran = client.run_programs(step, [(g.prompt_index, g.tokens, g.mask) for g in groups], events)
            for g in groups:
                apply_environment(g, ran[g.prompt_index], step, events)
            step_alert(groups, step, self.cfg.rl.env.alert_rate, events)
        return groups
