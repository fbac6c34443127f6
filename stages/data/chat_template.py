"""The chat template rendered without `apply_chat_template`'s per-call work.

`apply_chat_template` converts every message through transformers' general-purpose
normalisation (message objects to dicts, None keys dropped, reasoning fields aliased, a
plain copy of everything the template sees) before it renders. For the messages baton
hands it (fresh dicts of a `role` and a `content` string) each of those steps is the
identity, yet on a chat dataset they cost about as much as the rendering itself; and
finding the assistant's tokens renders every conversation's prefixes too.

So chat rows are rendered here with the tokenizer's own compiled template and the same
variables `apply_chat_template` passes it. That it gives the same text is checked, not
assumed: the first conversation of every batch is rendered both ways, and any
difference (another transformers version, a template variable it adds) switches this
renderer off for good, back to `apply_chat_template`.
"""
from __future__ import annotations


class DirectTemplate:
    """`render(messages, generation)`: what `apply_chat_template(messages, tokenize=False,
    add_generation_prompt=generation)` returns, for plain string messages; None when this
    transformers has no compiled template to use."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._compiled = self._variables = None
        try:
            from transformers.utils.chat_template_utils import (_compile_jinja_template,
                                                                _plain_template_data)
            self._compiled = _compile_jinja_template(tokenizer.get_chat_template(None, None))
            self._variables = _plain_template_data(dict(tokenizer.special_tokens_map))
        except Exception:  # another transformers, or no template: apply_chat_template it is
            self._compiled = None

    @property
    def usable(self) -> bool:
        return self._compiled is not None

    def render_many(self, conversations: list[list[dict]], generation: bool) -> list[str]:
        """Each conversation rendered; the first is compared with `apply_chat_template`'s
        rendering of it (raises what the template raises, as apply_chat_template would)."""
        # What Template.render does, with the template's globals and the variables merged
        # into one dict once (`shared`): jinja would merge them again for every render.
        template = self._compiled
        merged = {**dict(template.globals), **self._variables, "tools": None, "documents": None,
                  "add_generation_prompt": generation}
        out = ["".join(template.root_render_func(template.new_context({**merged, "messages": messages}, shared=True)))
               for messages in conversations]
        if out and out[0] != self.tok.apply_chat_template(conversations[0], tokenize=False,
                                                          add_generation_prompt=generation):
            self._compiled = None
            return self.tok.apply_chat_template(conversations, tokenize=False, add_generation_prompt=generation)
        return out

    def __getstate__(self):  # datasets.map pickles the renderer into its processes
        return {"tok": self.tok}

    def __setstate__(self, state):
        self.__init__(state["tok"])
