"""Examples by index, for the objectives: your tokenized data or the built-in tasks.

Both answer the same three questions: how many rows a split has, a language-model row
(ids and labels, IGNORE where no loss is taken) and a preference pair. The order in
which rows are read is the sampler's (stages.sampler), so nothing here depends on the
world size. Your data is read from the Arrow copies stages.data.prepare wrote,
memory-mapped: a worker's memory does not grow with the dataset.
"""
from __future__ import annotations

from stages.data.render import IGNORE
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
        row = self._rows[split][index]
        return row["input_ids"], row["labels"]

    def preference(self, split: str, index: int) -> tuple[list[int], list[int]]:
        row = self._rows[split][index]
        return row["chosen_ids"], row["rejected_ids"]


class BuiltinExamples:
    """The synthetic arithmetic tasks, tokenized as each stage trains on them."""

    def __init__(self, tasks: ArithmeticTasks, tokenizer, stage: str, seq_len: int):
        self.tasks, self.tok, self.stage, self.seq_len = tasks, tokenizer, stage, seq_len

    def size(self, split: str) -> int:
        return self.tasks.size(split)

    def lm_example(self, split: str, index: int) -> tuple[list[int], list[int]]:
        t = self.tok
        if self.stage == "cpt":  # packed lines of solved problems, loss on every token
            text = self.tasks.corpus_text(split, index, min_chars=self.seq_len)
            ids = ([t.bos_token_id] + t(text)["input_ids"])[: self.seq_len]
            return ids, list(ids)
        prompt, answer = self.tasks.sft_example(split, index)  # loss on the answer only
        p_ids = [t.bos_token_id] + t(prompt)["input_ids"]
        a_ids = t(answer)["input_ids"] + [t.eos_token_id]
        return (p_ids + a_ids)[: self.seq_len], ([IGNORE] * len(p_ids) + a_ids)[: self.seq_len]

    def preference(self, split: str, index: int) -> tuple[list[int], list[int]]:
        prompt, good, bad = self.tasks.preference_pair(split, index)
        t = self.tok

        def ids(answer: str) -> list[int]:
            return ([t.bos_token_id] + t(prompt)["input_ids"] + t(answer)["input_ids"]
                    + [t.eos_token_id])[: self.seq_len]
        return ids(good), ids(bad)


def stage_examples(plan: dict | None, tasks: ArithmeticTasks, tokenizer, stage_cfg):
    """The examples a stage trains on: the launch's data plan, else the built-in tasks."""
    if plan is not None:
        return FileExamples(plan)
    return BuiltinExamples(tasks, tokenizer, stage_cfg.name, stage_cfg.seq_len)
