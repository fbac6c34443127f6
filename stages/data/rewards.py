"""Your reward functions: loaded from a file or a module, checked before any worker
starts, and called per sample with a time limit.

The shape is verl's `custom_reward_function` (a file `path` and a function `name`, or a
dotted `module: pkg.mod:fn`): `fn(data_source, solution_str, ground_truth, extra_info)`
returns a number. Several functions are summed with their weights. A function that
raises, runs past `rl.reward.timeout_s` or returns something that is not a number is an
environment failure: the sample is never scored with it; it is retried, then its group
is dropped from the step, and every attempt is recorded (stages.rl.env_records).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

SIGNATURE = "fn(data_source, solution_str, ground_truth, extra_info)"
CHECKED_ROWS = 3
"""Rows of the train data each function is tried on before any worker starts."""


@dataclass
class RewardFunction:
    label: str
    """How the config named it: path::name or module:fn."""
    fn: object
    weight: float


class RewardFailure(Exception):
    """One call of a reward function failed (raised, timed out, returned a non-number)."""


def load_reward_functions(reward_cfg) -> list[RewardFunction]:
    """Import every configured function and check its signature; refuse by name."""
    found, problems = [], []
    for i, spec in enumerate(reward_cfg.functions):
        key = f"rl.reward.functions[{i}]"
        try:
            label, fn = _import(key, spec)
            _check_signature(key, label, fn)
        except ConfigError as exc:
            problems += exc.problems
            continue
        found.append(RewardFunction(label, fn, float(spec.weight)))
    if problems:
        raise ConfigError(problems)
    return found


def _import(key: str, spec) -> tuple[str, object]:
    if spec.module:
        module_name, _, attr = str(spec.module).partition(":")
        label = str(spec.module)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, or the module's own code failing
            raise ConfigError([f"{key}.module={label!r}: cannot import {module_name} "
                               f"({type(exc).__name__}: {exc}); expected an importable 'pkg.module:function'"]) from None
        attr = attr or spec.name
    elif spec.path:
        path = Path(spec.path).expanduser().resolve()
        label, attr = f"{path}::{spec.name}", spec.name
        if not path.is_file():
            raise ConfigError([f"{key}.path={str(spec.path)!r}: no such file; expected a Python file "
                               f"defining {spec.name}"])
        try:
            loader = importlib.util.spec_from_file_location(f"baton_reward_{abs(hash(str(path)))}", path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[loader.name] = module  # dataclasses and pickling look modules up by name
            loader.loader.exec_module(module)
        except Exception as exc:  # a syntax error or the file's own code failing on import
            raise ConfigError([f"{key}.path={str(spec.path)!r}: importing it failed ({type(exc).__name__}: "
                               f"{exc}); fix the file so that `python {path}` runs"]) from None
    else:
        raise ConfigError([f"{key}: names neither a path (a Python file, with name=<function>) "
                           "nor a module ('pkg.module:function')"])
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError([f"{key}: {label} has no function {attr!r}"
                           + (f" (it holds a {type(fn).__name__})" if fn is not None else "")
                           + f"; expected def {attr}(data_source, solution_str, ground_truth, extra_info)"])
    return label, fn


def _check_signature(key: str, label: str, fn) -> None:
    try:
        inspect.signature(fn).bind(data_source="", solution_str="", ground_truth="", extra_info={})
    except TypeError as exc:
        raise ConfigError([f"{key}: {label} has the signature {inspect.signature(fn)}, which cannot take "
                           f"{SIGNATURE} ({exc}); expected verl's reward shape, "
                           "e.g. def compute_score(data_source, solution_str, ground_truth, extra_info=None)"]) from None
    except ValueError:  # a builtin without a signature: called and judged by its result
        return


class RewardScorer:
    """Calls the functions for one sample; sums weighted results; time-limited."""

    def __init__(self, functions: list[RewardFunction], timeout_s: float, data_source: str):
        self.functions, self.timeout_s, self.data_source = functions, timeout_s, data_source

    def score(self, completion: str, answer, extra: dict) -> float:
        """The weighted sum, or RewardFailure naming the function and what went wrong.
        `data_source` is the row's own column of that name (verl's datasets carry one),
        else the dataset's path."""
        source = extra.get("data_source", self.data_source)
        return sum(f.weight * self._call(f, source, completion, answer, extra) for f in self.functions)

    def _call(self, f: RewardFunction, source, completion: str, answer, extra: dict) -> float:
        # A thread, not a process: the function may hold state (a loaded verifier). A call
        # past the limit is abandoned (its thread is a daemon) and the sample is not scored.
        outcome: dict = {}

        def run():
            try:
                outcome["value"] = f.fn(data_source=source, solution_str=completion,
                                        ground_truth=answer, extra_info=extra)
            except BaseException as exc:  # whatever the user's code raises is its failure
                outcome["error"] = exc
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise RewardFailure(f"{f.label} ran past rl.reward.timeout_s={self.timeout_s:g} s")
        if "error" in outcome:
            exc = outcome["error"]
            raise RewardFailure(f"{f.label} raised {type(exc).__name__}: {exc}")
        value = outcome.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RewardFailure(f"{f.label} returned {value!r}; expected a finite number")
        return float(value)


def scorer_for(cfg, plan: dict) -> RewardScorer:
    return RewardScorer(load_reward_functions(cfg.rl.reward), cfg.rl.reward.timeout_s,
                        str(plan["train"]["path"]))


def check_rl_reward(cfg, plan: dict) -> None:
    """Before any worker: RL on your prompts has a reward, and each function imports, takes
    verl's arguments and returns a number on the first rows."""
    from stages.data.examples import FileExamples
    from stages.tasks import TRAIN

    if not cfg.rl.reward.functions and cfg.stage.reward_model_weight <= 0:
        raise ConfigError(["data.rl.train.path is set but nothing scores the completions: add "
                           "rl.reward.functions (a file and function name, verl's shape) and/or "
                           "a reward model (stage.reward_model_from with rl.reward.rm_weight > 0)"])
    if cfg.rl.reward.functions:
        check_on_rows(scorer_for(cfg, plan), FileExamples(plan), TRAIN)


def check_on_rows(scorer: RewardScorer, examples, split: str) -> None:
    """Call every function on the first rows, with the ground truth as the completion:
    a function that fails there would fail every sample."""
    for index in range(min(CHECKED_ROWS, examples.size(split))):
        _, answer, extra = examples.prompt(split, index)
        try:
            scorer.score(str(answer), answer, extra)
        except RewardFailure as exc:
            raise ConfigError([f"rl.reward.functions: on row {index + 1} of the RL train data "
                               f"(solution_str = its ground truth {str(answer)[:40]!r}), {exc}; fix "
                               f"the function so that it returns a number for every row"]) from None
