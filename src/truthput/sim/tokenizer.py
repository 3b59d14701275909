"""The model's own tokenizer, when the simulator is given a model directory (or `--tokenizer`).

Why: a client compares the server's prompt counts with its own, and `/tokenize` answers are fed
back as prompts; with the real tokenizer the simulator's prompt tokens, `/tokenize` and
`/detokenize` are the model's (chat prompts through the model's chat template). Without one the
simulator keeps its estimate (`textgen.count_text_tokens`) and says so at start-up.
"""

from __future__ import annotations

import json
import os
from typing import Any


class ModelTokenizer:
    """`tokenizer.json` (Hugging Face `tokenizers`) plus the chat template beside it."""

    def __init__(self, folder: str) -> None:
        # the server's own read of the model directory: the simulator stands beside the core (it is
        # launched, never imported), so it does not share the client's loader in truthput.load
        from tokenizers import Tokenizer

        self.folder = folder
        self.tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.template = _chat_template(folder)

    @property
    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self.tok.id_to_token(i) or "" for i in ids]

    def chat_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt the chat template makes of `messages` (content parts joined as text)."""
        msgs = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        if self.template is None:
            return "".join(f"{m.get('role', 'user')}: {m['content']}\n" for m in msgs)
        return self.template.render(messages=msgs, add_generation_prompt=add_generation_prompt)

    def count_text(self, text: str) -> int:
        return len(self.encode(text))

    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        return len(self.encode(self.chat_text(messages)))


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _chat_template(folder: str):
    import jinja2

    text = None
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    else:
        cfg = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as f:
                tmpl = json.load(f).get("chat_template")
            text = tmpl if isinstance(tmpl, str) else None
    if text is None:
        return None
    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    return env.from_string(text)


def find_model_tokenizer(*candidates: str | None) -> ModelTokenizer | None:
    """The first candidate folder that holds a tokenizer.json, or None."""
    for folder in candidates:
        if folder and os.path.isfile(os.path.join(folder, "tokenizer.json")):
            return ModelTokenizer(folder)
    return None
