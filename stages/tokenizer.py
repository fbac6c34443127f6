"""The built-in character-level tokenizer, saved in Hugging Face format (tokenizer.json).

One token per character keeps the synthetic arithmetic tasks exactly verifiable and
lets any stage load the tokenizer with `AutoTokenizer.from_pretrained(dir)`.
"""
from __future__ import annotations


PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = "0123456789+-*=?:;,. \nabcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character, newline included, is its own pre-token.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        clean_up_tokenization_spaces=False)
