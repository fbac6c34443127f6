"""The trainer's side of the roles (rank 0): weight syncs, rollout and reward requests,
and recovery of a role that died, without rewinding anything else.

A request lost with its actor is re-issued unchanged (same per-sample seeds, same policy
version) once the actor is back: Ray restarts it, `sync` re-loads the current version
(the call waits for the restart), and the samples come out the same as if it had never
died. Every failure and retry is returned as an event for the step's journal segment.
"""
from __future__ import annotations

import contextlib
import random
import time
from dataclasses import replace

import numpy as np

from core.errors import BatonError
from stages.rl.actors import REWARD, rollout_actor_name
from stages.rl.engine import RolloutRequest, weights_digest
from stages.rl.environment import ENVIRONMENT


RESTART_DEADLINE_S, RESTART_POLL_S = 300, 0.1


class RoleGaveUp(BatonError):
    def __init__(self, role: str, step: int, attempts: int, error: str):
        self.role, self.step = role, step
        super().__init__(
            f"RL role {role} failed {attempts} times at step {step} (last: {error}); the step "
            "cannot complete. Nothing after the last checkpoint is lost: the journal holds every "
            "committed step. See the actor's log under the Ray session directory, raise "
            "rl.role_retries, or resume the stage (resume=latest) once the cause is fixed")


def _role_errors():
    from ray.exceptions import ActorUnavailableError, RayActorError
    return (RayActorError, ActorUnavailableError)


@contextlib.contextmanager
def global_rng_untouched():
    """Ray's client code draws from Python's global `random` (ids, backoff jitter). The
    trainer checkpoints that state, and a trainer re-applying steps from the journal makes
    no Ray calls for them: without this, its RNG state would differ from an uninterrupted
    run's. Role traffic must leave no trace in the trainer's random state."""
    python, numpy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


class RoleClient:
    """Rollout *slots* (prompt j of a step goes to slot j mod n) served by actors; a warm
    spare (`rl.rollout.spares`, imported and built but holding no weights) takes over a
    slot whose actor died, so the step waits for one weight sync, not for a process
    restart. Ray restarts the dead actor meanwhile, and it becomes the next spare."""

    def __init__(self, ray, rollout_actors: int, spares: int, retries: int, environment: bool = False):
        self.ray, self.retries = ray, retries
        names = [rollout_actor_name(i) for i in range(rollout_actors + spares)]
        self.actors = {name: ray.get_actor(name) for name in names}
        self.slots, self.spares = names[:rollout_actors], names[rollout_actors:]
        self.synced: dict[str, tuple[int, int]] = {}
        """actor -> (policy version, pid) of the incarnation last synced."""
        self.reward = ray.get_actor(REWARD)
        self.environment = ray.get_actor(ENVIRONMENT) if environment else None
        self.version: int | None = None
        self.digest: str | None = None
        self._weights_ref = None

    # -- weight sync -----------------------------------------------------------------
    def sync_weights(self, version: int, state: dict, events: list) -> None:
        """Policy `version` to every serving actor through the object store (one put)."""
        self.version, self.digest = version, weights_digest(state)
        self._weights_ref = self.ray.put(state)
        started = time.perf_counter()
        for name in self.slots:
            self._sync(name, events)
        events.append({"kind": "weight_sync", "version": version, "digest": self.digest,
                       "actors": list(self.slots), "seconds": round(time.perf_counter() - started, 4)})

    def _sync(self, name: str, events: list) -> None:
        actor = self.actors[name]
        reply = self._call(actor, lambda: actor.sync.remote(self.version, self._weights_ref, self.digest),
                           name, self.version, events)
        self.synced[name] = (self.version, reply["pid"])

    def _serving(self, slot: int, events: list) -> str:
        """The actor serving `slot`, synced to the current version (a spare that just took
        over, or a restarted actor, is synced here: `weight_resync`)."""
        name = self.slots[slot]
        if self.synced.get(name, (None, None))[0] != self.version:
            self._sync(name, events)
            events.append({"kind": "weight_resync", "role": name, "version": self.version,
                           "digest": self.digest})
        return name

    def _fail_over(self, slot: int, dead: str, sent_to, events: list) -> None:
        """`sent_to`: the (version, pid) synced when the failed request was sent; if `dead`
        was re-synced since (a restarted incarnation), this failure is an old one."""
        if self.synced.get(dead) == sent_to:
            self.synced.pop(dead, None)
        if self.slots[slot] != dead or not self.spares:
            return  # already replaced, or no spare: Ray's restart of `dead` is awaited
        spare = self.spares.pop(0)
        self.slots[slot] = spare
        self.spares.append(dead)  # once Ray has restarted it
        events.append({"kind": "failover", "role": dead, "to": spare, "slot": slot})

    # -- requests ------------------------------------------------------------------------
    def submit_rollouts(self, requests: list[RolloutRequest]) -> list:
        """Send a step's requests (prompt j to slot j mod n); `collect_rollouts` waits for
        them, now or, with rl.max_staleness, some steps later. An actor runs its calls in
        the order they were sent, so each request meets the weights synced before it."""
        pending = []
        for j, request in enumerate(requests):
            slot = j % len(self.slots)
            name = self.slots[slot]
            pending.append((slot, name, self.synced.get(name), request,
                            self.actors[name].generate.remote(request)))
        return pending

    def collect_rollouts(self, pending: list, events: list) -> dict:
        """prompt index -> RolloutResult of requests sent by `submit_rollouts`."""
        return {request.prompt_index: self._generate(slot, name, sent_to, request, ref, events)
                for slot, name, sent_to, request, ref in pending}

    def _generate(self, slot: int, name: str, sent_to, request, ref, events: list):
        """The request's result; when its actor died, fail the slot over (or await the
        restart), sync, and re-issue it unchanged (same seeds, same policy version).
        `sent_to`: the incarnation (version, pid) the request was sent to."""
        detail = {"prompt_index": request.prompt_index, "seeds": request.seeds}
        failed_at, first_dead = None, None
        for attempt in range(self.retries + 1):
            try:
                value = self.ray.get(ref)
                if failed_at is not None:  # the time this failure cost the request
                    events.append({"kind": "recovered", "role": first_dead, "served_by": name,
                                   "step": request.step,
                                   "seconds": round(time.perf_counter() - failed_at, 4), **detail})
                return value
            except _role_errors() as exc:
                failed_at, first_dead = failed_at or time.perf_counter(), first_dead or name
                events.append({"kind": "role_failure", "role": name, "step": request.step,
                               "attempt": attempt + 1, "error": type(exc).__name__, **detail})
                if attempt == self.retries:
                    raise RoleGaveUp(name, request.step, attempt + 1, type(exc).__name__) from None
                self._fail_over(slot, name, sent_to, events)
                name = self._serving(slot, events)
                sent_to = self.synced.get(name)
                if request.policy_version != self.version:
                    # A stale request (rl.max_staleness): its version's weights are gone, so
                    # it is generated again from the current ones, and says so.
                    events.append({"kind": "stale_reissue", "role": name, "step": request.step,
                                   "from_version": request.policy_version, "to_version": self.version})
                    request = replace(request, policy_version=self.version)
                ref = self.actors[name].generate.remote(request)
                events.append({"kind": "retry", "role": name, "step": request.step,
                               "attempt": attempt + 2, **detail})
        raise AssertionError("unreachable")

    def rewards(self, step: int, items: list[tuple[int, list[int], object, object]],
                events: list) -> dict:
        """prompt index -> {"checker", "rm"} for (prompt index, prompt ids, tokens, mask)."""
        refs = {p: self.reward.score.remote(step, p, ids, tokens, mask)
                for p, ids, tokens, mask in items}
        return {p: self._call(self.reward, lambda p=p, ids=ids, t=tokens, m=mask: self.reward.score.remote(step, p, ids, t, m),
                              REWARD, step, events, first=refs[p], detail={"prompt_index": p})
                for p, ids, tokens, mask in items}

    def run_programs(self, step: int, items: list[tuple[int, object, object]], events: list) -> dict:
        """prompt index -> the environment role's result (stages.rl.environment) for
        (prompt index, tokens, mask); the role dying is recovered like the reward actor."""
        env = self.environment
        refs = {p: env.run.remote(step, p, tokens, mask) for p, tokens, mask in items}
        return {p: self._call(env, lambda p=p, t=tokens, m=mask: env.run.remote(step, p, t, m),
                              ENVIRONMENT, step, events, first=refs[p], detail={"prompt_index": p})
                for p, tokens, mask in items}

    def _call(self, actor, submit, role: str, step: int, events: list, *, first=None,
              detail: dict | None = None):
        """ray.get the call; when the actor died, record it, wait for Ray's restart of it,
        and re-issue the same request (the reward actor; syncs of a rollout actor)."""
        ref = first if first is not None else submit()
        failed_at = None
        for attempt in range(self.retries + 1):
            try:
                value = self.ray.get(ref)
                if failed_at is not None:  # the time this role's failure cost the step
                    events.append({"kind": "recovered", "role": role, "step": step,
                                   "seconds": round(time.perf_counter() - failed_at, 4),
                                   **(detail or {})})
                return value
            except _role_errors() as exc:
                failed_at = failed_at or time.perf_counter()
                events.append({"kind": "role_failure", "role": role, "step": step,
                               "attempt": attempt + 1, "error": type(exc).__name__,
                               **(detail or {})})
                if attempt == self.retries:
                    raise RoleGaveUp(role, step, attempt + 1, type(exc).__name__) from None
                self._await_restart(actor, role, step)
                ref = submit()
                events.append({"kind": "retry", "role": role, "step": step,
                               "attempt": attempt + 2, **(detail or {})})
        raise AssertionError("unreachable")

    def _await_restart(self, actor, role: str, step: int) -> None:
        """Until Ray has the actor back (its `__init__` done). Ray offers no event for an
        actor's restart, and a call made meanwhile fails at once with
        ActorUnavailableError, so ask `ready` with a short pause, within a deadline."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline = time.monotonic() + RESTART_DEADLINE_S
        while True:
            try:
                self.ray.get(actor.ready.remote())
                return
            except (ActorUnavailableError, RayActorError) as exc:
                if time.monotonic() > deadline:
                    raise RoleGaveUp(role, step, 1, f"not back {RESTART_DEADLINE_S} s after "
                                     f"it died ({type(exc).__name__})") from None
                time.sleep(RESTART_POLL_S)
