"""Rows to token ids: what each format trains on, and which tokens carry the loss.

Chat rows are rendered once with the chat template; the assistant's spans are found as
the characters each assistant turn adds to the rendering of the turns before it (with
the generation prompt), and a token carries the loss when it starts inside one. That
works for any template that renders a conversation's turns in order, without needing
`{% generation %}` markers in it.

A row that cannot be rendered does not raise inside `datasets.map` (a traceback per
process): its problem is returned in the `problem` column and reported by row number.
"""
from __future__ import annotations

import json
from bisect import bisect_left

from stages.data.chat_template import DirectTemplate
from stages.data.formats import MESSAGES, PREFERENCE, PROMPT_COMPLETION, PROMPTS, ROLES, TEXT

IGNORE = -100


def text_ids(tokenizer, text: str, *, bos: bool, eos: bool) -> list[int]:
    """`text`'s ids, starting with BOS (`bos`) and ending with EOS (`eos`) where the model has
    them, each once: a Llama tokenizer adds BOS itself, a Qwen2 one has none, the built-in
    one adds nothing."""
    ids = list(tokenizer(text, add_special_tokens=bos)["input_ids"])
    if bos and tokenizer.bos_token_id is not None and (not ids or ids[0] != tokenizer.bos_token_id):
        ids = [tokenizer.bos_token_id] + ids
    if eos and tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    return ids


def _encoding_labels(encoding, ids: list[int], spans: list[tuple[int, int]], text: str) -> list[int]:
    """`_labels`, asking the fast tokenizer's encoding for the few token offsets around each
    span's ends instead of converting every token's offsets into Python first."""
    labels = [IGNORE] * len(ids)
    for lo, hi in spans:
        first, end = _first_starting_from(encoding, lo, text), _first_starting_from(encoding, hi, text)
        if first is None or end is None:
            return _labels(ids, encoding.offsets, spans)
        labels[first:end] = ids[first:end]
    return labels


def _first_starting_from(encoding, position: int, text: str) -> int | None:
    """The first token whose start offset is at or after `position`: `bisect_left` over the
    start offsets, which run left to right. Several tokens can share a start (the bytes of
    one character split across tokens), hence the walks. None: no token covers it."""
    count = len(encoding)
    if position >= len(text):
        return count
    token = encoding.char_to_token(position)
    if token is None:
        return None
    try:
        while token > 0 and encoding.token_to_chars(token - 1)[0] >= position:
            token -= 1
        while token < count and encoding.token_to_chars(token)[0] < position:
            token += 1
    except TypeError:  # a token with no offsets (None)
        return None
    return token


class RowProblem(Exception):
    """What is wrong with one row (reported with its row number by the caller)."""


NOT_PREFIXES = ("the chat template does not render the conversation's turns as prefixes of it, so "
                "the assistant's tokens cannot be found; set data.loss_on=all, or a template that "
                "does (model.chat_template)")
NO_ASSISTANT = ("no assistant message, so no token would carry the loss; expected at least one "
                "message with role 'assistant' (or data.loss_on=all)")


def _labels(ids: list[int], offsets, spans: list[tuple[int, int]]) -> list[int]:
    """Each token's id where it starts inside an assistant span, else IGNORE. Token starts
    run left to right, so each span is a slice of tokens, found by bisection."""
    starts = [start for start, _ in offsets]
    labels = [IGNORE] * len(ids)
    for lo, hi in spans:
        first, end = bisect_left(starts, lo), bisect_left(starts, hi)
        labels[first:end] = ids[first:end]
    return labels


class Renderer:
    def __init__(self, tokenizer, fmt: str, columns: dict[str, str], max_length: int,
                 truncation: str, loss_on: str):
        self.tok, self.fmt, self.columns = tokenizer, fmt, columns
        self.max_length, self.truncation, self.loss_on = max_length, truncation, loss_on
        self.eos = tokenizer.eos_token_id
        self._direct = DirectTemplate(tokenizer) if fmt == MESSAGES and tokenizer.chat_template else None

    # -- one row ------------------------------------------------------------------------
    def row(self, row: dict) -> dict:
        if self.fmt == TEXT:
            ids = self._plain(self._string(row, "text"), add_special=True, eos=True)
            return self._fit({"input_ids": ids, "labels": list(ids)})
        if self.fmt in (PROMPT_COMPLETION, MESSAGES):
            return self._supervised_row(*self._supervised(row))
        if self.fmt == PREFERENCE:
            prompt = row.get(self.columns["prompt"]) if self.columns["prompt"] in row else None
            chosen, rejected = (self._answered(prompt, row[self.columns[r]], r)[0]
                                for r in ("chosen", "rejected"))
            return self._fit({"chosen_ids": chosen, "rejected_ids": rejected})
        if self.fmt == PROMPTS:
            prompt = row[self.columns["prompt"]]
            ids = (self._chat(self._messages(prompt, "prompt"), generation=True) if isinstance(prompt, list)
                   else self._plain(self._string(row, "prompt"), add_special=True, eos=False))
            if row[self.columns["answer"]] is None:
                raise RowProblem(f"'{self.columns['answer']}' is empty (null); expected the ground truth "
                                 "your reward function compares with")
            used = {self.columns[role] for role in ROLES[PROMPTS]}
            extra = {k: v for k, v in row.items() if k not in used}
            return self._fit({"prompt_ids": ids, "answer_json": json.dumps(row[self.columns["answer"]]),
                              "extra_json": json.dumps(extra, default=str)})
        raise RowProblem(f"unknown format {self.fmt!r}")

    def _supervised_row(self, ids: list[int], labels: list[int]) -> dict:
        fitted = self._fit({"input_ids": ids, "labels": labels})
        if fitted["labels"].count(IGNORE) == len(fitted["labels"]):
            raise RowProblem(f"no token of the answer is left within data.max_length={self.max_length} "
                             f"({len(ids)} tokens, the prompt alone fills it); raise data.max_length, "
                             "or set data.truncation=left")
        return fitted

    # -- a batch ------------------------------------------------------------------------
    def rows(self, batch: list[dict]) -> list:
        """`row` of each (a dict, or the RowProblem it raised), with chat rows' renders and
        their tokenization done once per batch: the template's and the tokenizer's own
        per-call work is most of a chat row's cost. The output is `row`'s, row by row."""
        if self.fmt != MESSAGES:
            return [self._attempt(row) for row in batch]
        conversations = []
        for row in batch:
            try:
                conversations.append(self._messages(row[self.columns["messages"]], "messages"))
            except RowProblem as problem:
                conversations.append(problem)
        good = [i for i, c in enumerate(conversations) if not isinstance(c, RowProblem)]
        try:
            texts = self._render_many([conversations[i] for i in good], generation=False)
            spans = self._spans_many([conversations[i] for i in good], texts)
        except RowProblem:  # a conversation the template refuses: find it row by row
            return [self._attempt(row) for row in batch]
        # The fast tokenizer's own batch encoding: what `self.tok(texts, add_special_tokens=False)`
        # runs, without converting every encoding into transformers' structures first.
        encodings = self.tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
        out = list(conversations)
        for n, i in enumerate(good):
            ids = encodings[n].ids
            if isinstance(spans[n], RowProblem):
                out[i] = spans[n]
                continue
            labels = list(ids) if self.loss_on == "all" else _encoding_labels(encodings[n], ids, spans[n], texts[n])
            try:
                out[i] = self._supervised_row(ids, labels)
            except RowProblem as problem:
                out[i] = problem
        return out

    def _attempt(self, row: dict):
        try:
            return self.row(row)
        except Exception as exc:  # RowProblem, or the template / JSON failing on this row
            return exc if isinstance(exc, RowProblem) else RowProblem(f"{type(exc).__name__}: {exc}")

    def _spans_many(self, conversations: list[list[dict]], texts: list[str]) -> list:
        """`_assistant_spans` of each rendered conversation (a list of spans, or the
        RowProblem), from two batched renders: the turns before each assistant turn (with
        the generation prompt), and those up to it when it is not the last."""
        if self.loss_on == "all":
            return [[] for _ in conversations]
        wanted = [(n, i) for n, messages in enumerate(conversations)
                  for i, message in enumerate(messages) if message["role"] == "assistant"]
        before = self._render_many([conversations[n][:i] for n, i in wanted if i], generation=True)
        upto = self._render_many([conversations[n][:i + 1] for n, i in wanted
                                  if i < len(conversations[n]) - 1], generation=False)
        before_of, upto_of = iter(before), iter(upto)
        spans: list = [[] for _ in conversations]
        for n, i in wanted:
            head = next(before_of) if i else ""
            end = next(upto_of) if i < len(conversations[n]) - 1 else texts[n]
            if isinstance(spans[n], RowProblem):
                continue
            if not texts[n].startswith(end) or not end.startswith(head):
                spans[n] = RowProblem(NOT_PREFIXES)
            else:
                spans[n].append((len(head), len(end)))
        return [s if isinstance(s, RowProblem) or s else RowProblem(NO_ASSISTANT) for s in spans]

    def _render_many(self, conversations: list[list[dict]], generation: bool) -> list[str]:
        if not conversations:
            return []
        try:
            if self._direct is not None and self._direct.usable:
                return self._direct.render_many(conversations, generation)
            return self.tok.apply_chat_template(conversations, tokenize=False,
                                                add_generation_prompt=generation)
        except Exception as exc:
            raise RowProblem(f"the chat template refused a conversation ({type(exc).__name__}: {exc})") from None

    def _supervised(self, row: dict) -> tuple[list[int], list[int]]:
        if self.fmt == MESSAGES:
            messages = self._messages(row[self.columns["messages"]], "messages")
            text, spans = self._assistant_spans(messages, [])
            return self._spans_to_labels(text, spans)
        prompt, completion = row[self.columns["prompt"]], row[self.columns["completion"]]
        if prompt is None or completion is None:
            role = "prompt" if prompt is None else "completion"
            raise RowProblem(f"'{self.columns[role]}' is empty (null or missing); expected a string "
                             "or a list of messages")
        return self._answered(prompt, completion, "completion")

    def _answered(self, prompt, answer, role: str) -> tuple[list[int], list[int]]:
        """(ids, labels) of prompt + answer; the answer's tokens carry the loss. Strings are
        tokenized as they are (BOS if the tokenizer adds one, EOS after the answer);
        message lists go through the chat template."""
        if isinstance(answer, list) or isinstance(prompt, list):
            before = self._messages(prompt, "prompt") if prompt is not None else []
            text, spans = self._assistant_spans(before + self._messages(answer, role), before)
            return self._spans_to_labels(text, spans)
        if not isinstance(answer, str) or (prompt is not None and not isinstance(prompt, str)):
            raise RowProblem(f"'{self.columns.get('prompt')}'/'{self.columns[role]}' hold "
                             f"{type(prompt).__name__}/{type(answer).__name__}; expected strings, "
                             "or lists of {role, content} messages")
        head = self._plain(prompt, add_special=True, eos=False) if prompt else self._bos()
        tail = self._plain(answer, add_special=False, eos=True)
        labels = [IGNORE] * len(head) + tail if self.loss_on == "completion" else head + tail
        return head + tail, labels

    # -- chat templates -----------------------------------------------------------------
    def _assistant_spans(self, messages: list[dict], context: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans the assistant's turns add
        (after `context`, which never carries the loss)."""
        text = self._render(messages, generation=False)
        if self.loss_on == "all":  # every token trains: no need to find the assistant's
            return text, []
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or i < len(context):
                continue
            before = self._render(messages[:i], generation=True) if i else ""
            upto = self._render(messages[:i + 1], generation=False)
            if not text.startswith(upto) or not upto.startswith(before):
                raise RowProblem(NOT_PREFIXES)
            spans.append((len(before), len(upto)))
        if not spans:
            raise RowProblem(NO_ASSISTANT)
        return text, spans

    def _spans_to_labels(self, text: str, spans) -> tuple[list[int], list[int]]:
        encoded = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoded["input_ids"]
        if self.loss_on == "all":
            return ids, list(ids)
        return ids, _labels(ids, encoded["offset_mapping"], spans)

    def _render(self, messages: list[dict], generation: bool) -> str:
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        except Exception as exc:  # the template's own raise_exception ("roles must alternate"), …
            raise RowProblem(f"the chat template refused the conversation ({type(exc).__name__}: {exc})") from None

    def _chat(self, messages: list[dict], generation: bool) -> list[int]:
        return self.tok(self._render(messages, generation), add_special_tokens=False)["input_ids"]

    def _messages(self, value, role: str) -> list[dict]:
        if isinstance(value, str):
            return [{"role": "user" if role == "prompt" else "assistant", "content": value}]
        if not isinstance(value, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in value):
            raise RowProblem(f"'{self.columns[role]}' holds {_shape(value)}; expected a list of "
                             "{\"role\": ..., \"content\": \"...\"} messages")
        return [{"role": m["role"], "content": m["content"]} for m in value]

    # -- plain strings ------------------------------------------------------------------
    def _string(self, row: dict, role: str) -> str:
        value = row[self.columns[role]]
        if not isinstance(value, str):
            raise RowProblem(f"'{self.columns[role]}' holds {_shape(value)}; expected a string")
        return value

    def _plain(self, text: str, add_special: bool, eos: bool) -> list[int]:
        return text_ids(self.tok, text, bos=add_special, eos=eos)

    def _bos(self) -> list[int]:
        return [self.tok.bos_token_id] if self.tok.bos_token_id is not None else []

    # -- length -------------------------------------------------------------------------
    def _fit(self, out: dict) -> dict:
        """Cut each id list to max_length as data.truncation says (labels with their ids)."""
        for name in [k for k in out if k.endswith("ids")]:
            n = len(out[name])
            if n <= self.max_length:
                continue
            if self.truncation == "error":
                raise RowProblem(f"{n} tokens, longer than data.max_length={self.max_length}; raise "
                                 "data.max_length, or set data.truncation=left or right")
            cut = slice(n - self.max_length, n) if self.truncation == "left" else slice(0, self.max_length)
            out[name] = out[name][cut]
            if name == "input_ids":
                out["labels"] = out["labels"][cut]
        return {**out, "length": max(len(v) for k, v in out.items() if k.endswith("ids"))}


def _shape(value) -> str:
    text = json.dumps(value, default=str)
    return f"a {type(value).__name__} ({text[:60]}{'…' if len(text) > 60 else ''})"
