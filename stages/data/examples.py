"""Examples by index, for the objectives: your tokenized data or the built-in tasks.

Both answer the same three questions: how many rows a split has, a language-model row
(ids and labels, IGNORE where no loss is taken) and a preference pair. The order in
which rows are read is the sampler's (stages.sampler), so nothing here depends on the
world size. Your data is read from the Arrow copies stages.data.prepare wrote,
memory-mapped: a worker's memory does not grow with the dataset.
"""
from __future__ import annotations

import json

from stages.data.render import IGNORE, text_ids
from stages.tasks import HELDOUT, TRAIN, ArithmeticTasks

SPLIT_DIRS = {TRAIN: "train", HELDOUT: "eval"}


class FileExamples:
    def __init__(self, plan: dict):
        import datasets

        self.plan = plan
        self._rows = {split: datasets.load_from_disk(plan[name]["cache"])
                      for split, name in SPLIT_DIRS.items()}

    def size(self, split: str) -> int:
        return len(self._rows[split])

    def lm_example(self, split: str, index: int) -> tuple[list[int], list[int]]:
        """(ids, labels); of a preference pair, the chosen answer after the prompt the two
        answers share (what a handoff into RM judges a policy on)."""
        row = self._rows[split][index]
        if "input_ids" in row:
            return row["input_ids"], row["labels"]
        chosen, rejected = row["chosen_ids"], row["rejected_ids"]
        shared = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b),
                      min(len(chosen), len(rejected)))
        return chosen, [IGNORE] * shared + chosen[shared:]

    def lm_examples(self, split: str, indices: list[int]) -> list[tuple[list[int], list[int]]]:
        """`lm_example` of each index, read in one Arrow take: a row at a time costs
        `datasets` about as much per row as the whole batch does."""
        rows = self._rows[split][list(indices)]
        if "input_ids" in rows:
            return list(zip(rows["input_ids"], rows["labels"]))
        return [self.lm_example(split, index) for index in indices]

    def preference(self, split: str, index: int) -> tuple[list[int], list[int]]:
        row = self._rows[split][index]
        return row["chosen_ids"], row["rejected_ids"]

    def prompt(self, split: str, index: int) -> tuple[list[int], object, dict]:
        """An RL prompt: (ids, ground truth, the row's other columns) as the reward
        functions receive them."""
        row = self._rows[split][index]
        return row["prompt_ids"], json.loads(row["answer_json"]), json.loads(row["extra_json"])


class BuiltinExamples:
    """The synthetic arithmetic tasks, tokenized as each stage trains on them (with any
    model's tokenizer: BOS and EOS only where it has them)."""

    def __init__(self, tasks: ArithmeticTasks, tokenizer, stage: str, seq_len: int):
        self.tasks, self.tok, self.stage, self.seq_len = tasks, tokenizer, stage, seq_len

    def size(self, split: str) -> int:
        return self.tasks.size(split)

    def lm_example(self, split: str, index: int) -> tuple[list[int], list[int]]:
        if self.stage == "cpt":  # packed lines of solved problems, loss on every token
            text = self.tasks.corpus_text(split, index, min_chars=self.seq_len)
            ids = text_ids(self.tok, text, bos=True, eos=False)[: self.seq_len]
            return ids, list(ids)
        prompt, answer = self.tasks.sft_example(split, index)  # loss on the answer only
        p_ids = text_ids(self.tok, prompt, bos=True, eos=False)
        a_ids = text_ids(self.tok, answer, bos=False, eos=True)
        return (p_ids + a_ids)[: self.seq_len], ([IGNORE] * len(p_ids) + a_ids)[: self.seq_len]

    def lm_examples(self, split: str, indices: list[int]) -> list[tuple[list[int], list[int]]]:
        return [self.lm_example(split, index) for index in indices]

    def preference(self, split: str, index: int) -> tuple[list[int], list[int]]:
        prompt, good, bad = self.tasks.preference_pair(split, index)
        head = text_ids(self.tok, prompt, bos=True, eos=False)

        def ids(answer: str) -> list[int]:
            return (head + text_ids(self.tok, answer, bos=False, eos=True))[: self.seq_len]
        return ids(good), ids(bad)


def stage_examples(plan: dict | None, tasks: ArithmeticTasks, tokenizer, stage_cfg):
    """The examples a stage trains on: the launch's data plan, else the built-in tasks."""
    if plan is not None:
        return FileExamples(plan)
    return BuiltinExamples(tasks, tokenizer, stage_cfg.name, stage_cfg.seq_len)
