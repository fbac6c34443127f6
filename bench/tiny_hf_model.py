"""Tiny random-initialised Hugging Face causal LMs, built offline: `baton bench data`'s
model, the example's (`examples/own_data/make_data.py --model DIR`) and the tests' two
model families.

Users bring a model directory written by `save_pretrained`, not a baton-made one, so
this builds exactly that: a config, safetensors weights and a real tokenizer side by
side. Two families cover the differences that break post-training code in practice:

- "llama": a BOS token added on every encode, no pad token, a Llama-3-style chat template
  that itself starts with the BOS token;
- "qwen2": no BOS token at all, a separate pad token, a ChatML chat template.

The tokenizer is a byte-level BPE trained here on a small built-in corpus, so encoding
behaves like a real one (merges, multi-token words, special tokens) with nothing
downloaded. Everything is seeded: the same arguments give the same bytes on disk.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_REGEX

VOCAB_SIZE = 512

# Llama-3's template and header tokens. It renders the BOS token itself, as the real one
# does, so a rendered conversation must be encoded without adding special tokens again.
LLAMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

# `specials` in id order (0, 1, ...), the order of the real vocabularies: Llama's
# <unk>, <s>, </s> first; Qwen2's <|endoftext|>, <|im_start|>, <|im_end|>.
FAMILIES = {
    "llama": dict(
        config=LlamaConfig, model=LlamaForCausalLM, template=LLAMA_CHAT_TEMPLATE,
        specials=["<unk>", "<s>", "</s>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        unk="<unk>", bos="<s>", eos="</s>", pad=None),
    "qwen2": dict(
        config=Qwen2Config, model=Qwen2ForCausalLM, template=CHATML_TEMPLATE,
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        unk=None, bos=None, eos="<|im_end|>", pad="<|endoftext|>"),
}

_WORDS = ("the model learns to add small numbers and answer short questions about "
          "cats dogs birds trees rivers hello world what is sum of plus equals answer "
          "please tell me one two three four five six seven eight nine ten "
          "a quick brown fox jumps over lazy dog while children read books in quiet "
          "library every morning sun rises above green hills people walk through "
          "streets carrying bread milk apples teacher writes simple sums on board "
          "students count fingers together after lunch they play outside until evening").split()


def _corpus() -> list[str]:
    """A few hundred short English and arithmetic lines, the same on every call: the
    arithmetic gives digits and `+`/`=` merges, the sentences give word merges."""
    lines = []
    for a in range(0, 60, 3):
        for b in range(0, 50, 7):
            lines.append(f"{a}+{b}={a + b}")
            lines.append(f"What is {a} plus {b}? The answer is {a + b}.")
    n = len(_WORDS)
    for i in range(n):
        sentence = " ".join(_WORDS[(i + k * k) % n] for k in range(8))
        lines.append(sentence.capitalize() + ".")
    return lines


def _backend(family: str) -> Tokenizer:
    """An untrained byte-level BPE with the family's pre-processing. transformers 5 loads
    a qwen2 directory with `Qwen2Tokenizer`, which rebuilds Qwen2's own normalizer and
    pre-tokenizer around the saved vocabulary; training with exactly those keeps the
    tokenizer a test loads the same as the one saved. Llama directories load as saved."""
    if family == "llama":
        backend = Tokenizer(models.BPE(unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend = Tokenizer(models.BPE())
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _tokenizer(family: str, chat_template: bool) -> PreTrainedTokenizerFast:
    spec = FAMILIES[family]
    backend = _backend(family)
    # The full byte alphabet makes every string encodable, as in GPT-2-style tokenizers.
    backend.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=spec["specials"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if spec["bos"]:
        bos = spec["bos"]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
            special_tokens=[(bos, backend.token_to_id(bos))])
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    named = {spec[k] for k in ("unk", "bos", "eos", "pad")}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token=spec["unk"], bos_token=spec["bos"],
        eos_token=spec["eos"], pad_token=spec["pad"],
        additional_special_tokens=[t for t in spec["specials"] if t not in named],
        chat_template=spec["template"] if chat_template else None)


def build_tiny_model(directory: Path, family: str, *, chat_template: bool = True,
                     seed: int = 0) -> Path:
    """Write a tiny random `family` ("llama" or "qwen2") causal LM and its tokenizer to
    `directory` with `save_pretrained`, as a user's model directory; returns `directory`.
    `chat_template=False` leaves the tokenizer without a chat template."""
    tokenizer = _tokenizer(family, chat_template)
    spec = FAMILIES[family]
    config = spec["config"](
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = spec["model"](config)
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
